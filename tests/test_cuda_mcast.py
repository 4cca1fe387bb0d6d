"""Thread-block clusters with TMA multicast for the persistent Hopper GEMM (``tilecore.cuda.cluster_multicast``,
docs/decisions.md D44), through the public API: the README GEMM, unchanged, compiled with the pass config.

Compile-only wherever a CUDA compiler exists (CI): the note, the launch metadata (clusters of two, an even grid of
pairs of slots), the shared operand's tensor map with boxes of half its rows, the tile function (pairs of tiles
side by side in the dimension that moves only the other operand, ``T.use_swizzle`` on the pairs, a slot past an
odd edge running its partner's tile without storing), the kernels that keep single blocks and why, the config's
errors, the runtime's even grid, and the SASS: UTMALDG.2D.MULTICAST beside the plain loads, the cluster barrier
(UCGABAR), the remote arrival, no spills. The cross-block protocol runs on the host with two simulated blocks a
cluster (tests/mcast_host.cpp), as it ships and mutated. On an sm_90 GPU the kernels run against float64
references, three runs bit-identical, and bit for bit equal to the config off.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tilecore
from tilecore.errors import CompileError

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import HOPPER, _notes, dynamic_m_gemm, gemm, hopper_gpu  # noqa: E402
from test_cuda_persistent import _body, _run_harness as _run_persistent_harness  # noqa: E402
from test_cuda_hopper import _the_plugins_hopper_pipeline  # noqa: E402,F401 (D62: plain GEMMs pinned to the plugin)

BIG = dict(M=4096, N=4096, K=512, bm=128, bn=256, threads=256, stages=3)  # 16 x 32 tiles
PRELUDE = Path(tilecore_cuda.__file__).parent / "prelude"


def _compile(shape: dict, mc="1x2", target=HOPPER, **kw):
    cfg = dict(kw.pop("pass_configs", {}))
    if mc is not None:
        cfg["tilecore.cuda.cluster_multicast"] = mc
    if "persistent" in kw:
        cfg["tilecore.cuda.persistent"] = kw.pop("persistent")
    s = dict(shape)
    fn = gemm(s.pop("M"), s.pop("N"), s.pop("K"), **s, **kw)
    return tilecore.compile(fn, target=target, pass_configs={**NOCACHE, **cfg})


# -- the decision, the launch and the tile function -------------------------------------------------------

@needs_toolchain
def test_off_is_the_default_and_leaves_the_kernel_as_it_was():
    default, off = _compile(BIG, mc=None), _compile(BIG, mc=False)
    assert default.get_kernel_source() == off.get_kernel_source()
    assert "cluster_multicast" not in _notes(default) and "__cluster_dims__" not in _body(default)
    assert "tc_mc<" not in _body(default) and "cluster" not in default.source.meta


@needs_toolchain
@pytest.mark.parametrize("mc,share,dim,boxes", [("1x2", "A", "x", [[64, 64], [64, 64]]),
                                                ("2x1", "B", "y", [[64, 128], [64, 32]])])
def test_pairs_of_tiles_share_one_operand_in_clusters_of_two(mc, share, dim, boxes):
    k = _compile(BIG, mc=mc)
    side = "N" if share == "A" else "M"
    assert (f"cluster_multicast {mc}: clusters of two blocks on tiles side by side in {side}, each loading half of "
            f"{share}'s box and multicasting it to both") in _notes(k)
    meta = k.source.meta
    assert meta["cluster"] == [2, 1, 1] and meta["grid"] == ["132", "1", "1"]
    assert meta["hopper_persistent"] == {"tiles": "512", "blocks_per_sm": 1, "cluster": 2}
    # the shared operand's map has boxes of half its rows (A: 128 -> 64; B N-major: block_K 64 -> 32); the other's
    # and C's are as before
    assert [m["box"] for m in meta["tensor_maps"][:2]] == boxes and meta["tensor_maps"][2]["box"] == [64, 64]
    body = _body(k)
    assert body.startswith('extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1)')
    assert "const long long tc_rank = tc_t % 2, tc_pair = tc_t / 2;" in body
    if dim == "x":  # pairs side by side in x (bx: N): a grid of 8 x 32 pairs
        assert "tc_px = tc_pair % (8), tc_py = tc_pair / (8);" in body
        assert "const int bx = (int)(2 * vtc_qx + tc_rank);" in body and "const int by = (int)(vtc_qy);" in body
    else:  # in y (by: M): 16 x 16 pairs
        assert "tc_px = tc_pair % (16), tc_py = tc_pair / (16);" in body
        assert "const int bx = (int)(vtc_qx);" in body and "const int by = (int)(2 * vtc_qy + tc_rank);" in body
    assert "tc_dup" not in body  # even tile counts: no slot past the grid
    share_n = 1 if share == "A" else 2
    assert re.search(r"tc_wgmma_persistent<384, 128, 256, 64, 3, 2, 1, false, 0, 64, 64, 0, 11, 16, false, "
                     r"tc_wgmma_f16_n256_t1>\(\(pipe_A_s \+ 0\), C, \(long long\)\(512\), \(long long\)\(4096\), "
                     rf"tc_tile_of, &tc_tmap0, &tc_tmap1, &tc_tmap2, tc_mc<{share_n}, 1>\(\)\);", body)  # per warp (D49)


@needs_toolchain
def test_an_odd_edge_runs_its_partners_tile_and_stores_nothing():
    """13 tiles in N: the pairs' last slot of each row takes its partner's tile (bx 12) with m_valid 0; the pairs
    are walked with T.use_swizzle on the grid of pairs (7 x 29)."""
    k = _compile(dict(BIG, M=4096 - 3 * 128 - 5, N=4096 - 3 * 256 - 8), mc="1x2", panel=8)
    assert "(13 tiles that way: the last of each row's pairs runs its partner's tile and stores nothing)" in _notes(k)
    body = _body(k)
    assert "const long long tc_gf = 7, tc_gs = 29;" in body  # the swizzle on the pairs
    assert "const bool tc_dup = 2 * (long long)vtc_qx + tc_rank >= 13;" in body
    assert "const int bx = (int)(2 * vtc_qx + tc_rank - (tc_dup ? 1 : 0));" in body
    assert "(long long)(tc_dup ? 0 : (((by * (-128)) + 3707)))" in body
    assert k.source.meta["hopper_persistent"]["tiles"] == "406"  # 7 x 29 pairs


@needs_toolchain
@pytest.mark.parametrize("shape,kw,why", [
    (dict(BIG, M=128, N=1024, K=4096), {}, "not cluster_multicast: its clusters of two take tiles of the persistent "
                                           "grid, and this kernel keeps one block per (tile, split)"),
    (BIG, {"persistent": False}, "not cluster_multicast: its clusters of two take tiles of the persistent grid, and "
                                 "this kernel keeps one block per tile"),
])
def test_kernels_that_keep_single_blocks_say_why(shape, kw, why):
    k = _compile(shape, **kw)
    assert why in _notes(k)
    assert "__cluster_dims__(2, 1, 1)" not in _body(k) and "tc_mc<" not in _body(k)


@needs_toolchain
def test_a_dynamic_grid_keeps_single_blocks_and_says_why():
    k = tilecore.compile(dynamic_m_gemm(N=1024, K=512), target=HOPPER,
                         pass_configs={**NOCACHE, "tilecore.cuda.cluster_multicast": "2x1"})
    assert "not cluster_multicast: it pairs the tiles of a static two-dimensional grid" in _notes(k)
    assert "persistent: at most" in _notes(k) and "__cluster_dims__" not in _body(k)


@needs_toolchain
@pytest.mark.parametrize("value", [True, "2x2", 2, "on"])
def test_the_config_is_checked_and_the_error_names_the_users_loop(value):
    with pytest.raises(CompileError) as e:
        _compile(BIG, mc=value)
    msg = str(e.value)
    assert "tilecore.cuda.cluster_multicast must be False, \"1x2\"" in msg and repr(value) in msg
    assert "test_cuda_hopper.py" in msg  # the user's T.Pipelined line


# -- SASS -------------------------------------------------------------------------------------------------

def _sass(k) -> str:
    return tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)


def _registers(k) -> int:
    """Registers a thread from ptxas's report. On the GPU hosts NVRTC 13.0 gave ptxas's lines only for a run's first
    compile of a program (the report says ``reported: False``; tenth session's probe): there the bound is not checked
    and the SASS checks (no STL/LDL) stand alone; everywhere else a report without the count fails."""
    report = k.source.meta["ptxas"]
    if report.get("reported") is False:
        return 0
    return report["registers"]


@needs_toolchain
@pytest.mark.parametrize("shape,mc,kw", [
    (BIG, "1x2", {}),
    (BIG, "2x1", {"dtype": "bfloat16", "tb": True}),
    (dict(BIG, bn=128, stages=4), "2x1", {"persistent": "pingpong", "panel": 8}),
])
def test_sass_multicasts_the_shared_half_and_syncs_the_cluster(shape, mc, kw):
    k = _compile(shape, mc=mc, **kw)
    assert f"cluster_multicast {mc}:" in _notes(k)
    sass = _sass(k)
    ops = set(re.findall(r"\b(UTMALDG[.\w]*|UCGABAR_\w+|SYNCS\.ARRIVE[.\w]*)", sass))
    assert {"UTMALDG.2D", "UTMALDG.2D.MULTICAST", "UCGABAR_ARV", "UCGABAR_WAIT"} <= ops, ops
    assert "SYNCS.ARRIVE.TRANS64.RED.A1T0" in ops  # the remote release (mbarrier.arrive.shared::cluster)
    assert not _fenced_remote_arrivals(sass)  # D49: no MEMBAR.ALL.GPU before it (D44's release.cluster had one)
    assert "STL" not in sass and "LDL" not in sass  # no spills
    assert k.source.meta["ptxas"].get("spill_stores", 0) == 0 and _registers(k) <= 168
    off = _sass(_compile(shape, mc=False, **kw))
    assert "MULTICAST" not in off and "UCGABAR" not in off


def _fenced_remote_arrivals(sass: str) -> int:
    """The remote arrivals (SYNCS.ARRIVE...RED) with a MEMBAR.ALL.GPU among the four instructions before them: D44's
    release at cluster scope, in every consumer warp at every k step (docs/decisions.md D49)."""
    ins = [ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    return sum(1 for i, ln in enumerate(ins) if "SYNCS.ARRIVE.TRANS64.RED" in ln
               and any("MEMBAR.ALL.GPU" in x for x in ins[max(0, i - 4):i]))


# -- how a stage is released (tilecore.cuda.stage_release, D49) ---------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("rel,code,fenced", [(None, 1, False), ("warp", 1, False), ("thread", 0, False),
                                             ("d44", 2, True)])
def test_stage_release_in_clusters_and_d44s_fenced_remote_arrival(rel, code, fenced):
    """Per warp by default in a cluster; "d44" keeps D44's remote arrival (release at cluster scope), whose fence
    before every remote arrival is what the SASS check finds (and finds nowhere else: the check can fail)."""
    k = _compile(BIG, mc="2x1", pass_configs={} if rel is None else {"tilecore.cuda.stage_release": rel})
    assert f", tc_mc<2, {code}>());" in _body(k)
    assert (f"stage_release {rel}" in _notes(k)) == (rel is not None)
    sass = _sass(k)
    assert (_fenced_remote_arrivals(sass) > 0) == fenced
    assert "STL" not in sass and _registers(k) <= 168


@needs_toolchain
def test_stage_release_per_warp_without_clusters_and_the_default_text_unchanged():
    default = _compile(BIG, mc=None)
    thread = _compile(BIG, mc=None, pass_configs={"tilecore.cuda.stage_release": "thread"})
    warp = _compile(BIG, mc=None, pass_configs={"tilecore.cuda.stage_release": "warp"})
    assert "tc_mc<" not in _body(default) and _body(thread) == _body(default)  # "thread" is the default alone
    assert _body(warp).count(", &tc_tmap2, tc_mc<0, 1>());") == 1 and "__cluster_dims__" not in _body(warp)


@needs_toolchain
@pytest.mark.parametrize("mc,value,msg", [
    ("2x1", "lane", "tilecore.cuda.stage_release must be \"thread\", \"warp\" or \"d44\", got 'lane'"),
    (None, "d44", "stage_release=\"d44\" is the remote release of clusters with TMA multicast: set "
                  "tilecore.cuda.cluster_multicast too"),
])
def test_stage_release_errors_name_the_value_and_the_users_loop(mc, value, msg):
    with pytest.raises(CompileError) as e:
        _compile(BIG, mc=mc, pass_configs={"tilecore.cuda.stage_release": value})
    assert msg in str(e.value) and "test_cuda_hopper.py" in str(e.value)


@needs_toolchain
@pytest.mark.parametrize("mc", ["2x1", None])
def test_pipeline_profile_declares_its_array_and_passes_it(mc):
    k = _compile(BIG, mc=mc, pass_configs={"tilecore.cuda.pipeline_profile": True})
    src = k.get_kernel_source()
    assert "__device__ unsigned long long tc_pipe_prof[TC_PROF_BLOCKS * TC_PROF_WORDS];" in src
    assert f"tc_mc<{2 if mc else 0}, {1 if mc else 0}, 1>{{tc_pipe_prof}});" in _body(k)
    assert "pipeline_profile: cycle counts into tc_pipe_prof" in _notes(k)
    assert k.source.meta["ptxas"].get("spill_stores", 0) == 0
    assert "tc_pipe_prof" not in _compile(BIG, mc=mc).get_kernel_source()


# -- the runtime: an even grid of whole clusters -------------------------------------------------------------

@pytest.mark.parametrize("sms,grid", [(132, (132, 1, 1)), (131, (130, 1, 1)), (78, (78, 1, 1)), (7, (6, 1, 1))])
def test_the_runtime_launches_whole_clusters(monkeypatch, sms, grid):
    torch = pytest.importorskip("torch")
    from test_c_launcher import on_cpu
    from test_cuda_backend import HAS_TOOLCHAIN
    from tilecore_cuda import runtime as cuda_runtime

    if not HAS_TOOLCHAIN:
        pytest.skip("no CUDA compiler here")
    monkeypatch.setattr(cuda_runtime, "device_properties", lambda index=0: {"sm_count": sms})
    kernel = _compile(BIG)
    for c_launcher in (True, False):
        k, prog, driver = on_cpu(kernel, c_launcher, monkeypatch)
        k(torch.randn(4096, 512).half(), torch.randn(512, 4096).half(), torch.empty(4096, 4096).half())
        assert driver.records[-1]["grid"] == grid and prog._grid == grid


# -- on an H100 / H200 --------------------------------------------------------------------------------------

@hopper_gpu
@pytest.mark.parametrize("shape,mc,kw", [
    (dict(BIG, K=4096), "1x2", {}),                                                   # 4096^3
    (dict(BIG, K=4096), "2x1", {}),
    (dict(BIG, M=1000, N=3320, K=1000), "1x2", {"out": "float32"}),                   # 13 tiles in N: odd
    (dict(BIG, M=1100, N=3000, K=1000), "2x1", {"dtype": "bfloat16", "out": "bfloat16"}),  # 9 tiles in M: odd
    (dict(BIG, M=2000, N=3000, bn=128), "2x1", {"tb": True, "panel": 3}),             # B k-major, swizzled
    (dict(BIG, M=2000, N=3000, bn=128), "1x2", {"tb": True, "dtype": "bfloat16"}),
    (dict(BIG, M=1024, N=1024, K=1024), "1x2", {}),                                   # 32 tiles: fewer than SMs
    (dict(BIG, M=384, N=256 * 3, K=1024), "2x1", {}),                                 # 9 tiles, 3 x 3: both odd
    (dict(BIG, M=1000, N=3000, K=1000, bn=128, threads=128), "2x1", {"dtype": "bfloat16"}),  # MR 2
    (dict(BIG, bn=128, stages=4), "1x2", {"persistent": "pingpong", "panel": 8}),     # ping-pong
    (dict(BIG, M=1000, N=3000), "2x1", {"pass_configs": {"tilecore.cuda.tma_store": False}}),  # direct stores
])
def test_device_multicast_gemm_matches_float64_and_the_config_off_bit_for_bit(shape, mc, kw):
    torch = pytest.importorskip("torch")
    from test_cuda_persistent import _run, _runs_match_float64

    M, N, K = shape["M"], shape["N"], shape["K"]
    dtype, out, tb = kw.get("dtype", "float16"), kw.get("out", "float16"), kw.get("tb", False)
    k = _compile(shape, mc=mc, target="cuda", **kw)
    assert f"cluster_multicast {mc}:" in _notes(k), _notes(k)
    g = torch.Generator().manual_seed(M + N + K)
    a32, b32 = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    a, b = a32.cuda().to(getattr(torch, dtype)), b32.cuda().to(getattr(torch, dtype))
    ref = a.double() @ b.double()
    if tb:
        b = b.t().contiguous()
    first = _runs_match_float64(k, a, b, ref, M, N, K, out, torch)
    off = _compile(shape, mc=False, target="cuda", **kw)
    assert "cluster_multicast" not in _notes(off)
    assert torch.equal(_run(off, a, b, M, N, out, torch), first)


@hopper_gpu
@pytest.mark.parametrize("shape,mc,rel", [
    (dict(BIG, K=4096), "2x1", "thread"),                      # D49: every thread, CTA-scope remote arrivals
    (dict(BIG, K=4096), "1x2", "d44"),                         # D44's remote release at cluster scope
    (dict(BIG, M=1100, N=3000, K=1000), "2x1", "warp"),        # per warp (the clusters' default), 9 tiles in M
    (dict(BIG, K=4096), None, "warp"),                         # per warp without clusters
    (dict(BIG, bn=128, stages=4), None, "warp"),               # ... and with ping-pong's one releasing warpgroup
])
def test_device_stage_release_matches_the_default_off_bit_for_bit(shape, mc, rel):
    torch = pytest.importorskip("torch")
    from test_cuda_persistent import _run, _runs_match_float64

    M, N, K = shape["M"], shape["N"], shape["K"]
    kw = {"persistent": "pingpong", "panel": 8} if shape.get("bn") == 128 else {}
    k = _compile(shape, mc=mc, target="cuda", pass_configs={"tilecore.cuda.stage_release": rel}, **kw)
    assert f"stage_release {rel}" in _notes(k)
    g = torch.Generator().manual_seed(M + N + K)
    a, b = torch.randn(M, K, generator=g).cuda().half(), torch.randn(K, N, generator=g).cuda().half()
    first = _runs_match_float64(k, a, b, a.double() @ b.double(), M, N, K, "float16", torch)
    assert torch.equal(_run(_compile(shape, mc=False, target="cuda", **kw), a, b, M, N, "float16", torch), first)


@hopper_gpu
@pytest.mark.parametrize("mc", ["2x1", None])
def test_device_pipeline_profile_counts_each_blocks_k_steps(mc):
    """The profile (D49) of 4096 x 4096 x 512 (512 tiles of 8 k steps on 132 blocks): per block, the producer's and
    consumer 0's k steps are 8 x its tiles, its waits within its loops, the ranks alternate in clusters, one block
    an SM; the result the same bits as the kernel without the profile."""
    torch = pytest.importorskip("torch")
    from test_cuda_persistent import _run

    k = _compile(BIG, mc=mc, target="cuda", pass_configs={"tilecore.cuda.pipeline_profile": True})
    a, b = torch.randn(4096, 512).cuda().half(), torch.randn(512, 4096).cuda().half()
    _run(k, a, b, 4096, 4096, "float16", torch)
    prog = k._load()
    prog.global_words("tc_pipe_prof", clear=True)
    c = _run(k, a, b, 4096, 4096, "float16", torch)
    words = prog.global_words("tc_pipe_prof")
    grid = prog._grid[0]
    blocks = [words[i * 16:(i + 1) * 16] for i in range(grid)]
    assert not any(words[grid * 16:])  # no block past the grid
    for i, w in enumerate(blocks):
        tiles = len(range(i, 512, grid))
        assert w[4] == w[8] == 8 * tiles, (i, w)
        assert w[3] <= w[2] and w[6] <= w[5] and w[7] <= w[5] and w[1] >= w[0] > 0, (i, w)
        assert w[13] == (i % 2 if mc else 0)
    assert len({w[12] for w in blocks}) == grid  # one block an SM
    assert torch.equal(_run(_compile(BIG, mc=mc, target="cuda"), a, b, 4096, 4096, "float16", torch), c)


# -- the cross-block protocol on the host: two simulated blocks a cluster, tc_persistent.cuh as it ships and mutated --

HARNESS = Path(__file__).with_name("mcast_host.cpp")
HEADER = PRELUDE / "tc_persistent.cuh"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here")
_REMOTE = "        if (MCAST) tc_mbar_arrive_remote<REL == TC_REL_D44>(e, rank ^ 1u);\n"
_START = ("  if (MCAST)\n    tc_mc_cluster_sync();  /* both blocks' barriers initialised before any multicast or remote "
          "arrival */\n")
_EXIT = "  if (MCAST) tc_mc_cluster_sync();  /* no block exits while its partner may still arrive on its barriers */\n"

#: one way each to break the protocol (old, new, how many times old occurs); the harness must catch every one (the
#: unmutated header passes). The cluster barrier's mutants keep two meetings per thread, so only the missing order
#: can show.
MUTANTS = {
    "no remote release: the partner's producer never hears this block is done with a stage": [(_REMOTE, "", 1)],
    "the partner's releases not counted on the empty barrier": [
        ("REL == TC_REL_WARP ? (MCAST ? 2 : 1) * READERS / 32", "REL == TC_REL_WARP ? READERS / 32", 1)],
    "per thread (D44's counts): the partner's releases not counted": [
        ("READERS + (MCAST ? READERS / 32 : 0)", "READERS", 1)],
    "per warp: every lane arrives on its block's barrier too": [
        ("      if (REL != TC_REL_WARP) tc_mbar_arrive(e);\n", "      tc_mbar_arrive(e);\n", 1)],
    "the CTA mask multicasts to this block only": [("(unsigned short)3", "(unsigned short)(1u << rank)", 2)],
    "the full barrier expects only this block's own bytes": [
        ("tc_mbar_expect_tx(full, STAGE);",
         "tc_mbar_expect_tx(full, STAGE - (MCAST == 1 ? A_BYTES / 2 : MCAST == 2 ? B_BYTES / 2 : 0));", 1)],
    "no cluster barrier before exit": [(_EXIT, "", 1), (_START, _START + "  if (MCAST) tc_mc_cluster_sync();\n", 1)],
    "no cluster barrier after the barriers' init": [(_START, "", 1), (_EXIT, _EXIT + _EXIT, 1)],
    "both blocks load the first half of the shared box": [
        ("ar + (int)rank * (BM / 2)", "ar", 1), ("+ rank * (BM / 2) * 128", "", 1),
        ("br + (int)rank * (B_ROWS / 2)", "br", 1), ("+ rank * (B_ROWS / 2) * 128", "", 1)],
    "the slot past the grid's tiles stores its partner's tile again": [
        ("      if (MCAST && g.m_valid <= 0) continue;", "", 1)],
}


#: the harness's build for a mutant other than the shipped release per warp (TC_HOST_REL, D49)
MUTANT_DEFINES = {"per thread (D44's counts): the partner's releases not counted": ("TC_HOST_REL=TC_REL_THREAD",)}


def _run_harness(header_text: str, tmp: Path, defines=()) -> subprocess.CompletedProcess:
    return _run_persistent_harness(header_text, tmp, defines, harness=HARNESS)


@needs_gxx
@pytest.mark.parametrize("defines", [(), ("TC_HOST_REL=TC_REL_THREAD",), ("TC_HOST_REL=TC_REL_D44", "TC_HOST_FAST"),
                                     ("TC_HOST_PROF=1",)], ids=["warp", "thread", "d44", "profiled"])
def test_protocol_runs_both_blocks_of_each_cluster_with_every_tile_once(defines, tmp_path):
    """Each release (per warp as shipped, per thread, D44's) and the profile on (its k steps, ranks and times
    checked per block after each case)."""
    proc = _run_harness(HEADER.read_text(), tmp_path, defines)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


@needs_gxx
@pytest.mark.parametrize("name", list(MUTANTS))
def test_protocol_harness_catches_each_mutant(name, tmp_path):
    text = HEADER.read_text()
    for old, new, count in MUTANTS[name]:
        assert text.count(old) == count, (name, old)  # the mutation still applies to the shipped header
        text = text.replace(old, new)
    proc = _run_harness(text, tmp_path, defines=("TC_HOST_FAST",) + MUTANT_DEFINES.get(name, ()))  # 2 cases (CI time)
    assert proc.returncode != 0 and "FAIL" in proc.stdout, f"{name}: not caught\n{proc.stdout}"
    print(name, "->", proc.stdout.strip())
