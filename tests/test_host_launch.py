"""A kernel's call reaches its compiled launcher from C (D57): ``kernel(*args)`` runs no Python frame once the
kernel has a launcher, and ends exactly as the Python paths end (outputs, errors word for word, the first call's
device learning, keyword arguments, a new device, a failed launch).

As in tests/test_c_launcher.py, kernels compiled for CUDA through the public interface are loaded into a
``CUDAProgram`` whose driver is a recorder and which takes CPU tensors (the stand-in for "on the device"); a meta
tensor stands in for a tensor on another device. The last tests run the same calls on a GPU where there is one.
"""
from __future__ import annotations

import sys

import pytest

import tilecore
from tilecore.compiler.kernel import JITKernel
from tilecore.errors import DeviceError, TilecoreError
from tilecore.runtime import clauncher

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")
pytest.importorskip("tilecore_cuda.runtime")
from test_c_launcher import KERNELS, on_cpu  # noqa: E402


@pytest.fixture(scope="module")
def compiled():
    out = {}
    for name in ("static_add", "scale_add", "two_symbols", "asserting"):
        func, opts = KERNELS[name]()
        out[name] = tilecore.compile(func, target=opts.pop("target", "cuda:sm_90a"), **opts)
    return out


def _first(k, args, mode, monkeypatch):
    monkeypatch.setenv("TILECORE_C_LAUNCHER", mode)
    r = k(*args)
    monkeypatch.setenv("TILECORE_C_LAUNCHER", "1")
    return r


def _python_frames(fn) -> list:
    """The functions of JITKernel's Python call path entered while ``fn()`` runs (sys.setprofile's 'call' events;
    the recording driver is a Python callback, whose frames are not the call path's)."""
    from tilecore.compiler import kernel

    path = {kernel._PYTHON_CALL.__code__: "JITKernel.__call__", JITKernel._call.__code__: "JITKernel._call"}
    seen = []

    def hook(frame, event, arg):
        if event == "call" and frame.f_code in path:
            seen.append(path[frame.f_code])

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def _ended(fn):
    try:
        return "ok", fn()
    except (TilecoreError, TypeError, ValueError, RuntimeError) as e:  # (torch's own, e.g. a nested tensor's sizes)
        return "error", type(e), str(e)


def test_a_call_runs_no_python_frame_once_the_kernel_has_a_launcher(compiled, monkeypatch):
    x, y, z = (torch.randn(512) for _ in range(3))
    kernels = {}
    for mode in ("1", "frame", "frame-shim"):
        k, prog, driver = on_cpu(compiled["static_add"], True, monkeypatch)
        frames = _python_frames(lambda: _first(k, (x, y, z), mode, monkeypatch))
        assert "JITKernel._call" in frames  # the first call: the Python path
        kernels[mode] = (k, driver)
    assert clauncher.kernel_call_type(kernels["1"][0]._native) is not None
    assert isinstance(JITKernel.__dict__["__call__"], clauncher.kernel_call_type(kernels["1"][0]._native))
    k, driver = kernels["1"]
    n = len(driver.records)
    assert _python_frames(lambda: k(x, y, z)) == [] and len(driver.records) == n + 1  # no frame: launched from C
    assert k._direct is k._native
    for mode in ("frame", "frame-shim"):  # D23's path: the launcher behind JITKernel.__call__ (getters / C shim)
        k, driver = kernels[mode]
        n = len(driver.records)
        assert k._direct is None and k._native.reads == ("getters" if mode == "frame" else kernels["1"][0]._native.reads)
        assert _python_frames(lambda: k(x, y, z)) == ["JITKernel.__call__"] and len(driver.records) == n + 1


@pytest.mark.parametrize("name", ["static_add", "scale_add", "two_symbols"])
def test_outputs_and_errors_are_the_python_paths(name, compiled, monkeypatch):
    """Right arguments and every kind of wrong one: the three paths return the same outputs' shapes and dtypes
    and the same launches' grids, or raise the same error word for word."""
    ks = {mode: on_cpu(compiled[name], True, monkeypatch) for mode in ("1", "frame", "0")}
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
        assert ends["1"] == ends["frame"] == ends["0"], kind
        launched += kind == "right" and len(ends["1"][1]) == 1
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


def test_keyword_arguments_raise_as_before(compiled, monkeypatch):
    x, y, z = (torch.randn(512) for _ in range(3))
    ends = {}
    for mode in ("1", "frame", "0"):
        k, _, driver = on_cpu(compiled["static_add"], True, monkeypatch)
        _first(k, (x, y, z), mode, monkeypatch)
        n = len(driver.records)
        ends[mode] = _ended(lambda: k(x, y, C=z)), _ended(lambda: k(x, y, z, C=z))
        assert len(driver.records) == n
    assert ends["1"] == ends["frame"] == ends["0"]
    assert ends["1"][0] == ("error", TypeError, "JITKernel.__call__() got an unexpected keyword argument 'C'")


def test_outputs_are_returned_and_the_bound_method_takes_the_same_path(compiled, monkeypatch):
    k, prog, driver = on_cpu(compiled["two_symbols"], True, monkeypatch)
    X, Y = torch.randn(40, 24).bfloat16(), torch.randint(0, 9, (24, 40), dtype=torch.int32)
    _first(k, (7, X, Y), "1", monkeypatch)
    assert k._direct is not None
    n = len(driver.records)
    for call in (lambda: k(7, X, Y), lambda: k.__call__(7, X, Y), lambda: JITKernel.__call__(k, 7, X, Y)):
        assert _python_frames(call) == []
        Z, W = call()
        assert (Z.shape, Z.dtype, W.shape, W.dtype) == ((40, 24), torch.float32, (40,), torch.float32)
    words = [int.from_bytes(p, "little", signed=True) for p in driver.records[-1]["params"]]
    assert words[:2] == [X.data_ptr(), Y.data_ptr()] and len(driver.records) == n + 6
    assert JITKernel.__call__.__wrapped__.__qualname__ == "JITKernel.__call__"


def test_a_new_device_and_a_failed_launch_and_assert_from_the_direct_call(compiled, monkeypatch):
    k, prog, driver = on_cpu(compiled["static_add"], True, monkeypatch, devices=(0, 1))
    x, y, z = (torch.randn(512) for _ in range(3))
    _first(k, (x, y, z), "1", monkeypatch)
    prog.current = 1  # the launcher knows device 0 only: this call takes the Python path, which enters device 1
    frames = _python_frames(lambda: k(x, y, z))
    assert "JITKernel._call" in frames and "JITKernel.__call__" not in frames  # from C to the rest of the path
    assert driver.records[-1]["func"] == 0xF00D + 1
    assert _python_frames(lambda: k(x, y, z)) == [] and driver.records[-1]["stream"] == 0x5001
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


def test_kernels_without_a_launcher_after_the_switch(compiled, monkeypatch):
    """Once the class's __call__ is the C one, a kernel that has no launcher (TILECORE_C_LAUNCHER=0, or before its
    first call) still runs its Python path, first call included."""
    x, y, z = (torch.randn(512) for _ in range(3))
    k, _, _ = on_cpu(compiled["static_add"], True, monkeypatch)
    _first(k, (x, y, z), "1", monkeypatch)
    assert isinstance(JITKernel.__dict__["__call__"], clauncher.kernel_call_type(k._native))
    k0, _, driver = on_cpu(compiled["static_add"], True, monkeypatch)
    monkeypatch.setenv("TILECORE_C_LAUNCHER", "0")
    assert k0(x, y, z) is None and k0(x, y, z) is None and k0._native is None and len(driver.records) == 2
    blank = JITKernel.__new__(JITKernel)  # no attributes at all: the Python __call__ raises what it raises
    with pytest.raises(AttributeError):
        blank(x, y, z)


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
def test_on_the_gpu_the_direct_call_computes_and_refuses_as_the_python_path(monkeypatch):
    kernels = {}
    for mode in ("1", "getters", "frame", "0"):
        monkeypatch.setenv("TILECORE_C_LAUNCHER", mode)
        k = tilecore.compile(_vadd(4096), target="cuda")
        x, y, z = (torch.randn(4096, device="cuda") for _ in range(3))
        k(x, y, z)
        kernels[mode] = k
    monkeypatch.setenv("TILECORE_C_LAUNCHER", "1")
    assert kernels["1"]._direct is not None and kernels["frame"]._direct is None and kernels["0"]._native is None
    assert kernels["getters"]._native.reads == "getters" and kernels["frame"]._native.reads == "getters"
    print("the default launcher reads tensors through", kernels["1"]._native.reads)
    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    for mode, k in kernels.items():
        z = torch.empty(4096, device="cuda")
        assert k(x, y, z) is None
        torch.cuda.synchronize()
        assert torch.equal(z, x + y), mode
    bad = {"cpu tensor": (x.cpu(), y, torch.empty(4096, device="cuda")),
           "dtype": (x.half(), y, torch.empty(4096, device="cuda")),
           "shape": (x[:4095], y, torch.empty(4096, device="cuda")),
           "non-contiguous": (torch.randn(8192, device="cuda")[::2], y, torch.empty(4096, device="cuda"))}
    for kind, args in bad.items():
        ends = {mode: _ended(lambda: k(*args)) for mode, k in kernels.items()}
        assert ends["1"][0] == "error" and ends["1"] == ends["getters"] == ends["frame"] == ends["0"], kind
    ends = {mode: _ended(lambda: k(x, y, C=z)) for mode, k in kernels.items()}
    assert ends["1"][0] == "error" and ends["1"] == ends["getters"] == ends["frame"] == ends["0"]
