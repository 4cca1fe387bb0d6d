"""The compiled launcher (tilecore/runtime/launcher.c through the CUDA backend's ``fast_call``) gives the
driver's launch function exactly what the Python path gives it, and hands every argument it does not take
to the Python path, whose errors the user sees.

No GPU is needed: kernels are compiled for CUDA through the public interface, then loaded into a
``CUDAProgram`` whose driver is a recorder (a ctypes function with cuLaunchKernel's signature that copies
out the grid, block, shared bytes, stream and the 8 bytes of every kernel parameter), and called with CPU
torch tensors standing in for device tensors (the runtime's device type and tensor flag point at the CPU).
Every kernel is called twice per argument set: once with the compiled launcher, once with it disabled.
"""
from __future__ import annotations

import ctypes
import sysconfig
import tempfile
import types

import pytest

import tilecore
import tilecore.language as T
from tilecore.compiler.binding import compile_binder
from tilecore.compiler.kernel import JITKernel
from tilecore.errors import DeviceError, TilecoreError
from tilecore.runtime import clauncher

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

cuda_runtime = pytest.importorskip("tilecore_cuda.runtime")

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                          ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


class Driver:
    """A stand-in for cuLaunchKernel: records each launch (the bytes the real driver would read)."""

    def __init__(self, nparams: int):
        self.nparams, self.records, self.rc = nparams, [], 0
        self.fn = LAUNCH(self._launch)

    def _launch(self, func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.records.append({"func": func, "grid": (gx, gy, gz), "block": (bx, by, bz), "shared": shared,
                             "stream": stream, "extra": extra,
                             "params": [ctypes.string_at(params[k], 8) for k in range(self.nparams)]})
        return self.rc


def _encode(out, dtype, rank, ptr, dims, strides, box, estrides, interleave, swizzle, l2, oob):
    """A stand-in for cuTensorMapEncodeTiled: the descriptor's first 8 bytes say which tensor and rows."""
    word = (ptr.value or 0) ^ (dims[rank.value - 1] << 48)
    ctypes.memmove(out, ctypes.byref(ctypes.c_uint64(word & (2 ** 64 - 1))), 8)
    return 0


def on_cpu(kernel: JITKernel, c_launcher: bool, monkeypatch, devices=(0,)):
    """``kernel`` (a fresh copy) loaded into a CUDAProgram that launches through a recorder and takes CPU
    tensors; the compiled launcher on or off (it is made at the first call)."""
    monkeypatch.delenv("TILECORE_DEVICE", raising=False)  # the recorder's devices, whatever the process was given
    k = JITKernel(kernel.meta, kernel.binary, kernel.backend, kernel.target)
    rt = cuda_runtime.CUDARuntime(kernel.target.arch)
    rt.tensor_device = "cpu"  # the Python binders' device check
    k._runtime = rt
    prog = cuda_runtime.CUDAProgram(kernel.binary, kernel.source)
    sig = kernel.meta["signature"]
    nparams = (sum(p["kind"] == "buffer" for p in sig["params"]) + len(sig["ints"]) + len(sig["floats"])
               + len(kernel.meta["source"]["meta"].get("tensor_maps", ()))
               + (1 if kernel.meta["source"]["meta"].get("workspace") else 0) + 1)
    driver = Driver(nparams)
    prog.tensor_flag = "is_cpu"  # the compiled launcher's device check
    prog._cuLaunchKernel = driver.fn
    prog.lib = types.SimpleNamespace(cuGetErrorString=lambda code, out: 0, cuTensorMapEncodeTiled=_encode)
    prog.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_current_stream_capturing=lambda: False),
                                       int64=torch.int64, uint8=torch.uint8,
                                       zeros=lambda *shape, device=None, **kw: torch.zeros(*shape, **kw))
    prog.current = devices[0]
    prog._get_device = lambda: prog.current
    prog._get_stream = lambda dev: 0x5000 + dev
    for dev in devices:
        prog.funcs[dev] = (None, ctypes.c_void_p(0xF00D + dev))
        status = torch.zeros(cuda_runtime.STATUS_WORDS, dtype=torch.int32)
        prog._status_by_dev[dev] = (status, status.data_ptr())
    prog._enter(devices[0])  # as a first launch would: the function and status word of the current device
    k._program = prog
    monkeypatch.setenv("TILECORE_C_LAUNCHER", "1" if c_launcher else "0")
    return k, prog, driver


# -- kernels with different signatures ---------------------------------------------------------------

def _static_add():
    @T.prim_func
    def static_add(A: T.Tensor((512,), "float32"), B: T.Tensor((512,), "float32"), C: T.Tensor((512,), "float32")):
        with T.Kernel(4, threads=128) as bx:
            for i in T.Parallel(128):
                C[bx * 128 + i] = A[bx * 128 + i] + B[bx * 128 + i]

    return static_add, {}


def _scale_add():
    n = T.symbolic("n")

    @T.prim_func
    def scale_add(A: T.Tensor((n, 4), "float32"), B: T.Tensor((n, 4), "float16"), C: T.Tensor((n, 4), "float32"),
                  alpha: T.float32, shift: T.int32):
        with T.Kernel(T.ceildiv(n, 64), threads=64) as bx:
            for i, j in T.Parallel(64, 4):
                r = bx * 64 + i
                if r < n:
                    C[r, j] = A[r, j] * alpha + B[r, j] + shift

    return scale_add, {"out_idx": [2]}


def _two_symbols():
    m, n = T.symbolic("m"), T.symbolic("n")

    @T.prim_func
    def two_symbols(k: T.int32, X: T.Tensor((m, n), "bfloat16"), Y: T.Tensor((n, m), "int32"),
                    Z: T.Tensor((m, n), "float32"), W: T.Tensor((m,), "float32")):
        with T.Kernel(T.ceildiv(m, 32), threads=32) as bx:
            for i in T.Parallel(32):
                r = bx * 32 + i
                if r < m:
                    W[r] = X[r, 0] + Y[0, r] + k
                    Z[r, 0] = W[r]

    return two_symbols, {"out_idx": [3, 4]}


def _asserting():
    n = T.symbolic("n")

    @T.prim_func
    def asserting(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 32), threads=32) as bx:
            for i in T.Parallel(32):
                if bx * 32 + i < n:
                    T.device_assert(X[bx * 32 + i] >= 0, "X must be non-negative")
                    Y[bx * 32 + i] = T.sqrt(X[bx * 32 + i])

    return asserting, {}


def _workspace():
    @T.prim_func
    def workspace(A: T.Tensor((64, 32), "float32"), B: T.Tensor((64,), "float32")):
        W = T.alloc_global((64, 32), "float32")
        with T.Kernel(4, threads=64) as bx:
            for i, j in T.Parallel(16, 32):
                W[bx * 16 + i, j] = A[bx * 16 + i, j] * 2
            for i in T.Parallel(16):
                B[bx * 16 + i] = W[bx * 16 + i, 0]

    return workspace, {"out_idx": [-1]}


def _pipelined_gemm():  # its cp.async copies need 16-byte aligned A and B (meta["aligned_args"])
    @T.prim_func
    def gemm(A: T.Tensor((64, 64), "float16"), B: T.Tensor((64, 64), "float16"), C: T.Tensor((64, 64), "float16")):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            A_shared = T.alloc_shared((32, 32), "float16")
            B_shared = T.alloc_shared((32, 32), "float16")
            C_local = T.alloc_fragment((32, 32), "float32")
            T.clear(C_local)
            for ko in T.Pipelined(2, num_stages=2):
                T.copy(A[by * 32, ko * 32], A_shared)
                T.copy(B[ko * 32, bx * 32], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * 32, bx * 32])

    return gemm, {"target": "cuda:sm_80"}


def _tma_gemm():  # Hopper: TMA descriptors for A and B, encoded per launch (rows of A from the symbol m)
    m = T.symbolic("m")

    @T.prim_func
    def tma_gemm(A: T.Tensor((m, 128), "float16"), B: T.Tensor((128, 128), "float16"),
                 C: T.Tensor((m, 128), "float16")):
        with T.Kernel(2, T.ceildiv(m, 64), threads=128) as (bx, by):
            A_shared = T.alloc_shared((64, 64), "float16")
            B_shared = T.alloc_shared((64, 64), "float16")
            C_local = T.alloc_fragment((64, 64), "float32")
            T.clear(C_local)
            for ko in T.Pipelined(2, num_stages=2):
                T.copy(A[by * 64, ko * 64], A_shared)
                T.copy(B[ko * 64, bx * 64], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * 64, bx * 64])

    # A's and B's descriptors only: C's (the persistent epilogue's TMA stores, D38) is test_cuda_tma_store.py's
    return tma_gemm, {"out_idx": [2], "pass_configs": {"tilecore.cuda.tma_store": False}}


def _splitk_gemm():  # Hopper, K split over 2 blocks per tile: a workspace address after the descriptors
    @T.prim_func
    def splitk_gemm(A: T.Tensor((64, 512), "float16"), B: T.Tensor((512, 128), "float16"),
                    C: T.Tensor((64, 128), "float16")):
        with T.Kernel(2, 1, threads=128) as (bx, by):
            A_shared = T.alloc_shared((64, 64), "float16")
            B_shared = T.alloc_shared((64, 64), "float16")
            C_local = T.alloc_fragment((64, 64), "float32")
            T.clear(C_local)
            for ko in T.Pipelined(8, num_stages=2):
                T.copy(A[by * 64, ko * 64], A_shared)
                T.copy(B[ko * 64, bx * 64], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * 64, bx * 64])

    # summed through the global workspace (D27), not in a cluster (D41): the launch passes the workspace
    return splitk_gemm, {"out_idx": [2], "pass_configs": {"tilecore.cuda.split_k": 2,
                                                          "tilecore.cuda.split_k_reduce": "global"}}


KERNELS = {f.__name__[1:]: f for f in (_static_add, _scale_add, _two_symbols, _asserting, _workspace, _pipelined_gemm,
                                       _tma_gemm, _splitk_gemm)}


@pytest.fixture(scope="module")
def compiled():
    out = {}
    for name, make in KERNELS.items():
        func, opts = make()
        out[name] = tilecore.compile(func, target=opts.pop("target", "cuda:sm_90a"), **opts)
    return out


# -- arguments ---------------------------------------------------------------------------------------

def _tensor(shape, dtype):
    return (torch.randn(shape) * 4).to(dtype)


@st.composite
def arguments(draw, sig):
    """A kernel's inputs, right or broken one way; ``(args, broken)``."""
    params = sig["params"]
    skip = set(sig["out_idx"]) | {i for i, p in enumerate(params) if p.get("workspace")}
    inputs = [p for i, p in enumerate(params) if i not in skip]
    sizes = {}
    for p in inputs:
        for w in p.get("shape", ()):
            if isinstance(w, str) and w not in sizes:
                sizes[w] = draw(st.sampled_from([0, 1, 5, 64, 65, 300]))
    args = []
    for p in inputs:
        if p["kind"] == "buffer":
            shape = tuple(sizes[w] if isinstance(w, str) else w for w in p["shape"])
            args.append(_tensor(shape, getattr(torch, p["dtype"])))
        elif p["dtype"].startswith("float"):
            args.append(draw(st.sampled_from([1.5, -2.0, 3, 0.0])))
        else:
            args.append(draw(st.sampled_from([0, 7, -3, 2 ** 31 - 1])))
    tensors = [j for j, p in enumerate(inputs) if p["kind"] == "buffer"]
    scalars = [j for j, p in enumerate(inputs) if p["kind"] != "buffer"]
    kinds = ["none", "none", "none", "count-", "count+", "dtype", "dim", "rank", "non-contiguous", "numpy", "subclass",
             "offset"] + (["scalar"] if scalars else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "count-":
        return tuple(args[:-1]), kind
    if kind == "count+":
        return tuple(args) + (args[-1],), kind
    if kind == "scalar":
        j = draw(st.sampled_from(scalars))
        args[j] = draw(st.sampled_from([True, "x", 1.5, 2, torch.tensor(3), None, 10 ** 30]))
        return tuple(args), kind
    if kind == "none":
        return tuple(args), kind
    j = draw(st.sampled_from(tensors))
    t = args[j]
    if kind == "dtype":
        other = draw(st.sampled_from([torch.float32, torch.float16, torch.int32, torch.float64, torch.bfloat16]))
        args[j] = t.to(other)
    elif kind == "dim":
        d = draw(st.integers(0, t.dim() - 1))
        shape = list(t.shape)
        shape[d] += draw(st.sampled_from([1, 3]))
        args[j] = _tensor(tuple(shape), t.dtype)
    elif kind == "rank":
        args[j] = t.reshape(-1) if t.dim() > 1 else t[:, None]
    elif kind == "non-contiguous":
        big = _tensor(tuple(s * 2 for s in t.shape), t.dtype)
        args[j] = big[tuple(slice(None, None, 2) for _ in t.shape)]
    elif kind == "numpy":
        args[j] = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
    elif kind == "subclass":
        args[j] = torch.nn.Parameter(t, requires_grad=False)
    elif kind == "offset":  # contiguous, but 2 or 4 bytes past an aligned address
        flat = torch.empty(t.numel() + 1, dtype=t.dtype)
        args[j] = flat[1:].view(t.shape)
    return tuple(args), kind


def _outcome(k, driver, args):
    """What one call did: ("ok", outputs, records) or ("error", type, message)."""
    n = len(driver.records)
    try:
        out = k(*args)
    except (TilecoreError, TypeError, ValueError, OverflowError) as e:
        return "error", type(e), str(e), driver.records[n:]
    outs = [] if out is None else out if isinstance(out, list) else [out]
    return "ok", outs, driver.records[n:]


def _address(t) -> int:
    return t.data_ptr() if isinstance(t, torch.Tensor) else t.ctypes.data  # numpy in, numpy out (bind)


def _same_launches(sig, c_out, py_out, c_prog, py_prog):
    """The records of two calls agree byte for byte, where outputs' and status words' addresses read as
    'the output's own' and 'the program's own'."""
    (_, c_outs, c_recs), (_, py_outs, py_recs) = c_out, py_out
    assert [(o.shape, o.dtype) for o in c_outs] == [(o.shape, o.dtype) for o in py_outs]
    assert len(c_recs) == len(py_recs)
    buffers = [i for i, p in enumerate(sig["params"]) if p["kind"] == "buffer"]
    returned = {i: n for n, i in enumerate(sig["out_idx"])}
    for c, py in zip(c_recs, py_recs):
        c, py = dict(c), dict(py)
        cp, pp = c.pop("params"), py.pop("params")
        assert c == py
        for slot, (a, b) in enumerate(zip(cp, pp)):
            if slot < len(buffers) and buffers[slot] in returned:
                n = returned[buffers[slot]]
                assert int.from_bytes(a, "little") == _address(c_outs[n])
                assert int.from_bytes(b, "little") == _address(py_outs[n])
            elif slot < len(buffers) and sig["params"][buffers[slot]].get("workspace"):
                assert int.from_bytes(a, "little") and int.from_bytes(b, "little")
            elif slot == len(cp) - 1:  # the status word
                assert int.from_bytes(a, "little") == c_prog._status_ptr
                assert int.from_bytes(b, "little") == py_prog._status_ptr
            elif slot == len(cp) - 2 and c_prog.workspace_bytes:  # each program's workspace on this stream
                assert int.from_bytes(a, "little") == c_prog._workspaces[(0, c["stream"])][0].data_ptr()
                assert int.from_bytes(b, "little") == py_prog._workspaces[(0, py["stream"])][0].data_ptr()
            else:
                assert a == b, f"parameter slot {slot} differs"


def agree(sig, binder, c, py, args, kind) -> bool:
    """One argument set through both paths: the compiled launcher declines exactly what the Python fast
    binder declines (launching nothing), launches what the Python path launches, and the kernel calls end
    the same way, errors word for word. True when the compiled launcher launched."""
    (kc, progc, dc), (kp, progp, dp) = c, py
    n = len(dc.records)
    native = kc._native(args)
    try:
        bound = binder(args) if binder is not None else None
    except (TypeError, ValueError, OverflowError):
        bound = None
    launched = False
    if bound is None:  # the Python fast path declines: the compiled one must too, launching nothing
        assert native is NotImplemented and len(dc.records) == n, kind
    elif native is NotImplemented:  # allowed only where the Python launch itself refuses or truncates
        assert kind in ("offset", "scalar"), kind
    else:
        launched = True
        c_out = ("ok", [] if native is None else native if isinstance(native, list) else [native], dc.records[n:])
        py_out = _outcome(kp, dp, args)
        assert py_out[0] == "ok", (kind, py_out)  # the compiled launcher launched what the Python path refuses
        _same_launches(sig, c_out, py_out, progc, progp)
    c_out, py_out = _outcome(kc, dc, args), _outcome(kp, dp, args)
    assert c_out[0] == py_out[0], (kind, c_out, py_out)
    if c_out[0] == "ok":
        _same_launches(sig, c_out, py_out, progc, progp)
    else:
        assert c_out[1:3] == py_out[1:3]
    return launched


@pytest.mark.parametrize("name,reads", [(n, "shim") for n in KERNELS]
                         + [(n, "getters") for n in ("scale_add", "two_symbols", "tma_gemm")])
def test_the_compiled_launcher_launches_what_the_python_path_launches(name, reads, compiled, monkeypatch):
    """``reads``: the launcher reads tensors through torch's C shim (the default, D57) or its getters (D23)."""
    kernel = compiled[name]
    sig = kernel.meta["signature"]
    kc, progc, dc = on_cpu(kernel, True, monkeypatch)
    kp, progp, dp = on_cpu(kernel, False, monkeypatch)
    binder = compile_binder(sig, "cpu")
    taken = {"c": 0}

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(arguments(sig))
    def check(drawn):
        args, kind = drawn
        if kc._native is None:  # the first call makes it (after one launch through the Python path)
            monkeypatch.setenv("TILECORE_C_LAUNCHER", "1" if reads == "shim" else reads)
            _outcome(kc, dc, args)
            monkeypatch.setenv("TILECORE_C_LAUNCHER", "0")
            _outcome(kp, dp, args)
            assert kc._native is not None and kp._native is None and kc._native.reads == reads
        taken["c"] += agree(sig, binder, (kc, progc, dc), (kp, progp, dp), args, kind)

    check()
    assert taken["c"] > 0  # the compiled path did run


def test_the_launch_reads_constant_and_computed_grids_and_skips_empty_ones(compiled, monkeypatch):
    k, prog, driver = on_cpu(compiled["scale_add"], True, monkeypatch)
    a, b = torch.randn(130, 4), torch.randn(130, 4).half()
    k(a, b, 1.0, 0)  # the first call: the Python path, which tells the compiled launcher the device
    out = k._native((a, b, 2.0, 5))
    assert out.shape == (130, 4) and out.dtype == torch.float32
    rec = driver.records[-1]
    assert rec["grid"] == (3, 1, 1) and rec["block"] == (64, 1, 1) and rec["stream"] == 0x5000 and rec["func"] == 0xF00D
    # A, B, C, then ints [shift, n], floats [alpha], then the status word's address
    words = [int.from_bytes(p, "little", signed=True) for p in rec["params"]]
    assert words[:3] == [a.data_ptr(), b.data_ptr(), out.data_ptr()]
    assert words[3:5] == [5, 130]
    assert rec["params"][5] == bytes(ctypes.c_double(2.0))
    assert words[6] == prog._status_ptr
    n = len(driver.records)
    empty = k._native((torch.randn(0, 4), torch.randn(0, 4).half(), 1.0, 0))
    assert empty.shape == (0, 4) and len(driver.records) == n  # grid 0: nothing launched, the output returned


def test_a_new_device_goes_through_the_python_path_once(compiled, monkeypatch):
    k, prog, driver = on_cpu(compiled["static_add"], True, monkeypatch, devices=(0, 1))
    x, y, z = (torch.randn(512) for _ in range(3))
    k(x, y, z)
    assert k._native((x, y, z)) is None and driver.records[-1]["func"] == 0xF00D
    prog.current = 1
    assert k._native((x, y, z)) is NotImplemented  # device 1's function is not loaded in C yet
    k(x, y, z)  # the Python path enters device 1 and tells the launcher
    assert k._native((x, y, z)) is None
    assert driver.records[-1]["func"] == 0xF00D + 1 and driver.records[-1]["stream"] == 0x5001
    assert int.from_bytes(driver.records[-1]["params"][-1], "little") == prog._status_by_dev[1][1]


def test_a_failed_launch_and_a_failed_assert_raise_as_the_python_path_does(compiled, monkeypatch):
    for c in (True, False):
        k, prog, driver = on_cpu(compiled["asserting"], c, monkeypatch)
        x = torch.rand(40)
        assert k(x, torch.empty(40)) is None
        driver.rc = 700
        with pytest.raises(DeviceError, match=r"cuLaunchKernel failed: 700 \(unknown\) \(grid \(2, 1, 1\), 32 threads"):
            k(x, torch.empty(40))
        driver.rc = 0
        prog.status[0] = 1  # the kernel's first assertion failed
        with pytest.raises(TilecoreError, match="X must be non-negative"):
            k(x, torch.empty(40))
        assert int(prog.status[0]) == 0  # read and cleared
        prog.status[0] = 1
        prog.torch.cuda.is_current_stream_capturing = lambda: True  # in a CUDA graph capture: no read-back
        k(x, torch.empty(40))
        assert int(prog.status[0]) == 1
        if c:
            assert k._native is not None


def test_switches_and_kernels_without_it(compiled, monkeypatch):
    k, _, driver = on_cpu(compiled["static_add"], False, monkeypatch)  # TILECORE_C_LAUNCHER=0
    x, y, z = (torch.randn(512) for _ in range(3))
    k(x, y, z)
    assert k._native is None and len(driver.records) == 1
    monkeypatch.setenv("TILECORE_C_LAUNCHER", "1")
    prog = on_cpu(compiled["static_add"], True, monkeypatch)[1]
    assert prog.fast_call(compiled["static_add"].meta["signature"]) is not None
    prog._cuLaunchKernel = None  # no driver
    assert prog.fast_call(compiled["static_add"].meta["signature"]) is None


def test_tma_descriptors_are_encoded_per_launch_and_passed_by_address(compiled, monkeypatch):
    kernel = compiled["tma_gemm"]
    assert len(kernel.meta["source"]["meta"]["tensor_maps"]) == 2
    k, prog, driver = on_cpu(kernel, True, monkeypatch)
    a, b = torch.randn(100, 128).half(), torch.randn(128, 128).half()
    k(a, b)
    c = k._native((a, b))
    assert c.shape == (100, 128)
    words = [int.from_bytes(p, "little") for p in driver.records[-1]["params"]]
    # A, B, C, the integer m, then the two descriptors (A's with 100 rows, B's with 128), the status word
    assert words[:4] == [a.data_ptr(), b.data_ptr(), c.data_ptr(), 100]
    assert words[4:6] == [a.data_ptr() ^ (100 << 48), b.data_ptr() ^ (128 << 48)]
    # 2 x 2 tiles on the persistent grid (D43): 4 blocks in x, each looping over its tiles
    assert words[6] == prog._status_ptr and driver.records[-1]["grid"] == (4, 1, 1)
    assert len(prog.tmap_cache) == 2  # cached per (tensor, address, dims): a second call encodes nothing
    k._native((a, b))
    assert len(prog.tmap_cache) == 2


@pytest.mark.parametrize("missing", ["compiler", "headers"])
def test_no_compiler_or_headers_means_the_python_path_and_a_debug_line(missing, compiled, monkeypatch, tmp_path,
                                                                       caplog):
    monkeypatch.setattr(clauncher, "_state", {})
    if missing == "compiler":
        monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
        monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path / "cache"))  # nothing built yet
    else:
        monkeypatch.setattr(clauncher.sysconfig, "get_paths", lambda scheme=None: {"include": str(tmp_path)})
        config_var = sysconfig.get_config_var
        monkeypatch.setattr(clauncher.sysconfig, "get_config_var",
                            lambda name: str(tmp_path) if name == "INCLUDEPY" else config_var(name))
    caplog.set_level("DEBUG", logger="tilecore.launcher")
    k, _, driver = on_cpu(compiled["static_add"], True, monkeypatch)
    x, y, z = (torch.randn(512) for _ in range(3))
    k(x, y, z)
    k(x, y, z)
    assert k._native is None and len(driver.records) == 2
    assert clauncher.module() is None
    why = clauncher.why_unavailable()
    assert ("no-such-cc" in why) if missing == "compiler" else ("Python.h" in why)
    assert [r.getMessage() for r in caplog.records if r.name == "tilecore.launcher"] == [
        f"tilecore: kernels launch through the Python path: {why}"]  # stated once


def test_the_module_builds_here_and_is_cached(tmp_path, monkeypatch):
    """CI has a C compiler and Python's headers (scripts/setup.sh): the launcher must build there."""
    monkeypatch.setattr(clauncher, "_state", {})
    monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path))
    mod = clauncher.module()
    assert mod is not None, clauncher.why_unavailable()
    built = list((tmp_path / "launchers").glob("*/_tilecore_launch*"))
    assert len(built) == 1
    monkeypatch.setattr(clauncher, "_state", {})
    stamp = built[0].stat().st_mtime_ns
    assert clauncher.module() is not None and built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt


def test_without_a_cache_the_build_folder_is_removed(tmp_path, monkeypatch):
    """No usable cache directory: the launcher builds in a temporary folder and removes it once loaded."""
    from tilecore.compiler import cache

    monkeypatch.setattr(clauncher, "_state", {})
    monkeypatch.setattr(cache, "usable_root", lambda: None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert clauncher.module() is not None, clauncher.why_unavailable()
    assert not list(tmp_path.glob("tilecore-launch-*"))


MUTATIONS = {  # launcher.c with one thing broken, an argument set that shows it, and how the launcher reads tensors
    "descriptor order": ("params[nb + ni + nf + nviews] = views[nviews].buf;",
                         "params[nb + ni + nf + self->ndesc - 1 - nviews] = views[nviews].buf;", "tma_gemm",
                         lambda: (torch.randn(100, 128).half(), torch.randn(128, 128).half()), "1"),
    "dtype": ("ok = o == p->dtype;", "ok = 1;", "scale_add",
              lambda: (torch.randn(9, 4), torch.randn(9, 4), 1.0, 2), "getters"),
    "symbols": ("ok = *s == have;", "ok = 1;", "scale_add",
                lambda: (torch.randn(9, 4), torch.randn(8, 4).half(), 1.0, 2), "getters"),
    "alignment": ("if (store[self->aligned[i]] % 16)", "if (0)", "pipelined_gemm",
                  lambda: (torch.empty(64 * 64 + 1).half()[1:].view(64, 64), torch.randn(64, 64).half(),
                           torch.empty(64, 64).half()), "1"),
    # the same facts read through torch's C shim (D57)
    "shim dtype": ("v != p->code", "0", "scale_add", lambda: (torch.randn(9, 4), torch.randn(9, 4), 1.0, 2), "1"),
    "shim device": ("v != f->device", "0", "scale_add",  # (no elements: a meta tensor's address reads as 0)
                    lambda: (torch.empty(0, 4, device="meta"), torch.randn(0, 4).half(), 1.0, 2), "1"),
    "shim rank": ("rank != p->rank", "0", "static_add",
                  lambda: (torch.randn(512, 1), torch.randn(512), torch.randn(512)), "1"),
    "shim sizes": ("            if (have != p->dims[d])\n                return 1;", "", "scale_add",
                   lambda: (torch.randn(9, 5), torch.randn(9, 5).half(), 1.0, 2), "1"),
    "shim symbols": ("else if (*s != have)", "else if (0)", "scale_add",
                     lambda: (torch.randn(9, 4), torch.randn(8, 4).half(), 1.0, 2), "1"),
    "shim contiguity": ("|| !contiguous ", "", "static_add",
                        lambda: (torch.randn(1024)[::2], torch.randn(512), torch.randn(512)), "1"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_launcher_with_a_check_broken_is_caught(mutation, compiled, monkeypatch, tmp_path):
    old, new, name, make_args, mode = MUTATIONS[mutation]
    source = clauncher.SOURCE.read_text()
    assert source.count(old) == 1
    mutant = tmp_path / "launcher.c"
    mutant.write_text(source.replace(old, new))
    cc, include, why = clauncher.toolchain()
    assert why is None, why
    kernel = compiled[name]
    sig = kernel.meta["signature"]
    args = make_args()
    kind = "offset" if mutation == "alignment" else mutation  # agree() lets only an offset tensor decline
    right = mutation == "descriptor order"  # the arguments are right: the unmutated launcher launches
    for broken in (False, True):
        if broken:
            mod, why = clauncher.build(mutant, tmp_path / "built", cc, include)
            assert mod is not None, why
            monkeypatch.setattr(clauncher, "_state", {"module": mod})
        kc, progc, dc = on_cpu(kernel, True, monkeypatch)
        kp, progp, dp = on_cpu(kernel, False, monkeypatch)
        monkeypatch.setenv("TILECORE_C_LAUNCHER", mode)
        _outcome(kc, dc, args)  # the first call makes the compiled launcher
        monkeypatch.setenv("TILECORE_C_LAUNCHER", "0")
        assert kc._native is not None and kc._native.reads == ("getters" if mode == "getters" else "shim")
        if broken:
            with pytest.raises(AssertionError):
                agree(sig, compile_binder(sig, "cpu"), (kc, progc, dc), (kp, progp, dp), args, kind)
        else:
            assert agree(sig, compile_binder(sig, "cpu"), (kc, progc, dc), (kp, progp, dp), args, kind) == right
