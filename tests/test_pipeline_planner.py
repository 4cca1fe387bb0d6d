"""The core's pipeline planner (``tilecore.plan_pipelines``): ``T.Pipelined`` copies become multi-buffered
shared tiles filled by asynchronous copies on targets that declare ``feature:async_copy`` (CUDA: cp.async),
planned against the shared-memory limit; other targets keep the serial loop.

Through the public API: the DSL, ``tilecore.compile`` and ``tilecore.compiler.lower`` (what
``tilecore compile --emit lowered`` prints). GEMMs here are ones the CUDA whole-kernel passes do not take
(B with 777 columns, float32 operands, 96 threads), so they show the generic path's pipeline; they run on
the host through ``cuda_host_emulator`` (the generated source, cp.async emulated) and on a GPU where there
is one.
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.compiler import lower

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
from cuda_host_emulator import run_on_host  # noqa: E402
from test_cuda_backend import HAS_DEVICE, NOCACHE, needs_toolchain  # noqa: E402

ARCHS = ["cuda:sm_80", "cuda:sm_90a"]
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")


def gemm(M, N, K, bm, bn, bk, threads=128, stages=3, dtype="float16", use_after=False, accum="float32"):
    """C (float32) = A @ B through shared tiles in a T.Pipelined loop (``use_after``: A_s is read after it)."""

    @T.prim_func
    def kernel(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), accum)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), accum)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            if use_after:
                for i, j in T.Parallel(bm, bn):
                    C_l[i, j] += A_s[0, 0]
            T.copy(C_l, C[by * bm, bx * bn])

    return kernel


def _compile(fn, target="cuda:sm_80"):
    return tilecore.compile(fn, target=target, pass_configs=NOCACHE)


def _body(k) -> str:
    return k.get_kernel_source().split('extern "C"')[1]


def _operands(rng, M, N, K, dtype):
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    return a, b


def _check(c, a, b):
    ref = a.astype(np.float64) @ b.astype(np.float64)
    bound = 1e-5 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))) + 1e-5
    err = np.abs(c.astype(np.float64) - ref)
    assert (err <= bound).all(), f"max error {err.max()} at {np.unravel_index(err.argmax(), err.shape)}"


# -- what the planner decides ---------------------------------------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("target", ARCHS)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_777_column_gemm_is_pipelined_on_the_generic_path(target, dtype):
    k = _compile(gemm(256, 777, 256, 64, 64, 32, dtype=dtype), target)
    assert tilecore_cuda.lowering_path(k) == "generic"
    (note,) = k.meta["attrs"]["pipelines"]
    assert note.startswith("loop ko: 3 stages, 2 tiles x 3 buffers"), note
    body = _body(k)
    # A's rows (256 elements) are whole 16-byte runs; B's (777 elements) are not 16-byte aligned
    assert "tc_cp_async16(A_s + " in body and "tc_cp_async_commit();" in body and "tc_cp_async_wait<1>();" in body
    if dtype == "float32":  # a 4-byte element is one cp.async.ca each
        assert "B_s async 4-byte copies" in note and "tc_cp_async_ca<4>(B_s + " in body
        assert "cp.async.ca.shared.global" in k.get_kernel_source()
    else:  # 2-byte elements with no aligned run: B_s stays a synchronous (multi-buffered) store
        assert "B_s synchronous" in note and "B_s[" in body and "tc_cp_async_ca" not in body
    assert f", {24 if dtype == 'float16' else 48} KiB;" in note  # 3 x (64x32 + 32x64 elements)


@needs_toolchain
@pytest.mark.parametrize("target", ARCHS)
def test_777_column_gemm_sass_has_ldgsts(target):
    from test_cuda_tensor_cores import _sass

    k = _compile(gemm(256, 777, 256, 64, 64, 32, dtype="float32"), target)
    ops = set(re.findall(r"\b(LDGSTS[.A-Z0-9_]*|LDGDEPBAR|DEPBAR[.A-Z0-9_]*)", _sass(k, target)))
    # 16-byte copies of A (.cg), 4-byte copies of B (.ca), the commit and the wait
    assert {"LDGSTS.E.BYPASS.128", "LDGSTS.E", "LDGDEPBAR", "DEPBAR.LE"} <= ops, ops


@needs_toolchain
def test_lowered_ir_shows_the_schedule():
    _, _, lowered, _, _ = lower(gemm(128, 777, 96, 64, 64, 32, stages=3), "cuda:sm_80", NOCACHE)
    text = lowered.script()
    assert "T.async_copy(A_s[" in text and "elements=8" in text
    assert text.count("T.async_commit()") == 3  # two in the prologue, one per iteration
    assert "T.async_wait(pending=1)" in text
    assert "A_s = T.alloc_shared((3, 64, 32,), 'float16')" in text


@needs_toolchain
def test_stages_reduced_to_fit_shared_memory():
    # float32 128x64 and 64x128 tiles: 64 KiB a stage (the accumulator is in registers)
    fn = gemm(512, 512, 512, 128, 128, 64, threads=256, stages=4, dtype="float32")
    k = _compile(fn, "cuda:sm_90a")  # 227 KiB per block: 3 stages (192 KiB), not 4 (256 KiB)
    (note,) = k.meta["attrs"]["pipelines"]
    assert note.startswith("loop ko: 3 stages (of 4 asked: on-chip memory limit 232448 bytes), 2 tiles x 3 buffers")
    assert "tc_cp_async_wait<1>();" in _body(k)
    # 128x128 float32 tiles: 128 KiB a stage; 163 KiB per block on sm_80: not even 2 stages
    k = _compile(gemm(512, 512, 512, 128, 128, 128, threads=256, stages=4, dtype="float32"), "cuda:sm_80")
    (note,) = k.meta["attrs"]["pipelines"]
    assert note.startswith("loop ko: serialized (2 tiles x 2 buffers need 262")  # 256 KiB of tiles + the rest
    assert note.endswith("bytes of on-chip memory with the kernel's other buffers; target allows 166912)")
    assert "tc_cp_async_wait" not in _body(k)
    assert "tc_cp_async_wait" not in _body(k)


@needs_toolchain
def test_reasons_a_loop_stays_serial():
    k = _compile(gemm(128, 128, 128, 64, 64, 32, use_after=True))
    assert k.meta["attrs"]["pipelines"] == ("loop ko: serialized (A_s is used outside the loop)",)
    assert "tc_cp_async_wait" not in _body(k)

    @T.prim_func
    def scaled(A: T.Tensor((128, 128), "float32"), B: T.Tensor((128, 128), "float32")):
        with T.Kernel(1, threads=128) as bx:
            S = T.alloc_shared((32, 128), "float32")
            for ko in T.Pipelined(4, num_stages=2):
                for i, j in T.Parallel(32, 128):
                    B[ko * 32 + i, j] = A[ko * 32 + i, j] * 2.0
                T.copy(A[ko * 32, 0], S)
                T.copy(S, B[ko * 32, 0])

    k = _compile(scaled)
    assert k.meta["attrs"]["pipelines"] == (
        "loop ko: serialized (its body does not start with a T.copy from a global tensor into a whole shared "
        "buffer)",)


def test_cpu_keeps_the_serial_loop():
    fn = gemm(128, 777, 96, 64, 64, 32)
    _, _, lowered, source, _ = lower(fn, "cpu", NOCACHE)
    assert "pipelines" not in lowered.attrs and "async" not in lowered.script() and "async" not in source.code
    k = tilecore.compile(fn, target="cpu", pass_configs=NOCACHE)
    rng = np.random.default_rng(3)
    a, b = _operands(rng, 128, 777, 96, "float16")
    c = np.zeros((128, 777), np.float32)
    k(a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(c - ref).max() <= 1e-3


def test_webgpu_keeps_the_serial_loop():
    pytest.importorskip("tilecore_webgpu")
    _, _, lowered, source, _ = lower(gemm(128, 777, 96, 64, 64, 32, dtype="float32"), "webgpu", NOCACHE)
    assert "pipelines" not in lowered.attrs and "async" not in lowered.script()


@needs_toolchain
def test_checked_mode_keeps_the_serial_loop():
    k = tilecore.compile(gemm(128, 777, 96, 64, 64, 32), target="cuda:sm_80",
                         pass_configs={**NOCACHE, "tilecore.checked": True})
    assert "pipelines" not in k.meta["attrs"] and "tc_cp_async_wait" not in _body(k)


# -- results ---------------------------------------------------------------------------------------------

@needs_toolchain
@needs_gxx
@pytest.mark.parametrize("case", ["f16_777", "f32_777", "threads96", "two_stages_ragged_k"])
def test_emulated_pipelined_gemm(case):
    """Ragged in every dimension: the last B tile runs past column 777 and the last K tile past K (the
    predicated copies zero-fill), every stage buffer is reused."""
    M, N, K = 70, 777, 88
    if case == "f16_777":
        fn, dtype = gemm(M, N, K, 64, 64, 16, stages=3), "float16"
    elif case == "f32_777":
        fn, dtype = gemm(M, N, K, 64, 64, 16, stages=3, dtype="float32"), "float32"
    elif case == "threads96":
        fn, dtype = gemm(M, N, K, 32, 96, 16, threads=96, stages=4), "float16"
    else:
        fn, dtype = gemm(M, N, K, 64, 64, 32, stages=2, dtype="float32"), "float32"
    k = _compile(fn)
    assert tilecore_cuda.lowering_path(k) == "generic" and "stages" in k.meta["attrs"]["pipelines"][0]
    rng = np.random.default_rng(11)
    a, b = _operands(rng, M, N, K, dtype)
    out = run_on_host(k, [a, b, np.full((M, N), np.nan, np.float32)])
    _check(out[2], a, b)


@pytest.mark.skipif(not HAS_DEVICE, reason="no CUDA device")
@pytest.mark.parametrize("target", ARCHS)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_device_pipelined_777_gemm(target, dtype):
    torch = pytest.importorskip("torch")
    from tilecore_cuda import local_arch

    if target.split(":")[1] != local_arch():  # a cubin runs on its own architecture only
        pytest.skip(f"{target} code does not load on this GPU ({local_arch()})")
    M, N, K = 1000, 777, 520
    k = tilecore.compile(gemm(M, N, K, 64, 64, 32, dtype=dtype), target=target, pass_configs=NOCACHE)
    a = torch.randn(M, K, device="cuda", dtype=getattr(torch, dtype))
    b = torch.randn(K, N, device="cuda", dtype=getattr(torch, dtype))
    c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float32)
    k(a, b, c)
    torch.cuda.synchronize()
    _check(c.cpu().numpy(), a.float().cpu().numpy(), b.float().cpu().numpy())


@needs_toolchain
def test_stage_ahead_needs_no_bound_check_and_copies_move_storage():
    """K a multiple of the tile: inside ``if ko + 1 < n`` the prover shows the next stage's rows in bounds
    (a known fact scaled to cancel ``ko``), so neither the async copy nor the synchronous one tests them;
    the synchronous float16 copy moves the stored element (no float round trip)."""
    k = _compile(gemm(256, 777, 256, 64, 64, 32, stages=2), "cuda:sm_80")
    body = _body(k)
    assert "tc_p ?" not in body and "* 32) + i" not in body.split("for (long long ko")[1].split("mma")[0]
    assert "__half2float(B[" not in body and "? B[" in body
    ragged = _body(_compile(gemm(256, 777, 250, 64, 64, 32, stages=2), "cuda:sm_80"))  # K % 32 != 0: kept
    assert "< 250)" in ragged.split("for (long long ko")[1]


def test_prover_scales_a_known_fact():
    from tilecore.ir import Var, as_expr, binary, compare
    from tilecore.ir.bounds import Facts

    ko, i = Var("ko"), Var("i")
    base = Facts().with_range(ko, as_expr(0), as_expr(127)).with_cond(compare("lt", binary("add", ko, 1), 128))
    cond = compare("lt", binary("add", binary("mul", binary("add", ko, 1), 32), i), 4096)
    assert base.with_range(i, as_expr(0), as_expr(31)).proves(cond)
    assert not base.with_range(i, as_expr(0), as_expr(32)).proves(cond)  # i = 32 at ko = 126 reaches 4096
    assert not Facts().with_range(ko, as_expr(0), as_expr(127)).with_range(i, as_expr(0), as_expr(31)).proves(cond)


# -- copies further down the body (FlashAttention's V) ---------------------------------------------------

def two_gemm_loop(M, S, D, bm=32, bn=32, stages=2, threads=128):
    """O = sum over key blocks of (Q K_b^T) V_b, FlashAttention's loop without the softmax: K's copy opens
    the body, V's stands between the two gemms (its source depends on the loop variable only)."""

    @T.prim_func
    def kernel(Q: T.Tensor((M, D), "float16"), K: T.Tensor((S, D), "float16"), V: T.Tensor((S, D), "float16"),
               O: T.Tensor((M, D), "float32")):
        with T.Kernel(T.ceildiv(M, bm), threads=threads) as bx:
            Q_s = T.alloc_shared((bm, D), "float16")
            K_s = T.alloc_shared((bn, D), "float16")
            V_s = T.alloc_shared((bn, D), "float16")
            S_l = T.alloc_fragment((bm, bn), "float32")
            P = T.alloc_fragment((bm, bn), "float16")
            O_l = T.alloc_fragment((bm, D), "float32")
            T.copy(Q[bx * bm, 0], Q_s)
            T.clear(O_l)
            for k in T.Pipelined(T.ceildiv(S, bn), num_stages=stages):
                T.copy(K[k * bn, 0], K_s)
                T.gemm(Q_s, K_s, S_l, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(S_l, P)
                T.copy(V[k * bn, 0], V_s)
                T.gemm(P, V_s, O_l, policy=T.GemmWarpPolicy.FullRow)
            T.copy(O_l, O[bx * bm, 0])

    return kernel


def test_a_copy_further_down_is_issued_with_the_stage_ahead():
    # 256 threads: the threads, not the staged tiles' shared memory, bound the resident blocks
    k = _compile(two_gemm_loop(64, 128, 32, stages=3, threads=256))
    note = k.meta["attrs"]["pipelines"][0]
    assert "2 tiles x 3 buffers" in note and "V_s async 16-byte copies (issued with the stage ahead" in note
    body = _body(k)
    loop = body[body.index("for (long long k"):]
    # two commit groups a stage: before the first gemm all but stage k's K group may be pending (3), before
    # the second all but stage k's V group (4: the stage ahead's two groups were committed in between)
    assert loop.index("tc_cp_async_wait<3>();") < loop.index("tc_cp_async_wait<4>();")
    assert loop.count("tc_cp_async_commit();") == 2


@needs_toolchain
@needs_gxx
@pytest.mark.parametrize("stages", [2, 3])
def test_emulated_late_copy_lands_before_its_use(stages, monkeypatch):
    """On the host emulator a copy lands only when a wait retires its group: a wait one group short leaves
    V's tile stale and the result wrong (the mutation below); the planned waits give the product."""
    import tilecore.passes.pipeline as pl

    M, S, D = 64, 96, 32
    rng = np.random.default_rng(4)
    q, kk, v = (rng.standard_normal(shape).astype(np.float16) for shape in ((M, D), (S, D), (S, D)))
    p = (q.astype(np.float64) @ kk.astype(np.float64).T).astype(np.float16).astype(np.float64)
    ref = p @ v.astype(np.float64)
    out = run_on_host(_compile(two_gemm_loop(M, S, D, stages=stages, threads=256)),
                      [q, kk, v, np.full((M, D), np.nan, np.float32)])
    np.testing.assert_allclose(out[3], ref, rtol=2e-3, atol=2e-3)
    # mutation: V's wait leaves one group more pending than the schedule allows
    real = pl.AsyncWait

    def short(pending, span=None):
        return real(pending + 1 if pending == 2 * (stages - 1) else pending, span=span)

    monkeypatch.setattr(pl, "AsyncWait", short)
    bad = run_on_host(_compile(two_gemm_loop(M, S, D, stages=stages, threads=256)),
                      [q, kk, v, np.full((M, D), np.nan, np.float32)])
    assert "issued with the stage ahead" in _compile(two_gemm_loop(M, S, D, stages=stages, threads=256)).meta[
        "attrs"]["pipelines"][0]
    assert not np.allclose(bad[3], ref, rtol=2e-3, atol=2e-3)


#: on sm_90a the late tile V_s arrives by TMA (the default), by a producer warpgroup, or by 16-byte cp.async
LATE_COPIES = {"bulk": ({}, "V_s bulk tile copies (1 x 128-byte panel(s)) (issued with the stage ahead"),
               "producer": ({"tilecore.warp_specialize": True}, "warp-specialized: a producer group of 128 threads"),
               "cp.async": ({"tilecore.bulk_copy": False}, "V_s async 16-byte copies (issued with the stage ahead")}


@pytest.mark.skipif(not HAS_DEVICE, reason="no CUDA device")
@pytest.mark.parametrize("copies", sorted(LATE_COPIES))
@pytest.mark.parametrize("stages", [2, 3])
def test_device_late_copy_on_the_general_path(stages, copies):
    """The same loop on the GPU through the core's general path (on sm_90a: wgmma, the second gemm left
    running while the stage ahead is copied when 3 stages allow it), against float64."""
    import torch

    M, S, D = 384, 320, 64
    rng = np.random.default_rng(6)
    q, kk, v = (rng.standard_normal(shape).astype(np.float16) for shape in ((M, D), (S, D), (S, D)))
    p = (q.astype(np.float64) @ kk.astype(np.float64).T).astype(np.float16).astype(np.float64)
    cfg, note = LATE_COPIES[copies]
    k = tilecore.compile(two_gemm_loop(M, S, D, bm=128, bn=64, stages=stages, threads=256), target="cuda",
                         pass_configs={**NOCACHE, "tilecore.cuda.register_programs": False, **cfg,
                                       "tilecore.bulk_store": False})  # D51's staged C would cost a resident block
    if torch.cuda.get_device_capability() >= (9, 0):  # (sm_80 has neither TMA nor wgmma)
        assert note in k.meta["attrs"]["pipelines"][0]
    o = torch.full((M, D), float("nan"), device="cuda")
    k(*(torch.from_numpy(x).cuda() for x in (q, kk, v)), o)
    np.testing.assert_allclose(o.cpu().numpy(), p @ v.astype(np.float64), rtol=2e-3, atol=5e-2)


def test_a_late_copy_that_would_cost_resident_blocks_is_waited_where_it_stands():
    """On sm_90a (228 KiB of shared memory per SM) a 64-row block with d=128 holds 64 KiB: three blocks fit;
    staging V too would make 80 KiB and two. V is then copied where it stands (16-byte cp.async, waited
    there) and the note says why."""
    k = tilecore.compile(two_gemm_loop(128, 256, 128, bm=64, bn=64, stages=2), target="cuda:sm_90a",
                         pass_configs={**NOCACHE, "tilecore.cuda.register_programs": False,
                                       "tilecore.bulk_store": False})  # D51's bulk store's tile would take 16 KiB
    note = k.meta["attrs"]["pipelines"][0]
    assert "1 tiles x 2 buffers" in note and "staging V_s would leave 2 resident block(s) per SM instead of 3" in note
    assert "tc_cp_async16(V_s" in _body(k)
