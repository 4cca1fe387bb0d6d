"""Split-K on the core's general path and the IR it needs (decision D69).

- ``T.atomic_add(..., return_prev=True)`` (an :class:`~tilecore.ir.AtomicRet`), ``T.fence`` and kept workspaces:
  on the CPU reference (blocks as OpenMP iterations, one or two threads), the CUDA source (the PTX spellings), and
  refusals where a target spells none;
- ``tilecore.split_k``: on the CPU reference against float64 and bit for bit across calls (the counters reset by
  the last block: no fill between calls), "auto"'s choice, the refusals; the CUDA source of the general path's split
  GEMM (the partial stores, the arrival, the split-order sum before the bulk store) compiled by NVRTC;
- on an sm_90 GPU (skipped here): the LLM rows and ragged shapes against float64, bit for bit across calls and
  across two streams' workspaces.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.errors import CompileError

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from test_cuda_backend import needs_toolchain  # noqa: E402
from test_cuda_hopper import hopper_gpu  # noqa: E402
from cuda_gemm import matmul  # noqa: E402

NOCACHE = {"tilecore.disable_cache": True}


def tickets(n=64, blocks=4, order=None):
    @T.prim_func
    def k(cnt: T.Tensor((1,), "int32"), out: T.Tensor((n * blocks,), "int32")):
        with T.Kernel(blocks, threads=64) as bx:
            for i in T.Parallel(n):
                out[bx * n + i] = T.atomic_add(cnt[0], 1, memory_order=order, return_prev=True)

    return k


def test_atomic_return_prev_cpu_gives_every_ticket_once():
    k = tilecore.compile(tickets(), target="cpu", pass_configs=NOCACHE)
    cnt, out = np.array([5], np.int32), np.zeros(256, np.int32)
    k(cnt, out)
    assert cnt[0] == 5 + 256
    assert sorted(out.tolist()) == list(range(5, 5 + 256))


def test_atomic_return_prev_ir_and_orders():
    k = tilecore.compile(tickets(order="acq_rel"), target="cpu", pass_configs=NOCACHE)
    assert "__atomic_fetch_add(" in k.source.code and "__ATOMIC_ACQ_REL" in k.source.code
    with pytest.raises(Exception, match="memory_order 'bogus'"):
        tickets(order="bogus")


def test_return_prev_of_a_region_is_refused():
    with pytest.raises(Exception, match="return_prev=True\\) takes one element"):
        @T.prim_func
        def k(a: T.Tensor((16,), "int32"), b: T.Tensor((16,), "int32")):
            with T.Kernel(1, threads=16) as bx:
                T.atomic_add(a[0:16], b[0:16], return_prev=True)


@needs_toolchain
def test_atomic_return_prev_and_fence_cuda_spelling():
    @T.prim_func
    def k(cnt: T.Tensor((1,), "int32"), out: T.Tensor((64,), "int32")):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(64):
                out[i] = T.atomic_add(cnt[0], 1, memory_order="release", return_prev=True)
            T.fence("device", "acq_rel")

    src = tilecore.compile(k, target="cuda:sm_90a", pass_configs=NOCACHE).source.code
    assert "atom.release.gpu.global.add.s32" in src
    assert "fence.acq_rel.gpu" in src


def test_fence_is_refused_where_not_spelled():
    from tilecore.codegen.cfamily import CFamilyEmitter
    from tilecore.codegen import EmitState
    from tilecore.ir import Fence

    with pytest.raises(CompileError, match="no such memory fence"):
        CFamilyEmitter().stmt_Fence(EmitState(), Fence(scope="device", order="release"))
    with pytest.raises(ValueError, match="fence order"):
        Fence(scope="device", order="relaxed")


def test_atomic_return_prev_refused_where_not_spelled():
    from tilecore.codegen.cfamily import CFamilyEmitter
    from tilecore.codegen import EmitState
    from tilecore.ir import AtomicRet, Buffer

    e = AtomicRet("add", Buffer("c", (1,), "int32", "global"), (0,), 1)
    with pytest.raises(CompileError, match="no atomic that returns the old value"):
        CFamilyEmitter().expr(EmitState(), e)


def test_atomics_are_never_the_same_value():
    from tilecore.ir import AtomicRet, Buffer, same, simplify

    b = Buffer("c", (1,), "int32", "global")
    a1, a2 = AtomicRet("add", b, (0,), 1), AtomicRet("add", b, (0,), 1)
    assert same(a1, a1) and not same(a1, a2)
    from tilecore.ir import const_value
    assert const_value(simplify(a1 - a2)) is None  # not folded to 0


def _cpu_gemm(M, N, K, bm, bn, bk, split, dtype="float32"):
    f = matmul(M, N, K, bm, bn, bk, threads=128, num_stages=2, dtype=dtype, accum="float32")
    return tilecore.compile(f, target="cpu", pass_configs={**NOCACHE, "tilecore.split_k": split})


@pytest.mark.parametrize("M,N,K,split", [(64, 64, 512, 4), (40, 72, 256, 2), (32, 32, 1024, 8)])
def test_split_k_cpu_matches_float64_and_is_bit_identical(M, N, K, split):
    k = _cpu_gemm(M, N, K, 32, 32, 32, split)
    notes = k.meta.get("attrs", {}).get("split_k")
    assert notes and f"split over {split} blocks" in notes[0]
    rng = np.random.default_rng(1)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    outs = []
    for _ in range(3):  # the counters reset themselves: the second and third calls see zeros again
        C = np.zeros((M, N), np.float32)
        k(A, B, C)
        outs.append(C)
    assert np.abs(outs[0] - ref).max() < 1e-3 * np.sqrt(K)
    assert all(np.array_equal(o, outs[0]) for o in outs[1:])
    # the split sum is not the unsplit loop's (other additions): it is its own, in split order
    k1 = _cpu_gemm(M, N, K, 32, 32, 32, False)
    C1 = np.zeros((M, N), np.float32)
    k1(A, B, C1)
    assert np.abs(C1 - outs[0]).max() < 1e-3 * np.sqrt(K)


def test_split_k_cpu_one_thread_runs_blocks_one_after_another():
    """With OMP_NUM_THREADS=1 the blocks run in grid order: the last split's block sums; with two threads in any
    order; both give the same bits (the sum is in split order whoever sums)."""
    code = r"""
import sys, numpy as np, tilecore
sys.path.insert(0, %r)
from cuda_gemm import matmul
k = tilecore.compile(matmul(64, 64, 512, 32, 32, 32, threads=128, num_stages=2, dtype="float32", accum="float32"),
                     target="cpu", pass_configs={"tilecore.split_k": 4})
rng = np.random.default_rng(2)
A = rng.standard_normal((64, 512)).astype(np.float32); B = rng.standard_normal((512, 64)).astype(np.float32)
C = np.zeros((64, 64), np.float32); k(A, B, C); sys.stdout.buffer.write(C.tobytes())
""" % str(Path(__file__).parent.parent / "benchmarks")
    outs = []
    for threads in ("1", "2"):
        env = dict(os.environ, OMP_NUM_THREADS=threads)
        outs.append(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True).stdout)
    assert len(outs[0]) == 64 * 64 * 4 and outs[0] == outs[1]


def test_split_k_uneven_cpu_matches_float64_and_is_bit_identical():
    """tilecore.split_k_uneven (D75): 3 splits of 16 k tiles (5, 5, 6) on the CPU reference: within the bound, the
    same bits every call, and the refusal without it names the option."""
    f = matmul(64, 64, 512, 32, 32, 32, threads=128, num_stages=2, dtype="float32", accum="float32")
    k = tilecore.compile(f, target="cpu", pass_configs={**NOCACHE, "tilecore.split_k": 3, "tilecore.split_k_uneven": True})
    assert "5-6 of 16 k tiles" in k.meta["attrs"]["split_k"][0]
    rng = np.random.default_rng(4)
    A = rng.standard_normal((64, 512)).astype(np.float32)
    B = rng.standard_normal((512, 64)).astype(np.float32)
    outs = []
    for _ in range(2):
        C = np.zeros((64, 64), np.float32)
        k(A, B, C)
        outs.append(C)
    assert np.abs(outs[0] - A.astype(np.float64) @ B.astype(np.float64)).max() < 1e-3 * np.sqrt(512)
    assert np.array_equal(outs[0], outs[1])
    with pytest.raises(CompileError, match="split_k_uneven=True"):
        _cpu_gemm(64, 64, 512, 32, 32, 32, 3)


def test_split_k_refusals():
    with pytest.raises(CompileError, match="do not divide into 3 equal splits"):
        _cpu_gemm(64, 64, 512, 32, 32, 32, 3)
    with pytest.raises(CompileError, match="expected False"):
        _cpu_gemm(64, 64, 512, 32, 32, 32, "sometimes")

    @T.prim_func
    def copy_only(a: T.Tensor((64,), "float32"), b: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(64):
                b[i] = a[i]

    with pytest.raises(CompileError, match="cannot be split over K: 0 top-level pipelined loops"):
        tilecore.compile(copy_only, target="cpu", pass_configs={**NOCACHE, "tilecore.split_k": 2})
    # "auto" leaves it alone
    tilecore.compile(copy_only, target="cpu", pass_configs={**NOCACHE, "tilecore.split_k": "auto"})


@needs_toolchain
def test_split_k_auto_rule_on_sm90():
    """"auto" takes the plugin's rule (D31): 32 tiles of 128x128 on 132 SMs -> min(4, 64 // 16, 16) = 4 splits, fewer
    while the tail's partial reads outweigh a split's operand bytes; 16x8192x8192 at 64x128: 64 tiles -> 2."""
    def auto(M, N, K, bm, bn, bk, th, st):
        k = tilecore.compile(matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st), target="cuda:sm_90a",
                             pass_configs={**NOCACHE, "tilecore.cuda.general_plain_gemm": True, "tilecore.split_k": "auto"})
        return k.meta.get("attrs", {}).get("split_k"), k.source.meta["grid"]

    notes, grid = auto(128, 4096, 4096, 128, 128, 64, 256, 4)
    assert grid == ["32", "1", "4"] and "split over 4 blocks" in notes[0]
    notes, grid = auto(16, 8192, 8192, 64, 128, 64, 128, 4)
    assert grid[2] == "2"
    notes, grid = auto(4096, 4096, 4096, 128, 128, 64, 256, 4)  # 1024 tiles: not split
    assert notes is None and grid[2] == "1"


@needs_toolchain
def test_split_k_general_path_cuda_source():
    k = tilecore.compile(matmul(128, 4096, 4096, 128, 128, 64, threads=256, num_stages=4), target="cuda:sm_90a",
                         pass_configs={**NOCACHE, "tilecore.cuda.general_plain_gemm": True, "tilecore.split_k": 4})
    src, meta = k.source.code, k.source.meta
    assert meta["grid"] == ["32", "1", "4"]
    # 32 tiles x 4 splits x 64 registers x 256 threads float32, then the counters at a 256-byte offset
    assert meta["workspace"]["bytes"] == 32 * 4 * 64 * 256 * 4 + 32 * 4
    assert "reinterpret_cast<float*>(__builtin_assume_aligned(tc_workspace + 0, 16))" in src
    assert "reinterpret_cast<int*>(__builtin_assume_aligned(tc_workspace + 8388608, 16))" in src
    assert "atom.acq_rel.gpu.global.add.s32" in src and "fence.acq_rel.gpu" not in src
    # 16 float4 partial stores; the last block's sum once per split index, each with the other 3 splits' loads
    assert src.count("tc_vst<tc_vecn<float, 4>>(&vtc_splitk_parts[") == 16
    assert src.count("vtc_splitk_parts[") == 16 + 4 * 64 * 3
    assert "__builtin_assume_aligned(tc_workspace + 0, 16)" in src
    scalar = tilecore.compile(matmul(128, 4096, 4096, 128, 128, 64, threads=256, num_stages=4), target="cuda:sm_90a",
                              pass_configs={**NOCACHE, "tilecore.cuda.general_plain_gemm": True, "tilecore.split_k": 4,
                                            "tilecore.split_k_partials": "scalar"}).source.code
    assert scalar.count("vtc_splitk_parts[") == 64 + 64 * 4  # 64 partial stores, 64 sums of 4 loads
    body = src[src.index("tc_atom_add_acq_rel_device_int32(&"):]
    assert body.index("vtc_splitk_count[") < body.index("tc_tma_store_2d(")  # the reset, then the bulk store
    # the arrival between two block barriers: every thread's partial stores before it, the last block's sum after it
    head = src[:src.index("vtc_splitk_last[0] = tc_atom_add_acq_rel_device_int32(&")]
    assert head.rstrip().endswith("__syncthreads();\n  if ((((int)threadIdx.x) == 0)) {")
    assert body.index("__syncthreads();") < body.index("vtc_splitk_last[0] == 3")
    fenced = tilecore.compile(matmul(128, 4096, 4096, 128, 128, 64, threads=256, num_stages=4), target="cuda:sm_90a",
                              pass_configs={**NOCACHE, "tilecore.cuda.general_plain_gemm": True, "tilecore.split_k": 4,
                                            "tilecore.split_k_fences": True}).source.code
    assert fenced.count("fence.acq_rel.gpu") == 2  # every thread's release after its stores, acquire before its sum
    assert "tc_wgmma_splitk" not in src  # not the plugin's pipeline


@needs_toolchain
def test_split_k_partials_sass():
    """The default partials: 16-byte stores and loads (STG.E.128 / LDG.E.128), no local memory."""
    import re

    import tilecore_cuda

    k = tilecore.compile(matmul(128, 4096, 4096, 128, 128, 64, threads=256, num_stages=4), target="cuda:sm_90a",
                         pass_configs={**NOCACHE, "tilecore.cuda.general_plain_gemm": True, "tilecore.split_k": 4})
    try:
        sass = tilecore_cuda.CUDABackend().disassemble(k.binary, None)
    except SystemExit as e:  # no cuobjdump here
        pytest.skip(str(e))
    ops = re.findall(r"\b((?:LDG|STG)\.[\w.]+)", sass)
    assert ops.count("STG.E.128") == 16 and ops.count("STG.E") == 1  # the partial; the counter's reset
    assert ops.count("LDG.E.128") >= 4 * 3 * 16 * 3 // 4  # most of the 4 versions' 3 x 16 float4 loads
    assert "LDL" not in sass and "STL" not in sass


@needs_toolchain
def test_core_split_k_needs_the_general_path():
    with pytest.raises(CompileError, match="general_plain_gemm"):
        tilecore.compile(matmul(128, 4096, 4096, 128, 128, 64, threads=256, num_stages=4), target="cuda:sm_90a",
                         pass_configs={**NOCACHE, "tilecore.cuda.general_plain_gemm": False, "tilecore.split_k": 4})


# -- on an sm_90 GPU ----------------------------------------------------------------------------------------------
def _check_on_gpu(k, M, N, K, seed, dtype="float16", out_dtype="float16"):
    """``k(A, B, C)`` on random A, B (``seed``; 8-bit: drawn in float32, B given as (N, K)): C (NaN before each call)
    within the float64 bound and the same bits over three more calls (the counters and the group's barriers reset
    themselves); returns A, B and C."""
    import torch

    torch.manual_seed(seed)
    tt = {"float16": torch.float16, "float32": torch.float32, "float8_e4m3": torch.float8_e4m3fn}
    if dtype == "float8_e4m3":
        A, B = torch.randn(M, K, device="cuda").to(tt[dtype]), torch.randn(N, K, device="cuda").to(tt[dtype])
        ref = A.double() @ B.double().t()
    else:
        A = torch.randn(M, K, device="cuda", dtype=tt[dtype])
        B = torch.randn(K, N, device="cuda", dtype=tt[dtype])
        ref = A.double() @ B.double()
    C = torch.full((M, N), float("nan"), device="cuda", dtype=tt[out_dtype])
    k(A, B, C)
    first = C.clone()
    err = (first.double() - ref).abs()
    ulp = 2 ** -10 if out_dtype == "float16" else 2 ** -20
    # the 8-bit wgmma's accumulation is not float32's: test_general_fp8's bound, 3e-3 of max |ref| a 1024 of K (D67)
    eight = 3e-3 * max(1.0, K / 1024) * float(ref.abs().max()) if dtype == "float8_e4m3" else 0.0
    assert (err <= K ** 0.5 * 8e-3 + eight + ref.abs() * ulp).all(), err.max()
    for _ in range(3):
        C.fill_(float("nan"))
        k(A, B, C)
        assert torch.equal(C, first)
    return A, B, first


@hopper_gpu
@pytest.mark.parametrize("M,N,K,tile,split", [
    (128, 4096, 4096, (128, 128, 64, 256, 4), 4), (16, 8192, 8192, (64, 128, 64, 128, 4), 4),
    (16, 8192, 8192, (64, 256, 64, 128, 3), 8), (100, 1000, 2048, (64, 128, 64, 128, 4), 4),
    (128, 4096, 4096, (128, 128, 64, 256, 4), "auto")])
def test_split_k_on_gpu_against_float64(M, N, K, tile, split):
    import torch

    bm, bn, bk, th, st = tile
    k = tilecore.compile(matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st), target="cuda",
                         pass_configs={"tilecore.cuda.general_plain_gemm": True, "tilecore.split_k": split})
    A, B, first = _check_on_gpu(k, M, N, K, 0)
    s = torch.cuda.Stream()  # another stream: its own workspace, the same bits
    with torch.cuda.stream(s):
        C2 = torch.empty_like(first)
        k(A, B, C2)
    torch.cuda.synchronize()
    assert torch.equal(C2, first)


@hopper_gpu
@pytest.mark.parametrize("M,N,K,tile,split", [
    (128, 4096, 4096, (128, 128, 64, 256, 4), 2), (128, 4096, 4096, (64, 128, 64, 128, 4), 2),
    (16, 8192, 8192, (64, 128, 64, 128, 4), 2), (16, 8192, 8192, (64, 128, 64, 128, 4), 4),
    (100, 1000, 2048, (64, 128, 64, 128, 4), 4), (128, 4096, 4096, (128, 64, 64, 256, 4), 2),
    (128, 4096, 4096, (128, 128, 64, 256, 4), (2, "stages")), (100, 1000, 2048, (64, 128, 64, 128, 2), 4),
    (16, 8192, 8192, (64, 128, 64, 128, 4), (2, "auto", "copy_barrier")),
    (100, 1000, 2048, (64, 128, 64, 128, 2), (4, "auto", "copy_barrier")),
    (128, 4096, 4096, (128, 128, 64, 256, 5), (3, "auto", "barrier", True)),
    (100, 1000, 2048, (64, 128, 64, 128, 4), (3, "auto", "copy_barrier", True)),
    (128, 4096, 4096, (128, 128, 64, 256, 5), (3, "auto", "barrier", True, "rank0")),
    (100, 1000, 2048, (64, 128, 64, 128, 4), (4, "auto", "copy_barrier", False, "rank0")),
    (16, 8192, 8192, (64, 128, 64, 128, 4), (2, "auto", "barrier", False, "slices")),
    (16, 8192, 8192, (64, 128, 64, 128, 4), (4, "stages", "barrier", False, "slices")),
    (16, 8192, 8192, (64, 128, 64, 128, 4), (2, "auto", "copy_barrier", False, "rank0")),
    (128, 4096, 4096, (64, 128, 64, 128, 4), (2, "auto", "barrier", False, "rank0")),
    (100, 1000, 2048, (64, 128, 64, 128, 4), (2, "auto", "barrier", False, "panels")),
    (16, 8192, 8192, (64, 256, 64, 128, 3), (4, "auto", "barrier", False, "panels"))])
def test_split_k_group_on_gpu_against_float64_and_the_workspace_bits(M, N, K, tile, split):
    """D75: the tile's splits one block group (a cluster), summed in block memory (all into rank 0, or in slices then
    gathered; the areas beside or over the stages; a group barrier or transaction barriers; equal or uneven splits):
    within the float64 bound, bit for bit every call, and the workspace form's bits (the same additions in the same
    order)."""
    _group_on_gpu(M, N, K, tile, split)


@hopper_gpu
@pytest.mark.parametrize("M,N,K,tile,split", [
    (128, 4096, 4096, (128, 128, 64, 256, 5), (3, "auto", "barrier", True, "cells")),
    (128, 4096, 4096, (128, 128, 64, 256, 5), (3, "stages", "barrier", True, "cells")),
    (16, 8192, 8192, (64, 256, 64, 128, 3), (3, "auto", "barrier", True, "cells")),
    (64, 8192, 8192, (64, 256, 64, 128, 3), (3, "auto", "barrier", True, "cells")),
    (100, 1000, 2048, (64, 128, 64, 128, 4), (3, "auto", "barrier", True, "cells")),
    (128, 4096, 4096, (128, 128, 64, 256, 4), (4, "auto", "barrier", False, "cells")),
    (200, 1000, 4096, (128, 128, 64, 256, 4), (3, "stages", "barrier", True, "auto")),
    (128, 4096, 4096, (128, 128, 64, 256, 5), (3, "auto", "barrier", True, "slices")),
    (100, 904, 2048, (64, 128, 64, 128, 4), (3, "auto", "barrier", True, "cells")),
    (128, 4000, 4096, (128, 128, 64, 256, 5), (3, "auto", "barrier", True, "cells")),
    (16, 8192, 8192, (128, 128, 64, 256, 4), (2, "auto", "barrier", False, "cells"))])
def test_split_k_group_in_cells_on_gpu_against_float64_and_the_workspace_bits(M, N, K, tile, split):
    """D78: the splits summed in cells (rows x one panel, each block summing and bulk-storing a run of them: 3 splits
    of the plugin's 128x128 and 64x256 tiles, 4 of two panels, ragged shapes (D84: 904 / 4000 columns, the last tile's
    second panel past C, not exchanged; 2 splits of a 128-row tile at M 16, only the first band live); the area beside
    the stages, with the
    staging tile over it, or over the stages), and D75's slices at 3 splits beside them: within the float64 bound, bit for bit every call, the workspace form's bits."""
    _group_on_gpu(M, N, K, tile, split)


def _group_on_gpu(M, N, K, tile, split):
    import torch

    bm, bn, bk, th, st = tile
    given = split if isinstance(split, tuple) else (split,)
    split, area, sync, uneven, gsum = given + (None, "auto", "barrier", False, "auto")[len(given):]
    cfg = {"tilecore.cuda.general_plain_gemm": True, "tilecore.split_k": split, "tilecore.split_k_uneven": uneven,
           "tilecore.split_k_group_sum": gsum}
    kg = tilecore.compile(matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st), target="cuda",
                          pass_configs={**cfg, "tilecore.split_k_reduce": "group", "tilecore.split_k_group_area": area,
                                        "tilecore.split_k_group_sync": sync})
    assert kg.source.meta["cluster"] == [1, 1, split] and "workspace" not in kg.source.meta
    kw = tilecore.compile(matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st), target="cuda", pass_configs=cfg)
    A, B, first = _check_on_gpu(kg, M, N, K, 1)
    Cw = torch.empty_like(first)
    kw(A, B, Cw)
    torch.cuda.synchronize()
    assert torch.equal(Cw, first)


@hopper_gpu
@pytest.mark.parametrize("M,N,K,tile", [(128, 4096, 4096, (64, 128, 64, 128, 4)), (16, 8192, 8192, (64, 128, 64, 128, 4)),
                                        (128, 4096, 4096, (128, 64, 64, 256, 4))])
def test_routed_group_on_gpu_against_float64(M, N, K, tile):
    """D75: the plugin's split GEMM routed to the core (tilecore.cuda.general_split_k="group"), summed in groups of 2
    (the peers' stores on rank 0's transaction barrier); float64 bound, bit for bit every call."""
    bm, bn, bk, th, st = tile
    k = tilecore.compile(matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st), target="cuda",
                         pass_configs={"tilecore.cuda.general_split_k": "group"})
    assert k.source.meta.get("cluster") == [1, 1, 2]
    _check_on_gpu(k, M, N, K, 2)


@hopper_gpu
@pytest.mark.parametrize("M,N,K,tile", [(128, 4096, 4096, (128, 128, 64, 256, 5)), (16, 8192, 8192, (64, 256, 64, 128, 3)),
                                        (32, 4096, 14336, (128, 128, 64, 256, 4))])
def test_routed_cells_on_gpu_against_float64(M, N, K, tile):
    """D78: the plugin's 3-split GEMMs at its default tiles routed to the core's sum in cells
    (tilecore.cuda.general_split_k_cells=True): float64 bound, bit for bit every call."""
    bm, bn, bk, th, st = tile
    k = tilecore.compile(matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st), target="cuda",
                         pass_configs={"tilecore.cuda.general_split_k_cells": True})
    assert k.source.meta.get("cluster") == [1, 1, 3] and "summed in cells" in k.meta["attrs"]["split_k"][0]
    _check_on_gpu(k, M, N, K, 3)


#: D84: the options that route the plugin's 8-bit / 32-bit-C split GEMMs to the core's group sum
WIDE = {"tilecore.cuda.general_split_k_8bit": True, "tilecore.cuda.general_split_k_c32": True}


@hopper_gpu
@pytest.mark.parametrize("M,N,K,tile,dtype,out,cells", [
    (128, 4096, 4096, (128, 128, 128, 256, 4), "float8_e4m3", "float16", "auto"),
    (16, 8192, 8192, (64, 256, 128, 128, 3), "float8_e4m3", "float16", "auto"),
    (100, 1000, 4096, (64, 128, 128, 128, 4), "float8_e4m3", "float16", "auto"),
    (128, 4096, 4096, (64, 128, 64, 128, 4), "float16", "float32", "auto"),
    (128, 4096, 4096, (128, 128, 64, 256, 3), "float16", "float32", "auto"),
    (128, 4096, 4096, (128, 128, 64, 256, 5), "float16", "float32", True),
    (200, 1000, 4096, (64, 128, 64, 128, 4), "float16", "float32", "auto")])
def test_routed_wide_on_gpu_against_float64_and_the_workspace_bits(M, N, K, tile, dtype, out, cells):
    """D84: the plugin's split GEMMs with 8-bit operands or a 32-bit C routed to the core's group sum
    (tilecore.cuda.general_split_k_8bit / _c32; ``cells``: general_split_k_cells=True too, the area over the
    stages): within the float64 bound, bit for bit every call, and the bits of the core's workspace sum at the same
    count (the same additions in the same order)."""
    import torch

    bm, bn, bk, th, st = tile
    build = lambda: matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st, dtype=dtype, out_dtype=out,  # noqa: E731
                           b_transposed=dtype == "float8_e4m3")
    k = tilecore.compile(build(), target="cuda", pass_configs={**WIDE, "tilecore.cuda.general_split_k_cells": cells})
    split = k.source.meta.get("cluster", [1, 1, 1])[2]
    assert split > 1 and "workspace" not in k.source.meta and "split_k" in k.meta["attrs"], \
        k.meta["attrs"].get("hopper_pipelines")  # the core's group sum, not the plugin's cluster
    kw = tilecore.compile(build(), target="cuda", pass_configs={"tilecore.cuda.general_plain_gemm": True,
                                                                 "tilecore.split_k": split,
                                                                 "tilecore.split_k_uneven": True})
    A, B, first = _check_on_gpu(k, M, N, K, 4, dtype, out)
    Cw = torch.empty_like(first)
    kw(A, B, Cw)
    torch.cuda.synchronize()
    assert torch.equal(Cw, first)


@needs_toolchain
def test_the_clusters_at_once_warning_names_the_option_that_made_the_groups():
    """D84: the runtime's warning where the driver holds fewer clusters at once than the grid has names the option
    that made them (``meta["cluster_by"]``): the core's group sum asked for (tilecore.split_k_reduce), the plugin's
    split GEMM routed to it (tilecore.cuda.general_split_k), never the plugin's own tilecore.cuda.split_k_reduce."""
    from test_cuda_splitk import cluster_warnings

    tile = dict(threads=256, num_stages=5)
    routed = tilecore.compile(matmul(128, 4096, 4096, 128, 128, 64, **tile), target="cuda:sm_90a")
    assert routed.source.meta["cluster_by"] == ["tilecore.cuda.general_split_k", "tilecore.split_k_reduce"]
    said, asked = cluster_warnings(routed, 31)
    assert len(said) == 1 and "holds 31 clusters of 3 blocks at once, the grid has 32" in said[0], said
    assert "tilecore.cuda.general_split_k=False" in said[0] and "tilecore.cuda.split_k_reduce" not in said[0]
    assert cluster_warnings(routed, 32)[0] == []
    core = tilecore.compile(matmul(128, 4096, 4096, 64, 128, 64, threads=128, num_stages=4), target="cuda:sm_90a",
                            pass_configs={"tilecore.cuda.general_plain_gemm": True, "tilecore.split_k": 2,
                                          "tilecore.split_k_reduce": "group"})
    assert core.source.meta["cluster_by"] == ["tilecore.split_k_reduce"]
    said, _ = cluster_warnings(core, 40)
    assert len(said) == 1 and 'tilecore.split_k_reduce="workspace"' in said[0] and "cuda.split_k" not in said[0]
    plugin = tilecore.compile(matmul(128, 4096, 4096, 128, 128, 64, **tile), target="cuda:sm_90a",
                              pass_configs={"tilecore.cuda.general_split_k": False})
    assert "cluster_by" not in plugin.source.meta and plugin.source.meta["cluster"] == [1, 1, 3]
    assert 'tilecore.cuda.split_k_reduce="global"' in cluster_warnings(plugin, 31)[0][0]


def _route(M, N, K, tile, dtype="float16", out="float16", cfg=None):
    """(None, the plugin's kept-reason note or None, the launch's attributes) of a lowering."""
    from tilecore.compiler import lower
    from tilecore_cuda.hopper import SPLIT_K_KEPT

    bm, bn, bk, th, st = tile
    attrs = lower(matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st, dtype=dtype, out_dtype=out,
                         b_transposed=dtype == "float8_e4m3"), "cuda:sm_90a", {**NOCACHE, **(cfg or {})})[2].attrs
    notes = attrs.get("hopper_pipelines", ())
    kept = next((n[len(SPLIT_K_KEPT):] for n in notes if n.startswith(SPLIT_K_KEPT)), None)
    return None, kept, attrs


@pytest.mark.parametrize("tile,dtype,out,opt,form", [
    ((128, 128, 128, 256, 4), "float8_e4m3", "float16", "tilecore.cuda.general_split_k_8bit", "panels"),
    ((64, 256, 128, 128, 3), "float8_e4m3", "float16", "tilecore.cuda.general_split_k_8bit", "panels"),
    ((64, 128, 64, 128, 4), "float16", "float32", "tilecore.cuda.general_split_k_c32", "panels"),
    ((128, 128, 64, 256, 3), "float16", "float32", "tilecore.cuda.general_split_k_c32", "cells")])
def test_wide_split_route_options(tile, dtype, out, opt, form):
    """D84: with its option False the plugin keeps an 8-bit / 32-bit-C split GEMM and says why (the option); True
    routes it to the core's group sum (panels at 2 splits, cells at 3); the other type's option is not enough. By
    default ("auto" for both) each of these goes: the area beside the stages, C's 128 rows filling the tiles."""
    _, kept, attrs = _route(128, 4096, 4096, tile, dtype, out, {opt: False})
    assert "split_k" not in attrs and kept is not None and opt in kept and "False" in kept, kept
    _, kept, attrs = _route(128, 4096, 4096, tile, dtype, out, {opt: True})
    assert kept is None and f"summed in {form}" in attrs["split_k"][0], attrs.get("hopper_pipelines")
    other = ("tilecore.cuda.general_split_k_c32" if opt.endswith("8bit") else "tilecore.cuda.general_split_k_8bit")
    _, kept, attrs = _route(128, 4096, 4096, tile, dtype, out, {other: True, opt: False})
    assert "split_k" not in attrs and opt in kept
    _, kept, attrs = _route(128, 4096, 4096, tile, dtype, out)  # the defaults ("auto"): C's rows fill the tiles
    assert "split_k" in attrs and kept is None, kept


def test_wide_auto_routes_only_beside_the_stages():
    """D84: "auto" (both options' default) routes where the group's receive area lies beside the stages; over them
    (fp32 C's 64 KiB staging tile beside 5 stages of 128x128x64: the panels at 16x8192x8192, the cells at
    128x4096x4096) the plugin keeps it and says which option routes it (True does). 8-bit: the panels only, where C's
    rows fill a quarter of the tiles' rows; not the cells."""
    c32 = "tilecore.cuda.general_split_k_c32"
    for M, N, K, form in ((16, 8192, 8192, "panels"), (128, 4096, 4096, "cells")):
        _, kept, attrs = _route(M, N, K, (128, 128, 64, 256, 5), "float16", "float32")
        assert "split_k" not in attrs and f"{c32}=True" in kept, kept
        assert ("panels' area (32768 bytes) fits only over the stages" if form == "panels" else "'stages'") in kept
        _, kept, attrs = _route(M, N, K, (128, 128, 64, 256, 5), "float16", "float32",
                                {c32: True, "tilecore.cuda.general_split_k_cells": True})
        assert kept is None and f"summed in {form}" in attrs["split_k"][0] and "over its stages" in attrs["split_k"][0]
        _, kept, attrs = _route(M, N, K, (128, 128, 64, 256, 3), "float16", "float32")
        assert kept is None and "split_k" in attrs and "over its stages" not in attrs["split_k"][0]
    e8 = "tilecore.cuda.general_split_k_8bit"
    _, kept, attrs = _route(16, 8192, 8192, (64, 256, 128, 128, 3), "float8_e4m3", "float16")
    assert "split_k" not in attrs and "8-bit operands in cells" in kept and f"{e8}=True" in kept, kept
    _, kept, attrs = _route(16, 8192, 8192, (64, 256, 128, 128, 3), "float8_e4m3", "float16", {e8: True})
    assert kept is None and "summed in cells" in attrs["split_k"][0]
    # "auto": 8-bit panels only where C's rows fill a quarter of the tiles' rows (16 of 128: not; 16 of 64: yes)
    _, kept, attrs = _route(16, 8192, 8192, (128, 128, 128, 256, 4), "float8_e4m3", "float16")
    assert "split_k" not in attrs and "C's 16 rows fill less than 0.25 of the 128-row tiles'" in kept, kept
    _, kept, attrs = _route(16, 8192, 8192, (64, 128, 128, 128, 4), "float8_e4m3", "float16")
    assert kept is None and "summed in panels" in attrs["split_k"][0]
    _, kept, attrs = _route(16, 8192, 8192, (128, 128, 128, 256, 4), "float8_e4m3", "float16", {e8: True})
    assert kept is None and "summed in panels" in attrs["split_k"][0]


def test_split_route_reasons():
    """D84: the plugin's note says why a split GEMM stays there (the census's column): the pipeline's own option,
    the area rule, the receive bound, a one-panel tile; a routed one has no such note; a bad value is refused by name."""
    cases = [((128, 128, 64, 256, 5), "float16", "float32", {"tilecore.cuda.general_split_k_c32": True}, "'stages'"),
             ((128, 128, 128, 256, 4), "float8_e4m3", "float16", {"tilecore.cuda.general_split_k_8bit": False},
              "8-bit operands (tilecore.cuda.general_split_k_8bit=False)"),
             ((128, 256, 64, 256, 3), "float16", "float16", {}, "4 splits divide the tile's 4 panels"),
             ((128, 64, 64, 256, 3), "float16", "float16", {}, "1 128-byte panel"),
             ((128, 128, 64, 256, 5), "float16", "float16", {"tilecore.cuda.stage_release": "thread"},
              "own option tilecore.cuda.stage_release")]
    for tile, dt, out, cfg, why in cases:
        _, kept, attrs = _route(128, 4096, 4096, tile, dt, out, cfg)
        assert kept is not None and why in kept, (tile, kept)
    _, kept, attrs = _route(16, 8192, 8192, (128, 256, 64, 256, 3), "float16", "float16")
    assert "receive 90112 bytes a block (more than 49152)" in kept
    _, kept, attrs = _route(128, 4096, 4096, (128, 128, 64, 256, 5))
    assert kept is None and "summed in cells" in attrs["split_k"][0]
    with pytest.raises(CompileError, match="general_split_k_8bit"):
        _route(128, 4096, 4096, (128, 128, 128, 256, 4), "float8_e4m3", "float16",
               {"tilecore.cuda.general_split_k_8bit": "maybe"})


# -- the CUDA source on the host emulator (sm_80's general path: mma.sync on registers, cp.async stages) -----------
@needs_toolchain
@pytest.mark.parametrize("split,partials", [(2, "vector"), (4, "vector"), (4, "scalar")])
def test_split_k_cuda_source_on_host_emulator(split, partials):
    from cuda_host_emulator import run_on_host

    M, N, K = 64, 64, 256
    f = matmul(M, N, K, 64, 64, 32, threads=128, num_stages=2, dtype="float16", out_dtype="float32")
    k = tilecore.compile(f, target="cuda:sm_80", pass_configs={**NOCACHE, "tilecore.matrix_unit_families": ["mma_sync"],
                                                                "tilecore.split_k": split,
                                                                "tilecore.split_k_partials": partials})
    assert k.source.meta["grid"] == ["1", "1", str(split)]
    src = k.source.code
    assert "atom.acq_rel.gpu.global.add.s32" in src and "mma.sync" in src
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((M, K)) / 4).astype(np.float16)
    b = (rng.standard_normal((K, N)) / 4).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    ws = np.zeros(int(k.source.meta["workspace"]["bytes"]), np.uint8)
    import re

    off = int(re.search(r"reinterpret_cast<int\*>\(__builtin_assume_aligned\(tc_workspace \+ (\d+),", src).group(1))
    outs = []
    for _ in range(2):  # the same workspace twice: the last block left the counter at 0
        res = run_on_host(k, [a, b, np.full((M, N), np.nan, np.float32)], workspace=ws)
        c, ws = res[2], res[3]
        outs.append(c)
        counters = ws[off:off + 4].view(np.int32)
        assert counters.tolist() == [0]
    assert np.abs(outs[0] - ref).max() < 1e-3 * np.sqrt(K)
    assert np.array_equal(outs[0], outs[1])


def block_tickets():
    @T.prim_func
    def k(cnt: T.Tensor((1,), "int32"), out: T.Tensor((4,), "int32")):
        with T.Kernel(4, threads=64) as bx:
            p = T.atomic_add(cnt[0], 1, memory_order="acq_rel", return_prev=True)
            out[bx] = p

    return k


def test_block_level_return_prev_runs_once_per_block_cpu():
    k = tilecore.compile(block_tickets(), target="cpu", pass_configs=NOCACHE)
    cnt, out = np.zeros(1, np.int32), np.full(4, -1, np.int32)
    k(cnt, out)
    assert cnt[0] == 4 and sorted(out.tolist()) == [0, 1, 2, 3]


@needs_toolchain
def test_block_level_return_prev_runs_once_per_block_cuda_emulated():
    """A block of 64 threads updates once, as the CPU reference's block does (thread 0 through a shared slot)."""
    from cuda_host_emulator import run_on_host

    k = tilecore.compile(block_tickets(), target="cuda:sm_90a", pass_configs=NOCACHE)
    assert "prev_slot[0] = tc_atom_add_acq_rel_device_int32(" in k.source.code
    cnt, out = run_on_host(k, [np.zeros(1, np.int32), np.full(4, -1, np.int32)])
    assert cnt[0] == 4 and sorted(out.tolist()) == [0, 1, 2, 3]
    # the T.Parallel form: one update per iteration, every ticket once
    k = tilecore.compile(tickets(n=64, blocks=4), target="cuda:sm_90a", pass_configs=NOCACHE)
    cnt, out = run_on_host(k, [np.zeros(1, np.int32), np.zeros(256, np.int32)])
    assert cnt[0] == 256 and sorted(out.tolist()) == list(range(256))


def test_return_prev_on_webgpu():
    """WebGPU: atomicAdd returns the old value (relaxed only: the language has no device-scope acquire / release)."""
    pytest.importorskip("tilecore_webgpu")
    k = tilecore.compile(tickets(), target="webgpu", pass_configs=NOCACHE)
    assert "array<atomic<i32>>" in k.source.code and "= atomicAdd(&cnt[0i], 1i);" in k.source.code
    with pytest.raises(CompileError, match="relaxed only"):
        tilecore.compile(tickets(order="acq_rel"), target="webgpu", pass_configs=NOCACHE)


@pytest.mark.parametrize("target,plugin", [("hip:gfx942", "tilecore_hip"), ("metal", "tilecore_metal")])
def test_return_prev_refused_by_name_where_not_spelled(target, plugin):
    """Backends whose code generator spells no atomic returning its old value refuse it by name (skipped where the
    backend's distribution is not installed, as on a device host given only the CUDA and WebGPU wheels)."""
    pytest.importorskip(plugin)
    with pytest.raises(CompileError, match="no atomic that returns the old value"):
        tilecore.compile(tickets(), target=target, pass_configs=NOCACHE)


@needs_toolchain
def test_plugin_split_gemm_routed_to_the_core_split_k():
    """tilecore.cuda.general_split_k=True: the GEMM the plugin would split by its rule (4 splits at 128x4096x4096 on
    128x128 tiles) takes the general path with the core's split-K over that count; unset ("group"), since D78 the
    core's sum in cells over 3 where the routing's measured areas hold it; without the cells the plugin's."""
    f = lambda: matmul(128, 4096, 4096, 128, 128, 64, threads=256, num_stages=5)  # noqa: E731
    k = tilecore.compile(f(), target="cuda:sm_90a", pass_configs={**NOCACHE, "tilecore.cuda.general_split_k": True})
    assert k.source.meta["grid"] == ["32", "1", "4"]
    assert "the backend's request" in k.meta["attrs"]["split_k"][0]
    assert "tc_wgmma_splitk" not in k.source.code and "atom.acq_rel.gpu.global.add.s32" in k.source.code
    from tilecore_cuda.hopper import CELLS_AREAS

    k = tilecore.compile(f(), target="cuda:sm_90a", pass_configs=NOCACHE)
    if "staging" in CELLS_AREAS:
        assert k.source.meta["grid"] == ["32", "1", "3"] and "summed in cells" in k.meta["attrs"]["split_k"][0]
    else:
        assert "split_k" not in k.meta["attrs"] and "tc_wgmma_splitk" in k.source.code
    k = tilecore.compile(f(), target="cuda:sm_90a", pass_configs={**NOCACHE, "tilecore.cuda.general_split_k_cells": False})
    assert "split_k" not in k.meta["attrs"] and "tc_wgmma_splitk" in k.source.code
    with pytest.raises(CompileError, match="general_split_k"):
        tilecore.compile(f(), target="cuda:sm_90a", pass_configs={**NOCACHE, "tilecore.cuda.general_split_k": "x"})


def test_split_k_refuses_state_carried_out_of_the_loop():
    """Only the gemm's accumulator is summed over the splits: a loop that also accumulates another fragment read after
    it, or an accumulator that starts from a value other than 0, is refused with the reason."""
    M = N = 64
    K = 256

    @T.prim_func
    def rowsum(A: T.Tensor((M, K), "float32"), B: T.Tensor((K, N), "float32"), C: T.Tensor((M, N), "float32"),
               S: T.Tensor((M, 32), "float32")):
        with T.Kernel(1, 1, threads=128) as (bx, by):
            As = T.alloc_shared((M, 32), "float32")
            Bs = T.alloc_shared((32, N), "float32")
            Cl = T.alloc_fragment((M, N), "float32")
            Sl = T.alloc_fragment((M, 32), "float32")
            T.clear(Cl)
            T.clear(Sl)
            for ko in T.Pipelined(K // 32, num_stages=2):
                T.copy(A[0, ko * 32], As)
                T.copy(B[ko * 32, 0], Bs)
                for i, j in T.Parallel(M, 32):
                    Sl[i, j] += As[i, j]
                T.gemm(As, Bs, Cl)
            T.copy(Cl, C[0, 0])
            T.copy(Sl, S[0, 0])

    with pytest.raises(CompileError, match="also writes Sl"):
        tilecore.compile(rowsum, target="cpu", pass_configs={**NOCACHE, "tilecore.split_k": 2})

    @T.prim_func
    def biased(A: T.Tensor((M, K), "float32"), B: T.Tensor((K, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, 1, threads=128) as (bx, by):
            As = T.alloc_shared((M, 32), "float32")
            Bs = T.alloc_shared((32, N), "float32")
            Cl = T.alloc_fragment((M, N), "float32")
            T.fill(Cl, 1.0)
            for ko in T.Pipelined(K // 32, num_stages=2):
                T.copy(A[0, ko * 32], As)
                T.copy(B[ko * 32, 0], Bs)
                T.gemm(As, Bs, Cl)
            T.copy(Cl, C[0, 0])

    with pytest.raises(CompileError, match="other than 0"):
        tilecore.compile(biased, target="cpu", pass_configs={**NOCACHE, "tilecore.split_k": 2})
    tilecore.compile(biased, target="cpu", pass_configs={**NOCACHE, "tilecore.split_k": "auto"})  # left alone
