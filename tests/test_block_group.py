"""A block group in the core IR (decision D75) and the split-K sum through it (``tilecore.split_k_reduce``).

- the IR: :class:`~tilecore.ir.GroupBarrier` (arrive / wait / sync with their orders), :class:`~tilecore.ir.PeerStore`,
  ``KernelLaunch.attrs["block_group"]``, ``Allocate.reuses``; printed, validated;
- the CUDA spellings (``__cluster_dims__``, ``barrier.cluster.arrive.release`` / ``wait.acquire``, ``mapa`` +
  ``st.shared::cluster``) in the split GEMM's source, its SASS (UCGABAR, DSMEM stores, LDS.128, nothing global),
  the receive area over the pipelined loop's stages or beside them;
- ``"group"`` / ``"auto"`` / ``"workspace"``: the choice and its notes, the refusals by name (the CPU reference,
  a receive area that fits nowhere, more splits than the largest group) and the emitters that spell no block group
  (C family, WebGPU, HIP, Metal).

The device tests (float64, the workspace form's bits, bit for bit every call) are in tests/test_general_splitk.py.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import tilecore
from tilecore.errors import CompileError

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from test_cuda_backend import needs_toolchain  # noqa: E402
from cuda_gemm import matmul  # noqa: E402

NOCACHE = {"tilecore.disable_cache": True}
GENERAL = {**NOCACHE, "tilecore.cuda.general_plain_gemm": True}


def _cuda(M, N, K, tile, split, reduce_="group", **cfg):
    """The GEMM split over ``split`` blocks a tile; the rank-0 group sum unless ``cfg`` names another."""
    bm, bn, bk, th, st = tile
    return tilecore.compile(matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st), target="cuda:sm_90a",
                            pass_configs={**GENERAL, "tilecore.split_k": split, "tilecore.split_k_reduce": reduce_,
                                          "tilecore.split_k_group_sum": "rank0", **cfg})


# -- the IR ---------------------------------------------------------------------------------------------------------
def test_group_barrier_phases_and_orders_are_checked():
    from tilecore.ir import GroupBarrier

    assert GroupBarrier("arrive", "relaxed").order == "relaxed"
    with pytest.raises(ValueError, match="phase 'enter'"):
        GroupBarrier("enter", "release")
    with pytest.raises(ValueError, match="wait order 'release'"):
        GroupBarrier("wait", "release")


def test_group_statements_print():
    from tilecore.ir import Buffer, GroupBarrier, PeerStore, as_expr
    from tilecore.ir.printer import stmt_lines

    b = Buffer("recv", (64,), "float32", "shared")
    lines = stmt_lines(PeerStore(b, (as_expr(4),), (as_expr(1.0), as_expr(2.0)), as_expr(0)), 0) + \
        stmt_lines(GroupBarrier("arrive", "release"), 0)
    assert lines == ["T.peer_store(recv[4], (1.0, 2.0), rank=0)", "T.group_barrier('arrive', order='release')"]


def test_emitters_without_block_groups_refuse_them_by_name():
    from tilecore.codegen import EmitState
    from tilecore.codegen.cfamily import CFamilyEmitter
    from tilecore.ir import Buffer, GroupBarrier, PeerStore, as_expr

    b = Buffer("recv", (64,), "float32", "shared")
    with pytest.raises(CompileError, match="block group's barrier .* no block groups"):
        CFamilyEmitter().stmt(EmitState(), GroupBarrier("sync", "acq_rel"))
    with pytest.raises(CompileError, match="block group peer's recv.* no block groups"):
        CFamilyEmitter().stmt(EmitState(), PeerStore(b, (as_expr(0),), (as_expr(1.0),), as_expr(1)))


@pytest.mark.parametrize("plugin,cls", [("tilecore_webgpu", "WebGPUEmitter"), ("tilecore_hip", "HIPEmitter"),
                                        ("tilecore_metal", "MetalEmitter"), ("tilecore_cpu", "CPUEmitter")])
def test_backends_without_block_groups_refuse_them_by_name(plugin, cls):
    mod = pytest.importorskip(f"{plugin}.codegen")
    from tilecore.codegen import EmitState
    from tilecore.ir import GroupBarrier

    with pytest.raises(CompileError, match=f"no block groups.*|{cls}.*no block groups"):
        getattr(mod, cls)().stmt(EmitState(), GroupBarrier("wait", "acquire"))


# -- the split-K choice and its refusals ------------------------------------------------------------------------------
def test_group_refused_by_name_on_the_cpu_reference():
    f = matmul(64, 64, 512, 32, 32, 32, threads=128, num_stages=2, dtype="float32", accum="float32")
    with pytest.raises(CompileError, match="target cpu has no block groups .*execution.cluster.supported"):
        tilecore.compile(f, target="cpu", pass_configs={**NOCACHE, "tilecore.split_k": 4, "tilecore.split_k_reduce": "group"})
    k = tilecore.compile(f, target="cpu", pass_configs={**NOCACHE, "tilecore.split_k": 4, "tilecore.split_k_reduce": "auto"})
    assert "last block" in k.meta["attrs"]["split_k"][0]  # "auto": the workspace sum
    with pytest.raises(CompileError, match="expected \"workspace\""):
        tilecore.compile(f, target="cpu", pass_configs={**NOCACHE, "tilecore.split_k": 4, "tilecore.split_k_reduce": "dsmem"})


@needs_toolchain
def test_group_refusals_on_sm90():
    with pytest.raises(CompileError, match="receive area of 196608 bytes .*fits neither"):
        _cuda(128, 4096, 4096, (128, 128, 64, 256, 4), 4, **{"tilecore.split_k_group_sum": "rank0"})
    with pytest.raises(CompileError, match="16 splits exceed the largest block group .* \\(8, limits.max_cluster_size\\)"):
        _cuda(16, 8192, 8192, (64, 128, 64, 128, 2), 16)


@needs_toolchain
def test_auto_takes_the_group_where_every_group_is_resident_at_once():
    """"auto": groups of 2 (66 resident at once on sm_90a's profile) for 64 tiles; 32 groups of 4 (30 at once) and a
    receive area that fits nowhere keep the workspace sum, with the reason in the notes."""
    k = _cuda(16, 8192, 8192, (64, 128, 64, 128, 4), 2, "auto")
    assert k.source.meta["cluster"] == [1, 1, 2] and "one block group a tile" in k.meta["attrs"]["split_k"][0]
    k = _cuda(256, 4096, 4096, (128, 64, 64, 256, 4), 2, "auto")
    assert "cluster" not in k.source.meta and "workspace" in k.source.meta
    assert "128 groups of 2 would not all be resident at once (cuda/sm_90a holds 66" in k.meta["attrs"]["split_k"][0]
    # the measured bound (D75): rank 0 receiving more than 32 KiB (4 splits' slices of 64x128 tiles: 48 KiB, where
    # D78's cells would send 24 KiB; 2 splits of 128x128: 64 KiB) keeps the workspace sum
    for tile, n, got, form in (((64, 128, 64, 128, 4), 4, 49152, "slices"), ((128, 128, 64, 256, 4), 2, 65536, "rank0")):
        k = _cuda(128, 4096, 4096, tile, n, "auto", **{"tilecore.split_k_group_sum": form})
        assert "cluster" not in k.source.meta
        assert f"a block would receive {got} bytes through block memory, more than the 32768" in k.meta["attrs"]["split_k"][0]
    k = _cuda(128, 4096, 4096, (128, 128, 64, 256, 2), 4, "auto", **{"tilecore.split_k_group_sum": "rank0"})
    assert "cluster" not in k.source.meta and "fits neither" in k.meta["attrs"]["split_k"][0]
    k = _cuda(128, 4096, 4096, (128, 128, 64, 256, 4), 4, "workspace")
    assert "cluster" not in k.source.meta


# -- the CUDA source and SASS -------------------------------------------------------------------------------------------
@needs_toolchain
def test_group_sum_cuda_source_receive_area_beside():
    """By default the receive area lies beside the block's buffers where it fits (64 KiB beside 161 KiB): the blocks
    arrive (relaxed) at the top, wait after the main loop, no barrier between; the sum, then the bulk store."""
    k = _cuda(128, 4096, 4096, (128, 128, 64, 256, 4), 2, **{"tilecore.split_k_group_sync": "barrier"})
    src, meta = k.source.code, k.source.meta
    assert meta["cluster"] == [1, 1, 2] and meta["shared_bytes"] == 164864 + 65536  # A_shared from offset 66560, 1024-aligned
    assert re.search(r"float\* __restrict__ vtc_group_recv = ", src)
    assert src.index("barrier.cluster.arrive.relaxed.aligned;") < src.index("for (long long ko = 0;") \
        < src.index("barrier.cluster.wait.acquire.aligned;") < src.index("if ((split != 0)) {") \
        < src.index("barrier.cluster.arrive.release.aligned;")
    assert src.count("barrier.cluster.wait.acquire.aligned;") == 2 and "tc_fence_proxy_async();\n  __syncthreads();\n  asm" \
        not in src
    assert src.count("st.shared::cluster.v4.f32") == 16


@needs_toolchain
def test_group_sum_cuda_source_over_the_stages():
    k = _cuda(128, 4096, 4096, (128, 128, 64, 256, 4), 2, **{"tilecore.split_k_group_area": "stages"})
    src, meta = k.source.code, k.source.meta
    assert meta["grid"] == ["32", "1", "2"] and meta["cluster"] == [1, 1, 2] and "workspace" not in meta
    assert '__global__ void __cluster_dims__(1, 1, 2) __launch_bounds__(256)' in src
    # the receive area over the stages (A_shared's offset), neither pointer restrict; no more block memory
    off = re.search(r"float\* vtc_group_recv = \(float\*\)\(tc_smem \+ (\d+)\);", src).group(1)
    assert f"__half* A_shared = (__half*)(tc_smem + {off});" in src
    assert meta["shared_bytes"] == 164864  # the workspace kernel's (its counter slot aside)
    tail = src[src.index("tc_wg_wait<0>(); tc_wg_fence_regs<64>(C_local);\n  }\n"):]
    # every block past its main loop (the stages free) before the stores into rank 0's, then all landed
    assert tail.index("tc_fence_proxy_async();") < tail.index("barrier.cluster.arrive.release.aligned;") \
        < tail.index("barrier.cluster.wait.acquire.aligned;") < tail.index("if ((split != 0)) {")
    assert src.count("mapa.shared::cluster.u32") == 16 and src.count("st.shared::cluster.v4.f32") == 16
    assert src.count("barrier.cluster.arrive.release.aligned;") == 2 and "barrier.cluster.arrive.relaxed" not in src
    sends = tail[tail.index("if ((split != 0)) {"):]
    assert sends.index("barrier.cluster.wait.acquire.aligned;") < sends.index("if ((split == 0)) {") \
        < sends.index("C_local[0] = (C_local[0] + vtc_group_recv[") < sends.index("tc_tma_store_2d(")
    assert "atom." not in src and "tc_workspace" not in src.split("tc_kernel(")[1].split(")")[0]


@needs_toolchain
def test_group_receive_area_beside_the_stages_where_they_do_not_hold_it():
    """4 splits of 64x128 tiles at 2 stages: 3 partials (96 KiB) over 48 KiB of stages: an area of its own, the
    blocks saying they started at the top (arrive, relaxed) and waiting only before the first peer store."""
    k = _cuda(16, 8192, 8192, (64, 128, 64, 128, 2), 4, **{"tilecore.split_k_group_sum": "rank0",
                                                           "tilecore.split_k_group_sync": "barrier"})
    src = k.source.code
    assert re.search(r"float\* __restrict__ vtc_group_recv = ", src)
    assert src.count("barrier.cluster.arrive.relaxed.aligned;") == 1
    assert src.index("barrier.cluster.arrive.relaxed.aligned;") < src.index("for (long long ko = 0;")
    assert src.count("barrier.cluster.arrive.release.aligned;") == 1
    assert src.count("st.shared::cluster.v4.f32") == 3 * 16  # one version a sending rank


@needs_toolchain
def test_group_sum_sass():
    """The cluster barrier (UCGABAR arrive / wait, twice), 16 DSMEM stores of 16 bytes (ST.E.128 through mapa's
    address), the sum's 16 LDS.128 and 64 FADD; nothing global but the bulk store: no STG / LDG / ATOMG; no spill."""
    import tilecore_cuda

    k = _cuda(128, 4096, 4096, (128, 128, 64, 256, 4), 2, **{"tilecore.split_k_group_sync": "barrier"})
    try:
        sass = tilecore_cuda.CUDABackend().disassemble(k.binary, None)
    except SystemExit as e:  # no cuobjdump here
        pytest.skip(str(e))
    ops = re.findall(r"\b((?:UCGABAR|LDS|STS|ST|LDG|STG|ATOMG|FADD|MAPA)[\w.]*)", sass)
    assert ops.count("UCGABAR_ARV") == 2 and ops.count("UCGABAR_WAIT") == 2
    assert ops.count("ST.E.128") == 16 and ops.count("LDS.128") == 16 and ops.count("FADD") == 64
    assert not [o for o in ops if o.startswith(("STG", "LDG", "ATOMG"))]
    assert "LDL" not in sass and "STL" not in sass


@needs_toolchain
def test_routed_split_gemm_takes_the_group_sum_when_asked():
    """tilecore.cuda.general_split_k=True with split_k_reduce="auto": the plugin's tile and count on the general path,
    summed in groups where they all fit at once (16x8192x8192 at 64x128 tiles: 64 tiles, the rule's 2 splits, 64
    groups of 2 of the 66 resident at once); at the 64x256 tile the rule's 4 splits would send rank 0 96 KiB in
    slices, over the measured bound: the workspace."""
    def routed(bn, stages):
        f = matmul(16, 8192, 8192, 64, bn, 64, threads=128, num_stages=stages)
        return tilecore.compile(f, target="cuda:sm_90a", pass_configs={**NOCACHE, "tilecore.cuda.general_split_k": True,
                                                                       "tilecore.split_k_reduce": "auto"})

    k = routed(128, 4)
    assert "tc_wgmma_splitk" not in k.source.code and "mapa.shared::cluster" in k.source.code
    assert k.source.meta["grid"] == ["64", "1", "2"] and k.source.meta.get("cluster") == [1, 1, 2]
    k = routed(256, 3)  # each block would receive 48 KiB in panels (4 splits of 4 panels): the workspace
    assert k.source.meta["grid"] == ["32", "1", "4"] and "cluster" not in k.source.meta
    assert "a block would receive 49152 bytes" in k.meta["attrs"]["split_k"][0]
    # asked for ("group") the count is kept, whether its groups fit at once or not
    f = matmul(16, 8192, 8192, 64, 256, 64, threads=128, num_stages=3)
    k = tilecore.compile(f, target="cuda:sm_90a", pass_configs={**NOCACHE, "tilecore.cuda.general_split_k": True,
                                                                 "tilecore.split_k_reduce": "group"})
    assert k.source.meta["cluster"] == [1, 1, 4]


@needs_toolchain
def test_group_stores_completing_on_rank0s_transaction_barrier():
    """tilecore.split_k_group_sync="copy_barrier": rank 0's barrier initialised (and announced for the 32 KiB of its
    peer's partial) before the blocks' relaxed arrival; the peer's 16 stores are st.async completing on it (STAS.128),
    rank 0 waits for its phase alone: one cluster barrier (the top's), no release fence (MEMBAR.ALL.GPU)."""
    import tilecore_cuda

    k = _cuda(16, 8192, 8192, (64, 128, 64, 128, 4), 2, **{"tilecore.split_k_group_sync": "copy_barrier"})
    src = k.source.code
    assert "stores completing on its transaction barrier" in k.meta["attrs"]["split_k"][0]
    init = src.index("tc_mbar_init(tc_smem_addr(vtc_group_full + tc_i), 1);")
    assert init < src.index("barrier.cluster.arrive.relaxed.aligned;") < src.index(
        "tc_mbar_expect_tx(tc_smem_addr(vtc_group_full + (0)), 32768u);") < src.index("for (long long ko = 0;")
    assert src.count("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32") == 16
    assert "barrier.cluster.arrive.release" not in src
    assert src.index("tc_mbar_wait(tc_smem_addr(vtc_group_full + (0)), 0);") < src.index("C_local[0] = (C_local[0] + vtc_group_recv[")
    try:
        sass = tilecore_cuda.CUDABackend().disassemble(k.binary, None)
    except SystemExit as e:
        pytest.skip(str(e))
    ops = re.findall(r"\b((?:UCGABAR|STAS|MEMBAR|LDS)[\w.]*)", sass)
    assert ops.count("STAS.128") == 16 and ops.count("UCGABAR_ARV") == 1 and "MEMBAR.ALL.GPU" not in ops
    # over the stages the post-loop group barrier is needed anyway: the option keeps the barrier form there
    k = _cuda(128, 4096, 4096, (128, 128, 64, 256, 4), 2, **{"tilecore.split_k_group_sync": "copy_barrier",
                                                             "tilecore.split_k_group_area": "stages"})
    assert "st.async" not in k.source.code and "st.shared::cluster.v4.f32" in k.source.code
    with pytest.raises(CompileError, match="split_k_group_sync='fast'"):
        _cuda(16, 8192, 8192, (64, 128, 64, 128, 4), 2, **{"tilecore.split_k_group_sync": "fast"})


@needs_toolchain
def test_uneven_group_over_the_stages_keeps_the_pipelines_stages():
    """3 splits of 64 k tiles (21-22 each, tilecore.split_k_uneven) at 128x128x64 / 5 stages: rank 0's area (2
    partials, 128 KiB) over the 160 KiB of stages, which the pipeline still plans at 5 (the area counts no bytes)."""
    k = _cuda(128, 4096, 4096, (128, 128, 64, 256, 5), 3, **{"tilecore.split_k_uneven": True,
                                                             "tilecore.split_k_group_sum": "rank0"})
    src = k.source.code
    assert k.source.meta["cluster"] == [1, 1, 3] and "21-22 of 64 k tiles" in k.meta["attrs"]["split_k"][0]
    assert "tc_floormod(ko, 5)" in src and k.source.meta["shared_bytes"] == 197632
    assert re.search(r"float\* vtc_group_recv = \(float\*\)\(tc_smem \+ 1024\);", src)
    assert src.count("st.shared::cluster.v4.f32") == 2 * 16  # ranks 1 and 2, one version each


@needs_toolchain
def test_group_sum_in_slices():
    """The sum in slices (asked for; "auto" sums 3 splits of two panels in cells since D78): 3 blocks own 20/20/24 of
    64 registers; each block's barrier
    announced for exactly what it receives (2 x 5 or 2 x 6 float4 groups x 256 threads x 16 bytes), rank 0's second
    for the other blocks' sums (11 groups); both areas over the stages one after the other; 43 st.async (11 + 11 + 10
    sends of slices, 5 + 6 of sums); nothing but the post-loop group barrier."""
    import tilecore_cuda

    k = _cuda(128, 4096, 4096, (128, 128, 64, 256, 5), 3, **{"tilecore.split_k_uneven": True,
                                                             "tilecore.split_k_group_sum": "slices"})
    src, note = k.source.code, k.meta["attrs"]["split_k"][0]
    assert "summed in slices: each block sums 20/20/24 of 64 float32 registers" in note and "over its stages" in note
    a1 = int(re.search(r"float\* vtc_group_slices = \(float\*\)\(tc_smem \+ (\d+)\);", src).group(1))
    a2 = int(re.search(r"float\* vtc_group_sums = \(float\*\)\(tc_smem \+ (\d+)\);", src).group(1))
    assert a1 == 1024 and a2 == a1 + 2 * 6 * 256 * 16 and "__half* A_shared = (__half*)(tc_smem + 1024);" in src
    assert src.count("tc_mbar_expect_tx(tc_smem_addr(vtc_group_full + (0)), 40960u);") == 2
    assert src.count("tc_mbar_expect_tx(tc_smem_addr(vtc_group_full + (0)), 49152u);") == 1
    assert src.count("tc_mbar_expect_tx(tc_smem_addr(vtc_group_full + (1)), 45056u);") == 1
    assert src.count("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32") == 43
    body = src[src.index("barrier.cluster.wait.acquire.aligned;"):]
    assert body.index("tc_mbar_wait(tc_smem_addr(vtc_group_full + (0)), 0);") \
        < body.index("tc_mbar_wait(tc_smem_addr(vtc_group_full + (1)), 0);") < body.index("tc_tma_store_2d(")
    try:
        sass = tilecore_cuda.CUDABackend().disassemble(k.binary, None)
    except SystemExit as e:
        pytest.skip(str(e))
    ops = re.findall(r"\b((?:STAS|LDS|UCGABAR)[\w.]*)", sass)
    assert ops.count("STAS.128") == 43 and ops.count("UCGABAR_ARV") == 1 and "LDL" not in sass
    # "rank0" at the same count: every peer's whole partial into rank 0 (2 partials, 128 KiB over the stages)
    k = _cuda(128, 4096, 4096, (128, 128, 64, 256, 5), 3, **{"tilecore.split_k_uneven": True,
                                                             "tilecore.split_k_group_sum": "rank0"})
    assert "summed in slices" not in k.meta["attrs"]["split_k"][0] and "131072 bytes" in k.meta["attrs"]["split_k"][0]
    with pytest.raises(CompileError, match="split_k_group_sum='all'"):
        _cuda(16, 8192, 8192, (64, 128, 64, 128, 4), 2, **{"tilecore.split_k_group_sum": "all"})


@needs_toolchain
def test_routing_mode_group_routes_only_what_the_core_sums_in_groups():
    """tilecore.cuda.general_split_k="group" (D75, the default): the plugin's split GEMM goes to the core only where
    the core sums it in panels (2 splits, a 16-bit C of two or more 128-byte panels, at most 32 KiB into a block, every
    group resident at once): 64x128 tiles at 128x4096x4096 and 16x8192x8192 and 128x128 at 256x4096x4096 do; since
    D78 the 3 splits of 64x256 in cells (their area beside the stages) and of 128x128/5 at 128x4096x4096 (the
    staging tile over the area) where the measured CELLS_AREAS hold it; 128x64 (one panel, 2 splits) stays on the
    plugin."""
    def compiled(M, N, K, bm, bn, th, st):
        return tilecore.compile(matmul(M, N, K, bm, bn, 64, threads=th, num_stages=st), target="cuda:sm_90a",
                                pass_configs={**NOCACHE, "tilecore.cuda.general_split_k": "group"})

    for M, N, K in ((128, 4096, 4096), (16, 8192, 8192)):
        k = compiled(M, N, K, 64, 128, 128, 4)
        assert k.source.meta["cluster"] == [1, 1, 2] and "tc_wgmma_splitk" not in k.source.code
        assert "st.async.shared::cluster" in k.source.code  # the transaction-barrier form by default
    k = compiled(256, 4096, 4096, 128, 128, 256, 4)
    assert k.source.meta["cluster"] == [1, 1, 2] and "summed in panels" in k.meta["attrs"]["split_k"][0]
    from tilecore_cuda.hopper import CELLS_AREAS

    k = compiled(128, 4096, 4096, 128, 128, 256, 5)  # D78: cells, the staging tile over the area
    assert ("tc_wgmma_splitk" in k.source.code) == ("staging" not in CELLS_AREAS)
    assert "summed in cells" in compiled(16, 8192, 8192, 64, 256, 128, 3).meta["attrs"]["split_k"][0]  # D78
    assert "tc_wgmma_splitk" in compiled(128, 4096, 4096, 128, 64, 256, 4).source.code
    # unset, the same: "group" is the default
    k = tilecore.compile(matmul(16, 8192, 8192, 64, 128, 64, threads=128, num_stages=4), target="cuda:sm_90a",
                         pass_configs=NOCACHE)
    assert k.source.meta["cluster"] == [1, 1, 2] and "summed in panels" in k.meta["attrs"]["split_k"][0]


@needs_toolchain
def test_group_sum_in_panels():
    """The epilogue a bulk store of a paneled tile (64x128: two 64-column panels): each of 2 splits owns the float4
    groups whose columns lie in its panel (found from the epilogue's staging stores, every thread), receives them from
    its peer on its transaction barrier (16 KiB), sums them in split order and bulk-stores its own panel: no gather
    into rank 0, every block runs the epilogue."""
    import tilecore_cuda

    k = _cuda(16, 8192, 8192, (64, 128, 64, 128, 4), 2, **{"tilecore.split_k_group_sum": "auto"})
    src, note = k.source.code, k.meta["attrs"]["split_k"][0]
    assert "summed in panels: each block sums 32/32 of 64" in note and "16384 bytes" in note
    assert src.count("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32") == 2 * 8
    assert src.count("tc_mbar_expect_tx(tc_smem_addr(vtc_group_full + (0)), 16384u);") == 2  # one version a rank
    assert "vtc_group_sums" not in src and "if ((split == 0)) {\n    tc_mbar_wait" not in src
    store = re.findall(r"tc_tma_store_2d\(&tc_tmap2, [^;]*;", src)
    assert store == ["tc_tma_store_2d(&tc_tmap2, tc_smem_addr(C_local_st) + (unsigned)(((int)(split) + 0)) * 8192u, "
                     "(int)((bx * 128)) + ((int)(split) + 0) * 64, (int)((by * 64)));"]
    try:
        sass = tilecore_cuda.CUDABackend().disassemble(k.binary, None)
    except SystemExit as e:
        pytest.skip(str(e))
    ops = re.findall(r"\b((?:STAS|UCGABAR|MEMBAR)[\w.]*)", sass)
    assert ops.count("STAS.128") == 16 and ops.count("UCGABAR_ARV") == 1 and "MEMBAR.ALL.GPU" not in ops
    # 128x64 tiles have one panel: the rank-0 form; asked for, "panels" says why
    with pytest.raises(CompileError, match="1 panel\\(s\\) do not divide among 2 splits"):
        _cuda(128, 4096, 4096, (128, 64, 64, 256, 4), 2, **{"tilecore.split_k_group_sum": "panels"})


@needs_toolchain
def test_panels_refused_where_the_epilogue_reads_the_accumulator_elsewhere():
    """An epilogue that also stores the accumulator directly (a second output) must see every register summed: not
    the panels form ("auto" takes the rank-0 form; asked for, "panels" names the reason)."""
    import tilecore.language as T

    M, N, K = 128, 4096, 4096

    @T.prim_func
    def two_outputs(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16"),
                    D: T.Tensor((M, N), "float32")):
        with T.Kernel(N // 128, M // 64, threads=128) as (bx, by):
            As = T.alloc_shared((64, 64), "float16")
            Bs = T.alloc_shared((64, 128), "float16")
            Cl = T.alloc_fragment((64, 128), "float32")
            T.clear(Cl)
            for ko in T.Pipelined(K // 64, num_stages=4):
                T.copy(A[by * 64, ko * 64], As)
                T.copy(B[ko * 64, bx * 128], Bs)
                T.gemm(As, Bs, Cl)
            T.copy(Cl, C[by * 64, bx * 128])
            T.copy(Cl, D[by * 64, bx * 128])

    cfg = {**GENERAL, "tilecore.split_k": 2, "tilecore.split_k_reduce": "group"}
    k = tilecore.compile(two_outputs, target="cuda:sm_90a", pass_configs=cfg)
    assert "in panels" not in k.meta["attrs"]["split_k"][0] and k.source.meta["cluster"] == [1, 1, 2]
    with pytest.raises(CompileError, match="panels"):
        tilecore.compile(two_outputs, target="cuda:sm_90a", pass_configs={**cfg, "tilecore.split_k_group_sum": "panels"})


# -- D78: the sum in cells -------------------------------------------------------------------------------------------
def _eval(e, t, env):
    """An index / condition expression of the group sum for every thread ``t`` (numpy), the block's rank in ``env``."""
    import numpy as np
    from tilecore.ir import BinOp, Cast, Cmp, IntImm, Logic, Select, ThreadIndex, Var

    if isinstance(e, IntImm):
        return np.int64(e.value)
    if isinstance(e, ThreadIndex):
        return t
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Cast):
        return _eval(e.value, t, env)
    if isinstance(e, Select):
        return np.where(_eval(e.cond, t, env), _eval(e.t, t, env), _eval(e.f, t, env))
    if isinstance(e, Logic):
        a = _eval(e.a, t, env)
        return ~a if e.op == "not" else (a & _eval(e.b, t, env)) if e.op == "and" else (a | _eval(e.b, t, env))
    a, b = _eval(e.a, t, env), _eval(e.b, t, env)
    if isinstance(e, Cmp):
        return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[e.op]
    assert isinstance(e, BinOp), e
    ops = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "floordiv": lambda: a // b,
           "floormod": lambda: a % b}
    return ops[e.op]()


def _run(s, t, env, mask, out):
    """Every PeerStore / Store / CopyBarrierArrive / BulkStore of ``s`` with the threads' masks (Ifs followed)."""
    import numpy as np
    from tilecore.ir import For, If, PerThread, Seq

    if isinstance(s, For):  # the main loop
        return
    if isinstance(s, Seq):
        for x in s.body:
            _run(x, t, env, mask, out)
    elif isinstance(s, PerThread):
        _run(s.body, t, env, mask, out)
    elif isinstance(s, If):
        c = np.broadcast_to(_eval(s.cond, t, env), t.shape)
        _run(s.then, t, env, mask & c, out)
        if s.orelse is not None:
            _run(s.orelse, t, env, mask & ~c, out)
    else:
        out.append((s, mask.copy()))


@pytest.mark.parametrize("M,N,K,tile,split", [(128, 4096, 4096, (128, 128, 64, 256, 5), 3),
                                              (16, 8192, 8192, (64, 256, 64, 128, 3), 3),
                                              (128, 4096, 4096, (128, 128, 64, 256, 4), 4),
                                              (100, 1000, 2048, (64, 128, 64, 128, 4), 3),
                                              (128, 4096, 4096, (128, 128, 64, 128, 4), 3),
                                              (100, 904, 2048, (64, 128, 64, 128, 4), 3),
                                              (128, 4000, 4096, (128, 128, 64, 256, 5), 3),
                                              (16, 8000, 8192, (64, 256, 64, 128, 3), 3)])
def test_cells_exchange_simulated(monkeypatch, M, N, K, tile, split):
    """D78's sum in cells, run for every rank and thread from the IR the pass builds (the first and last row and column
    of tiles, where C's rows or, D84, columns end inside the tile: 904 columns leave the last 128-column tile's second
    panel past C): each block's area written once a float (no two stores on one place), exactly the bytes its
    barrier announced; each block sums, for every thread, the registers of its own cells whose first row and column
    lie in C (every such register of the tile summed by exactly one block, none of the cells past C) in split order 0 .. S-1, term j
    its own register where j is its rank, else the place split j stored that thread's same register to; its bulk
    store covers exactly the cells it summed (each cell of the tile stored by one block)."""
    import numpy as np
    import tilecore.passes.splitk as sk
    from tilecore.compiler import lower
    from tilecore.ir import BinOp, BufferLoad, BulkStore, CopyBarrierArrive, PeerStore, Seq, Store, const_value, rewrite

    seen = {}
    real = sk._finish_group

    def keep(func, ctx, launch, gexprs, bvars, z, splits, new_top, note):
        seen.update(top=new_top, z=z, splits=splits, bvars=bvars)
        return real(func, ctx, launch, gexprs, bvars, z, splits, new_top, note)

    monkeypatch.setattr(sk, "_finish_group", keep)
    bm, bn, bk, th, st = tile
    lower(matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st), target="cuda:sm_90a",
          pass_configs={**GENERAL, "tilecore.split_k": split, "tilecore.split_k_uneven": True,
                        "tilecore.split_k_reduce": "group", "tilecore.split_k_group_sum": "cells"})
    top, S = seen["top"], seen["splits"]
    assert S == split
    t = np.arange(th, dtype=np.int64)
    area = next(a.buffer for a in top if getattr(a, "buffer", None) is not None and a.buffer.name == "tc_group_cells")
    k = next(i for i, x in enumerate(top) if getattr(x, "attrs", {}).get("split_k") == "group cell sum in split order")
    epi = rewrite(Seq(list(top[k + 1:])), lambda x: x.with_(cells=None) if isinstance(x, BulkStore) else None).body
    acc = None
    rows_of_tiles, cols_of_tiles = -(-M // bm), -(-N // bn)
    for by, bx in sorted({(y, x) for y in (0, rows_of_tiles - 1) for x in (0, cols_of_tiles - 1)}):
        env0 = {v.name: np.int64(0) for v in seen["bvars"]}
        env0[seen["bvars"][1].name] = np.int64(by)
        env0[seen["bvars"][0].name] = np.int64(bx)
        written = [dict() for _ in range(S)]  # owner -> {float index: (sender, thread, register)}
        sums, announced, stored = {}, {}, {}
        for me in range(S):
            env = {**env0, seen["z"].name: np.int64(me)}
            out = []
            for x in top:
                _run(x, t, env, np.ones(th, dtype=bool), out)
            for x, mask in out:
                if isinstance(x, PeerStore) and x.buffer is area:
                    acc = x.values[0].buffer
                    rank = np.broadcast_to(_eval(x.rank, t, env), t.shape)
                    at = np.broadcast_to(_eval(x.indices[0], t, env), t.shape)
                    regs = [int(const_value(v.indices[0])) for v in x.values]
                    for th_ in t[mask]:
                        o = int(rank[th_])
                        assert o != me
                        for q, r in enumerate(regs):
                            key = int(at[th_]) + q
                            assert key not in written[o], (o, key)  # one store a place
                            written[o][key] = (me, int(th_), r)
                elif isinstance(x, Store) and acc is not None and x.buffer is acc and const_value(x.value) is None:
                    r = int(const_value(x.indices[0]))
                    terms = []

                    def flat(e):  # the sum's terms in order (left-nested additions)
                        if isinstance(e, BinOp) and e.op == "add":
                            flat(e.a)
                            flat(e.b)
                        else:
                            terms.append(e)

                    flat(x.value)
                    assert len(terms) == S and all(isinstance(y, BufferLoad) for y in terms)
                    for th_ in t[mask]:
                        assert (int(th_), r) not in sums  # summed once
                        got = []
                        for j, y in enumerate(terms):
                            if y.buffer is acc:
                                assert j == me and int(const_value(y.indices[0])) == r  # its own, at its index
                                got.append(None)
                            else:
                                got.append(int(np.broadcast_to(_eval(y.indices[0], t, env), t.shape)[th_]))
                        sums[(int(th_), r)] = (me, got)
                elif isinstance(x, CopyBarrierArrive) and "group" in x.barrier.name and mask.any():
                    assert me not in announced  # one arrival
                    announced[me] = int(x.bytes)
                elif isinstance(x, BulkStore):
                    first, end, rows = x.cells
                    stored[me] = (int(_eval(first, t, env)), int(_eval(end, t, env)), rows)
        nregs = int(const_value(acc.numel())) if not isinstance(acc.numel(), int) else acc.numel()
        for (th_, r), (me, got) in sums.items():
            for j, key in enumerate(got):
                if j != me:
                    assert written[me][key] == (j, th_, r)  # split j's same thread, same register
        for o in range(S):
            assert announced[o] == 4 * len(written[o])  # the barrier's bytes: exactly what its peers store
        firsts = sorted(stored.values())
        assert firsts[0][0] == 0 and all(a[1] == b[0] for a, b in zip(firsts, firsts[1:]))  # each cell stored once
        bs, rows, cols = sk._epilogue_map(epi, acc, nregs, th)
        bands, cell_rows = bs.layout.rows // firsts[0][2], firsts[0][2]
        live = 0
        for th_ in t:
            for r in range(nregs):
                row0 = int(rows[r][0][th_])
                c = (int(cols[r][0][th_]) // bs.layout.panel_elems) * bands + row0 // cell_rows
                panel0 = (int(cols[r][0][th_]) // bs.layout.panel_elems) * bs.layout.panel_elems
                inside = by * bm + (row0 // cell_rows) * cell_rows < M and bx * bn + panel0 < N
                assert ((th_, r) in sums) == inside  # the live cells' registers summed, the others not
                if inside:
                    live += 1
                    me = sums[(th_, r)][0]
                    assert stored[me][0] <= c < stored[me][1], (th_, r, me, c)
        whole = (by + 1) * bm <= M and (bx + 1) * bn - bs.layout.panel_elems < N  # every cell's first row / column
        assert live == th * nregs if whole else 0 < live < th * nregs


@needs_toolchain
def test_group_sum_in_cells():
    """3 splits of the plugin's 128x128 tile (two panels, which do not divide among 3): "auto" sums in cells of 16 rows
    x one 64-column panel, 16 cells owned 5/5/6; each block's barrier announced for its cells from 2 peers (5 or 6 x 4
    KiB x 2); C's tensor map a 64 x 16 box; each block's thread 0 bulk-stores its run of cells in a loop; SASS: 3
    versions x 16 DSMEM stores (predicated by the group's owner), no global traffic but the bulk store, no spills."""
    import tilecore_cuda

    k = _cuda(128, 4096, 4096, (128, 128, 64, 256, 5), 3, **{"tilecore.split_k_uneven": True,
                                                             "tilecore.split_k_group_sum": "auto"})
    src, note = k.source.code, k.meta["attrs"]["split_k"][0]
    assert "summed in cells: the tile's 16 cells of 16 rows x one panel owned 5/5/6" in note
    assert "an area of its own, 49152 bytes, the staging tile over it" in note and k.source.meta["cluster"] == [1, 1, 3]
    # the area beside the 5 stages (160 KiB), the staging tile (32 KiB) over it: placed inside the area, written only
    # after the block barrier that follows the sum's last read of it
    area = int(re.search(r"float\* vtc_group_cells = \(float\*\)\(tc_smem \+ (\d+)\);", src).group(1))
    stg = int(re.search(r"__half\* C_local_st = \(__half\*\)\(tc_smem \+ (\d+)\);", src).group(1))
    assert area <= stg and stg + 32768 <= area + 49152 and stg % 1024 == 0
    tail = src[src.index("tc_mbar_wait(tc_smem_addr(vtc_group_full + (0)), 0);"):]
    last_read = tail.rindex("vtc_group_cells[")
    assert tail.index("__syncthreads();", last_read) < tail.index("tc_stsm_x4(", last_read)
    assert src.count("barrier.cluster.arrive.relaxed.aligned;") == 1  # no group barrier after the main loop
    assert re.findall(r"tc_mbar_expect_tx\(tc_smem_addr\(vtc_group_full \+ \(0\)\), (\d+)u\);", src) == \
        ["40960", "40960", "49152"]
    assert k.source.meta["tensor_maps"][2]["box"] == [64, 16]
    assert "for (int tc_c = (int)(tc_floordiv((split * 16), 3)); tc_c < (int)(tc_floordiv(((split * 16) + 16), 3)); " \
           "++tc_c) {\n      tc_tma_store_2d(&tc_tmap2, tc_smem_addr(C_local_st) + (unsigned)(tc_c / 8) * 16384u + " \
           "(unsigned)(tc_c % 8) * 2048u, (int)((bx * 128)) + (tc_c / 8) * 64, (int)((by * 128)) + (tc_c % 8) * 16);" in src
    assert "vtc_group_sums" not in src and "vtc_group_slices" not in src
    try:
        sass = tilecore_cuda.CUDABackend().disassemble(k.binary, None)
    except SystemExit as e:
        pytest.skip(str(e))
    ops = re.findall(r"\b((?:STAS|LDS|UCGABAR|STG|LDG|ATOMG|UTMASTG)[\w.]*)", sass)
    assert ops.count("STAS.128") == 3 * 16 and ops.count("LDS.128") == 3 * 16 * 2 and ops.count("UCGABAR_ARV") == 1
    assert not [o for o in ops if o.startswith(("STG", "LDG", "ATOMG"))] and "UTMASTG.2D" in ops
    assert "LDL" not in sass and "STL" not in sass
    # over the stages (round 1's form, tilecore.split_k_group_area="stages"): a group barrier after the main loop
    k = _cuda(128, 4096, 4096, (128, 128, 64, 256, 5), 3, **{"tilecore.split_k_uneven": True,
                                                             "tilecore.split_k_group_area": "stages",
                                                             "tilecore.split_k_group_sum": "cells"})
    assert "over its stages, 49152 bytes;" in k.meta["attrs"]["split_k"][0]
    assert k.source.code.count("barrier.cluster.arrive.release.aligned;") == 1
    # 64x256 (four panels, 128 threads): 16 cells, an area of its own (beside the stages)
    k = _cuda(16, 8192, 8192, (64, 256, 64, 128, 3), 3, **{"tilecore.split_k_uneven": True,
                                                           "tilecore.split_k_group_sum": "cells"})
    assert "16 cells of 16 rows x one panel owned 5/5/6" in k.meta["attrs"]["split_k"][0]
    assert "an area of its own" in k.meta["attrs"]["split_k"][0]


@needs_toolchain
def test_cells_refused_by_name_where_they_do_not_apply():
    """Asked for, "cells" names why it does not apply: an epilogue that is no bulk store of the accumulator alone."""
    with pytest.raises(CompileError, match="split_k_group_sum=\"cells\": the epilogue is not one bulk tile store"):
        _cuda(128, 4096, 4096, (128, 128, 64, 256, 4), 2, **{"tilecore.split_k_group_sum": "cells",
                                                             "tilecore.bulk_store": False})


@needs_toolchain
def test_routing_takes_the_plugins_three_splits_in_cells_when_asked():
    """tilecore.cuda.general_split_k_cells=True (D78): the plugin's default tiles, whose rule says 4 splits of which
    32 groups would not all be resident at once (30 of 4), go to the core at one split fewer, 3 (39 at once), unevenly
    over the k tiles, summed in cells (the panels do not divide among 3); unset ("auto"), only where the cells' area
    lies in a measured place (CELLS_AREAS: beside the stages and the staging tile, 64x256x64/3: 144 + 32 + 48 KiB;
    with the staging tile over it, 128x128x64/5: 160 + 48 KiB); False: neither."""
    from tilecore_cuda.hopper import CELLS_AREAS

    def compiled(M, N, K, bm, bn, th, st, **cfg):
        return tilecore.compile(matmul(M, N, K, bm, bn, 64, threads=th, num_stages=st), target="cuda:sm_90a",
                                pass_configs={**NOCACHE, **cfg})

    for M, N, K, bm, bn, th, st, per in ((128, 4096, 4096, 128, 128, 256, 5, "21-22 of 64"),
                                         (16, 8192, 8192, 64, 256, 128, 3, "42-43 of 128")):
        k = compiled(M, N, K, bm, bn, th, st, **{"tilecore.cuda.general_split_k_cells": True})
        note = k.meta["attrs"]["split_k"][0]
        assert k.source.meta["cluster"] == [1, 1, 3] and "tc_wgmma_splitk" not in k.source.code
        assert f"({per} k tiles each)" in note and "summed in cells" in note and "owned 5/5/6" in note
        code = compiled(M, N, K, bm, bn, th, st).source.code
        assert ("tc_wgmma_splitk" in code) == (bm == 128 and "staging" not in CELLS_AREAS)
        assert "tc_wgmma_splitk" in compiled(M, N, K, bm, bn, th, st,
                                             **{"tilecore.cuda.general_split_k_cells": False}).source.code
    # D75's 2-split route is unchanged by the option
    k = compiled(128, 4096, 4096, 64, 128, 128, 4, **{"tilecore.cuda.general_split_k_cells": True})
    assert k.source.meta["cluster"] == [1, 1, 2] and "summed in panels" in k.meta["attrs"]["split_k"][0]
    with pytest.raises(CompileError, match="general_split_k_cells"):
        compiled(128, 4096, 4096, 128, 128, 256, 5, **{"tilecore.cuda.general_split_k_cells": "sometimes"})
