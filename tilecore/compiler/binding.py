"""Argument binding: check the caller's tensors against the kernel's signature and build the launch
arrays. Every mismatch raises :class:`~tilecore.errors.ArgumentError` naming the argument and what
was expected. numpy and torch are imported only when an argument needs them.
"""
from __future__ import annotations

import sys

from ..errors import ArgumentError

#: numpy cannot hold these; they need torch tensors
_TORCH_ONLY = {"bfloat16", "float8_e4m3", "float8_e5m2"}
_TORCH_NAMES = {"float8_e4m3": "float8_e4m3fn", "bool": "bool"}


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def device_buffer(x):
    """The descriptor of an argument that lives in a backend's own memory, or None.

    The protocol: ``type(x).__tilecore_buffer__(x)`` returns a dict with ``handle`` (an int the backend's
    runtime resolves; it is passed where a host or device address would be), ``shape`` (tuple),
    ``dtype`` (a tilecore dtype name) and ``backend`` (the name of the backend whose kernels take it).
    Such tensors are always contiguous."""
    f = getattr(type(x), "__tilecore_buffer__", None)
    return None if f is None else f(x)


def _is_numpy(x) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


_DTYPE_NAMES: dict = {}


def dtype_name(x) -> str:
    """The canonical dtype name of a tensor; memoized per dtype object (it is on every launch's path)."""
    dt = x.dtype
    try:
        return _DTYPE_NAMES[dt]
    except (KeyError, TypeError):
        from ..ir.dtypes import canonical

        name = str(canonical(dt))
        try:
            _DTYPE_NAMES[dt] = name
        except TypeError:  # an unhashable dtype object: no memo
            pass
        return name


def torch_dtype(name: str):
    import torch

    return getattr(torch, _TORCH_NAMES.get(name, name))


def numpy_dtype(name: str):
    import numpy as np

    return np.dtype("bool" if name == "bool" else name)


def _describe(p: dict) -> str:
    shape = ", ".join(str(s) for s in p["shape"])
    return f"a {p['dtype']} tensor of shape ({shape})"


class Bound:
    __slots__ = ("buffers", "ints", "floats", "outputs", "keep")

    def __init__(self):
        self.buffers, self.ints, self.floats, self.outputs, self.keep = [], [], [], [], []


def bind(sig: dict, args: tuple, kernel_name: str, device_type: str, backend: str = "") -> Bound:
    params = sig["params"]
    out_idx = sig["out_idx"]
    inputs = [i for i in range(len(params)) if i not in out_idx and not params[i].get("workspace")]
    if len(args) != len(inputs):
        names = [params[i]["name"] for i in inputs]
        if len(args) < len(inputs):
            missing = names[len(args)]
            p = params[inputs[len(args)]]
            what = _describe(p) if p["kind"] == "buffer" else f"a {p['dtype']} scalar"
            raise ArgumentError(f"kernel {kernel_name}: missing argument {missing!r} ({what}); it takes "
                                f"{len(inputs)} argument(s): {', '.join(names)}"
                                + (f" (outputs {[params[i]['name'] for i in out_idx]} are allocated for you)"
                                   if out_idx else ""))
        raise ArgumentError(f"kernel {kernel_name}: takes {len(inputs)} argument(s) ({', '.join(names)}), "
                            f"got {len(args)}" + (" (out_idx outputs are returned, not passed)" if out_idx else ""))
    symbols: dict = {}
    values: dict = {}
    like_torch = None
    for i, a in zip(inputs, args):
        p = params[i]
        if p["kind"] == "buffer":
            _check_tensor(p, a, kernel_name, device_type, symbols, backend)
            if _is_torch(a):
                like_torch = a
        else:
            values[p["name"]] = _check_scalar(p, a, kernel_name)
        values.setdefault(p["name"], a)
    out = Bound()
    workspaces = [i for i, p in enumerate(params) if p.get("workspace")]
    for i in out_idx + workspaces:
        p = params[i]
        shape = []
        for s in p["shape"]:
            if isinstance(s, str):
                if s not in symbols:
                    if p.get("workspace"):
                        raise ArgumentError(f"kernel {kernel_name}: the T.alloc_global workspace {p['name']!r} has "
                                            f"the dimension {s!r}, which no input tensor determines; size it from "
                                            "the inputs' dimensions or pass it as a T.Tensor parameter")
                    raise ArgumentError(f"kernel {kernel_name}: output {p['name']!r} has the dimension {s!r}, which "
                                        "no input tensor determines; pass the output yourself (drop it from out_idx)")
                shape.append(symbols[s])
            else:
                shape.append(s)
        t = _allocate(p, tuple(shape), like_torch, kernel_name, device_type, zero=p.get("workspace", False))
        values[p["name"]] = t
        if not p.get("workspace"):
            out.outputs.append(t)
    for p in params:
        v = values[p["name"]]
        if p["kind"] == "buffer":
            if _is_torch(v):
                out.buffers.append(v.data_ptr())
            elif _is_numpy(v):
                out.buffers.append(v.ctypes.data)
            else:
                out.buffers.append(int(device_buffer(v)["handle"]))
            out.keep.append(v)
    for name in sig["ints"]:
        if name in symbols:
            out.ints.append(int(symbols[name]))
        else:
            out.ints.append(int(values[name]))
    for name in sig["floats"]:
        out.floats.append(float(values[name]))
    return out


def _check_tensor(p: dict, a, kernel_name: str, device_type: str, symbols: dict, backend: str = "") -> None:
    name = p["name"]
    desc = None
    if _is_torch(a):
        dev = a.device.type
        if dev != device_type:
            raise ArgumentError(f"kernel {kernel_name}: argument {name!r} is on device {a.device}, but this "
                                f"kernel's target runs on {device_type!r} tensors; move it with .to({device_type!r})")
        contiguous = a.is_contiguous()
    elif _is_numpy(a):
        if device_type != "cpu":
            raise ArgumentError(f"kernel {kernel_name}: argument {name!r} is a numpy array, but this kernel's "
                                f"target needs {device_type!r} torch tensors")
        contiguous = a.flags["C_CONTIGUOUS"]
    else:
        desc = device_buffer(a)
        if desc is None:
            raise ArgumentError(f"kernel {kernel_name}: argument {name!r} must be {_describe(p)} (numpy array, torch "
                                f"tensor or a backend's device tensor), got {type(a).__name__}")
        if desc["backend"] != backend:
            raise ArgumentError(f"kernel {kernel_name}: argument {name!r} lives in the memory of the "
                                f"{desc['backend']!r} backend, but this kernel runs on {backend or device_type!r}; "
                                "read it back first (e.g. .numpy())")
        got, shape, contiguous = str(desc["dtype"]), tuple(desc["shape"]), True
    if desc is None:
        try:
            got = dtype_name(a)
        except ValueError:
            got = str(a.dtype)
        shape = tuple(a.shape)
    if got != p["dtype"]:
        raise ArgumentError(f"kernel {kernel_name}: argument {name!r} has dtype {got}, expected {p['dtype']}")
    if len(shape) != len(p["shape"]):
        raise ArgumentError(f"kernel {kernel_name}: argument {name!r} has shape {shape}, expected {_describe(p)}")
    for d, (want, have) in enumerate(zip(p["shape"], shape)):
        if isinstance(want, str):
            prev = symbols.setdefault(want, have)
            if prev != have:
                raise ArgumentError(f"kernel {kernel_name}: argument {name!r} dim {d} is {have}, but {want!r} is "
                                    f"already {prev} from an earlier argument")
        elif want != have:
            raise ArgumentError(f"kernel {kernel_name}: argument {name!r} has shape {shape}, expected "
                                f"{_describe(p)} (dim {d} differs)")
    if not contiguous:
        raise ArgumentError(f"kernel {kernel_name}: argument {name!r} is not contiguous; pass .contiguous() "
                            "(torch) or np.ascontiguousarray (numpy)")


def _check_scalar(p: dict, a, kernel_name: str):
    if hasattr(a, "item") and getattr(a, "ndim", 0) == 0:
        a = a.item()
    if p["dtype"].startswith(("float", "bfloat")):
        if not isinstance(a, (int, float)) or isinstance(a, bool):
            raise ArgumentError(f"kernel {kernel_name}: argument {p['name']!r} must be a number ({p['dtype']}), "
                                f"got {type(a).__name__}")
        return float(a)
    if not isinstance(a, int) or isinstance(a, bool) and p["dtype"] != "bool":
        raise ArgumentError(f"kernel {kernel_name}: argument {p['name']!r} must be an int ({p['dtype']}), "
                            f"got {type(a).__name__}")
    return int(a)


def _allocate(p: dict, shape: tuple, like_torch, kernel_name: str, device_type: str, zero: bool = False):
    """An output (uninitialized) or a workspace (``zero``: zero-filled), where the inputs live."""
    if like_torch is not None or device_type != "cpu" or p["dtype"] in _TORCH_ONLY:
        try:
            import torch
        except ImportError:
            what = "workspace" if p.get("workspace") else "output"
            raise ArgumentError(f"kernel {kernel_name}: {what} {p['name']!r} ({p['dtype']}) needs torch, which "
                                "is not installed") from None
        device = like_torch.device if like_torch is not None else device_type
        return (torch.zeros if zero else torch.empty)(shape, dtype=torch_dtype(p["dtype"]), device=device)
    import numpy as np

    return (np.zeros if zero else np.empty)(shape, dtype=numpy_dtype(p["dtype"]))


# -- the fast path ---------------------------------------------------------------------------------------

def compile_binder(sig: dict, device_type: str):
    """A binder specialized for one kernel's signature: ``f(args) -> Bound``, or None where the arguments
    are anything but the common case (torch tensors of the right dtype, shape, device and layout, Python
    numbers for scalars), so that :func:`bind` handles them and raises its errors.

    Generated once per kernel as straight-line Python (the checks :func:`bind` makes, without its loops,
    dictionaries and messages): 3 tensors bind in about 1.5 us instead of 12 us. Returns None when torch is
    not importable (every call then takes :func:`bind`)."""
    try:
        import torch
    except ImportError:
        return None
    params, out_idx = sig["params"], list(sig["out_idx"])
    skip = set(out_idx) | {i for i, p in enumerate(params) if p.get("workspace")}
    inputs = [i for i in range(len(params)) if i not in skip]
    env: dict = {"_Tensor": torch.Tensor, "_Bound": Bound, "_empty": torch.empty, "_zeros": torch.zeros}
    # torch's boolean property for the runtime's device type (is_cpu, is_mps, ...) is one attribute read;
    # ``.device.type`` builds a device object per call
    flag = f"is_{device_type}"
    attr = getattr(torch.Tensor, flag, None) if device_type.isidentifier() else None
    dev_check = ("{a}.%s" % flag if attr is not None and not callable(attr)  # a data descriptor, not a method
                 else "{a}.device.type == %r" % device_type)
    lines = ["def _bind(args):", f"    if len(args) != {len(inputs)}:", "        return None"]
    if inputs:
        lines.append(f"    {', '.join(f'a{i}' for i in inputs)}, = args")
    syms: dict = {}   # symbol -> the Python expression holding it
    value: dict = {}  # parameter index -> expression of its value
    last_tensor = None
    for i in inputs:
        p, a = params[i], f"a{i}"
        if p["kind"] == "buffer":
            env[f"_d{i}"] = torch_dtype(p["dtype"])
            lines += [f"    if type({a}) is not _Tensor or {a}.dtype is not _d{i} or not ({dev_check.format(a=a)}):",
                      "        return None"]
            if not any(isinstance(w, str) for w in p["shape"]):  # a static shape: one comparison
                env[f"_s{i}"] = tuple(int(w) for w in p["shape"])
                lines += [f"    if {a}.shape != _s{i} or not {a}.is_contiguous():", "        return None"]
                value[i] = f"{a}.data_ptr()"
                last_tensor = a
                continue
            lines += [f"    s{i} = {a}.shape", f"    if len(s{i}) != {len(p['shape'])}:", "        return None"]
            for d, want in enumerate(p["shape"]):
                if isinstance(want, str) and want not in syms:
                    syms[want] = f"s{i}[{d}]"
                else:
                    ref = syms[want] if isinstance(want, str) else str(int(want))
                    lines += [f"    if s{i}[{d}] != {ref}:", "        return None"]
            lines += [f"    if not {a}.is_contiguous():", "        return None"]
            value[i] = f"{a}.data_ptr()"
            last_tensor = a
        elif p["dtype"].startswith(("float", "bfloat")):
            lines += [f"    if type({a}) is not float and type({a}) is not int:", "        return None"]
            value[i] = f"float({a})"
        else:
            lines += [f"    if type({a}) is not int:", "        return None"]
            value[i] = a
    outs = []
    for i in out_idx + sorted(skip - set(out_idx)):
        p = params[i]
        if last_tensor is None or any(isinstance(s, str) and s not in syms for s in p["shape"]):
            return None  # outputs sized by what no input determines, or with no tensor to place them by: bind()
        shape = ", ".join(syms[s] if isinstance(s, str) else str(int(s)) for s in p["shape"])
        env[f"_d{i}"] = torch_dtype(p["dtype"])
        alloc = "_zeros" if p.get("workspace") else "_empty"
        lines.append(f"    o{i} = {alloc}(({shape}{',' if len(p['shape']) == 1 else ''}), dtype=_d{i}, "
                     f"device={last_tensor}.device)")
        value[i] = f"o{i}.data_ptr()"
        if not p.get("workspace"):
            outs.append(f"o{i}")
    names = {p["name"]: i for i, p in enumerate(params)}
    if any(n not in syms and names.get(n) not in value for n in list(sig["ints"]) + list(sig["floats"])):
        return None
    ints = [syms[n] if n in syms else value[names[n]] for n in sig["ints"]]
    floats = [value[names[n]] for n in sig["floats"]]
    bufs = [value[i] for i, p in enumerate(params) if p["kind"] == "buffer"]
    keep = [f"a{i}" for i in inputs if params[i]["kind"] == "buffer"] + [f"o{i}" for i in sorted(skip)]
    lines += ["    b = _Bound()", f"    b.buffers = [{', '.join(bufs)}]", f"    b.ints = [{', '.join(ints)}]",
              f"    b.floats = [{', '.join(floats)}]", f"    b.outputs = [{', '.join(outs)}]",
              f"    b.keep = [{', '.join(keep)}]", "    return b"]
    exec("\n".join(lines), env)  # noqa: S102 - generated from the signature alone (names are not interpolated)
    return env["_bind"]
