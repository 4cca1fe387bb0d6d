"""sm_86 / sm_89's FlashAttention routed to the core's general path, decision D85.

D73 / D79 routed FlashAttention's form (two gemms, the softmax between them, P @ V reading registers) to the general
path on sm_80 at the measured (block rows, head dimension) shapes, and only on targets with sm_80's block memory.
D85's rule reads the target's block memory from its capability profile: a measured shape is routed where the general
path's least plan of the kernel (every shared tile once, the leading copies' stages) fits
``max_shared_bytes_per_block``; where it does not (the general path would serialize the loop) the register program,
which folds the output's relay tile, keeps it. Compile-only checks of the route, its notes, the rule and the
registers on cuda:sm_86 / cuda:sm_89 (and on sm_90a with sm_86's profile overlaid, how the device measures it); the
routed form on the host emulator; on a GPU every routed form (fp16 / bf16, causal and not, fast math and the exact
build) against float64.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_mma_general import Small, _emulate, _path, gpu  # noqa: E402
from test_mma_route import ptxas_of_both_paths  # noqa: E402

import mma_general  # noqa: E402
import tilecore  # noqa: E402
from lower_once import lower_once as lower  # noqa: E402  (D89: one lowering per distinct input)
from tilecore_cuda.regprog import MMA_GENERAL_FORMS, form_defaults  # noqa: E402

#: sm_86 / sm_89's profile on the H100 / H200: the sm_80 paths (D63's overlay) with 99 KiB a block
SM86_ON_H100 = {**mma_general.BASE, "tilecore.capability_overlay": mma_general.SM86}
TARGETS = [("cuda:sm_86", {}), ("cuda:sm_89", {}), ("cuda:sm_90a", SM86_ON_H100)]
#: (kernel, head dimension) the default route sends to the general path on sm_86 / sm_89: every form the device
#: step sm86 / sm86-more measures (TileLang's fp16 forward, the catalog's kernel in bf16), causal and not
ROUTED = [("fa", 64), ("fa_causal", 64), ("fa64", 64), ("fa64_causal", 64), ("fa64", 128), ("fa64_causal", 128),
          ("fa_n32", 64), ("fa_n32_causal", 64), ("fa_n32", 128), ("fa_n32_causal", 128),
          ("bfa", 64), ("bfa_causal", 64), ("bfa64", 64), ("bfa64_causal", 64), ("bfa64", 128), ("bfa64_causal", 128)]
#: the catalog's own kernel (no warp policy: the general path would keep P in block memory): kept on the register
#: program by the default route (D85 round 1 measured it routed at 0.56-0.89x)
KEPT_P = [("cat64", 64), ("cat64_causal", 64), ("bcat64", 64), ("bcat64_causal", 128)]
#: the rows (block rows) of each kernel
ROWS = {"fa": 128, "fa_causal": 128, "fa64": 64, "fa64_causal": 64, "fa_n32": 128, "fa_n32_causal": 128,
        "bfa": 128, "bfa_causal": 128, "bfa64": 64, "bfa64_causal": 64, "cat64": 64, "cat64_causal": 64,
        "bcat64": 64, "bcat64_causal": 64}


def _size(d, s=512):
    class Size(Small):
        fa = (2, 2, s, d)
    return Size


def _low(name, d, configs, target="cuda:sm_86"):
    build, own, _ = mma_general.ALL_KERNELS[name]
    return lower(build(_size(d)), target, {**NOCACHE, **own, **configs})


def _notes(low):
    return low[2].attrs.get("hopper_pipelines", ())


@pytest.mark.parametrize("target,extra", TARGETS)
@pytest.mark.parametrize("name,d", ROUTED)
def test_the_route_takes_the_measured_forms_on_sm86(name, d, target, extra):
    """The default route on sm_86 / sm_89 (and sm_90a with sm_86's profile overlaid): the general path with the
    form's defaults, the note naming D85 and sm_86's measurement; the loop pipelined (not serialized) within the
    profile's block memory; the source the routed row of the benchmark (["gemm", "attention"]: D79's defaults)."""
    low = _low(name, d, extra, target)
    notes = _notes(low)
    assert _path(low[2].attrs) == "generic", notes
    note = next(n for n in notes if n.startswith("cuda.register_program: kernel not mapped"))
    assert f"its form (attention, {ROWS[name]} rows, head dimension {d}) runs on the core's general path" in note
    assert "with sm_86's / sm_89's (D71, D73, D79, D85" in note, note
    assert "the form's defaults on the general path: " + ", ".join(
        f"{k}={v!r}" for k, v in form_defaults((ROWS[name], d)).items()) in note, note
    assert not any("serialized" in p for p in low[2].attrs.get("pipelines", ())), low[2].attrs.get("pipelines")
    assert low[3].meta["shared_bytes"] <= 101376
    every = _low(name, d, {**extra, MMA_GENERAL_FORMS: ["gemm", "attention"]}, target)
    assert every[3].code == low[3].code


def test_the_overlay_plans_what_sm86_plans():
    """D63's overlay with sm_86's block memory on sm_90a (how the device step measures sm_86) plans the general
    path's pipelines and layouts as a real sm_86 compile, and the register program's stages too."""
    for name, d in (("fa64", 128), ("fa", 64), ("bfa64_causal", 128), ("cat64", 64)):
        real, over = _low(name, d, {}), _low(name, d, SM86_ON_H100, "cuda:sm_90a")
        assert _path(over[2].attrs) == _path(real[2].attrs)
        assert over[2].attrs.get("pipelines") == real[2].attrs.get("pipelines")
        assert over[2].attrs.get("fragment_layouts") == real[2].attrs.get("fragment_layouts")
        assert over[3].meta["shared_bytes"] == real[3].meta["shared_bytes"]
        forced = {"tilecore.cuda.register_programs": True}
        assert _low(name, d, {**SM86_ON_H100, **forced}, "cuda:sm_90a")[3].meta["shared_bytes"] == \
            _low(name, d, forced)[3].meta["shared_bytes"]


@pytest.mark.parametrize("target", ["cuda:sm_86", "cuda:sm_89"])
def test_the_block_memory_rule_keeps_what_the_general_path_cannot_pipeline(target):
    """128 rows, 64 keys a block, d128 (a measured shape, 128x128): the register program fits 99 KiB (O's relay tile
    folded, 99376 bytes) but the general path needs Q, K twice, V and O_shared (114688 bytes): routed it would
    serialize the loop (["gemm", "attention"] shows it). The rule reads the block memory from the target's profile: kept on sm_86 /
    sm_89 with a note naming both numbers, routed on sm_80 (163 KiB) and on sm_86 with sm_80's block memory overlaid."""
    f = mma_general.flash(2, 2, 512, 128, False, 128, 64, 256)
    cfg = {**NOCACHE, "tilecore.fast_math": True}
    low = lower(f, target, cfg)
    assert _path(low[2].attrs) == "register program (mma.sync)"
    assert any("FlashAttention's form at 128 rows, head dimension 128 stays on the register program (the general path "
               "needs at least 114688 bytes of block memory for it (every shared tile once, the leading copies' "
               "stages), this target has 101376: D85" in n for n in _notes(low)), _notes(low)
    every = lower(f, target, {**cfg, MMA_GENERAL_FORMS: ["gemm", "attention"]})
    assert _path(every[2].attrs) == "generic"
    assert "serialized" in every[2].attrs["pipelines"][0], every[2].attrs["pipelines"]
    assert _path(lower(f, "cuda:sm_80", cfg)[2].attrs) == "generic"
    sm80 = {k: v for k, v in mma_general.SM80.items() if k.startswith(("limits.max_shared", "memory.shared"))}
    assert _path(lower(f, target, {**cfg, "tilecore.capability_overlay": sm80})[2].attrs) == "generic"


@pytest.mark.parametrize("target,extra", [*TARGETS, ("cuda:sm_80", {})])
@pytest.mark.parametrize("name,d", KEPT_P)
def test_the_route_keeps_the_form_whose_p_the_general_path_keeps_in_block_memory(name, d, target, extra):
    """The catalog's kernel (no warp policy: the core splits S's columns between the warps, so the general path keeps
    P, the second gemm's A, in block memory and reduces rows through a scratch) stays on the register program on
    every mma.sync target, the note saying why (D85 round 1: 0.56-0.89x routed); ["gemm", "attention"] routes it, and
    its fragment layouts show P in block memory; with TileLang's FullRow policy (bfa64) the same kernel is routed."""
    low = _low(name, d, extra, target)
    assert _path(low[2].attrs) == "register program (mma.sync)", _notes(low)
    assert any(f"FlashAttention's form at 64 rows, head dimension {d} stays on the register program (the general path "
               "would keep P, the second gemm's A, in block memory: the first gemm's warp groups split its columns"
               in n and "0.56-0.89x" in n for n in _notes(low)), _notes(low)
    every = _low(name, d, {**extra, MMA_GENERAL_FORMS: ["gemm", "attention"]}, target)
    assert _path(every[2].attrs) == "generic"
    assert every[2].attrs["fragment_layouts"]["acc_s_cast"].startswith("shared")
    row = _low("bfa64", d, extra, target)
    assert _path(row[2].attrs) == "generic" and not row[2].attrs["fragment_layouts"]["acc_s_cast"].startswith("shared")


def test_the_route_is_unchanged_on_sm80():
    """sm_80's routed forms are those D79 left (the rule admits every shape sm_80 measured there)."""
    for name, d in (("fa", 128), ("fa_causal", 128), ("fa64", 64), ("fa", 64)):
        low = _low(name, d, {}, "cuda:sm_80")
        assert _path(low[2].attrs) == "generic", _notes(low)


@pytest.mark.parametrize("target", ["cuda:sm_86", "cuda:sm_89"])
def test_forms_option_and_register_programs_keep_their_meaning(target):
    """["gemm"] keeps every shape on the register program (the note says the option names no attention form);
    register_programs=True forces it; False puts it on the general path with the core's own defaults."""
    for name, d in (("fa64", 128), ("fa", 64)):
        kept = _low(name, d, {MMA_GENERAL_FORMS: ["gemm"]}, target)
        assert _path(kept[2].attrs) == "register program (mma.sync)"
        assert any('names neither "attention" nor "attention-measured"' in n for n in _notes(kept))
        assert _path(_low(name, d, {"tilecore.cuda.register_programs": True}, target)[2].attrs) == \
            "register program (mma.sync)"
        general = _low(name, d, {"tilecore.cuda.register_programs": False}, target)
        assert _path(general[2].attrs) == "generic"
        assert general[3].code != _low(name, d, {}, target)[3].code  # the form's defaults come with the route


@needs_toolchain
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("name,d", [("fa", 64), ("fa_causal", 64), ("fa64", 64), ("fa64_causal", 64),
                                    ("fa64", 128), ("fa64_causal", 128), ("bfa64_causal", 128)])
def test_the_routed_kernels_registers_on_sm86(name, d, fast):
    """ptxas for sm_86 at the benchmark's size (b8 h32 s4096): each routed default holds no stack and no spills, in
    registers that leave at least the register program's blocks an SM (sm_86: 65536 registers, 1536 threads an SM)."""
    regs = ptxas_of_both_paths(mma_general.ALL_KERNELS[name], d, fast, "cuda:sm_86")
    threads = 256 if ROWS[name] == 128 else 128

    def blocks(r, smem):
        return min(65536 // (-(-r // 8) * 8 * threads), 1536 // threads, 102400 // smem)
    assert blocks(*regs["default"]) >= blocks(*regs["regprog"]), regs


# -- the routed form on the host emulator ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_routed_form_on_the_host_emulator_matches_float64(causal, dtype, tmp_path):
    """The catalog's forward at 64 rows, 32 keys a block, d64 (small enough for the emulator's static shared
    memory), routed by the default on cuda:sm_86: the generated source run on the host (threads concurrent, barriers
    real, cp.async landing at its wait) against float64."""
    import numpy as np

    run = _emulate()
    b, h, s, d = 1, 2, 192, 64
    f = mma_general.bflash(b, h, s, d, causal, bm=64, bn=32, threads=128, dtype=dtype)
    kern = tilecore.compile(f, out_idx=[3], target="cuda:sm_86", pass_configs={**NOCACHE, "tilecore.fast_math": True})
    attrs = kern.meta["attrs"]
    assert _path(attrs) == "generic", attrs.get("hopper_pipelines")
    rng = np.random.default_rng(5)
    if dtype == "float16":
        q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float16) for _ in range(3))
        args = [q, k, v, np.zeros((b, h, s, d), np.float16)]
        tol = 2e-3
    else:  # bfloat16 as its 16-bit patterns (the emulator's buffers are raw bytes)
        x = [rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3)]
        bits = [((a.view(np.uint32) + 0x8000) >> 16).astype(np.uint16) for a in x]  # round to nearest (no NaN here)
        q, k, v = ((bb.astype(np.uint32) << 16).view(np.float32) for bb in bits)
        args = [*bits, np.zeros((b, h, s, d), np.uint16)]
        tol = 1.6e-2
    out = run(kern, args, tmp_path)[3]
    if dtype == "bfloat16":
        out = (out.astype(np.uint32) << 16).view(np.float32)
    out = out.astype(np.float64)
    sc = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) / d ** 0.5
    if causal:
        sc = np.where(np.tril(np.ones((s, s), bool)), sc, -np.inf)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    err = np.abs(out - ref).max()
    assert err <= tol, f"causal={causal} {dtype}: max error {err}"


# -- on a GPU: the routed forms with sm_86's profile against float64 --------------------------------------------

def device_error(name, d, configs, s=512) -> tuple:
    """``(max error against float64, tolerance, the kernel)``: kernel ``name`` at b2 h2, ``s`` keys, head dimension
    ``d``, built for the device with sm_86's profile overlaid (``SM86_ON_H100``), the kernel's own configs and
    ``configs``."""
    import torch

    build, own, out_idx = mma_general.ALL_KERNELS[name]
    kern = tilecore.compile(build(_size(d, s)), out_idx=out_idx, target="cuda",
                            pass_configs={**NOCACHE, **SM86_ON_H100, **own, **configs})
    dtype = torch.bfloat16 if name.startswith(("bfa", "bcat")) else torch.float16
    g = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(2, 2, s, d, device="cuda", generator=g).to(dtype) for _ in range(3))
    sc = (q.double() @ k.double().transpose(-1, -2)) / d ** 0.5
    if name.endswith("causal"):
        sc = sc.masked_fill(torch.ones(s, s, device="cuda", dtype=torch.bool).tril().logical_not(), float("-inf"))
    ref = sc.softmax(-1) @ v.double()
    out = kern(q, k, v)
    torch.cuda.synchronize()
    # P is rounded to the input type before P @ V and O is stored in it: bf16 keeps 8 bits, fp16 11
    tol = 3e-2 if dtype == torch.bfloat16 else 4e-3
    return (out.double() - ref).abs().max().item(), tol, kern


@gpu
@pytest.mark.parametrize("variant", ["default", "regprog"])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("name,d", ROUTED)
def test_device_sm86_routed_forms_match_float64(name, d, fast, variant):
    """Every routed form with sm_86's profile (the default: the general path; regprog: the register program it
    leaves), fast math and the exact build, against float64; the path each took."""
    err, tol, kern = device_error(name, d, {"tilecore.fast_math": fast, **mma_general.VARIANTS[variant]})
    assert tilecore_cuda.lowering_path(kern) == ("generic" if variant == "default" else "register program (mma.sync)")
    assert err < tol, f"{name} d{d} fast={fast} {variant}: max error {err}"


@gpu
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("name,d", KEPT_P)
def test_device_sm86_kept_forms_match_float64(name, d, fast):
    """The forms the route keeps (P in block memory on the general path), on the register program by default and on
    the general path by ["gemm", "attention"], against float64."""
    for variant, path in (("default", "register program (mma.sync)"), ("attention-all", "generic")):
        err, tol, kern = device_error(name, d, {"tilecore.fast_math": fast, **mma_general.VARIANTS[variant]})
        assert tilecore_cuda.lowering_path(kern) == path
        assert err < tol, f"{name} d{d} fast={fast} {variant}: max error {err}"


@gpu
@pytest.mark.parametrize("name", ["fa", "fa_causal", "fa64", "fa64_causal", "bfa_causal", "bfa64_causal"])
def test_device_sm86_ragged_sequence_matches_float64(name):
    """A sequence the blocks do not divide (200 keys): the routed default's edge masks and guards."""
    err, tol, kern = device_error(name, 64, {}, s=200)
    assert tilecore_cuda.lowering_path(kern) == "generic"
    assert err < tol, f"{name} s200: max error {err}"
