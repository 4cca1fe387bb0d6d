"""The 8-bit (fp8) GEMM on the core's general path (docs/decisions.md D67, issue 11 item 4).

The CUDA plugin lists wgmma's m64nNk32 for e4m3 / e5m2 as a matrix unit (``tilecore_cuda.units``: both operands
read K-major from their shared tiles, ``k_major_only``), so the core's planner takes the README GEMM with B given as
(N, K) through bulk tile copies (TMA) of both operands into 128-byte-swizzled panels and wgmma reading them by
descriptor: no operand copied per thread (before D67 the general path ran the generic register GEMM: B copied per
thread, 160 bytes spilled a thread at 128x256x128).

Checked through ``tilecore.compile`` / ``tilecore.compiler.lower``:

- the lowered kernel: bulk copies of A and B, the m64nNk32 accumulator, the bulk-store epilogue (in halves at 4
  stages, D58), for both formats and the benchmark's tiles;
- on sm_90a through NVRTC: SASS with QGMMA of the format, UTMALDG, UTMASTG, no local memory, no per-thread copies
  (LDGSTS / LDG); the consumers' k step within a few instructions of the plugin's pipeline (tests/sass_paths.py);
- on an sm_90 GPU (skipped here): against float64 and bit for bit against the general path with direct stores, the
  routed build and the plugin's pipeline, 4096^3 and ragged M / N / K, both formats, TileLang's example (C in fp8).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tilecore

sys.path.insert(0, str(Path(__file__).parent))

from test_cuda_backend import needs_toolchain  # noqa: E402
from test_cuda_hopper import gemm as hopper_gemm, hopper_gpu  # noqa: E402

GENERAL = {"tilecore.disable_cache": True, "tilecore.cuda.register_programs": False}
ROUTED = {"tilecore.disable_cache": True, "tilecore.cuda.general_plain_gemm": True}
PLUGIN = {"tilecore.disable_cache": True, "tilecore.cuda.general_plain_gemm": False}
#: the benchmark's fp8 tiles (benchmarks/cuda_gemm.py FP8_CONFIGS) and a 128x128 one: (bm, bn, bk, stages, panel)
TILES = {"128x256x128/3": (128, 256, 128, 3, 8), "128x256x128/4": (128, 256, 128, 4, 8),
         "128x128x128/4": (128, 128, 128, 4, 8)}
#: TileLang's own fp8 example (tests/tilelang_corpus/gemm_fp8.py): 64-byte rows (the plugin's pipeline takes only
#: 128-byte ones), one warpgroup, C in the operands' 8-bit type
CORPUS_TILE = (128, 128, 64, 3, 0)


def fp8(M, N, K, tile="128x256x128/3", dtype="float8_e4m3", tb=True, panel=None, out="float16", threads=256):
    bm, bn, bk, stages, pn = CORPUS_TILE if tile == "corpus" else TILES[tile]
    return hopper_gemm(M, N, K, bm, bn, bk, threads, stages, dtype, out, tb=tb, panel=pn if panel is None else panel)


def _lower(fn, cfg):
    _b, _t, low, src, _o = tilecore.compiler.lower(fn, target="cuda:sm_90a", pass_configs=cfg)
    return low, src


@pytest.mark.parametrize("dtype", ["float8_e4m3", "float8_e5m2"])
def test_the_8_bit_gemm_runs_on_the_general_path_by_default(dtype):
    """D72: with no pass config the plain 8-bit GEMM leaves its loop to the core's general path (the 16-bit one since
    D65), bit for bit what general_plain_gemm=True emits; asking for False keeps the plugin's pipeline."""
    default = {"tilecore.disable_cache": True}
    low, src = _lower(fp8(4096, 4096, 4096), default)
    assert any("left to the core's general path" in n for n in low.attrs["hopper_pipelines"]), low.attrs
    assert src.code == _lower(fp8(4096, 4096, 4096), ROUTED)[1].code
    plugin_low, _ = _lower(fp8(4096, 4096, 4096), PLUGIN)
    assert not any("general path" in n for n in plugin_low.attrs["hopper_pipelines"]), plugin_low.attrs


@pytest.mark.parametrize("dtype", ["float8_e4m3", "float8_e5m2"])
@pytest.mark.parametrize("tile", TILES)
def test_the_8_bit_gemm_takes_bulk_copies_and_wgmma_on_the_general_path(dtype, tile):
    bm, bn, _bk, _stages, _pn = TILES[tile]
    for cfg in (GENERAL, ROUTED):
        low, src = _lower(fp8(4096, 4096, 4096, tile, dtype), cfg)
        pipes = " ".join(low.attrs["pipelines"])
        assert "A_s bulk tile copies (1 x 128-byte panel(s)), B_s bulk tile copies (1 x 128-byte panel(s))" in pipes, pipes
        assert "async" not in pipes, pipes  # no per-thread copies
        assert low.attrs["fragment_layouts"]["C_l"].startswith(f"wgmma_m64n{bn}k32.C x 2x1 groups"), low.attrs
        assert low.attrs["bulk_store"][0].startswith("bulk store: C_l -> C"), low.attrs["bulk_store"]
        if tile == "128x256x128/4":  # 2 x 64 KiB of stages more: the tile in halves (D58)
            assert "in 2 parts of the tile's columns" in low.attrs["bulk_store"][0]
        ptx = dtype.split("_")[1]
        assert f"wgmma.mma_async.sync.aligned.m64n{bn}k32.f32.{ptx}.{ptx}" in src.code
        assert "C_l_mma_b" not in src.code and "C_l_mma_a" not in src.code  # no operand registers


@pytest.mark.parametrize("dtype", ["float8_e4m3", "float8_e5m2"])
def test_tilelangs_fp8_example_takes_wgmma_from_64_byte_panels(dtype):
    """TileLang's fp8 example (block_K 64: 64-byte rows, which the plugin's pipeline refuses; C in fp8): on the
    general path both operands by bulk copies into 64-byte panels, wgmma m64n128k32 over one warpgroup."""
    low, src = _lower(fp8(1024, 1024, 1024, "corpus", dtype, out=dtype, threads=128), {"tilecore.disable_cache": True})
    pipes = " ".join(low.attrs["pipelines"])
    assert "A_s bulk tile copies (1 x 64-byte panel(s)), B_s bulk tile copies (1 x 64-byte panel(s))" in pipes, pipes
    assert low.attrs["fragment_layouts"]["C_l"].startswith("wgmma_m64n128k32.C x 1x1 groups"), low.attrs
    assert "k32" in src.code and "C_l_mma_b" not in src.code


def test_an_8_bit_gemm_with_b_as_k_n_stays_off_wgmma():
    """B given as (K, N) (N contiguous): wgmma reads no MN-major 8-bit operand, so the general path keeps its generic
    register GEMM (as before D67); the result is computed all the same (tests/test_matrix_gemm.py has the reason)."""
    low, _src = _lower(fp8(1024, 1024, 1024, tb=False), GENERAL)
    assert not low.attrs["fragment_layouts"]["C_l"].startswith("wgmma"), low.attrs["fragment_layouts"]


@needs_toolchain
@pytest.mark.parametrize("dtype,sass_type", [("float8_e4m3", "E4M3.E4M3"), ("float8_e5m2", "E5M2.E5M2")])
@pytest.mark.parametrize("tile", TILES)
def test_sm90a_the_8_bit_general_gemm_is_qgmma_and_tma_without_local_memory(dtype, sass_type, tile):
    import tilecore_cuda

    bm, bn, _bk, _stages, _pn = TILES[tile]
    k = tilecore.compile(fp8(8192, 8192, 8192, tile, dtype), target="cuda:sm_90a", pass_configs=GENERAL)
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert f"QGMMA.64x{bn}x32.F32.{sass_type}" in sass
    assert "UTMALDG" in sass and "UTMASTG" in sass
    assert "STL" not in sass and "LDL" not in sass, "local memory"
    assert "LDGSTS" not in sass and " LDG" not in sass, "an operand copied per thread"
    assert sass.count("STSM") == bm * bn // 2048  # the float16 C tile by stmatrix (D51)


@needs_toolchain
def test_sm90a_the_8_bit_general_k_step_is_the_plugins():
    """The consumers' shortest path through the main loop, per k step (4 QGMMA at 128x256x128): within 4 SASS
    instructions of the plugin's pipeline (D67's table: 80 against 79 with nvcc 13.0; D58's form, before D62's
    uniform warp index, 97)."""
    import sass_paths
    import tilecore_cuda

    counts = {}
    for name, cfg in (("plugin", PLUGIN), ("general", GENERAL)):
        k = tilecore.compile(fp8(8192, 8192, 8192), target="cuda:sm_90a", pass_configs=cfg)
        ins = sass_paths.parse(tilecore_cuda.CUDABackend().disassemble(k.binary, k.target))
        loop = sass_paths.main_loop(ins, 4, "QGMMA")
        assert sum(sass_paths.opcode(ins[i][1]) == "QGMMA" for i in loop) == 4, name
        counts[name] = min(sum(c.values()) for _, c in sass_paths.paths(ins, loop))
    assert counts["general"] <= counts["plugin"] + 4, counts


# -- on an sm_90 GPU ---------------------------------------------------------------------------------------

DEVICE = {  # (M, N, K, dtype, tile, panel, out, threads)
    "e4m3-4096": (4096, 4096, 4096, "float8_e4m3", "128x256x128/3", 8, "float16", 256),
    "e5m2-4096": (4096, 4096, 4096, "float8_e5m2", "128x256x128/3", 8, "float16", 256),
    "e4m3-halves": (4096, 4096, 4096, "float8_e4m3", "128x256x128/4", 8, "float16", 256),
    "e5m2-128": (2048, 3072, 1024, "float8_e5m2", "128x128x128/4", 4, "float16", 256),
    # ragged M and N (K a whole number of 16-byte units: the rows TMA reads), a ragged last panel
    "e4m3-ragged": (1000, 1800, 1024, "float8_e4m3", "128x256x128/3", 3, "float16", 256),
    "e5m2-ragged-halves": (1000, 1800, 1040, "float8_e5m2", "128x256x128/4", 3, "float16", 256),
    "e4m3-ragged-128": (999, 777, 2048, "float8_e4m3", "128x128x128/4", 0, "float16", 256),
    # TileLang's example: 64-byte panels, one warpgroup, C in fp8 (and in bfloat16), ragged
    "corpus-e4m3": (1024, 1024, 1024, "float8_e4m3", "corpus", 0, "float8_e4m3", 128),
    "corpus-e5m2-ragged": (1000, 1800, 1024, "float8_e5m2", "corpus", 0, "float8_e5m2", 128),
    "corpus-e4m3-bf16": (1000, 1800, 1024, "float8_e4m3", "corpus", 0, "bfloat16", 128),
}


@hopper_gpu
@pytest.mark.parametrize("case", DEVICE)
def test_device_the_8_bit_general_gemm_matches_float64_and_the_direct_stores(case):
    import torch

    M, N, K, dtype, tile, panel, out, threads = DEVICE[case]
    tdt = {"float8_e4m3": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
    g = torch.Generator(device="cuda").manual_seed(7)
    a = (torch.randn(M, K, device="cuda", generator=g) / 4).to(tdt[dtype])
    b = (torch.randn(N, K, device="cuda", generator=g) / 4).to(tdt[dtype])
    ref = a.double() @ b.double().t()
    odt = tdt.get(out) or getattr(torch, out)
    outs = []
    # the general default, its direct stores, the routed build; the plugin's pipeline (where it takes the tile)
    plugin = [{**PLUGIN, "tilecore.cuda.split_k": 1}] if tile != "corpus" else []  # (not split: the same sums)
    for cfg in [GENERAL, {**GENERAL, "tilecore.bulk_store": False}, ROUTED] + plugin:
        k = tilecore.compile(fp8(M, N, K, tile, dtype, panel=panel, out=out, threads=threads), target="cuda",
                             pass_configs=cfg)
        if cfg not in plugin:
            assert k.meta["attrs"]["fragment_layouts"]["C_l"].startswith("wgmma_"), k.meta["attrs"]
        c = torch.zeros((M, N), device="cuda", dtype=odt)
        c.view(torch.uint8 if odt.itemsize == 1 else torch.int16).fill_(0x7F if odt.itemsize == 1 else 0x7FC0)  # NaN
        k(a, b, c)
        torch.cuda.synchronize()
        outs.append(c)
    got = outs[0].double()
    if odt.itemsize == 1:  # one rounding to the 8-bit type: within one of its steps (e4m3 2^-3, e5m2 2^-2 relative)
        step = 2.0 ** -(3 if out == "float8_e4m3" else 2)
        assert bool(((got - ref).abs() <= step * ref.abs() + 2.0 ** -6).all()), case
    else:
        # the 8-bit wgmma's accumulation is not float32's (round 1 on the H200: 4.9e-3 of max |ref| at K = 4096, the
        # plugin's pipeline the same bits): a bound growing with K; then one rounding to C's type (bf16: 2^-9 relative)
        err = float((got - ref).abs().max())
        rounding = 2.0 ** -9 if out == "bfloat16" else 2.0 ** -12
        assert err <= (3e-3 * max(1.0, K / 1024) + rounding) * max(1.0, float(ref.abs().max())), (case, err)
    bits = [c.view(torch.uint8 if odt.itemsize == 1 else torch.int16) for c in outs]
    assert all(torch.equal(bits[0], x) for x in bits[1:]), (case, [torch.equal(bits[0], x) for x in bits[1:]])
