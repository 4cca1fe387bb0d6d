"""wgmma as a registered matrix unit: the core's general path (tilecore.passes.matrix) runs ``T.gemm`` on
``wgmma.mma_async`` wherever the CUDA plugin's register programs do not take the kernel (or
``tilecore.cuda.register_programs`` is False), with A and B read from their shared tiles by descriptor
(128/64/32-byte swizzled panels: tilecore.layout.SharedLayout(panels=True)) or A from registers.

Compile-only checks wherever a CUDA compiler exists (CI): which unit and layouts the plan took, the
descriptors, and the SASS (HGMMA, no HMMA). On an sm_90 GPU every kernel runs and is compared with a
float64 reference: transposes, bf16, two warpgroups, 64/32-byte panels, A from registers, the 777-column B.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import GENERAL, HOPPER, gemm as hopper_gemm, hopper_gpu  # noqa: E402
from test_cuda_tensor_cores import gemm_kernel as gemm  # noqa: E402  (C float32 = op(A) @ op(B), any transpose)



def two_gemms(M, D, bm=64, bn=64, dtype="float16"):
    """S = Q K^T (64 x bn), P = S cast to 16 bits in registers, O = P V: the second gemm's A from registers
    (FlashAttention's shape without the softmax)."""

    @T.prim_func
    def main(Q: T.Tensor((M, D), dtype), K: T.Tensor((bn, D), dtype), V: T.Tensor((bn, D), dtype),
             O: T.Tensor((M, D), "float32")):
        with T.Kernel(T.ceildiv(M, bm), threads=128) as bx:
            Q_s = T.alloc_shared((bm, D), dtype)
            K_s = T.alloc_shared((bn, D), dtype)
            V_s = T.alloc_shared((bn, D), dtype)
            S = T.alloc_fragment((bm, bn), "float32")
            P = T.alloc_fragment((bm, bn), dtype)
            O_l = T.alloc_fragment((bm, D), "float32")
            T.copy(Q[bx * bm, 0], Q_s)
            T.copy(K[0, 0], K_s)
            T.copy(V[0, 0], V_s)
            T.clear(S)
            T.clear(O_l)
            T.gemm(Q_s, K_s, S, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
            T.copy(S, P)
            T.gemm(P, V_s, O_l, policy=T.GemmWarpPolicy.FullRow)
            T.copy(O_l, O[bx * bm, 0])

    return main


CASES = {  # id: (kernel args, the panel widths of A's and B's tiles)
    "128x128x32": (dict(M=256, N=256, K=256, bm=128, bn=128, bk=32), (64, 128)),
    "64x64x64": (dict(M=128, N=192, K=320, bm=64, bn=64, bk=64), (128, 128)),
    "128x256x64-2wg": (dict(M=256, N=512, K=256, bm=128, bn=256, bk=64, threads=256, stages=3), (128, 128)),
    "tb": (dict(M=256, N=256, K=256, bm=128, bn=128, bk=32, tb=True), (64, 64)),
    "ta": (dict(M=256, N=256, K=256, bm=128, bn=128, bk=32, ta=True), (128, 128)),
    "ta-tb-bf16": (dict(M=128, N=128, K=192, bm=64, bn=64, bk=64, ta=True, tb=True, dtype="bfloat16"), (128, 128)),
    "bk16": (dict(M=128, N=128, K=128, bm=64, bn=64, bk=16, tb=True), (32, 32)),
    "ragged": (dict(M=200, N=136, K=200, bm=64, bn=64, bk=64), (128, 128)),  # bulk copies past every edge
}
#: how the pipelined loop's stages are copied: TMA bulk tile copies on mbarriers issued by thread 0 between the
#: block's barriers (the default on sm_90a) or by a producer warpgroup of their own (tilecore.warp_specialize=True),
#: or each thread's 16-byte cp.async (tilecore.bulk_copy=False)
COPIES = {"thread 0": {}, "producer": {"tilecore.warp_specialize": True}, "cp.async": {"tilecore.bulk_copy": False}}


def _compile(fn, **kw):
    return tilecore.compile(fn, target=HOPPER, pass_configs={**GENERAL, **kw})


@needs_toolchain
@pytest.mark.parametrize("case", sorted(CASES))
def test_general_path_runs_gemm_on_wgmma_with_descriptor_operands(case):
    args, (pa, pb) = CASES[case]
    k = _compile(gemm(**args))
    layouts = k.meta["attrs"]["shared_layouts"]
    assert f"{pa}-byte panels" in layouts["A_s"] and f"{pb}-byte panels" in layouts["B_s"], layouts
    src = k.get_kernel_source()
    n = args["bn"] // (1 if args.get("threads", 128) == 128 else 1)
    assert f"tc_wgmma_{'bf16' if args.get('dtype') == 'bfloat16' else 'f16'}_n{n}_t{int(not args.get('tb', False))}" \
        f"{'_ta' if args.get('ta') else ''}::run" in src
    # each descriptor names its swizzle: 128-byte panels are mode 1, 64-byte 2, 32-byte 3
    modes = {128: 1, 64: 2, 32: 3}
    assert f"{8 * pa}u, {modes[pa]}u)" in src and f"{8 * pb}u, {modes[pb]}u)" in src
    # the operand tiles are only written by TMA (each thread waits for its stage): no proxy fence, no barrier
    body = src.split("__global__")[-1]
    assert "tc_wg_fence_proxy()" not in body and "tc_wg_fence();" in body and "tc_wg_wait<" in body
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "HGMMA" in sass and "HMMA" not in sass.replace("HGMMA", "")


@needs_toolchain
@pytest.mark.parametrize("copies", ["thread 0", "cp.async"])
def test_the_pipelined_loop_keeps_one_gemm_running_while_the_stage_ahead_is_copied(copies):
    """The loop ends with the gemm: it is issued before the stage-ahead copies and left running (wait_group 1,
    then a barrier, then the copies into the previous gemm's stage); after the loop one wait finishes it."""
    k = _compile(gemm(512, 512, 512, 128, 128, 64, stages=3), **COPIES[copies])
    assert "the gemm's matrix unit runs on while the stage ahead is copied" in k.meta["attrs"]["pipelines"][0]
    body = k.get_kernel_source().split("__global__")[-1]
    loop = body[body.index("for (long long ko"):]
    issue, pending = loop.index("::run("), loop.index("tc_wg_commit(); tc_wg_wait<1>();")
    copy = "tc_tma_load_2d(" if copies == "thread 0" else "tc_cp_async16("
    barrier, ahead = loop.index("__syncthreads();", pending), loop.index(copy, pending)
    drain = loop.rindex("tc_wg_wait<0>();")
    assert issue < pending < barrier < ahead < drain
    # only the last iteration waits for its own gemm: nothing stays in flight across the loop's exit (D29)
    assert "tc_wg_commit(); tc_wg_wait<0>" not in loop and loop.count("tc_wg_commit(); tc_wg_wait<1>") == 1
    last = loop.index("if ((ko == 7)) {")
    assert pending < last < loop.index("tc_wg_wait<0>();", last) < barrier


@needs_toolchain
def test_stages_arrive_by_bulk_tile_copies_on_transaction_barriers():
    """sm_90a, thread 0 issuing: each stage of A and B is one TMA load per 128-byte panel (A_s 128x64: one,
    B_s 64x128: two), issued by thread 0 after announcing the stage's bytes on the stage's mbarrier; every
    thread waits on that barrier for the phase of the stage's parity; the tensor maps go to the launch (box =
    one panel)."""
    k = _compile(gemm(512, 512, 512, 128, 128, 64, stages=3), **COPIES["thread 0"])
    note = k.meta["attrs"]["pipelines"][0]
    assert "A_s bulk tile copies (1 x 128-byte panel(s)), B_s bulk tile copies (2 x 128-byte panel(s))" in note
    assert "warp-specialized" not in note
    src = k.get_kernel_source().split("__global__")[-1]
    loop = src[src.index("for (long long ko"):]
    assert loop.count("tc_tma_load_2d(") == 3
    assert "tc_mbar_expect_tx(tc_smem_addr(A_s_full + (tc_floormod((ko + 2), 3))), 32768u);" in loop
    assert "tc_mbar_wait(tc_smem_addr(A_s_full + (tc_floormod(ko, 3))), tc_floormod(tc_floordiv(ko, 3), 2));" in loop
    maps = k.meta["source"]["meta"]["tensor_maps"]
    # A's and B's, then C's (the bulk-store epilogue, the general path's default since D51: 32 float columns a panel)
    assert [(m["arg"], m["box"], m["swizzle"]) for m in maps] == [(0, [64, 128], 3), (1, [64, 64], 3),
                                                                   (2, [32, 128], 3)]
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "UTMALDG" in sass and "SYNCS" in sass and "LDGSTS" not in sass


@needs_toolchain
@pytest.mark.parametrize("threads,regs", [(128, None), (256, 232)])
def test_a_producer_warpgroup_issues_the_stages_and_the_consumers_release_them(threads, regs):
    """tilecore.warp_specialize=True on sm_90a: the block gets one more warpgroup; its first thread waits until the consumers
    released a stage (its `empty` mbarrier, phase parity of the refill), announces and issues the stage; the
    kernel's own threads wait for each stage, keep one gemm running, release the previous stage, and meet at no
    block barrier inside the loop. With two consumer warpgroups the producer gives registers to them."""
    bn = 128 if threads == 128 else 256
    k = _compile(gemm(512, 512, 512, 128, bn, 64, threads=threads, stages=3), **COPIES["producer"])
    note = k.meta["attrs"]["pipelines"][0]
    assert f"warp-specialized: a producer group of 128 threads issues the stages, the kernel's {threads} threads" in note
    src = k.get_kernel_source().split("__global__")[-1]
    assert f"__launch_bounds__({threads + 128}{', 1' if regs else ''})" in src
    producer = src[src.index(f"if (((int)threadIdx.x) >= {threads})"):src.index("} else {")]
    consumer = src[src.index("} else {"):]
    assert "tc_mbar_wait(tc_smem_addr(A_s_empty + (tc_floormod(ko_stage, 3))), tc_floormod((tc_floordiv(ko_stage, 3) + 1), 2));" \
        in producer and producer.count("tc_tma_load_2d(") == 1 + bn // 64
    assert f"if (((int)threadIdx.x) == {threads})" in producer
    loop = consumer[consumer.index("for (long long ko"):consumer.rindex("tc_wg_wait<0>")]
    assert "tc_wg_commit(); tc_wg_wait<1>();" in loop and "bar.sync" not in loop and "__syncthreads" not in loop
    # the previous stage (ko - 1) % 3 spelled (ko + 2) % 3, released where ko > 0 (D62: nonnegative for the shifts)
    assert "tc_mbar_arrive(tc_smem_addr(A_s_empty + (tc_floormod((ko + 2), 3))));" in loop
    assert ("setmaxnreg" in src) == bool(regs) and (not regs or f"setmaxnreg.inc.sync.aligned.u32 {regs};" in consumer)
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "UTMALDG" in sass and "HGMMA" in sass


@needs_toolchain
def test_a_tile_whose_tensor_rows_are_not_whole_16_byte_units_keeps_per_thread_copies():
    """B with 777 columns (1554-byte rows): no tensor map can describe it; the note says so."""
    k = _compile(gemm(512, 777, 512, 128, 128, 32))
    note = k.meta["attrs"]["pipelines"][0]
    assert "no bulk copies: B_s: B's rows are not proven whole 16-byte units" in note
    assert "tc_tma_load" not in k.get_kernel_source().split("__global__")[-1]


def scaled_gemm(before: bool, M=256, N=256, K=256):
    """A pipelined GEMM whose loop also halves the accumulator, after its gemm (C = (C + A_k B_k) / 2 per k
    tile) or ``before`` it (C = C / 2 + A_k B_k)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, 128), T.ceildiv(M, 128), threads=128) as (bx, by):
            A_s = T.alloc_shared((128, 64), "float16")
            B_s = T.alloc_shared((64, 128), "float16")
            C_l = T.alloc_fragment((128, 128), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, 64), num_stages=3):
                T.copy(A[by * 128, ko * 64], A_s)
                T.copy(B[ko * 64, bx * 128], B_s)
                if before:
                    for i, j in T.Parallel(128, 128):
                        C_l[i, j] = C_l[i, j] * 0.5
                T.gemm(A_s, B_s, C_l)
                if not before:
                    for i, j in T.Parallel(128, 128):
                        C_l[i, j] = C_l[i, j] * 0.5
            T.copy(C_l, C[by * 128, bx * 128])

    return main


@needs_toolchain
def test_a_loop_that_uses_the_accumulator_after_its_gemm_waits_inside_the_loop():
    """Anything after the gemm in the loop body (here a scaling of the accumulator) needs its result: the
    gemm's group is waited for where it is closed, and the stage-ahead copies keep their place."""
    k = _compile(scaled_gemm(before=False))
    assert "runs on while" not in k.meta["attrs"]["pipelines"][0]
    assert "tc_wg_commit(); tc_wg_wait<0>();" in k.get_kernel_source() and "tc_wg_wait<1>" not in k.get_kernel_source()


@needs_toolchain
def test_a_loop_that_reads_the_accumulator_before_its_gemm_waits_inside_the_loop():
    k = _compile(scaled_gemm(before=True))
    assert "runs on while" not in k.meta["attrs"]["pipelines"][0]
    assert "tc_wg_wait<1>" not in k.get_kernel_source()


@needs_toolchain
def test_a_from_registers_takes_the_register_form_and_b_the_descriptor():
    k = _compile(two_gemms(128, 64))
    src = k.get_kernel_source()
    assert "tc_wgmma_rs_f16_n64_t1::run" in src  # P (registers) x V (shared, MN-major)
    assert "tc_wgmma_f16_n64_t0::run" in src     # Q x K^T, both from shared memory
    assert "P" not in k.meta["attrs"]["shared_layouts"]


@needs_toolchain
@pytest.mark.parametrize("copies", ["thread 0", "cp.async"])
def test_a_tile_copied_once_arrives_by_one_bulk_copy_and_needs_no_block_barrier(copies):
    """Q, K and V copied outside any pipelined loop: on sm_90a each is one TMA load per panel on a barrier of
    its own, waited for by every thread; the gemms then read tiles only TMA wrote, so they meet at no block
    barrier and need no proxy fence (tilecore.bulk_copy=False: cp.async, a barrier, the fence)."""
    k = _compile(two_gemms(128, 64), **COPIES[copies])
    body = k.get_kernel_source().split("__global__")[-1]
    gemms = body[body.index("tc_wgmma_f16_n64_t0::run") - 400:]
    if copies == "thread 0":
        for t in ("Q_s", "K_s", "V_s"):
            assert f"tc_mbar_wait(tc_smem_addr({t}_full + (0)), 0);" in body
        assert body.count("tc_tma_load_2d(") == 3 and "tc_cp_async16" not in body
        assert "tc_wg_fence_proxy" not in gemms and "__syncthreads" not in gemms[:gemms.index("tc_wg_wait<0>")]
    else:
        assert "tc_tma_load" not in body and "tc_cp_async16" in body and "tc_wg_fence_proxy(); __syncthreads();" in body


@needs_toolchain
def test_the_off_form_gemm_takes_wgmma_by_default():
    """The GEMM whose B rows (1554 bytes) rule out the register programs' copies: the core's general path,
    now on wgmma (B's tile is filled by element stores through the paneled layout)."""
    k = tilecore.compile(gemm(512, 777, 512, 128, 128, 32), target=HOPPER, pass_configs=NOCACHE)
    assert "tc_wgmma_f16_n128_t1::run" in k.get_kernel_source()


@needs_toolchain
def test_a_tile_no_descriptor_reads_keeps_mma_sync():
    """B's 24-column tile (48-byte rows) is not whole swizzle panels: the gemm runs on mma.sync
    (tests/test_matrix_gemm.py checks the reason the plan gives)."""
    k = _compile(gemm(128, 48, 128, 64, 24, 16))
    assert "tc_mma_16816_r" in k.get_kernel_source() and "tc_wgmma" not in k.get_kernel_source()


def test_pass_configs_from_the_environment(monkeypatch):
    monkeypatch.setenv("TILECORE_PASS_CONFIGS", '{"tilecore.cuda.register_programs": false}')
    k = tilecore.compile(gemm(256, 256, 256, 128, 128, 32), target=HOPPER, pass_configs=NOCACHE)
    assert "general path" in " | ".join(k.meta["attrs"].get("hopper_pipelines", ()))
    monkeypatch.setenv("TILECORE_PASS_CONFIGS", "[1]")
    with pytest.raises(tilecore.errors.CompileError, match="JSON object"):
        tilecore.compile(gemm(256, 256, 256, 128, 128, 32), target=HOPPER, pass_configs=NOCACHE)


# -- on an sm_90 GPU ---------------------------------------------------------------------------------------

def _run(k, *arrays):
    import torch

    ts = [torch.from_numpy(a).cuda() for a in arrays]
    k(*ts)
    torch.cuda.synchronize()
    return ts[-1].cpu().numpy()


def _operands(rng, shape, dtype):
    import torch

    x = rng.standard_normal(shape).astype(np.float32)
    t = torch.from_numpy(x).to(getattr(torch, dtype))
    return t.float().numpy().astype(np.float64), t


@hopper_gpu
@pytest.mark.parametrize("copies", sorted(COPIES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_wgmma_gemm_matches_float64(case, copies):
    import torch

    args, _ = CASES[case]
    M, N, K, dt = args["M"], args["N"], args["K"], args.get("dtype", "float16")
    rng = np.random.default_rng(7)
    a64, a = _operands(rng, (K, M) if args.get("ta") else (M, K), dt)
    b64, b = _operands(rng, (N, K) if args.get("tb") else (K, N), dt)
    k = _compile(gemm(**args), **COPIES[copies])
    note = k.meta["attrs"]["pipelines"][0]
    assert ("bulk tile copies" in note) == (copies != "cp.async") and ("warp-specialized" in note) == (copies == "producer")
    c = torch.zeros((M, N), dtype=torch.float32, device="cuda")
    k(a.cuda(), b.cuda(), c)
    ref = (a64.T if args.get("ta") else a64) @ (b64.T if args.get("tb") else b64)
    np.testing.assert_allclose(c.cpu().numpy(), ref, rtol=2e-3, atol=2e-3 * np.sqrt(K))


@hopper_gpu
def test_wgmma_a_from_registers_matches_float64():
    import torch

    rng = np.random.default_rng(3)
    q64, q = _operands(rng, (128, 64), "float16")
    k64, kk = _operands(rng, (64, 64), "float16")
    v64, v = _operands(rng, (64, 64), "float16")
    k = _compile(two_gemms(128, 64))
    o = torch.zeros((128, 64), dtype=torch.float32, device="cuda")
    k(q.cuda(), kk.cuda(), v.cuda(), o)
    p = (q64 @ k64.T).astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(o.cpu().numpy(), p @ v64, rtol=5e-3, atol=5e-2)


@hopper_gpu
def test_wgmma_off_form_gemm_matches_float64():
    import torch

    rng = np.random.default_rng(5)
    a64, a = _operands(rng, (512, 512), "float16")
    b64, b = _operands(rng, (512, 777), "float16")
    k = tilecore.compile(gemm(512, 777, 512, 128, 128, 32), target=HOPPER, pass_configs=NOCACHE)
    c = torch.zeros((512, 777), dtype=torch.float32, device="cuda")
    k(a.cuda(), b.cuda(), c)
    np.testing.assert_allclose(c.cpu().numpy(), a64 @ b64, rtol=2e-3, atol=2e-3 * np.sqrt(512))


@hopper_gpu
@pytest.mark.parametrize("before", [False, True])
def test_wgmma_loop_that_scales_the_accumulator_matches_float64(before):
    """Work on the accumulator after the gemm (C = (C + A_k B_k) / 2) or before it (C = C / 2 + A_k B_k)."""
    import torch

    M = N = K = 256
    rng = np.random.default_rng(11)
    a64, a = _operands(rng, (M, K), "float16")
    b64, b = _operands(rng, (K, N), "float16")
    c = torch.zeros((M, N), dtype=torch.float32, device="cuda")
    _compile(scaled_gemm(before=before))(a.cuda(), b.cuda(), c)
    ref = np.zeros((M, N))
    for ko in range(K // 64):
        prod = a64[:, ko * 64:(ko + 1) * 64] @ b64[ko * 64:(ko + 1) * 64]
        ref = ref * 0.5 + prod if before else (ref + prod) * 0.5
    np.testing.assert_allclose(c.cpu().numpy(), ref, rtol=2e-3, atol=2e-2)


def half_gemm(M, N, K, bm, bn, bk):
    """The README's GEMM with a float16 C, 128 threads and 2 stages (test_cuda_hopper.gemm)."""
    return hopper_gemm(M, N, K, bm=bm, bn=bn, bk=bk, threads=128, stages=2)


@needs_toolchain
def test_no_accumulator_is_read_before_the_last_wgmma_wait_in_the_sass():
    """The compile-only half of the regression below: between the last HGMMA and the wait for it
    (WARPGROUP.DEPBAR 0) the SASS converts and stores nothing (70 such instructions before the fix)."""
    k = _compile(half_gemm(1024, 1024, 1024, 128, 128, 32), **{"tilecore.vectorize": False})
    lines = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target).splitlines()
    last = max(i for i, ln in enumerate(lines) if "HGMMA" in ln)
    wait = next(i for i in range(last, len(lines)) if "DEPBAR.LE gsb0, 0x0" in lines[i])
    assert not [ln for ln in lines[last:wait] if "F2FP" in ln or "STG" in ln]


@hopper_gpu
@pytest.mark.parametrize("vectorize", [True, False])
def test_no_gemm_stays_in_flight_across_the_loop_exit(vectorize):
    """Regression (D29): with the last iteration's gemm left running past the loop, ptxas (CUDA 13.0) scheduled
    the element-by-element epilogue's reads of the accumulators above the drain's wait at 128x128x32 with 2
    stages (3% of C wrong on an H200); the last iteration now waits for its own gemm."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16, generator=g) / 8
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.float16, generator=g) / 8
    k = _compile(half_gemm(1024, 1024, 1024, 128, 128, 32), **{"tilecore.vectorize": vectorize})
    c = torch.empty(1024, 1024, device="cuda", dtype=torch.float16)
    k(a, b, c)
    torch.cuda.synchronize()
    assert float((c.float() - a.float() @ b.float()).abs().max()) < 2e-2
