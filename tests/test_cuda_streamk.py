"""Stream-K for the persistent Hopper GEMM's last wave (``tilecore.cuda.stream_k``, docs/decisions.md D53), through
the public API: the README GEMM compiled with the pass config.

Compile-only wherever a CUDA compiler exists (CI): the kernel's note, its workspace and its ``tc_mc`` argument; which
kernels keep whole tiles and why (the config off: the default's source byte for byte; a tile count that is whole
waves; clusters, ping-pong; "auto", which measured nothing to gain: D53); the config's error; the SASS of the stream-K kernels (the
fixup's 16-byte partial stores and loads, the flag's acquire and the fence before its release; HGMMA, UTMALDG,
UTMASTG stay; no local memory; 168 registers). The schedule itself is run as the kernel walks it
(tc_persistent.cuh's tc_sk_tiles and tc_sk_walk, compiled on the host by tests/persistent_host.cpp) for many
(tiles, blocks, k tiles): every (tile, k iteration) covered exactly once, each block's stream-K share within one k
iteration of even, each block's whole work within one k iteration of every other's, a contributor's piece only
first and an owner's only last in a block's range. The fixup protocol runs on the host too (persistent_host.cpp's
stream-K cases: every block at once, the flags and partials as the kernel uses them), as it ships and mutated.
On an sm_90 GPU (``-k device``) the kernels run against float64 references at the split-K tests' tolerances, the
same bits on every run, and agree with stream-K off to float32 accumulation rounding.
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
from test_cuda_persistent import HARNESS, HEADER, _run_harness, _sass  # noqa: E402

from tilecore_cuda.hopper import streamk_workspace_bytes  # noqa: E402
from test_cuda_hopper import _the_plugins_hopper_pipeline  # noqa: E402,F401 (D62: plain GEMMs pinned to the plugin)

SQ = dict(M=4096, N=4096, K=4096, bm=128, bn=256, threads=256, stages=3)  # 512 tiles on 132 SMs: 3.88 waves
SK = {"tilecore.cuda.stream_k": True}
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here")


def _compile(shape: dict, target=HOPPER, pass_configs=None, **kw):
    s = dict(shape)
    fn = gemm(s.pop("M"), s.pop("N"), s.pop("K"), **s, **kw)
    return tilecore.compile(fn, target=target, pass_configs={**NOCACHE, **(pass_configs or {})})


def _body(k) -> str:
    src = k.get_kernel_source()
    return src[src.index('extern "C" __global__'):]


# -- the decision ------------------------------------------------------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("value,mode", [(True, 1), ("tail", 2), ("stagger", 3)])
def test_stream_k_note_workspace_and_schedule_argument(value, mode):
    k = _compile(SQ, panel=8, pass_configs={"tilecore.cuda.stream_k": value})
    note = _notes(k)
    assert "(512 tiles on 132 blocks: 3.88 waves), split tiles summed through a workspace" in note, note
    assert ("the partial wave's tiles in even" in note) == (mode != 1)
    assert ("each block's range between its whole tiles (staggered)" in note) == (mode == 3)
    assert k.source.meta["workspace"] == {"bytes": streamk_workspace_bytes(132, 2, 128, 256), "zeroed": True}
    assert streamk_workspace_bytes(132, 2, 128, 256) == 1280 + 132 * 128 * 256 * 4  # flags padded, 128 KiB a slot
    body = _body(k)
    assert f"tc_mc<0, 0, 0, {mode}>{{nullptr, tc_workspace, 132}}" in body
    assert "unsigned char* tc_workspace" in body  # the kernel's parameter, after the tensor maps


@needs_toolchain
def test_stream_k_off_is_the_default_kernel_byte_for_byte():
    default = _compile(SQ, panel=8)
    off = _compile(SQ, panel=8, pass_configs={"tilecore.cuda.stream_k": False})
    assert "stream_k" not in _notes(default) and "stream_k off" in _notes(off)
    assert default.get_kernel_source() == off.get_kernel_source()
    assert "tc_workspace" not in default.get_kernel_source() and "workspace" not in default.source.meta


@needs_toolchain
@pytest.mark.parametrize("shape,kw,cfg,why", [
    (dict(SQ, M=132 * 128, N=512), {}, SK, "not stream_k: 264 tiles on 132 blocks leave no partial wave"),
    (dict(SQ, M=1024, N=1024), {}, {**SK, "tilecore.cuda.split_k": 1},
     "not stream_k: 32 tiles on 132 blocks leave no partial wave"),  # (one wave: split-K's, D27)
    (SQ, {"panel": 8}, {"tilecore.cuda.stream_k": "auto"},
     "not stream_k (auto): no shape measured faster with it on the H100 (D53: 0.54-0.95x of whole tiles)"),
    (dict(SQ, bn=128, stages=4), {}, {**SK, "tilecore.cuda.persistent": "pingpong"},
     "not stream_k: the ping-pong warpgroups take whole tiles"),
    (SQ, {"panel": 8}, {**SK, "tilecore.cuda.cluster_multicast": "2x1"},
     "not stream_k: its pieces are a single block's (no clusters of two)"),
])
def test_kernels_that_keep_whole_tiles_say_why(shape, kw, cfg, why):
    k = _compile(shape, pass_configs=cfg, **kw)
    assert why in _notes(k), _notes(k)
    assert "tc_workspace" not in _body(k)


@needs_toolchain
def test_a_bad_stream_k_value_is_a_clear_error():
    with pytest.raises(CompileError, match=r"tilecore.cuda.stream_k must be False, True, \"auto\", \"tail\" or \"stagger\", got 3"):
        _compile(SQ, pass_configs={"tilecore.cuda.stream_k": 3})


@needs_toolchain
@pytest.mark.parametrize("shape,kw,mma", [
    (SQ, {"panel": 8}, "HGMMA.64x256x16.F32"),
    (SQ, {"panel": 8, "dtype": "bfloat16", "out": "bfloat16"}, "HGMMA.64x256x16.F32.BF16"),
    (dict(SQ, M=8192, N=8192, K=1024), {"panel": 8}, "HGMMA.64x256x16.F32"),
    (dict(SQ, K=512), {}, "HGMMA.64x256x16.F32"),  # no panel, 8 k tiles (a 64-bit schedule spilled 8 bytes here)
    (dict(SQ, M=3000, N=3000, K=1000, bn=128, threads=128), {"dtype": "bfloat16", "out": "float32"},
     "HGMMA.64x128x16.F32.BF16"),  # one consumer warpgroup (MR 2), ragged, float32 C
    (dict(SQ, M=2000, N=3000, K=2000), {"tb": True, "pass_configs": {"tilecore.cuda.tma_store": False}},
     "HGMMA.64x256x16.F32"),  # B k-major, the direct stores
])
def test_stream_k_sass_has_the_fixup_and_the_pipeline_without_spills(shape, kw, mma):
    cfg = {**SK, **kw.pop("pass_configs", {})}
    k = _compile(shape, pass_configs=cfg, **kw)
    assert "stream_k: the partial wave's tiles and one whole wave" in _notes(k), _notes(k)
    sass = _sass(k)
    for op in (mma, "UTMALDG.2D", "SYNCS.PHASECHK", "SYNCS.ARRIVE"):
        assert op in sass, op
    if cfg.get("tilecore.cuda.tma_store", True):
        assert "UTMASTG.2D" in sass
    # the fixup: the partial tile through L2 (16-byte .cg stores and loads), the flag's acquire, a fence before its
    # release; 128 x 256 floats over 256 threads: 32 float4 stores and 32 loads a thread
    v = shape["bm"] * shape["bn"] // 4 // (shape["threads"])
    assert sass.count("STG.E.128.STRONG.GPU") == v and sass.count("LDG.E.128.STRONG.GPU") == v, v
    assert "LDG.E.STRONG.GPU" in sass and "MEMBAR.ALL.GPU" in sass
    assert "STL" not in sass and "LDL" not in sass  # no spills
    # one block an SM: 168 x 384 threads (setmaxnreg moves them), or at most 255 x 256 (one consumer warpgroup)
    regs = 168 if shape["threads"] == 256 else 255
    assert k.source.meta["ptxas"].get("spill_stores", 0) == 0 and k.source.meta["ptxas"].get("registers", 0) <= regs
    if shape["threads"] == 256:  # the registers still move from the producer to the consumers
        assert "USETMAXREG.DEALLOC.CTAPOOL 0x38" in sass and "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe0" in sass


@needs_toolchain
def test_stream_k_with_the_pipeline_profile_declares_its_array():
    k = _compile(SQ, panel=8, pass_configs={**SK, "tilecore.cuda.pipeline_profile": True})
    body = _body(k)
    assert "tc_mc<0, 0, 1, 1>{tc_pipe_prof, tc_workspace, 132}" in body
    assert "__device__ unsigned long long tc_pipe_prof[" in k.get_kernel_source()


@needs_toolchain
def test_stream_k_off_sass_has_no_fixup():
    sass = _sass(_compile(SQ, panel=8))
    assert "STG.E.128.STRONG.GPU" not in sass and "LDG.E.STRONG.GPU" not in sass and "MEMBAR.ALL.GPU" not in sass


# -- the schedule, as the kernel walks it (tc_sk_tiles, tc_sk_walk on the host) -----------------------------------

@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no g++ here")
    tmp = tmp_path_factory.mktemp("streamk")
    (tmp / "tc_persistent.cuh").write_text(HEADER.read_text())
    (tmp / "tc_hopper.cuh").write_text((HEADER.parent / "tc_hopper.cuh").read_text())
    exe = tmp / "persistent_host"
    subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-pthread", "-I", str(tmp), "-o", str(exe), str(HARNESS)],
                   check=True, capture_output=True, text=True)
    return exe


def _schedules(exe, cases):
    """{(mode, tiles, blocks, k): (stream-K tiles, [per block: [(tile, kb, ke)]])} as the kernel walks them."""
    args = [str(x) for c in cases for x in c]
    out = subprocess.run([str(exe), "schedule", *args], check=True, capture_output=True, text=True).stdout
    res, it = {}, iter(cases)
    cur = None
    for line in out.splitlines():
        w = line.split()
        if w[0] == "S":
            cur = next(it)
            res[cur] = (int(w[1]), [])
        else:
            nums = [int(x) for x in w[2:]]
            res[cur][1].append([tuple(nums[i:i + 3]) for i in range(0, len(nums), 3)])
    return res


CASES = [(mode, t, b, k) for mode in (1, 2, 3) for t, b, k in [
    (512, 132, 64), (2048, 132, 128), (512, 132, 224), (1792, 132, 64),  # 4096^3, 8192^3, the LLM shapes (128x256)
    (8 * 32, 132, 64), (9 * 17, 132, 16),                                 # ragged M and N (tiles rounded up)
    (133, 132, 2), (265, 132, 3), (1000, 114, 7), (9, 4, 6), (7, 3, 5), (13, 4, 1), (264, 132, 64), (100, 132, 64),
    (5, 4, 1), (131 * 3 + 1, 132, 1), (77, 8, 33)]]


def test_schedule_covers_every_k_iteration_once_and_balances_the_blocks(harness):
    for (mode, tiles, blocks, k), (sk, units) in _schedules(harness, CASES).items():
        case = (mode, tiles, blocks, k)
        assert len(units) == blocks
        partial = tiles % blocks
        want = partial if mode in (2, 3) else tiles - (tiles // blocks - 1) * blocks
        if tiles <= blocks or partial == 0:
            assert sk == 0, case
        elif sk:
            assert sk == want, case
        else:  # skipped only where some block would get fewer than two k iterations
            assert want * k < 2 * blocks, case
        seen = np.zeros((tiles, k), dtype=np.int64)
        work, inserted = [], []
        for b, us in enumerate(units):
            share = 0
            pieces = [n for n, u in enumerate(us) if u[2] != -1]
            # the stream-K pieces are one run of the block's units: first (modes 1, 2) or between whole tiles (3)
            assert pieces == list(range(pieces[0], pieces[0] + len(pieces))) if pieces else True, case
            if pieces and mode != 3:
                assert pieces[0] == 0, case
            inserted.append(pieces[0] if pieces else None)
            for n, (t, kb, ke) in enumerate(us):
                if ke == -1:  # a whole tile: data-parallel, in the block's round-robin order
                    assert t >= sk and (t - sk) % blocks == b, case
                    seen[t] += 1
                    continue
                assert t < sk and 0 <= kb < ke <= k, case
                seen[t, kb:ke] += 1
                share += ke - kb
                if kb > 0:  # a contributor's piece: the first of the block's range
                    assert n == pieces[0], case
                if kb == 0 and ke < k:  # an owner's piece: the last of the block's stream-K range
                    assert n == pieces[-1], case
            dps = [u[0] for u in us if u[2] == -1]
            assert dps == sorted(dps), case
            if sk:
                even = sk * k / blocks
                assert abs(share - even) < 1, (case, b, share, even)
            work.append(share + sum(k for u in us if u[2] == -1))
        assert (seen == 1).all(), case  # every (tile, k iteration) exactly once
        if sk:
            assert max(work) - min(work) <= 1, case  # every block's whole work within one k iteration
            # an owner's contributors (later blocks) start their ranges no later than it does, counted in whole
            # tiles before the range (staggered: later blocks earlier, spread over the whole tiles)
            assert all(x >= y for x, y in zip(inserted, inserted[1:])), (case, inserted)
            if mode == 3:
                n = (tiles - sk) // blocks
                assert inserted == [(blocks - 1 - b) * (n + 1) // blocks for b in range(blocks)], (case, inserted)


def test_schedule_of_the_4096_gemm_splits_tiles_between_two_or_three_blocks(harness):
    (sk, units), = _schedules(harness, [(1, 512, 132, 64)]).values()
    assert sk == 248  # 116 tiles past the 3 whole waves and one whole wave: 2 data-parallel waves
    assert all(sum(1 for u in us if u[2] == -1) == 2 for us in units)
    owners = {}
    for b, us in enumerate(units):
        for t, kb, ke in us:
            if ke != -1 and (kb, ke) != (0, 64):
                owners.setdefault(t, []).append(b)
    assert owners and all(2 <= len(bs) <= 3 and bs == list(range(bs[0], bs[-1] + 1)) for bs in owners.values())


# -- the fixup protocol on the host ------------------------------------------------------------------------

#: one way each to break stream-K's fixup (old, new, count in the shipped header): the harness's stream-K cases
#: must catch every one
MUTANTS = {
    "the owner does not wait for a contributor's flag": [("            tc_sk_flag_wait(tc_sk_flag(mc.ws, b, NC, me), 1u);\n", "", 1)],
    "the flag released before the warpgroup's partial stores": [
        ("          tc_consumer_sync(1 + me, 128);  /* the warpgroup's stores, then the flag", "          /* (", 1)],
    "the owner leaves out the last contributor": [("b <= last; ++b", "b < last; ++b", 1)],
    "the owner leaves the flags set": [("            tc_sk_flag_release(tc_sk_flag(mc.ws, b, NC, me), 0u);", "", 1)],
    "a contributor stores its piece as the tile": [("          continue;\n        }\n        /* the owner's piece", "        }\n        /* the owner's piece", 1)],
    "the data-parallel tiles start at the block's index": [("dp(sk + b)", "dp(b)", 1)],
    "both warpgroups' partials in one half": [("+ me * 128 * V * 4;", "+ 0;", 2)],
    "the schedule's ranges overlap": [("i1 = tc_sk_begin((unsigned)b + 1, blocks, (unsigned)(sk * k_));",
                                  "i1 = tc_sk_begin((unsigned)b + 1, blocks, (unsigned)(sk * k_)) + 1;", 1)],
}


@needs_gxx
def test_fixup_protocol_runs_every_piece_once_with_the_right_sums(tmp_path):
    proc = _run_harness(HEADER.read_text(), tmp_path, defines=("TC_HOST_SK_ONLY",))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


@needs_gxx
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_fixup_harness_catches_each_mutant(name, tmp_path):
    text = HEADER.read_text()
    for old, new, count in MUTANTS[name]:
        assert text.count(old) == count, (name, old)
        text = text.replace(old, new)
    proc = _run_harness(text, tmp_path, defines=("TC_HOST_SK_ONLY",))
    assert proc.returncode != 0 and "FAIL" in proc.stdout, f"{name}: not caught\n{proc.stdout}"


# -- on the GPU --------------------------------------------------------------------------------------------

def _slots(k) -> int:
    """The workspace's slots the kernel was compiled with (the target's SMs: its tc_mc argument)."""
    return int(re.search(r"tc_workspace, (\d+)\}", _body(k)).group(1))


def _run(k, a, b, M, N, out, torch):
    c = torch.full((M, N), float("nan"), device="cuda", dtype=getattr(torch, out))
    k(a, b, c)
    torch.cuda.synchronize()
    return c


@hopper_gpu
@pytest.mark.parametrize("shape,kw", [
    (SQ, {"panel": 8}),                                                              # 512 tiles: 3.88 waves
    (SQ, {"panel": 8, "dtype": "bfloat16", "out": "bfloat16"}),
    (dict(SQ, M=8192, N=8192, K=1024), {"panel": 8}),                               # 2048 tiles: 15.5 waves
    (dict(SQ, M=3000, N=7000, K=1000), {"out": "float32"}),                         # ragged M, N and K: 672 tiles
    (dict(SQ, M=3000, N=3000, K=1000, bn=128, threads=128), {"dtype": "bfloat16", "out": "bfloat16"}),  # MR 2
    # 192 tiles (1.45 waves: all stream-K), B k-major, swizzled, the direct stores
    (dict(SQ, M=2000, N=3000, K=2000), {"tb": True, "panel": 3, "pass_configs": {"tilecore.cuda.tma_store": False}}),
    (dict(SQ, M=4096 + 256, N=4096, K=2048), {"stream_k": "tail"}),                 # 544 tiles, the 16 past 4 waves
    (SQ, {"panel": 8, "stream_k": "stagger"}),                                      # the ranges between whole tiles
    (dict(SQ, M=3000, N=7000, K=1000), {"stream_k": "stagger", "dtype": "bfloat16", "out": "bfloat16"}),
])
def test_device_stream_k_matches_float64_and_stream_k_off(shape, kw):
    torch = pytest.importorskip("torch")
    kw = dict(kw)
    cfg = {"tilecore.cuda.stream_k": kw.pop("stream_k", True), **kw.pop("pass_configs", {})}
    M, N, K = shape["M"], shape["N"], shape["K"]
    dtype, out, tb = kw.get("dtype", "float16"), kw.get("out", "float16"), kw.get("tb", False)
    k = _compile(shape, target="cuda", pass_configs=cfg, **kw)
    assert "stream_k" in _notes(k) and "not stream_k" not in _notes(k), _notes(k)
    g = torch.Generator().manual_seed(M + N + K)
    a = torch.randn(M, K, generator=g).to(getattr(torch, dtype)).cuda()
    b = torch.randn(K, N, generator=g).to(getattr(torch, dtype)).cuda()
    ref = a.double() @ b.double()
    if tb:
        b = b.t().contiguous()
    runs = [_run(k, a, b, M, N, out, torch) for _ in range(3)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])  # the same bits every run (a fixed summation order)
    got = runs[0].double()
    assert torch.isfinite(got).all()  # every element written (NaN-filled before)
    tol = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 8e-2}[out] * np.sqrt(K)  # the split-K tests' tolerance
    assert torch.allclose(got, ref, atol=tol, rtol=2e-2), (got - ref).abs().max().item()
    # stream-K off: the same within float32 accumulation and one output rounding (a split tile's partials are summed
    # in another order); the workspace's flags left at zero (the next launch needs no clearing)
    off = _compile(shape, target="cuda", pass_configs={**cfg, "tilecore.cuda.stream_k": False}, **kw)
    c0 = _run(off, a, b, M, N, out, torch).double()
    assert torch.allclose(got, c0, atol=tol, rtol=2e-2)
    slots = _slots(k)
    ws = next(iter(k._program._workspaces.values()))[0]
    flags = ws[:k.source.meta["workspace"]["bytes"] - slots * shape["bm"] * shape["bn"] * 4].view(torch.int32)
    assert int(flags.abs().sum().item()) == 0


@hopper_gpu
def test_device_stream_k_4096_fp16_most_tiles_bit_for_bit_with_off():
    """Whole tiles sum in the same order as stream-K off: only the split tiles' elements may differ."""
    torch = pytest.importorskip("torch")
    M = N = K = 4096
    k = _compile(SQ, target="cuda", pass_configs=SK, panel=8)
    off = _compile(SQ, target="cuda", pass_configs={"tilecore.cuda.stream_k": False}, panel=8)
    g = torch.Generator().manual_seed(7)
    a = torch.randn(M, K, generator=g).half().cuda()
    b = torch.randn(K, N, generator=g).half().cuda()
    c1, c0 = _run(k, a, b, M, N, "float16", torch), _run(off, a, b, M, N, "float16", torch)
    same = (c1 == c0).view(M // 128, 128, N // 256, 256).all(dim=3).all(dim=1)  # per 128x256 tile
    blocks = min(_slots(k), torch.cuda.get_device_properties(0).multi_processor_count)
    sk = 512 - (512 // blocks - 1) * blocks  # 248 on 132 SMs
    assert same.sum().item() >= 512 - sk  # the data-parallel tiles at least (the same sums in the same order)


@hopper_gpu
def test_device_stream_k_dynamic_m_decides_at_launch():
    """A dynamic M: the schedule comes from the launch's tiles (384 at M = 3000: stream-K; 32 at M = 250: one wave,
    whole tiles), both against float64."""
    torch = pytest.importorskip("torch")
    from test_cuda_hopper import dynamic_m_gemm

    N, K = 4096, 1024
    k = tilecore.compile(dynamic_m_gemm(N=N, K=K), target="cuda", pass_configs={**NOCACHE, **SK})
    assert "stream_k: the partial wave's tiles and one whole wave" in _notes(k)
    for M in (3000, 250, 3000):
        g = torch.Generator().manual_seed(M)
        a = torch.randn(M, K, generator=g).half().cuda()
        b = torch.randn(K, N, generator=g).half().cuda()
        got = _run(k, a, b, M, N, "float16", torch).double()
        ref = a.double() @ b.double()
        assert torch.isfinite(got).all()
        assert torch.allclose(got, ref, atol=2e-2 * np.sqrt(K), rtol=2e-2), (M, (got - ref).abs().max().item())
