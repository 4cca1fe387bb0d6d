"""Split-K for GEMMs with few output tiles (``cuda.hopper_gemm_pipeline``, docs/decisions.md D27), through the
public API: the plain README GEMM, no change to the kernel.

Compile-only wherever a CUDA compiler exists (CI): when the pass splits (a static grid that leaves SMs of the
profile's ``limits.sm_count`` idle, each split at least 4 x stages k tiles but at most 16, the tail's partial
bytes at most a split's operand bytes: D31) and by how much, the note in
``kernel.meta["attrs"]["hopper_pipelines"]``, ``tilecore.cuda.split_k`` and its errors, the kernel's
workspace in the launch metadata, and the SASS (the atomic arrival count, the fences, the L2 loads of the
partials). Where the profile's thread-block clusters hold a tile's splits, the tile's blocks are one cluster and
sum through each other's shared memory instead (D41: ``__cluster_dims__``, no workspace; the SASS's cluster
barriers and DSMEM stores); ``tilecore.cuda.split_k_reduce`` chooses. The runtime passes the workspace (one per device and stream, allocated once, zero-filled) on both
launch paths, checked against a recording driver on the CPU. On an sm_90 GPU the split kernels run against
float64 references and must give the same bits on every run, the cluster sum the same bits as the global one.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
from tilecore.errors import CompileError

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import HOPPER, _notes, gemm, hopper_gpu  # noqa: E402
from test_cuda_hopper import _the_plugins_hopper_pipeline  # noqa: E402,F401 (D62: plain GEMMs pinned to the plugin)

#: the issue's two small-M rows at the tiles the benchmark found best for the user's split kernel, and a ragged one
LLM_128 = dict(M=128, N=4096, K=4096, bm=128, bn=128, threads=256, stages=3)
LLM_16 = dict(M=16, N=8192, K=8192, bm=64, bn=128, threads=128, stages=4)
RAGGED = dict(M=200, N=1000, K=3000, bm=128, bn=128, threads=256, stages=3)
#: the same on one consumer warpgroup: two 64-row slices of accumulators per thread (MR = 2)
RAGGED_MR2 = dict(RAGGED, threads=128)
#: D27/D31's sum through the global workspace (the default where a cluster holds the splits is the cluster's, D41)
GLOBAL = {"tilecore.cuda.split_k_reduce": "global"}
CLUSTER = {"tilecore.cuda.split_k_reduce": "cluster"}


def _compile(shape: dict, target=HOPPER, **kw):
    cfg = kw.pop("pass_configs", {})
    s = dict(shape)
    fn = gemm(s.pop("M"), s.pop("N"), s.pop("K"), **s, **kw)
    # this file tests the plugin's split-K: a GEMM the core would sum in block groups stays here (D75's routing)
    return tilecore.compile(fn, target=target, pass_configs={**NOCACHE, "tilecore.cuda.general_split_k": False, **cfg})


def _head(k) -> list:
    """The template arguments of the kernel's split collective."""
    src = k.get_kernel_source()
    return src[src.index("tc_wgmma_splitk<"):].split(">", 1)[0].split("<", 1)[1].split(", ")


# -- the decision ----------------------------------------------------------------------------------------

#: D41: 4 splits of 32 tiles in clusters would not all fit on an H100 at once (30 clusters of 4 do), 3 do (39)
FEWER = "; 4 splits in clusters would not all fit at once on cuda/sm_90a (30 of 4), 3 do (39)"


@needs_toolchain
@pytest.mark.parametrize("shape,splits,tiles,per,why,reduce", [
    (LLM_128, 3, 32, "21-22", FEWER, "cluster"), (LLM_16, 2, 64, "64", "", "cluster"),
    (RAGGED, 3, 16, "15-16", "", "cluster"),
    # 5 stages: 4 x 5 = 20 k tiles per split would allow 3; the floor stops at 16 k tiles (D31)
    (dict(LLM_128, stages=5), 3, 32, "21-22", FEWER, "cluster"),
    # 128x256 at 2 stages: 8 splits would fill the SMs, but 7 float32 partials of 128 KiB are more than the 8 k
    # tiles of 48 KiB a split streams; 5 is the most whose tail (4 x 128 KiB) stays within its 13 x 48 KiB. The
    # cluster's receive area (5 senders x 2 slices x 7 columns x 2 KiB) is more than the 2 stages: global (D41)
    (dict(LLM_128, N=2048, bn=256, stages=2), 5, 8, "12-13",
     "; 8 splits would read more partial bytes in the tail than a split's k tiles stream",
     "the cluster sum's 143360 bytes do not fit in the pipeline's 2 stages of 49152 bytes")])
def test_few_tile_gemms_are_split_over_k(shape, splits, tiles, per, why, reduce):
    k = _compile(shape)
    note = _notes(k)
    assert f"split-K {splits} ({tiles} tiles on 132 SMs{why}): {tiles * splits} blocks, {per} k tiles each" in note
    meta = k.source.meta
    assert meta["grid"][2] == str(splits) and int(meta["grid"][0]) * int(meta["grid"][1]) == tiles
    src = k.get_kernel_source()
    assert "tc_wgmma_pipeline<" not in src.split("__global__")[-1]
    if reduce == "cluster":  # D41: one cluster of the tile's splits, compiled into the kernel; no workspace
        assert (f"{per} k tiles each, each tile's blocks one cluster, float32 slices summed in split order through "
                "its shared memory (DSMEM)") in note
        assert meta["cluster"] == [1, 1, splits] and "workspace" not in meta
        assert f"__global__ void __cluster_dims__(1, 1, {splits}) __launch_bounds__(" in src
        assert _head(k)[-3:] == [str(splits), str(tiles), "true"] and "tc_workspace" not in src
        return
    assert f"float32 partials summed in split order by each tile's last block; partials summed through global " \
        f"memory, not in one cluster per tile: {reduce}" in note
    bm, bn = shape["bm"], shape["bn"]
    assert meta["workspace"] == {"bytes": -(-tiles * 4 // 256) * 256 + tiles * splits * bm * bn * 4, "zeroed": True}
    assert "cluster" not in meta and "void __cluster_dims__" not in src
    assert _head(k)[-2:] == [str(splits), str(tiles)]
    assert "unsigned char* tc_workspace, int* __restrict__ tc_status)" in src  # after the tensor maps


@needs_toolchain
@pytest.mark.parametrize("shape", [LLM_128, LLM_16, RAGGED])
def test_split_k_reduce_global_keeps_the_workspace_kernel(shape):
    """``tilecore.cuda.split_k_reduce="global"``: D27/D31's kernel as it was (last block sums from the workspace)."""
    k = _compile(shape, pass_configs={"tilecore.cuda.split_k_reduce": "global"})
    note, meta, src = _notes(k), k.source.meta, k.get_kernel_source()
    assert "float32 partials summed in split order by each tile's last block" in note
    splits, tiles = int(meta["grid"][2]), int(meta["grid"][0]) * int(meta["grid"][1])
    assert meta["workspace"]["bytes"] == -(-tiles * 4 // 256) * 256 + tiles * splits * shape["bm"] * shape["bn"] * 4
    assert "void __cluster_dims__" not in src and _head(k)[-2:] == [str(splits), str(tiles)]


@needs_toolchain
def test_split_k_reduce_cluster_limits_and_errors():
    # more splits than a portable cluster holds (8): by default the global sum, said so; asked for, an error
    k = _compile(LLM_128, pass_configs={"tilecore.cuda.split_k": 9})
    assert ("partials summed through global memory, not in one cluster per tile: 9 splits are more blocks than a "
            "cluster holds (8)") in _notes(k)
    assert "workspace" in k.source.meta and "void __cluster_dims__" not in k.get_kernel_source()
    k = _compile(LLM_128, pass_configs={"tilecore.cuda.split_k": 8, **CLUSTER})
    assert k.source.meta["cluster"] == [1, 1, 8] and "workspace" not in k.source.meta
    # by default only clusters that all fit on an H100 at once (execution.cluster.at_once): 32 of 2 and of 3 do,
    # 32 of 4 do not (30), and an asked-for split count is kept: the workspace sum, said so; asked for, clusters
    for n, cluster in ((2, True), (3, True), (4, False)):
        k = _compile(LLM_128, pass_configs={"tilecore.cuda.split_k": n})
        assert bool(k.source.meta.get("cluster")) == cluster and ("workspace" in k.source.meta) != cluster, n
    assert ("32 clusters of 4 blocks may not all fit on the GPU at once (cuda/sm_90a holds 30); "
            "tilecore.cuda.split_k_reduce=\"cluster\" asks for them") in _notes(k)
    assert _compile(LLM_128, pass_configs={"tilecore.cuda.split_k": 4, **CLUSTER}).source.meta["cluster"] == [1, 1, 4]
    with pytest.raises(CompileError, match=r'split_k_reduce="cluster": 9 splits are more blocks than a cluster '
                                           r'holds \(8\). Use fewer splits') as e:
        _compile(LLM_128, pass_configs={"tilecore.cuda.split_k": 9, "tilecore.cuda.split_k_reduce": "cluster"})
    assert "test_cuda_hopper.py:" in str(e.value)  # the line of the user's T.Pipelined loop
    with pytest.raises(CompileError, match='split_k_reduce must be "cluster" or "global", got \'dsmem\''):
        _compile(LLM_128, pass_configs={"tilecore.cuda.split_k_reduce": "dsmem"})
    # a grid the rule leaves unsplit is not a cluster kernel
    k = _compile(dict(M=4096, N=4096, K=4096, bm=128, bn=256, threads=256, stages=4))
    assert "cluster" not in k.source.meta and "void __cluster_dims__" not in k.get_kernel_source()


def _max_load_run(sass: str) -> int:
    """The most 16-byte global loads in a row before a float add or a global store: loads in flight per thread."""
    best = run = 0
    for op in re.findall(r"LDG\.E\.128|FADD|STG\.E\S*", sass):
        run = run + 1 if op.startswith("LDG") else 0
        best = max(best, run)
    return best


@needs_toolchain
def test_split_kernel_sass_counts_arrivals_and_reads_partials_from_l2():
    """The same main loop (HGMMA, TMA, the register hand-over), plus one atomic add on the tile's counter and one
    exchange that zeroes it, GPU-scope fences, 16-byte stores of the partial and 16-byte strong loads of the
    others (ld.global.cg: never a stale L1 line), grouped so that many are in flight (D31), and no spill."""
    be = tilecore_cuda.CUDABackend()
    split = _compile(LLM_128, pass_configs=GLOBAL)
    plain = _compile(LLM_128, pass_configs={"tilecore.cuda.split_k": 1})
    ss, sp = be.disassemble(split.binary, split.target), be.disassemble(plain.binary, plain.target)
    for op in ("HGMMA.64x128x16.F32", "UTMALDG.2D", "SYNCS.PHASECHK", "USETMAXREG"):
        assert op in ss and op in sp, op
    assert ss.count("ATOMG.E.ADD") == 1 and ss.count("ATOMG.E.EXCH") == 1 and "ATOMG" not in sp
    assert "MEMBAR.ALL.GPU" in ss and "MEMBAR.SC" not in ss  # fence.acq_rel.gpu
    # the consumers' own barrier (15) over their 256 threads: the producer warpgroup never arrives there
    assert "BAR.SYNC.DEFER_BLOCKING 0xf, 0x100 ;" in ss and "BAR.RED.OR.DEFER_BLOCKING 0xf, 0x100, P" in ss
    assert not re.search(r"\sLDG", sp)  # the plain kernel loads nothing but through TMA (UTMALDG)
    # LLM_128: 4 splits of 128x128 on two consumer warpgroups: 16 float4s per thread stored, 3 x 16 loaded (the
    # last block's own partial stays in its registers), 15 of them (5 columns x 3 splits) in flight at once
    assert ss.count("STG.E.128") == 16 and ss.count("LDG.E.128.STRONG.GPU") == 48
    assert _max_load_run(ss) == 15
    # no spills: the sum runs in the consumers' registers, at any split count and tile (D31)
    for shape, cfg in [(LLM_128, {"tilecore.cuda.split_k": 16}), (LLM_128, {"tilecore.cuda.split_k": 2}),
                       (LLM_128, {"tilecore.cuda.split_k": 64}),  # the other partials 16 at a time
                       (dict(LLM_128, threads=128), {}), (dict(LLM_128, bn=256), {})]:
        k = _compile(shape, pass_configs={**GLOBAL, **cfg})
        sass = be.disassemble(k.binary, k.target)
        assert "STL" not in sass and "LDL" not in sass, (shape, cfg)
        assert _max_load_run(sass) >= 15, (shape, cfg)


def test_split_main_loop_is_the_pipelines_one_copy():
    """tc_wgmma_splitk runs tc_wgmma_pipeline's main loop by calling it (tc_hopper.cuh's tc_wgmma_mainloop, D50),
    with its fixup as the epilogue: no copy of the loop in tc_splitk.cuh to drift apart."""
    prelude = Path(tilecore_cuda.__file__).parent / "prelude"
    hopper, splitk = (prelude / "tc_hopper.cuh").read_text(), (prelude / "tc_splitk.cuh").read_text()
    call = "tc_wgmma_mainloop<NTHREADS, BM, BN, BK, STAGES, NC, MR, B_KMAJOR, A_RS, A_CS, B_RS, B_CS, KSTEP,"
    assert call in hopper and call in splitk
    for part in ("tc_mbar_init(", "tc_tma_load_2d(", "tc_mbar_wait(", "tc_wgmma_ktile<", "tc_wgmma_wait<",
                 "tc_setmaxnreg_"):
        assert part in hopper and part not in splitk, part


def _ops(sass: str, op: str) -> int:
    return len(re.findall(rf"\s{re.escape(op)}[\s.]", sass))


@needs_toolchain
def test_cluster_kernel_sass_meets_twice_stores_dsmem_and_never_touches_global_scratch():
    """D41's kernel: the same main loop; the cluster barrier (arrive with release, wait with acquire: UCGABAR) in
    the consumers' sum and the producer warpgroup's two arrivals; the other blocks' columns as 16-byte DSMEM
    stores (generic ST.E.128 through the cluster window: 3 of every 4 float4 columns at 4 splits, unrolled over
    all 16 with the owner test), its own columns' 3 other slots as 16-byte shared loads; no atomic, no global
    load, no partial stored to global memory, no spill, at 2-8 splits and the benchmark's tiles."""
    be = tilecore_cuda.CUDABackend()
    k = _compile(LLM_128, pass_configs=CLUSTER)
    ss = be.disassemble(k.binary, k.target)
    for op in ("HGMMA.64x128x16.F32", "UTMALDG.2D", "SYNCS.PHASECHK", "USETMAXREG"):
        assert op in ss, op
    assert _ops(ss, "UCGABAR_ARV") >= 2 and _ops(ss, "UCGABAR_WAIT") >= 2
    assert "MEMBAR.ALL.GPU" in ss and "CCTL.IVALL" in ss  # the barrier's release and acquire halves
    assert "ATOMG" not in ss and not re.search(r"\sLDG", ss) and "STG.E.128" not in ss
    assert ss.count("ST.E.128") == 16 and ss.count("LDS.128") == 48 and ss.count("FADD") == 3 * 16 * 4
    for shape, cfg in [(LLM_128, {"tilecore.cuda.split_k": 2}), (LLM_128, {"tilecore.cuda.split_k": 8}),
                       (LLM_16, {}), (dict(LLM_128, threads=128), {}), (dict(LLM_128, bk=64, stages=5), {}),
                       (dict(LLM_128, bm=64, threads=128, stages=4), {}), (RAGGED, {})]:
        k = _compile(shape, pass_configs={**CLUSTER, **cfg})
        assert k.source.meta.get("cluster"), (shape, cfg)
        sass = be.disassemble(k.binary, k.target)
        assert "STL" not in sass and "LDL" not in sass, (shape, cfg)
        assert "UCGABAR_WAIT" in sass and "ATOMG" not in sass, (shape, cfg)


@needs_toolchain
def test_float8_gemm_is_split_too():
    k = _compile(dict(LLM_128, bk=128), dtype="float8_e4m3", tb=True)
    assert "split-K 2 (32 tiles on 132 SMs): 64 blocks, 16 k tiles each" in _notes(k)  # 32 k tiles of 128
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "QGMMA.64x128x32.F32.E4M3.E4M3" in sass and "UCGABAR_WAIT" in sass  # summed in its cluster (D41)


@needs_toolchain
def test_large_grids_and_short_k_loops_are_not_split():
    k = _compile(dict(M=4096, N=4096, K=4096, bm=128, bn=256, threads=256, stages=4))  # 512 tiles
    assert "split" not in _notes(k) and "workspace" not in k.source.meta
    assert k.source.meta["grid"] == ["132", "1", "1"]  # the persistent grid (D43: the default), not split
    k = _compile(dict(M=128, N=4096, K=512, bm=128, bn=128, threads=256, stages=3))  # 8 k tiles
    assert "not split over K: 32 tiles on 132 SMs, but 8 k tiles are too few for two splits of at least 12 (4 x 3 stages)" in _notes(k)
    assert "workspace" not in k.source.meta and "tc_wgmma_persistent<" in k.get_kernel_source()
    k = _compile(dict(M=128, N=4096, K=1024, bm=128, bn=128, threads=256, stages=5))  # 16 k tiles, 5 stages
    assert "16 k tiles are too few for two splits of at least 16 (4 x 5 stages, at most 16)" in _notes(k)


@needs_toolchain
def test_split_k_config_overrides_and_switches_off():
    k = _compile(LLM_128, pass_configs={"tilecore.cuda.split_k": 1})
    assert "split-K off (tilecore.cuda.split_k=1)" in _notes(k) and "workspace" not in k.source.meta
    assert k.source.meta["grid"] == ["32", "1", "1"]
    k = _compile(LLM_128, pass_configs={"tilecore.cuda.split_k": 7})  # beyond the SMs: allowed (no block waits)
    assert "split-K 7 (tilecore.cuda.split_k): 224 blocks, 9-10 k tiles each" in _notes(k)
    assert k.source.meta["grid"] == ["32", "1", "7"]
    # the sm_80 path has no pipeline to split: the option changes nothing there
    k = _compile(LLM_128, target="cuda:sm_80", pass_configs={"tilecore.cuda.split_k": 4})
    assert "split" not in _notes(k)


@needs_toolchain
@pytest.mark.parametrize("value,kw,match", [
    (0, {}, "tilecore.cuda.split_k must be a positive integer .1 switches split-K off., got 0"),
    ("4", {}, "must be a positive integer"),
    (True, {}, "must be a positive integer"),
    (65, {}, r"more splits than the K loop has k tiles \(64; every split needs one\): use at most "
             r"tilecore.cuda.split_k=64"),
    (2, {"epilogue": "relu"}, "cannot be split over blocks: the accumulator is used after the loop"),
])
def test_split_k_config_errors_name_the_users_loop_and_the_fix(value, kw, match):
    with pytest.raises(CompileError, match=match) as e:
        _compile(LLM_128, pass_configs={"tilecore.cuda.split_k": value}, **kw)
    assert "test_cuda_hopper.py:" in str(e.value)  # the line of the user's T.Pipelined loop


@needs_toolchain
def test_a_dynamic_grid_is_not_split():
    from test_cuda_hopper import dynamic_m_gemm

    k = tilecore.compile(dynamic_m_gemm(N=512, K=8192), target=HOPPER, pass_configs=NOCACHE)
    assert "split" not in _notes(k)
    with pytest.raises(CompileError, match="cannot be split over blocks: the launch grid is not static"):
        tilecore.compile(dynamic_m_gemm(N=512, K=8192), target=HOPPER,
                         pass_configs={**NOCACHE, "tilecore.cuda.split_k": 2})


@needs_toolchain
def test_swizzled_grid_splits_on_the_raw_tile_index():
    """T.use_swizzle remaps (bx, by); the tile index the counters use is a bijection of them, the split the z index."""
    k = _compile(LLM_128, panel=4)
    src = k.get_kernel_source()
    assert "tc_pn = 4LL * tc_gf" in src and "const int split = (int)blockIdx.z;" in src
    assert "(long long)(((by * 32) + bx)), (long long)(split)" in src


# -- the runtime: the workspace parameter, on the CPU with a recording driver -------------------------------

def test_the_workspace_is_allocated_once_per_stream_and_passed_on_both_launch_paths(monkeypatch):
    torch = pytest.importorskip("torch")
    from test_c_launcher import KERNELS, on_cpu

    func, opts = KERNELS["splitk_gemm"]()
    kernel = tilecore.compile(func, target=HOPPER, **opts)
    size = kernel.source.meta["workspace"]["bytes"]
    assert "split-K 2 (tilecore.cuda.split_k)" in _notes(kernel)
    a, b = torch.randn(64, 512).half(), torch.randn(512, 128).half()
    for c_launcher in (True, False):
        k, prog, driver = on_cpu(kernel, c_launcher, monkeypatch)
        for _ in range(3):
            k(a, b)
        slots = [int.from_bytes(r["params"][-2], "little") for r in driver.records]
        ws, _ = prog._workspaces[(0, 0x5000)]
        assert len(prog._workspaces) == 1 and slots == [ws.data_ptr()] * 3
        assert ws.numel() == size and ws.dtype == torch.uint8 and not ws.any()
        assert driver.records[-1]["grid"] == (2, 1, 2)
        if c_launcher:
            assert k._native is not None  # the later calls went through the compiled launcher
        prog._get_stream = lambda dev: 0x6000  # another stream: its own workspace
        k(a, b)
        assert int.from_bytes(driver.records[-1]["params"][-2], "little") == prog._workspaces[(0, 0x6000)][0].data_ptr()
        assert len(prog._workspaces) == 2 and prog._workspaces[(0, 0x6000)][0].data_ptr() != ws.data_ptr()


def cluster_warnings(kernel, fits: int) -> tuple:
    """Load ``kernel`` through the runtime with a stand-in driver whose cuOccupancyMaxActiveClusters says ``fits``
    clusters fit at once: ``(the PerformanceWarnings' texts, the occupancy queries' (grid, block, shared bytes,
    attributes))`` (D41's clusters-at-once check; test_group_multicast and test_general_splitk use it too)."""
    import types
    import warnings

    from tilecore.errors import PerformanceWarning
    from tilecore_cuda import runtime as cuda_runtime

    prog = cuda_runtime.CUDAProgram(kernel.binary, kernel.source)
    asked = []

    def occupancy(out, func, cfg):
        c = cfg._obj
        asked.append((c.grid_x, c.grid_y, c.grid_z, c.block_x, c.shared, c.num_attrs))
        out._obj.value = fits
        return 0

    ok = lambda *a: 0  # noqa: E731 - the driver calls _function makes, all successful
    prog.lib = types.SimpleNamespace(cuCtxGetCurrent=ok, cuDeviceGet=ok, cuDevicePrimaryCtxRetain=ok,
                                     cuCtxSetCurrent=ok, cuModuleLoadData=ok, cuModuleGetFunction=ok,
                                     cuFuncSetAttribute=ok, cuOccupancyMaxActiveClusters=occupancy)
    prog.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(init=lambda: None), empty=lambda *a, **k: None)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        prog._function(0)
    return [str(w.message) for w in got if issubclass(w.category, PerformanceWarning)], asked


@needs_toolchain
def test_a_cluster_grid_the_gpu_cannot_hold_at_once_is_a_performance_warning():
    """D41: 32 clusters of 4 need 32 GPC slots at once; where the driver says fewer fit (an H100's GPCs of 14-18
    SMs), loading the kernel warns with the fix; where they fit, or for the workspace kernel, nothing is said."""
    load = cluster_warnings
    k = _compile(dict(LLM_128, stages=5), pass_configs=CLUSTER)  # 32 tiles, clusters of 4
    said, asked = load(k, 30)
    assert asked == [(32, 1, 4, 384, k.source.meta["dynamic_shared_bytes"], 0)]
    assert len(said) == 1 and "this GPU holds 30 clusters of 4 blocks at once, the grid has 32" in said[0]
    assert 'tilecore.cuda.split_k_reduce=\"global\"' in said[0]
    assert load(k, 32)[0] == []
    said, asked = load(_compile(dict(LLM_128, stages=5), pass_configs=GLOBAL), 30)
    assert said == [] and asked == []  # no clusters: nothing to ask


# -- on an H100 / H200 --------------------------------------------------------------------------------------

def _inputs(torch, M, N, K, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(getattr(torch, dtype)).cuda()
    b = torch.randn(K, N, generator=g).to(getattr(torch, dtype)).cuda()
    return a, b, (a.double() @ b.double())


@hopper_gpu
@pytest.mark.parametrize("shape,dtype,out,kw", [(LLM_128, "float16", "float16", {}),
                                                (LLM_128, "bfloat16", "float16", {"panel": 4}),
                                                (LLM_16, "float16", "float16", {}), (LLM_16, "bfloat16", "bfloat16", {}),
                                                (RAGGED, "float16", "float32", {}), (RAGGED, "bfloat16", "bfloat16", {}),
                                                (RAGGED_MR2, "bfloat16", "bfloat16", {})])
def test_device_split_gemm_matches_float64_and_repeats_bit_for_bit(shape, dtype, out, kw):
    torch = pytest.importorskip("torch")
    M, N, K = shape["M"], shape["N"], shape["K"]
    k = _compile(shape, target="cuda", dtype=dtype, out=out, **kw)
    assert "split-K" in _notes(k) and "split-K off" not in _notes(k)
    a, b, ref = _inputs(torch, M, N, K, dtype, seed=M + N)
    runs = []
    for _ in range(3):
        c = torch.full((M, N), float("nan"), device="cuda", dtype=getattr(torch, out))
        k(a, b, c)
        torch.cuda.synchronize()
        runs.append(c)
    assert all(torch.equal(runs[0], r) for r in runs[1:])  # the same bits every run
    got = runs[0].double()
    assert torch.isfinite(got).all()
    # one rounding of a float32 sum: the unsplit kernel's error class (K-scaled accumulation + output rounding)
    tol = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 8e-2}[out] * np.sqrt(K)
    assert torch.allclose(got, ref, atol=tol, rtol=2e-2), (got - ref).abs().max().item()
    # the same tolerance for the unsplit kernel, and agreement with it to the output's rounding
    plain = _compile(shape, target="cuda", dtype=dtype, out=out, pass_configs={"tilecore.cuda.split_k": 1}, **kw)
    c1 = torch.empty_like(runs[0])
    plain(a, b, c1)
    torch.cuda.synchronize()
    assert torch.allclose(c1.double(), ref, atol=tol, rtol=2e-2)
    # the kernel left every tile's arrival counter at zero (the workspace needs no clearing between launches);
    # a cluster kernel (D41) has none
    tiles = int(k.source.meta["grid"][0]) * int(k.source.meta["grid"][1])
    assert bool(k._program._workspaces) == ("workspace" in k.source.meta)
    for ws, _ in k._program._workspaces.values():
        assert not ws[:tiles * 4].any()


@hopper_gpu
@pytest.mark.parametrize("shape,dtype,out,kw", [(LLM_128, "float16", "float16", {}), (LLM_16, "bfloat16", "bfloat16", {}),
                                                (RAGGED, "float16", "float32", {}), (RAGGED_MR2, "bfloat16", "bfloat16", {}),
                                                (LLM_128, "float16", "float16", {"tilecore.cuda.split_k": 8}),
                                                (dict(LLM_128, bm=64, threads=128, stages=4), "float16", "float16", {})])
def test_device_cluster_sum_gives_the_global_sums_bits(shape, dtype, out, kw):
    """D41: the cluster sum adds the same float32 partials in the same split order as D27/D31's last block, so C
    is the same bits; and it matches float64 like the unsplit kernel."""
    torch = pytest.importorskip("torch")
    M, N, K = shape["M"], shape["N"], shape["K"]
    kc = _compile(shape, target="cuda", dtype=dtype, out=out, pass_configs={**kw, **CLUSTER})
    kg = _compile(shape, target="cuda", dtype=dtype, out=out, pass_configs={**kw, **GLOBAL})
    assert kc.source.meta["cluster"][2] == int(kc.source.meta["grid"][2]) > 1 and "workspace" in kg.source.meta
    a, b, ref = _inputs(torch, M, N, K, dtype, seed=M + 3 * N)
    cs = []
    for k in (kc, kg, kc):
        c = torch.full((M, N), float("nan"), device="cuda", dtype=getattr(torch, out))
        k(a, b, c)
        torch.cuda.synchronize()
        cs.append(c)
    assert torch.equal(cs[0], cs[1]) and torch.equal(cs[0], cs[2])
    tol = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 8e-2}[out] * np.sqrt(K)
    assert torch.allclose(cs[0].double(), ref, atol=tol, rtol=2e-2), (cs[0].double() - ref).abs().max().item()


@hopper_gpu
@pytest.mark.parametrize("reduce", ["global", "cluster"])
def test_device_two_streams_and_a_cuda_graph_each_get_their_own_workspace(reduce):
    torch = pytest.importorskip("torch")
    shape = LLM_16
    M, N, K = shape["M"], shape["N"], shape["K"]
    k = _compile(shape, target="cuda", pass_configs={"tilecore.cuda.split_k_reduce": reduce})
    a, b, ref = _inputs(torch, M, N, K, "float16", seed=7)
    c0 = torch.empty(M, N, device="cuda", dtype=torch.float16)
    k(a, b, c0)  # the default stream
    torch.cuda.synchronize()
    outs = [torch.empty_like(c0) for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    for _ in range(5):  # both streams at once, many times
        for s, c in zip(streams, outs):
            with torch.cuda.stream(s):
                k(a, b, c)
    torch.cuda.synchronize()
    assert all(torch.equal(c, c0) for c in outs)
    assert len(k._program._workspaces) == (3 if reduce == "global" else 0)  # a cluster kernel needs none (D41)
    g = torch.cuda.CUDAGraph()
    cg = torch.full_like(c0, float("nan"))
    with torch.cuda.graph(g):
        k(a, b, cg)
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(cg, c0)
    tol = 2e-2 * np.sqrt(K)
    assert torch.allclose(c0.double(), ref, atol=tol, rtol=2e-2)


# -- the fixup on the host: tc_splitk.cuh as it ships, and mutated -------------------------------------------

HARNESS = Path(__file__).with_name("splitk_fixup_host.cpp")
HEADER = Path(tilecore_cuda.__file__).parent / "prelude" / "tc_splitk.cuh"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here")

#: one way each to break the fixup (text replacements in the header); the harness must catch every one (the
#: unmutated header passes)
MUTANTS = {
    "the first block sums": [("== (unsigned)(SPLITS - 1)", "== 0u")],
    "the counter is not reset": [("      atomicExch(counter, 0u);  /* as the launch found it */\n", "")],
    "the last block's registers go first, not at its own index": [
        ("v[g] = split == 0 ? own[g] : x[g][0];", "v[g] = own[g];"),
        ("if (split != 0) continue;", ""),
        ("} else if (o == split) {", "} else if (false) {"),
        ("if (split == OTHERS) {", "if (false) {")],
    "the last split's own registers left out": [("if (split == OTHERS) {", "if (false) {")],
    "each chunk of other partials restarts the sum": [("if (o == 0) {", "if (k == 0) {")],
    "the last block reads the wrong other partials": [("(o < split ? o : o + 1)", "(o <= split ? o : o + 1)")],
    "a warp leaves out a slab the sum reads": [
        ("slab >= m_valid) continue;  /* rows no block stores to C: not stored */",
         "slab + 16 > m_valid) continue;")],
    "rows past m_valid are stored": [("if ((EPI & TC_EPI_ROWS) || row < m_valid) {", "if (true) {")],
    "tiles share partials": [("+ tile * SPLITS * PART4;", "+ tile * PART4;")],
    "pairs stored without the alignment test": [("  return (EPI & TC_EPI_PAIRS) ||", "  return true ||")],
    "a partial written a column over": [("__stcg(dst + q * 128, v);", "__stcg(dst + q * 128 + 1, v);")],
    "the barrier counts the producer warpgroup too": [("tc_splitk_bar<128 * NC>();",
                                                       "tc_splitk_bar<128 * (NC + 1)>();")],
}


def _run_harness(header_text: str, tmp: Path) -> subprocess.CompletedProcess:
    (tmp / "tc_splitk.cuh").write_text(header_text)
    exe = tmp / "fixup"
    subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-pthread", "-I", str(tmp), "-o", str(exe), str(HARNESS)],
                   check=True, capture_output=True, text=True)
    return subprocess.run([str(exe), "7"], capture_output=True, text=True, timeout=120)


@needs_gxx
def test_fixup_sums_in_split_order_whatever_the_arrival_order(tmp_path):
    proc = _run_harness(HEADER.read_text(), tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


@needs_gxx
@pytest.mark.parametrize("name", list(MUTANTS))
def test_fixup_harness_catches_each_mutant(name, tmp_path):
    text = HEADER.read_text()
    for old, new in MUTANTS[name]:
        assert text.count(old) == 1, (name, old)  # the mutation still applies to the shipped header
        text = text.replace(old, new)
    proc = _run_harness(text, tmp_path)
    assert proc.returncode != 0, f"{name}: not caught\n{proc.stdout}"


# -- the cluster sum on the host (D41): tc_splitk.cuh as it ships, and mutated ---------------------------------

CLUSTER_HARNESS = Path(__file__).with_name("splitk_cluster_host.cpp")

#: one way each to break the cluster sum; the harness must catch every one (the unmutated header passes)
CLUSTER_MUTANTS = {
    "the block's own registers go first, not at its index": [
        ("float4 v = me == 0 ? own : slot[0];", "float4 v = own;"),
        ("const float4 x = s == me ? own : slot[s * NC * MR * QS * 128];",
         "const float4 x = s == me ? slot[0] : slot[s * NC * MR * QS * 128];")],
    "the block's own registers left out": [("const float4 x = s == me ? own : slot[s * NC * MR * QS * 128];",
                                           "const float4 x = slot[s * NC * MR * QS * 128];")],
    "the senders' owner of a column differs from the summer's": [
        ("const int owner = ((q + 1) * SPLITS - 1) / Q;", "const int owner = q * SPLITS / Q;")],
    "every sender's slice lands in slot 0": [("tc_dsmem_store4(recv + ((me * NC * MR + c * MR + i) * QS + q - q0)",
                                              "tc_dsmem_store4(recv + ((c * MR + i) * QS + q - q0)")],
    "a slice goes to the next block": [("(unsigned)owner, v);", "(unsigned)((owner + 1) % SPLITS), v);")],
    "no barrier before the DSMEM stores": [
        ("  tc_cluster_sync();  /* 1: every block of the cluster is past its main loop */\n", "")],
    "no barrier after the DSMEM stores": [
        ("  tc_cluster_sync();  /* 2: every slice is in its owner's shared memory */\n", "")],
    "a warp leaves out a slab it must send": [("slab >= m_valid) continue;  /* rows no block stores to C: not sent */",
                                               "slab + 16 > m_valid) continue;")],
    "every block sums every column": [
        ("if (((q + 1) * SPLITS - 1) / Q != me) continue;  /* another block's column */", "")],
    "the summer's columns start one over": [("  const int q0 = me * Q / SPLITS;\n",
                                             "  const int q0 = me * Q / SPLITS + 1;\n")],
}


def _run_cluster_harness(header_text: str, tmp: Path) -> subprocess.CompletedProcess:
    (tmp / "tc_splitk.cuh").write_text(header_text)
    exe = tmp / "cluster"
    subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-pthread", "-I", str(tmp), "-o", str(exe),
                    str(CLUSTER_HARNESS)], check=True, capture_output=True, text=True)
    return subprocess.run([str(exe), "7"], capture_output=True, text=True, timeout=120)


@needs_gxx
def test_cluster_sum_is_the_split_order_sum_whatever_the_blocks_timing(tmp_path):
    proc = _run_cluster_harness(HEADER.read_text(), tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


@needs_gxx
@pytest.mark.parametrize("name", list(CLUSTER_MUTANTS))
def test_cluster_harness_catches_each_mutant(name, tmp_path):
    text = HEADER.read_text()
    for old, new in CLUSTER_MUTANTS[name]:
        assert text.count(old) == 1, (name, old)  # the mutation still applies to the shipped header
        text = text.replace(old, new)
    proc = _run_cluster_harness(text, tmp_path)
    assert proc.returncode != 0, f"{name}: not caught\n{proc.stdout}"
