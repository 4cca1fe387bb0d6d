"""The compiled launcher reads tensors through torch's C shim (D57): a kernel's call ends exactly as the
launcher with torch's getters (D23) and the Python binder end it (outputs, launches, errors word for word, a new
device, a failed launch or assertion), and the shim is used only where torch has it and it agrees with the getters.

As in tests/test_c_launcher.py, kernels compiled for CUDA through the public interface are loaded into a
``CUDAProgram`` whose driver is a recorder and which takes CPU tensors (the stand-in for "on the device"); a meta
tensor stands in for a tensor on another device. The last test runs the same calls on a GPU where there is one.
"""
from __future__ import annotations

import pytest

import tilecore
from tilecore.errors import DeviceError, TilecoreError
from tilecore.runtime import clauncher

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")
pytest.importorskip("tilecore_cuda.runtime")
from test_c_launcher import KERNELS, on_cpu  # noqa: E402

MODES = ("1", "getters", "0")  # TILECORE_C_LAUNCHER: the C shim (default), torch's getters, the Python binder


@pytest.fixture(scope="module")
def compiled():
    out = {}
    for name in ("static_add", "scale_add", "two_symbols", "asserting"):
        func, opts = KERNELS[name]()
        out[name] = tilecore.compile(func, target=opts.pop("target", "cuda:sm_90a"), **opts)
    return out


def _first(k, args, mode, monkeypatch):
    """The kernel's first call (the Python path, which makes the launcher) with TILECORE_C_LAUNCHER=mode."""
    monkeypatch.setenv("TILECORE_C_LAUNCHER", mode)
    r = k(*args)
    monkeypatch.setenv("TILECORE_C_LAUNCHER", "1")
    return r


def _shim_here() -> bool:
    return clauncher.shim_for("is_cpu")[0] is not None


def _ended(fn):
    try:
        return "ok", fn()
    except (TilecoreError, TypeError, ValueError, RuntimeError) as e:  # (torch's own, e.g. a nested tensor's sizes)
        return "error", type(e), str(e)


@pytest.mark.parametrize("name", ["static_add", "scale_add", "two_symbols"])
def test_outputs_and_errors_are_the_python_paths(name, compiled, monkeypatch):
    """Right arguments and every kind of wrong one: the three paths return the same outputs' shapes and dtypes
    and the same launches' grids, or raise the same error word for word."""
    ks = {mode: on_cpu(compiled[name], True, monkeypatch) for mode in MODES}
    sig = compiled[name].meta["signature"]
    skip = set(sig["out_idx"])
    inputs = [p for i, p in enumerate(sig["params"]) if i not in skip]

    def args_of(rows=130, change=None):
        sizes = {"n": rows, "m": rows}
        out = []
        for j, p in enumerate(inputs):
            if p["kind"] == "buffer":
                shape = tuple(sizes.get(w, w) if isinstance(w, str) else w for w in p["shape"])
                t = torch.randn(shape).to(getattr(torch, p["dtype"]))
            else:
                t = 2.5 if p["dtype"].startswith("float") else 3
            out.append(change(j, p, t) if change else t)
        return tuple(out)

    first = args_of()
    for mode, (k, _, _) in ks.items():
        _first(k, first, mode, monkeypatch)
    assert ks["1"][0]._native.reads == ("shim" if _shim_here() else "getters")
    assert ks["getters"][0]._native.reads == "getters" and ks["0"][0]._native is None
    tensor = next(j for j, p in enumerate(inputs) if p["kind"] == "buffer")

    def at(kind):
        def change(j, p, t):
            if j != tensor:
                return t
            if kind == "dtype":
                return t.double()
            if kind == "shape":
                return torch.randn(tuple(s + 1 for s in t.shape)).to(t.dtype)
            if kind == "rank":
                return t.reshape(-1)[:, None] if t.dim() == 1 else t.reshape(-1)
            if kind == "non-contiguous":
                return torch.randn(tuple(s * 2 for s in t.shape)).to(t.dtype)[tuple(slice(None, None, 2)
                                                                                 for _ in t.shape)]
            if kind == "other device":  # not on the kernel's device ("cpu" here): a meta tensor
                return torch.empty(t.shape, dtype=t.dtype, device="meta")
            if kind == "numpy":
                return t.float().numpy()
            if kind == "nested":  # a torch.Tensor whose sizes torch will not give (the shim's call fails)
                return torch.nested.nested_tensor([torch.randn(t.shape[1:]).to(t.dtype) for _ in range(t.shape[0])])
            raise AssertionError(kind)
        return change

    cases = {"right": args_of(), "empty": args_of(rows=0), "count": args_of()[:-1], "extra": args_of() + (1,)}
    for kind in ("dtype", "shape", "rank", "non-contiguous", "other device", "numpy") + (
            ("nested",) if len(inputs[tensor]["shape"]) > 1 else ()):
        cases[kind] = args_of(change=at(kind))
    launched = 0
    for kind, args in cases.items():
        ends = {}
        for mode, (k, _, driver) in ks.items():
            n = len(driver.records)
            end = _ended(lambda: k(*args))
            recs = [(r["grid"], r["block"], r["shared"]) for r in driver.records[n:]]
            if end[0] == "ok":
                outs = [] if end[1] is None else end[1] if isinstance(end[1], list) else [end[1]]
                end = ("ok", [(tuple(o.shape), o.dtype) for o in outs])
            ends[mode] = (end, recs)
        assert ends["1"] == ends["getters"] == ends["0"], kind
        launched += kind == "right" and len(ends["1"][1]) == 1
        if kind in ("right", "empty"):  # the compiled launchers take these themselves
            assert all(ks[m][0]._native(args) is not NotImplemented for m in ("1", "getters")), kind
        if kind in ("dtype", "shape", "rank", "non-contiguous", "other device", "count", "nested"):
            assert ends["1"][0][0] == "error", kind
    assert launched == 1


def test_the_launcher_reads_tensors_through_torchs_c_shim_where_torch_has_it(compiled, monkeypatch):
    """The shim is used where libtorch exports its six functions and they agree with torch's getters on the probe
    tensors; where a probe disagrees the launcher reads through the getters, and calls end the same either way."""
    import ctypes
    from pathlib import Path

    monkeypatch.setattr(clauncher, "_state", dict(clauncher._state))
    clauncher._state.pop("shim", None)
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    has = all(hasattr(lib, n) for n in clauncher.SHIM_FUNCTIONS)
    x, y, z = (torch.randn(512) for _ in range(3))
    k, _, driver = on_cpu(compiled["static_add"], True, monkeypatch)
    _first(k, (x, y, z), "1", monkeypatch)
    assert k._native.reads == ("shim" if has else "getters")
    if not has:
        return
    clauncher._state.pop("shim")
    read = clauncher._Shim.read
    monkeypatch.setattr(clauncher._Shim, "read", lambda self, t: read(self, t)[:3] + ([7],) + read(self, t)[4:])
    k2, _, driver2 = on_cpu(compiled["static_add"], True, monkeypatch)
    _first(k2, (x, y, z), "1", monkeypatch)
    assert k2._native.reads == "getters"  # a probe read a wrong size: not used
    assert k2(x, y, z) is None and len(driver2.records) == 2
    with pytest.raises(TilecoreError) as e2:
        k2(x[:511], y, z)
    with pytest.raises(TilecoreError) as e1:
        k(x[:511], y, z)
    assert str(e1.value) == str(e2.value)


def test_outputs_are_returned(compiled, monkeypatch):
    k, prog, driver = on_cpu(compiled["two_symbols"], True, monkeypatch)
    X, Y = torch.randn(40, 24).bfloat16(), torch.randint(0, 9, (24, 40), dtype=torch.int32)
    _first(k, (7, X, Y), "1", monkeypatch)
    n = len(driver.records)
    for call in (lambda: k(7, X, Y), lambda: k._native((7, X, Y))):
        Z, W = call()
        assert (Z.shape, Z.dtype, W.shape, W.dtype) == ((40, 24), torch.float32, (40,), torch.float32)
    words = [int.from_bytes(p, "little", signed=True) for p in driver.records[-1]["params"]]
    assert words[:4] == [X.data_ptr(), Y.data_ptr(), Z.data_ptr(), W.data_ptr()] and len(driver.records) == n + 2


def test_a_new_device_and_a_failed_launch_and_assert(compiled, monkeypatch):
    k, prog, driver = on_cpu(compiled["static_add"], True, monkeypatch, devices=(0, 1))
    x, y, z = (torch.randn(512) for _ in range(3))
    _first(k, (x, y, z), "1", monkeypatch)
    prog.current = 1  # the launcher knows device 0 only: the Python path enters device 1 and tells it
    assert k._native((x, y, z)) is NotImplemented
    k(x, y, z)
    assert driver.records[-1]["func"] == 0xF00D + 1
    assert k._native((x, y, z)) is None and driver.records[-1]["stream"] == 0x5001
    driver.rc = 700
    with pytest.raises(DeviceError, match=r"cuLaunchKernel failed: 700 \(unknown\) \(grid \(4, 1, 1\), 128 threads"):
        k(x, y, z)
    driver.rc = 0
    k, prog, driver = on_cpu(compiled["asserting"], True, monkeypatch)
    v = torch.rand(40)
    _first(k, (v, torch.empty(40)), "1", monkeypatch)
    prog.status[0] = 1
    with pytest.raises(TilecoreError, match="X must be non-negative"):
        k(v, torch.empty(40))


# -- on a GPU --------------------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _vadd(n):
    import tilecore.language as T

    @T.prim_func
    def vadd(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 256), threads=256) as bx:
            for i in T.Parallel(256):
                if bx * 256 + i < n:
                    C[bx * 256 + i] = A[bx * 256 + i] + B[bx * 256 + i]

    return vadd


@gpu
def test_on_the_gpu_the_shim_launcher_computes_and_refuses_as_the_python_path(monkeypatch):
    kernels = {}
    for mode in MODES:
        monkeypatch.setenv("TILECORE_C_LAUNCHER", mode)
        k = tilecore.compile(_vadd(4096), target="cuda")
        x, y, z = (torch.randn(4096, device="cuda") for _ in range(3))
        k(x, y, z)
        kernels[mode] = k
    monkeypatch.setenv("TILECORE_C_LAUNCHER", "1")
    assert kernels["0"]._native is None and kernels["getters"]._native.reads == "getters"
    print("the default launcher reads tensors through", kernels["1"]._native.reads)
    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    for mode, k in kernels.items():
        z = torch.empty(4096, device="cuda")
        assert k(x, y, z) is None
        torch.cuda.synchronize()
        assert torch.equal(z, x + y), mode
        if mode != "0":  # the compiled launcher takes device tensors itself (the shim's device type code included)
            z.zero_()
            assert k._native((x, y, z)) is None
            torch.cuda.synchronize()
            assert torch.equal(z, x + y), mode
    bad = {"cpu tensor": (x.cpu(), y, torch.empty(4096, device="cuda")),
           "dtype": (x.half(), y, torch.empty(4096, device="cuda")),
           "shape": (x[:4095], y, torch.empty(4096, device="cuda")),
           "non-contiguous": (torch.randn(8192, device="cuda")[::2], y, torch.empty(4096, device="cuda"))}
    for kind, args in bad.items():
        ends = {mode: _ended(lambda: k(*args)) for mode, k in kernels.items()}
        assert ends["1"][0] == "error" and ends["1"] == ends["getters"] == ends["0"], kind
