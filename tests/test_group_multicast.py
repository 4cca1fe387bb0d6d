"""The warp-specialized GEMM in block groups of two with a shared operand multicast (docs/decisions.md D80,
``tilecore.group_multicast``, off by default).

Checked here without a GPU (cuda:sm_90a through NVRTC):

- the planner's choice and its note: at 128x256 / 256x128 / 128x128 tiles in T.use_swizzle panels the pair's tiles
  share B (evaluated over the whole walk); refused by name without a panel (B moves with bx, A's one panel does not
  divide), where a panel's last rows are odd (a pair would straddle two columns), without warp specialization, on an
  odd block count, for a bad value, and on a target without ``execution.cluster.multicast_copy``;
- the IR (``BulkCopy.multicast``, ``StageRelease.group``) as the printer shows it;
- the CUDA source: ``__cluster_dims__(2, 1, 1)``, the release barrier's count the group's consumers (512), a cluster
  barrier after the barriers' init and one at the end, B's panels issued half by each block with a cta mask of both,
  each release also arrived on the peer's barrier; the option off leaves the source as it was;
- the SASS: 2 UTMALDG.2D.MULTICAST and 1 UTMALDG.2D (A) a stage, HGMMA 64x256x16, UCGABAR arrive / wait twice, the
  remote arrive (SYNCS.ARRIVE.TRANS64.RED), no local memory.

On an sm_90 GPU (skipped here; in scripts/device_check.sh's device-tests list): fp16 / bf16 at 4096^3 and ragged /
smaller shapes against float64 and bit for bit the same kernel without groups (the same wgmma order), over 3 calls.
"""
from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

import pytest

import tilecore
from tilecore.errors import CompileError

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

from test_cuda_backend import needs_toolchain  # noqa: E402
from test_cuda_hopper import hopper_gpu  # noqa: E402

from _bench import tile_gemm  # noqa: E402

#: D76's warp-specialized form on the general path (benchmarks/general_gemm.py's ws-us-doff)
WS = {"tilecore.cuda.register_programs": False, "tilecore.cuda.uniform_warp_index": True,
      "tilecore.cuda.nonnegative_index_shifts": True, "tilecore.warp_specialize": True, "tilecore.persistent": True,
      "tilecore.bulk_store": True, "tilecore.cuda.descriptor_offsets": True, "tilecore.disable_cache": True}
MC = {**WS, "tilecore.group_multicast": 2}


def _gemm(M=4096, N=4096, K=4096, bm=128, bn=256, bk=64, threads=256, stages=3, panel=8, dtype="float16"):
    return tile_gemm(M, N, K, bm, bn, bk, threads, stages, dtype=dtype, panel=panel)


def _compile(cfg=MC, target="cuda:sm_90a", **kw):
    return tilecore.compile(_gemm(**kw), target=target, pass_configs=cfg)


def _note(k) -> str:
    return k.meta["attrs"]["pipelines"][0]


# -- the planner's choice ------------------------------------------------------------------------------------------
@needs_toolchain
@pytest.mark.parametrize("tile", [(128, 256), (256, 128), (128, 128)])
def test_pairs_in_panels_share_b(tile):
    k = _compile(bm=tile[0], bn=tile[1], stages=3 if tile != (128, 128) else 4)
    assert "tilecore.group_multicast: block groups of 2 consecutive blocks, their tiles walked in step share " \
           "B_shared:" in _note(k), _note(k)
    assert k.meta["source"]["meta"]["cluster"] == [2, 1, 1]


@needs_toolchain
def test_refused_by_name_where_no_operand_is_shared():
    # no panel: tiles x fastest, the pair's tiles side by side in N: B moves with bx, A's one panel does not divide
    k = _compile(panel=0)
    assert "not tilecore.group_multicast: no staged copy is shared by a group's tiles (A_shared: 1 panel(s) do not " \
           "divide among 2 blocks; B_shared: its box moves with bx within a group)" in _note(k), _note(k)
    assert "cluster" not in k.meta["source"]["meta"]
    # 33 rows of tiles in panels of 8: the last panel's one row pairs two columns
    k = _compile(M=4224)
    assert "A_shared: its box moves with by within a group; B_shared: its box moves with bx within a group" \
        in _note(k), _note(k)


@needs_toolchain
def test_refused_by_name_on_an_odd_block_count_and_without_warp_specialization():
    k = _compile({**MC, "tilecore.persistent": 3})
    assert "not tilecore.group_multicast: 3 blocks over 512 tiles: both must be multiples of 2" in _note(k), _note(k)
    k = _compile({**MC, "tilecore.warp_specialize": False})
    assert "not tilecore.group_multicast: the loop is not warp-specialized" in _note(k), _note(k)
    assert "cluster" not in k.meta["source"]["meta"]


@needs_toolchain
def test_a_bad_value_is_an_error():
    with pytest.raises(CompileError, match=r"tilecore.group_multicast=4: expected False \(the default\) or 2"):
        _compile({**MC, "tilecore.group_multicast": 4})
    with pytest.raises(CompileError, match=r"tilecore.group_multicast=True"):
        _compile({**MC, "tilecore.group_multicast": True})


@needs_toolchain
def test_a_target_without_multicast_copies_is_refused_by_name():
    overlay = {"execution": {"cluster": {"multicast_copy": False}}}
    k = _compile({**MC, "tilecore.capability_overlay": overlay})
    assert "not tilecore.group_multicast: the target has no copies into every block of a group " \
           "(execution.cluster.multicast_copy)" in _note(k), _note(k)


# -- the IR and the source ------------------------------------------------------------------------------------------
def test_the_fields_print():
    from tilecore.ir import Buffer, StageRelease, as_expr
    from tilecore.ir.printer import stmt_lines

    b = Buffer("full", (3,), "uint64", "shared")
    assert stmt_lines(StageRelease(b, as_expr(1), group=2), 0) == ["T.stage_release(full[1], group=2)"]
    assert stmt_lines(StageRelease(b, as_expr(1)), 0) == ["T.stage_release(full[1])"]


@needs_toolchain
def test_the_source():
    on, off = _compile(), _compile(WS)
    src, plain = on.get_kernel_source(), off.get_kernel_source()
    assert "__cluster_dims__(2, 1, 1) __launch_bounds__(384, 1) tc_kernel(" in src
    assert on.meta["source"]["meta"]["group_multicast"] is True and "group_multicast" not in off.meta["source"]["meta"]
    assert "__cluster_dims__" not in plain and "tc_group_rank" not in plain
    # the release barrier counts both blocks' 256 consumers; the stage's full barrier its one producer
    assert "tc_mbar_init(tc_smem_addr(A_shared_empty + tc_i), 512);" in src
    assert "tc_mbar_init(tc_smem_addr(A_shared_empty + tc_i), 256);" in plain
    body = src[src.index(" tc_kernel("):]
    cl = [m.start() for m in re.finditer(r"barrier\.cluster\.arrive\.release\.aligned", body)]
    assert len(cl) == 2 and body.count("barrier.cluster.wait.acquire.aligned") == 2
    assert body.index("__syncthreads();") < cl[0] < body.index("setmaxnreg.dec")
    assert cl[1] > body.rindex("tc_bulk_wait<0>();")
    # B: 2 of its 4 panels a block, into both blocks (mask 3), from the block's rank; A as before
    assert body.count("tc_tma_load_group_2d(") == 2 and body.count("(unsigned short)3") == 2
    assert body.count("tc_tma_load_2d(") == 1 and plain[plain.index(" tc_kernel("):].count("tc_tma_load_2d(") == 5
    assert "const int tc_gp = (int)tc_group_rank() * 2;" in body
    # every release also on the peer's barrier (a lane a warp, count 32)
    assert body.count("tc_mbar_arrive_peer_warp(tc_rb, tc_group_rank() ^ 1u);") == 2
    assert "mbarrier.arrive.shared::cluster.b64 _, [tc_pb], 32;" in src
    # the stage's announced bytes unchanged: A's 16 KiB and the whole of B's 32 KiB land in each block
    assert body.count("), 49152u);") == plain[plain.index(" tc_kernel("):].count("), 49152u);") == 1


@needs_toolchain
def test_the_option_off_changes_nothing():
    a = _compile(WS).get_kernel_source()
    b = _compile({**WS, "tilecore.group_multicast": False}).get_kernel_source()
    assert a == b


@needs_toolchain
@pytest.mark.parametrize("dtype,hgmma", [("float16", "HGMMA.64x256x16.F32"), ("bfloat16", "HGMMA.64x256x16.F32.BF16")])
def test_sass(dtype, hgmma):
    import tilecore_cuda

    k = _compile(dtype=dtype)
    try:
        sass = tilecore_cuda.CUDABackend().disassemble(k.binary, None)
    except SystemExit as e:  # no cuobjdump here
        pytest.skip(str(e))
    ops = collections.Counter(re.findall(r"\b((?:UTMALDG|UCGABAR|SYNCS\.ARRIVE|HGMMA|MEMBAR|ERRBAR)[\w.]*)", sass))
    assert ops["UTMALDG.2D.MULTICAST"] == 2 and ops["UTMALDG.2D"] == 1, ops
    assert ops[hgmma] == 8, ops
    assert ops["UCGABAR_ARV"] == 2 and ops["UCGABAR_WAIT"] == 2, ops
    assert ops["SYNCS.ARRIVE.TRANS64.RED.ART0"] >= 2, ops  # the release on the peer's barrier
    # no memory barrier in the k loop: a release at cluster scope on the peer's arrive (round 1: MEMBAR.ALL.GPU +
    # ERRBAR before each, 31% of the samples stalled there, 0.67x the kernel without groups) is not spelled; the two
    # group barriers (the top and the end) have theirs
    assert ops["MEMBAR.ALL.GPU"] == 2 and ops["ERRBAR"] == 2, ops
    assert "LDL" not in sass and "STL" not in sass


# -- on an sm_90 GPU ------------------------------------------------------------------------------------------------
DEVICE = {  # name -> (M, N, K, tile (bm, bn, stages), panel, more pass configs)
    "4096": (4096, 4096, 4096, (128, 256, 3), 8, {}),
    "ragged-rows": (4000, 4096, 1024, (128, 256, 3), 8, {}),  # the last row of tiles half outside A and C
    # one wave of tiles: the persistent loop asked for with fewer blocks (32 tiles over 8 blocks, 4 groups; 128 over
    # 22 blocks, 11 groups walking 5 or 6 tiles each)
    "small": (1024, 1024, 4096, (128, 256, 3), 8, {"tilecore.persistent": 8}),
    "wide-k": (2048, 2048, 8192, (128, 256, 3), 4, {"tilecore.persistent": 22}),
    "256x128": (4096, 4096, 2048, (256, 128, 3), 8, {}),
    "128x128": (2048, 4096, 2048, (128, 128, 4), 8, {}),
}


@hopper_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", list(DEVICE))
def test_device_matches_float64_and_the_kernel_without_groups(case, dtype):
    import torch

    M, N, K, (bm, bn, stages), panel, more = DEVICE[case]
    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(7)
    a = (torch.randn(M, K, device="cuda", generator=g) / 8).to(tdt)
    b = (torch.randn(K, N, device="cuda", generator=g) / 8).to(tdt)
    out = []
    for cfg in (WS, MC):
        k = tilecore.compile(_gemm(M, N, K, bm, bn, 64, 256, stages, panel, dtype), target="cuda",
                             pass_configs={**cfg, **more})
        if cfg is MC:
            assert k.meta["source"]["meta"].get("cluster") == [2, 1, 1], _note(k)
        calls = []
        for _ in range(3):
            c = torch.full((M, N), float("nan"), device="cuda", dtype=tdt)
            k(a, b, c)
            torch.cuda.synchronize()
            calls.append(c)
        assert all(torch.equal(calls[0], c) for c in calls[1:]), f"{case} {dtype}: calls differ ({_note(k)})"
        out.append(calls[0])
    ref = a.double() @ b.double()
    err = float((out[1].double() - ref).abs().max())
    assert err < 3e-2 * max(1.0, float(ref.abs().max()) / 8), f"{case} {dtype}: max error {err}"
    assert torch.equal(out[0], out[1]), f"{case} {dtype}: not the bits of the kernel without groups"


# -- the route's form (tilecore.cuda.gemm_route_form) and tilecore.warp_specialize="carried" -----------------------
ROUTE = {"tilecore.disable_cache": True}


@needs_toolchain
@pytest.mark.parametrize("form,cfg", [("ws-mc", MC), ("ws", WS)])
def test_the_routed_form_is_the_variant(form, cfg):
    """The plain 16-bit GEMM routed to the general path in form "ws-mc" / "ws": byte for byte the general path with
    the variant's pass configs (benchmarks/general_gemm.py's ws-mc / ws-us-doff), the note naming the defaults."""
    routed = _compile({**ROUTE, "tilecore.cuda.gemm_route_form": form})
    assert routed.get_kernel_source() == _compile(cfg).get_kernel_source()
    note = [n for n in routed.meta["attrs"]["hopper_pipelines"] if "gemm_route_form" in n]
    assert note and f"the routed GEMM's form {form!r}" in note[0] and "tilecore.warp_specialize='carried'" in note[0]
    # a value the pass config gives wins over the form's
    k = _compile({**ROUTE, "tilecore.cuda.gemm_route_form": form, "tilecore.cuda.descriptor_offsets": False})
    assert "(given by the pass config: tilecore.cuda.descriptor_offsets)" in \
        " ".join(k.meta["attrs"]["hopper_pipelines"])


@needs_toolchain
def test_carried_specializes_only_the_persistent_loop():
    """warp_specialize="carried": a GEMM of one wave (8 tiles: no persistent tile loop) keeps thread 0's issue, no
    groups; the default form "core" changes nothing."""
    small = _compile({**ROUTE, "tilecore.cuda.gemm_route_form": "ws-mc"}, M=512, N=512, K=512)
    assert "; warp-specialized:" not in _note(small) and "cluster" not in small.meta["source"]["meta"]
    assert "not tilecore.group_multicast: the loop is not warp-specialized" in _note(small), _note(small)
    assert _compile(ROUTE).get_kernel_source() == \
        _compile({**ROUTE, "tilecore.cuda.gemm_route_form": "core"}).get_kernel_source()


@needs_toolchain
def test_a_bad_form_is_an_error():
    with pytest.raises(CompileError, match=r"tilecore.cuda.gemm_route_form='x': expected one of 'core', 'ws', 'ws-mc'"):
        _compile({**ROUTE, "tilecore.cuda.gemm_route_form": "x"})


@needs_toolchain
def test_groups_the_gpu_cannot_hold_at_once_are_a_performance_warning():
    """The runtime's occupancy check (D41) on the 66 groups of two: where the driver says fewer fit, loading the kernel
    warns naming this option; where they fit, nothing is said."""
    from test_cuda_splitk import cluster_warnings

    k = _compile()

    def load(fits):
        return cluster_warnings(k, fits)[0]

    said = load(64)
    assert len(said) == 1 and "this GPU holds 64 clusters of 2 blocks at once, the persistent grid has 66" in said[0]
    assert "pass tilecore.group_multicast=False" in said[0]
    assert load(66) == []
