"""The Ascend emulator's checker, tested by mutation: every generated kernel runs with no finding, and
deleting one generated WaitFlag of each kind, oversizing a buffer or misaligning a copy is caught, with a
message naming the buffer, the pipes and the line (the results of a mutated kernel are still right:
sequential emulation hides the race, so the checker is the test)."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.errors import KernelRuntimeError, UnsupportedFeatureError

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the Ascend emulator needs g++")

TARGETS = ("ascend:910b", "ascend:a3")


def softmax():
    from tilecore_conformance import composite

    return composite.softmax("float32")


def reduce_rows(loop=1):
    """Column sums of ``loop`` 16x64 tiles: MTE2 -> V (copy, reduce), V -> MTE3 (result out), and with
    ``loop`` > 1 the tile is refilled while the vector unit read it the iteration before (V -> MTE2)."""
    @T.prim_func
    def colsum(A: T.Tensor((16 * loop, 64), "float32"), B: T.Tensor((64,), "float32")):
        with T.Kernel(1) as bx:
            x = T.alloc_shared((16, 64), "float32")
            r = T.alloc_fragment((64,), "float32")
            T.clear(r)
            for k in T.serial(loop):
                T.copy(A[k * 16, 0], x)
                T.reduce_sum(x, r, dim=0, clear=False)
            T.copy(r, B)
    return colsum


def row_max():
    """Row maxima: the scalar unit combines the per-row results (V -> S) and the copy out reads them (S -> MTE3)."""
    @T.prim_func
    def rowmax(A: T.Tensor((16, 64), "float32"), B: T.Tensor((16,), "float32")):
        with T.Kernel(1) as bx:
            x = T.alloc_shared((16, 64), "float32")
            r = T.alloc_fragment((16,), "float32")
            T.copy(A, x)
            T.reduce_max(x, r, dim=1)
            T.copy(r, B)
    return rowmax


def _inputs(name, rng):
    if name == "softmax":
        x = rng.standard_normal((64, 128)).astype(np.float32)
        e = np.exp(x - x.max(1, keepdims=True))
        return x, np.zeros_like(x), e / e.sum(1, keepdims=True)
    if name == "rowmax":
        x = rng.standard_normal((16, 64)).astype(np.float32)
        return x, np.zeros(16, np.float32), x.max(1)
    loop = int(name[-1])
    x = rng.standard_normal((16 * loop, 64)).astype(np.float32)
    return x, np.zeros(64, np.float32), x.sum(0)


KERNELS = {"softmax": softmax, "rowmax": row_max, "colsum1": lambda: reduce_rows(1), "colsum4": lambda: reduce_rows(4)}


def _build(name, target, mutate=None):
    k = tilecore.compile(KERNELS[name](), target=target)
    src = k.source
    if mutate is not None:
        code = mutate(src.code)
        assert code != src.code, "the mutation found nothing to change"
        from tilecore.plugin import Source

        src = Source(code, src.lang, src.entry, src.meta)
    rt = k.runtime
    return rt.load(rt.build(src, {}), src), src


def _run(prog, name):
    x, y, ref = _inputs(name, np.random.default_rng(0))
    prog.launch([x.ctypes.data, y.ctypes.data], [], [])
    return y, ref


def _drop_first(pattern):
    def mutate(code):
        lines = code.split("\n")
        k = next(i for i, line in enumerate(lines) if pattern in line)
        return "\n".join(lines[:k] + lines[k + 1:])
    return mutate


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_unmutated_kernels_report_nothing(name, target):
    prog, src = _build(name, target)
    y, ref = _run(prog, name)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    assert src.meta["kernel_type"] and "SetFlag" in src.code and "WaitFlag" in src.code


WAITS = [("softmax", "MTE2_V", r"RAW: V reads UB-buffer 'x' .* written by MTE2 .* no MTE2->V sync, line \d+"),
         ("colsum1", "V_MTE3", r"RAW: MTE3 reads UB-buffer 'r' .* written by V .* no V->MTE3 sync, line \d+"),
         ("colsum4", "V_MTE2", r"WAR: MTE2 overwrites UB-buffer 'x' .* read by V .* no V->MTE2 sync, line \d+"),
         ("softmax", "V_MTE3", r"RAW: MTE3 reads UB-buffer 'x' .* written by V .* no V->MTE3 sync"),
         ("rowmax", "V_S", r"RAW: S reads UB-buffer 'red_out' .* written by V .* no V->S sync"),
         ("rowmax", "S_MTE3", r"RAW: MTE3 reads UB-buffer 'r' .* written by S .* no S->MTE3 sync")]


@pytest.mark.parametrize("name,event,message", WAITS)
def test_each_deleted_waitflag_is_caught(name, event, message):
    prog, src = _build(name, "ascend:910b", _drop_first(f"WaitFlag<HardEvent::{event}>"))
    with pytest.raises(KernelRuntimeError, match=message) as info:
        _run(prog, name)
    # the SetFlag left behind is unbalanced too: never waited, or (a loop-carried flag) set again while pending
    assert "is never waited" in str(info.value) or "is still pending" in str(info.value)
    line = int(re.search(r"no \w+->\w+ sync, line (\d+)", str(info.value)).group(1))
    assert src.code.split("\n")[line - 1].strip()  # the line named is a line of the generated source


def test_deleted_pipe_barrier_is_caught():
    def mutate(code):  # the barrier between the last accumulation and the Add that reads its result
        lines = code.split("\n")
        k = next(i for i, line in enumerate(lines) if "Add(r, r, red_acc" in line)
        assert "PipeBarrier<PIPE_V>" in lines[k - 1]
        return "\n".join(lines[:k - 1] + lines[k:])

    prog, _ = _build("colsum1", "ascend:910b", mutate)
    with pytest.raises(KernelRuntimeError, match=r"RAW: V reads UB-buffer 'red_acc' .* written by V .* no V->V sync"):
        _run(prog, "colsum1")


def test_mutated_kernel_still_computes_the_right_numbers():
    """Why the checker exists: a sequential emulation gives right answers for a racy kernel."""
    prog, _ = _build("softmax", "ascend:910b", _drop_first("WaitFlag<HardEvent::MTE2_V>"))
    x, y, ref = _inputs("softmax", np.random.default_rng(0))
    with pytest.raises(KernelRuntimeError):
        prog.launch([x.ctypes.data, y.ctypes.data], [], [])
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_oversized_buffer_is_caught():
    def grow(code):
        return re.sub(r"InitBuffer\(tc_ub, \d+\)", "InitBuffer(tc_ub, 200000)", code)

    prog, _ = _build("softmax", "ascend:910b", grow)
    with pytest.raises(KernelRuntimeError, match=r"capacity: InitBuffer of 200000 bytes in UB .* exceeds its 196608 bytes"):
        _run(prog, "softmax")


def test_misaligned_copy_is_caught():
    def shift(code):  # the tile x 4 bytes off its 32-byte boundary: DataCopyPad's UB address is misaligned
        return code.replace("GetWithOffset<float>(2048, 0)", "GetWithOffset<float>(2048, 4)")

    prog, _ = _build("softmax", "ascend:910b", shift)
    with pytest.raises(KernelRuntimeError, match=r"alignment: DataCopyPad destination operand 'x' at UB offset 4 is not 32-byte"):
        _run(prog, "softmax")


def test_oversized_tile_is_refused_at_compile_time():
    @T.prim_func
    def big(A: T.Tensor((256, 256), "float32"), B: T.Tensor((256, 256), "float32")):
        with T.Kernel(1) as bx:
            x = T.alloc_shared((256, 256), "float32")  # 256 KiB > UB's 192 KiB
            T.copy(A, x)
            T.copy(x, B)

    with pytest.raises(UnsupportedFeatureError, match=r"needs 262144 bytes of UB .*x 262144 B .*196608") as info:
        tilecore.compile(big, target="ascend:910b")
    assert info.value.feature == "limit:max_ub_bytes"


def test_mode_is_emulated_never_device():
    k = tilecore.compile(softmax(), target="ascend:a3")
    assert k.mode == "emulated"


def test_softmax_is_vector_instructions():
    """Element-wise T.Parallel over whole tiles becomes vector instructions; only the row statistics touch
    the scalar unit (the per-row results of ReduceMax/ReduceSum, and the row scalars they feed)."""
    code = tilecore.compile(softmax(), target="ascend:910b").source.code
    for instr in ("DataCopyPad(x, X", "ReduceMax(", "ReduceSum(", "Muls(", "Exp(", "Div(x, x,", "DataCopyPad(Y"):
        assert instr in code, instr
    assert "x.SetValue" not in code and "x.GetValue" not in code


# -- the cube ----------------------------------------------------------------------------------------------

def _gemm(ta=False, tb=False, m=64, n=64, k=64, tile=(32, 32, 16, 128)):
    from tilecore_conformance import catalog

    return catalog._gemm_kernel("float16", "float32", ta, tb, m, n, k, tile=tile)


def _gemm_run(prog, ta=False, tb=False, m=64, n=64, k=64):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float16)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float16)
    c = np.zeros((m, n), np.float32)
    prog.launch([a.ctypes.data, b.ctypes.data, c.ctypes.data], [], [])
    ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    return c, ref


def _build_func(func, mutate=None, target="ascend:910b"):
    k = tilecore.compile(func, target=target)
    src = k.source
    if mutate is not None:
        from tilecore.plugin import Source

        code = mutate(src.code)
        assert code != src.code
        src = Source(code, src.lang, src.entry, src.meta)
    return k.runtime.load(k.runtime.build(src, {}), src), src


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_gemm_on_the_cube(ta, tb):
    prog, src = _build_func(_gemm(ta, tb, 100, 72, 40))
    c, ref = _gemm_run(prog, ta, tb, 100, 72, 40)
    np.testing.assert_allclose(c, ref, rtol=1e-3, atol=1e-3)
    assert src.meta["kernel_type"] == "KERNEL_TYPE_AIC_ONLY" and "if ASCEND_IS_AIC" in src.code
    for instr in ("Nd2NzParams(", "LoadData(", "Mmad(", "Fixpipe<", "WaitFlag<HardEvent::MTE1_M>", "WaitFlag<HardEvent::M_FIX>"):
        assert instr in src.code, instr


def test_k_split_into_l0_chunks_ping_pong():
    """A 64 x 512 float16 A tile is 64 KiB, all of L0A: two chunks of K = 256 through its two 32 KiB halves
    (in each half of the double-buffered loop: four Mmads)."""
    prog, src = _build_func(_gemm(m=64, n=64, k=1024, tile=(64, 64, 512, 128)))
    c, ref = _gemm_run(prog, m=64, n=64, k=1024)
    np.testing.assert_allclose(c, ref, rtol=1e-3, atol=2e-3)
    assert src.code.count("Mmad(") == 4 and "l0a_1" in src.code and "MmadParams(64, 64, 256," in src.code
    assert "A_s_pong" in src.code
    assert "WaitFlag<HardEvent::M_MTE1>" in src.code  # a half is refilled only after the Mmad that read it


CUBE_WAITS = [("MTE1_M", r"RAW: M reads L0A-buffer 'l0a_0' .* written by MTE1 .* no MTE1->M sync"),
              ("M_FIX", r"RAW: FIX reads L0C-buffer 'C_l' .* written by M .* no M->FIX sync"),
              ("MTE2_MTE1", r"RAW: MTE1 reads L1-buffer 'A_s' .* written by MTE2 .* no MTE2->MTE1 sync"),
              ("M_MTE1", r"WAR: MTE1 overwrites L0A-buffer 'l0a_0' .* read by M .* no M->MTE1 sync")]


@pytest.mark.parametrize("event,message", CUBE_WAITS)
def test_each_deleted_cube_waitflag_is_caught(event, message):
    prog, _ = _build_func(_gemm(), _drop_first(f"WaitFlag<HardEvent::{event}>"))
    with pytest.raises(KernelRuntimeError, match=message):
        _gemm_run(prog)


def test_unmutated_gemm_reports_nothing_on_both_profiles():
    for target in TARGETS:
        prog, _ = _build_func(_gemm(), target=target)
        c, ref = _gemm_run(prog)
        np.testing.assert_allclose(c, ref, rtol=1e-3, atol=1e-3)


# -- the README GEMM: cube, hand-off through GM, ReLU on the vector unit ---------------------------------------

def readme_gemm(M=200, N=128, K=96, bm=64, bn=64, bk=32):
    @T.prim_func
    def kernel(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_shared = T.alloc_shared((bm, bk), "float16")
            B_shared = T.alloc_shared((bk, bn), "float16")
            C_local = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=3):
                T.copy(A[by * bm, ko * bk], A_shared)
                T.copy(B[ko * bk, bx * bn], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            for i, j in T.Parallel(bm, bn):
                C_local[i, j] = T.max(C_local[i, j], 0)
            T.copy(C_local, C[by * bm, bx * bn])
    return kernel


def _readme_run(prog):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((200, 96)).astype(np.float16)
    b = rng.standard_normal((96, 128)).astype(np.float16)
    c = np.zeros((200, 128), np.float16)
    prog.launch([a.ctypes.data, b.ctypes.data, c.ctypes.data], [], [])
    return c.astype(np.float64), np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)


def test_readme_gemm_cube_then_vector():
    prog, src = _build_func(readme_gemm())
    c, ref = _readme_run(prog)
    np.testing.assert_allclose(c, ref, rtol=2e-3, atol=2e-2)
    code = src.code
    assert src.meta["kernel_type"] == "KERNEL_TYPE_MIX_AIC_1_2" and src.meta["workspace_bytes_per_block"] == 64 * 64 * 4
    aic, aiv = code.index("if ASCEND_IS_AIC"), code.index("if ASCEND_IS_AIV")
    assert aic < code.index("Mmad(") < code.index("CrossCoreSetFlag") < aiv < code.index("CrossCoreWaitFlag")
    assert aiv < code.index("Maxs(C_local") and aiv < code.index("Cast(C_local_cast")


def test_deleted_cross_core_wait_is_caught():
    prog, _ = _build_func(readme_gemm(), _drop_first("CrossCoreWaitFlag(0);"))
    with pytest.raises(KernelRuntimeError, match=r"RAW across cores: the AIV reads the GM workspace .* no "
                                                 r"CrossCoreSetFlag/CrossCoreWaitFlag .*\n.*unbalanced: CrossCoreSetFlag\(0\)"):
        _readme_run(prog)


def test_shared_tiles_are_placed_without_changing_the_kernel():
    """T.alloc_shared becomes a UB/L1 tile on Ascend (the profile has no shared memory); the PrimFunc itself
    is not changed, so it compiles the same way for another target afterwards."""
    from tilecore.ir import Allocate, collect

    func = reduce_rows(1)
    scopes = [a.buffer.scope for a in collect(func.body, Allocate)]
    tilecore.compile(func, target="ascend:910b")
    assert [a.buffer.scope for a in collect(func.body, Allocate)] == scopes and "shared" in scopes
    x = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    y = np.zeros(64, np.float32)
    tilecore.compile(func, target="cpu")(x, y)
    np.testing.assert_allclose(y, x.sum(0), rtol=1e-5, atol=1e-5)
