"""The compiled launcher: a kernel call (binding its torch tensors and calling the driver's launch function)
done in C, for runtimes whose driver launches through a function of the common driver-API shape
(``launch(function, grid x/y/z, block x/y/z, shared bytes, stream, params, extra) -> int``).

``launcher.c`` beside this file is one CPython extension module for every kernel, compiled on first use
with the host C compiler against this Python's headers and cached in the tilecore cache directory, keyed
by the source's hash, the Python version and the compiler. A kernel gets a :func:`make_launcher` object
built from a *plan* of its signature; a call checks what the generated Python binder
(:func:`tilecore.compiler.binding.compile_binder`) checks and returns ``NotImplemented`` for anything
else, having launched nothing, so that the general path runs and raises its errors.

Without a C compiler or Python's headers, or with ``TILECORE_C_LAUNCHER=0``, :func:`make_launcher`
returns None (the reason logged once at debug level on the ``tilecore.launcher`` logger) and kernels take
the Python path. Nothing here is an error a user sees.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Callable

from .tools import find_program

log = logging.getLogger("tilecore.launcher")

SOURCE = Path(__file__).with_name("launcher.c")
MODULE = "_tilecore_launch"
#: the C side's fixed limits (launcher.c): a signature beyond them gets no compiled launcher
MAX_ARGS, MAX_DIMS, MAX_SYMS, MAX_ALLOCS, MAX_SLOTS, MAX_DESCRIPTORS = 64, 8, 64, 16, 128, 8

_state: dict = {}  # "module": the loaded module, or None once it is known to be unavailable


def enabled() -> bool:
    """False when ``TILECORE_C_LAUNCHER=0``."""
    return os.environ.get("TILECORE_C_LAUNCHER", "1").strip() != "0"


def _mode() -> str:
    return os.environ.get("TILECORE_C_LAUNCHER", "1").strip()


def through_shim() -> bool:
    """False when ``TILECORE_C_LAUNCHER=getters``: the launcher reads tensors through torch's getters and methods
    (D23) instead of torch's C shim (D57)."""
    return _mode() != "getters"


SHIM_FUNCTIONS = ("aoti_torch_get_dtype", "aoti_torch_get_device_type", "aoti_torch_get_dim", "aoti_torch_get_sizes",
                  "aoti_torch_is_contiguous", "aoti_torch_get_data_ptr")


class _Shim:
    """torch's C shim (AOTInductor's stable C ABI in libtorch: ``torch/csrc/inductor/aoti_torch/c/shim.h``) as the
    compiled launcher calls it: a handle is the address of a word holding a tensor's TensorImpl address
    (``_cdata``), which is what an ``at::Tensor`` is."""

    def __init__(self, torch, lib):
        i32, i64 = ctypes.c_int32, ctypes.c_int64
        self.torch, self.lib, self.fns = torch, lib, [getattr(lib, n) for n in SHIM_FUNCTIONS]
        for f, out in zip(self.fns, (i32, i32, i64, ctypes.POINTER(i64), ctypes.c_bool, ctypes.c_void_p)):
            f.restype, f.argtypes = ctypes.c_int32, [ctypes.c_void_p, ctypes.POINTER(out)]
        self.addresses = tuple(ctypes.cast(f, ctypes.c_void_p).value for f in self.fns)
        self.codes: dict = {}

    def read(self, t):
        """(dtype code, device type code, dim, sizes, contiguous, data address) of ``t`` through the shim."""
        impl = ctypes.c_void_p(t._cdata)
        h = ctypes.addressof(impl)
        outs = [ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int64(), ctypes.POINTER(ctypes.c_int64)(),
                ctypes.c_bool(), ctypes.c_void_p()]
        for f, o in zip(self.fns, outs):
            if f(h, ctypes.byref(o)) != 0:
                raise RuntimeError(f"{f.__name__} failed")
        dim = outs[2].value
        return (outs[0].value, outs[1].value, dim, [outs[3][d] for d in range(dim)], outs[4].value,
                outs[5].value or 0)

    def dtype_code(self, dtype) -> int:
        if dtype not in self.codes:
            self.codes[dtype] = self.read(self.torch.empty(1, dtype=dtype))[0]
        return self.codes[dtype]


def _tensor_shim():
    """The shim, checked on probe tensors against torch's getters (every fact the launcher reads: dtype codes
    distinct per dtype, device type, dim, sizes, contiguity, data address), or None (logged once at debug level):
    torch without it, a shared library not found, or any disagreement."""
    if "shim" in _state:
        return _state["shim"]
    _state["shim"] = None
    try:
        import torch

        folder = Path(torch.__file__).parent / "lib"
        names = [n for n in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll") if (folder / n).exists()]
        if not names:
            raise OSError(f"no libtorch_cpu in {folder}")
        shim = _Shim(torch, ctypes.CDLL(str(folder / names[0])))
        cpu = shim.lib.aoti_torch_device_type_cpu
        cpu.restype, cpu.argtypes = ctypes.c_int32, []
        base = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
        probes = [base, base.transpose(0, 2), base[1], base[:, :, 1:], torch.ones((), dtype=torch.int32),
                  torch.empty(0, 7, dtype=torch.bfloat16), torch.zeros(9, dtype=torch.float16)[1:],
                  torch.ones(4, dtype=torch.int64), torch.ones(2, dtype=torch.uint8)]
        for t in probes:
            want = (None, cpu(), t.dim(), list(t.shape), t.is_contiguous(), t.data_ptr())
            got = shim.read(t)
            if got[1:] != want[1:]:
                raise RuntimeError(f"the shim reads {got[1:]} where torch's getters read {want[1:]}")
        codes = {shim.dtype_code(d) for d in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64,
                                               torch.uint8, torch.float64, torch.int8, torch.bool)}
        if len(codes) != 9:
            raise RuntimeError("the shim's dtype codes are not distinct")
    except (ImportError, OSError, AttributeError, RuntimeError, TypeError, ValueError) as e:
        log.debug("tilecore: the compiled launcher reads tensors through torch's getters: %s", e)
        return None
    _state["shim"] = shim
    return shim


def shim_for(device_attr: str):
    """``(shim, the launcher's shim tuple)`` for tensors whose ``device_attr`` (``is_<type>``) is True, or
    ``(None, None)`` (the launcher then reads tensors through torch's getters)."""
    shim = _tensor_shim() if through_shim() else None
    if shim is None or not device_attr.startswith("is_"):
        return None, None
    fn = getattr(shim.lib, "aoti_torch_device_type_" + device_attr[3:], None)  # is_<x>: ..._<x>()
    if fn is None:
        return None, None
    fn.restype, fn.argtypes = ctypes.c_int32, []
    return shim, shim.addresses + (int(fn()),)


def _unavailable(why: str):
    log.debug("tilecore: kernels launch through the Python path: %s", why)
    _state["module"] = None
    _state["why"] = why
    return None


def why_unavailable() -> str:
    """Why :func:`module` returned None ('' when it did not, or was not asked yet)."""
    return _state.get("why", "")


def build_command(cc: str, include: str, source: Path, out: str) -> list:
    return [cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-I", include, str(source), "-o", out]


def toolchain():
    """``(cc, include, None)`` for building the module here, or ``(None, None, why not)``."""
    # the include directory Python was built with (a venv's base Python's), then the install scheme's
    # (Debian's default "posix_local" scheme names /usr/local/include, where the headers are not)
    candidates = [sysconfig.get_config_var("INCLUDEPY"), sysconfig.get_paths().get("include")]
    if "posix_prefix" in sysconfig.get_scheme_names():
        candidates.append(sysconfig.get_paths("posix_prefix").get("include"))
    include = next((d for d in candidates if d and os.path.exists(os.path.join(d, "Python.h"))), None)
    if include is None:
        return None, None, (f"no Python.h in {', '.join(sorted({d for d in candidates if d})) or 'this Python'} "
                            "(install the python3-dev package)")
    cc = find_program(["cc", "gcc", "clang"], env="CC")
    if cc is None:
        return None, None, "no C compiler (install gcc or set $CC)"
    return cc, include, None


def build(source: Path, folder: Path, cc: str, include: str):
    """Compile ``source`` into ``folder`` (unless already there) and load it: ``(module, None)`` or
    ``(None, why not)``. The module file is published with one rename, so concurrent builders never load
    a torn file."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    path = folder / (MODULE + suffix)
    if not path.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=suffix, dir=folder)
            os.close(fd)
            proc = subprocess.run(build_command(cc, include, source, tmp), capture_output=True, text=True,
                                  timeout=120)
            if proc.returncode != 0:
                os.unlink(tmp)
                return None, f"{cc} could not build {source.name}: {proc.stderr.strip()[-400:]}"
            os.replace(tmp, path)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"building {source.name} failed: {e}"
    try:
        loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
        spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
    except (ImportError, OSError) as e:
        return None, f"loading {path} failed: {e}"
    return mod, None


def module():
    """The compiled launcher module, built on the first call in a process (or loaded from the cache), or
    None when this machine cannot build it."""
    if "module" in _state:
        return _state["module"]
    cc, include, why = toolchain()
    if why:
        return _unavailable(why)
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = hashlib.sha256(SOURCE.read_bytes() + f"\0{sys.version}\0{suffix}\0{cc}".encode()).hexdigest()[:24]
    from ..compiler.cache import usable_root

    root = usable_root()
    folder = (root / "launchers" / key) if root is not None else Path(tempfile.mkdtemp(prefix="tilecore-launch-"))
    mod, why = build(SOURCE, folder, cc, include)
    if root is None:  # no cache to keep it in: the loaded module stays mapped, its folder can go now
        shutil.rmtree(folder, ignore_errors=True)
    if mod is None:
        return _unavailable(why)
    _state["module"] = mod
    return mod


def plan(signature: dict):
    """The launcher plan of a signature (the positional arguments of ``Launcher`` up to ``nsyms``), or None
    where the compiled launcher does not take it (the cases :func:`compile_binder` leaves to ``bind``, and
    signatures beyond the C side's limits)."""
    try:
        import torch
    except ImportError:
        return None
    from ..compiler.binding import torch_dtype

    params, out_idx = signature["params"], list(signature["out_idx"])
    skip = set(out_idx) | {i for i, p in enumerate(params) if p.get("workspace")}
    inputs = [i for i in range(len(params)) if i not in skip]
    position = {i: j for j, i in enumerate(inputs)}
    syms: dict = {}

    def dims(shape, bind: bool):
        out = []
        for w in shape:
            if isinstance(w, str):
                if w not in syms:
                    if not bind:
                        return None
                    syms[w] = len(syms)
                out.append(-(syms[w] + 1))
            else:
                out.append(int(w))
        return tuple(out)

    args = []
    has_tensor = False
    for i in inputs:
        p = params[i]
        if p["kind"] == "buffer":
            args.append((0, torch_dtype(p["dtype"]), dims(p["shape"], True)))
            has_tensor = True
        else:
            args.append((2,) if p["dtype"].startswith(("float", "bfloat")) else (1,))
    allocs, alloc_of = [], {}
    for i in out_idx + sorted(skip - set(out_idx)):
        p = params[i]
        shape = dims(p["shape"], False)
        if shape is None or not has_tensor:
            return None  # sized by what no input determines, or with no tensor to place it by: bind()
        alloc_of[i] = len(allocs)
        allocs.append(((torch.zeros if p.get("workspace") else torch.empty), torch_dtype(p["dtype"]), shape,
                       not p.get("workspace")))
    buf_src = tuple(position[i] if i in position else -(alloc_of[i] + 1)
                    for i, p in enumerate(params) if p["kind"] == "buffer")
    names = {p["name"]: i for i, p in enumerate(params)}
    int_src, float_src = [], []
    for n in signature["ints"]:
        if n in syms:
            int_src.append(syms[n])
        elif n in names and names[n] in position and args[position[names[n]]][0] == 1:
            int_src.append(-(position[names[n]] + 1))
        else:
            return None
    for n in signature["floats"]:
        if n in names and names[n] in position and args[position[names[n]]][0] == 2:
            float_src.append(position[names[n]])
        else:
            return None
    if (len(args) > MAX_ARGS or len(allocs) > MAX_ALLOCS or len(syms) > MAX_SYMS
            or len(buf_src) + len(int_src) + len(float_src) + 1 > MAX_SLOTS
            or any(len(a[2]) > MAX_DIMS for a in args if a[0] == 0) or any(len(a[2]) > MAX_DIMS for a in allocs)):
        return None
    return (tuple(args), tuple(allocs), buf_src, tuple(int_src), tuple(float_src), len(syms))


def make_launcher(signature: dict, *, device_attr: str, launch_address: int, grid, block: tuple, shared: int,
                  get_device: Callable[[], int], get_stream: Callable[[int], int], fail: Callable,
                  after: Callable | None = None, aligned=(), descriptors: Callable | None = None,
                  ndescriptors: int = 0):
    """A compiled launcher for one kernel, or None (disabled, not buildable here, or a signature it does
    not take). Calling it with the tuple of the kernel's arguments returns what the kernel call returns
    (None, the output, or the list of outputs), or ``NotImplemented`` having launched nothing.

    :param device_attr: the tensor attribute that is True on the runtime's device (``is_cpu``, ...).
    :param launch_address: the address of the driver's launch function (the shape in the module docstring).
    :param grid: three ints, or a function of the list of integer arguments returning three ints.
    :param block: the block's three sizes; ``shared``: its dynamic shared memory in bytes.
    :param get_device: the current device's index; a call on a device other than the one last passed to
        ``launcher.set_device(device, function, status_address)`` returns NotImplemented, so the runtime's
        own launch loads the kernel there and calls ``set_device``.
    :param get_stream: the raw stream handle of a device index, as an int.
    :param fail: called as ``fail(code, grid)`` when the launch function returns non-zero; must raise.
    :param after: called after each launch (e.g. to read a status word back); may raise.
    :param aligned: indices of buffer arguments that must be 16-byte aligned (NotImplemented otherwise).
    :param descriptors: for kernels that take ``ndescriptors`` driver descriptors (by address, after the
        floats and before the status word): ``descriptors(buffers, ints)`` (the tuple of buffer addresses,
        the list of integers) returns a tuple of that many objects with the buffer protocol (ctypes
        arrays); it may raise, and the call then returns NotImplemented (the Python path raises again).
    """
    if not enabled():
        return None
    p = plan(signature)
    if p is None or not 0 <= ndescriptors <= MAX_DESCRIPTORS or (ndescriptors > 0) != (descriptors is not None):
        return None
    nslots = len(p[2]) + len(p[3]) + len(p[4]) + ndescriptors + 1
    if nslots > MAX_SLOTS:
        return None
    mod = module()
    if mod is None:
        return None
    import torch

    g = grid if callable(grid) else tuple(int(x) for x in grid)
    args, allocs, buf_src, int_src, float_src, nsyms = p
    shim, through = shim_for(device_attr)
    if shim is not None:  # each tensor's dtype as the shim's code
        try:
            args = tuple((a[0], a[1], a[2], shim.dtype_code(a[1])) if a[0] == 0 else a for a in args)
        except (RuntimeError, TypeError, ValueError) as e:
            log.debug("tilecore: the compiled launcher reads tensors through torch's getters: %s", e)
            through = None
    return mod.Launcher(args, allocs, buf_src, int_src, float_src, tuple(int(a) for a in aligned), nsyms,
                        torch.Tensor, device_attr, int(launch_address), g, tuple(int(b) for b in block),
                        int(shared), get_device, get_stream, after, fail, int(ndescriptors), descriptors, through)

__all__ = ["make_launcher", "module", "plan", "enabled", "through_shim", "shim_for", "why_unavailable"]
