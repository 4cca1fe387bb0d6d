"""FlashAttention's general path: O's rescale in the next iteration's turn (decision D87).

``tilecore.pipeline_scale_in_turn`` (core, pipeline.py / overlap.py; "auto" by default: the exact build at d128
128x176, where it measured +3.5% non-causal): in the loop D59 rotates (the last
gemm O += P V issued one iteration late, beside the next first gemm, inside ping-pong's turn), the late statements
that name the last gemm's accumulators and none of its operands (``O *= alpha``) move from the end of iteration k - 1
(after the exponentials, where the exact build's issue slots are full: ptxas put the 64 FMUL after the last
MUFU.EX2) to iteration k, between the first gemm's issue and the rotated gemm that adds to O; the peel's copy moves to
the first iteration and the last one to right before the gemm after the loop. Every buffer sees the same operations in
the same order, so the results are the same bits.

Compile-only checks wherever a CUDA compiler exists (the statements' place in the source, the count of rescales, no
spill, the default unchanged, a refused value); on an sm_90 GPU bit for bit the default and against float64, causal
and ragged, exact and fast math.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
import sass_paths  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import hopper_gpu  # noqa: E402
from test_cuda_fa_unswitch import FORMS, _inputs, _reference  # noqa: E402

import tilecore  # noqa: E402
from tilecore_conformance.composite import flash_attention_forward  # noqa: E402

HOPPER = "cuda:sm_90a"
SIT = {"tilecore.pipeline_scale_in_turn": True}
OFF = {"tilecore.pipeline_scale_in_turn": False}  # the kernel before D87
LOOPS = {"tilecore.pipeline_mask_unswitch": "loops"}
CH4 = {"tilecore.reduce_chains": 4}
DESC = {"tilecore.cuda.descriptor_offsets": True}
REGS = {"tilecore.cuda.descriptor_offsets": "registers"}


def fa(dim=128, bm=128, bn=128, causal=False, fast=False, kv_heads=None, stages=2, seq=4096, heads=32, batch=8,
       **configs):
    func = flash_attention_forward(seq, dim, heads, bm, bn, "float16", causal, batch=batch, threads=256,
                                   num_stages=stages, kv_heads=kv_heads)
    return tilecore.compile(func, target=HOPPER, out_idx=[3],
                            pass_configs={**NOCACHE, "tilecore.fast_math": fast, **configs})


def _src(**kw) -> str:
    return fa(**kw).source.code


def _rescales(src: str) -> list:
    """Line numbers of O's rescale nests (the statement ``acc_o[0] = (acc_o[0] * ...)``) in the source."""
    return [n for n, line in enumerate(src.splitlines()) if re.match(r"\s*acc_o\[0\] = \(acc_o\[0\] \* ", line)]


def _lines(src: str, pattern: str) -> list:
    return [n for n, line in enumerate(src.splitlines()) if re.search(pattern, line)]


@needs_toolchain
@pytest.mark.parametrize("form", [dict(), dict(causal=True), dict(causal=True, **LOOPS), dict(bn=176),
                                  dict(fast=True, causal=True)], ids=["x128", "c128", "c128-loops", "x176", "fc128"])
def test_scale_moves_into_the_turn_before_the_gemm_that_adds_to_o(form):
    """Each rescale sits right after a first gemm's issue (or, after the loop, after the late wait) and before the
    next P @ V; the peel keeps none; as many rescales as P @ V gemms, as many as before (the copies of the loop body:
    one loop, D70's two paths or D74's two loops, plus the gemm after the loop)."""
    base, moved = _src(**form, **OFF), _src(**form, **SIT)
    pv_base = _lines(base, r"tc_wgmma_rs_\w+::run\(.*acc_o")
    pv = _lines(moved, r"tc_wgmma_rs_\w+::run\(.*acc_o")
    scales = _rescales(moved)
    assert len(scales) == len(pv) == len(pv_base) == len(_rescales(base)), (len(scales), len(pv), len(_rescales(base)))
    syncs = _lines(moved, r"tc_named_sync\(2 \+")
    for s in scales:
        nxt = min(p for p in pv if p > s)
        # nothing but O's rescale, the wgmma fences and P's operand moves between it and the next P @ V
        between = moved.splitlines()[s:nxt]
        assert not any("exp2" in x or "tc_wg_wait" in x for x in between), "\n".join(between[:5])
        # in the loop: inside the turn (after the turn's sync that opens the first gemm)
        prev_sync = max((y for y in syncs if y < s), default=None)
        assert prev_sync is not None
    # the peel (before the consumers' first loop: the last loop opened before the first P @ V) keeps no rescale
    def first_loop(src, pv):
        return max(n for n in _lines(src, r"for \(long long k\w* = ") if n < pv[0])

    assert min(scales) > first_loop(moved, pv)
    assert min(_rescales(base)) < first_loop(base, pv_base)


@needs_toolchain
@pytest.mark.parametrize("form", [dict(), dict(causal=True), dict(bn=176, causal=True)], ids=["x128", "c128", "c176"])
def test_scale_in_turn_no_spill_and_the_exact_plan_shorter(form):
    """No local memory; in the exact build ptxas's planned cycles of the main loop's iteration no longer than the
    default's (non-causal 128x128: 1222 -> 1205, and 1173 with the row maximum as four chains)."""
    base, moved = fa(**form, **OFF), fa(**form, **SIT)
    sass = tilecore_cuda.CUDABackend().disassemble(moved.binary, moved.target)
    assert not any(sass_paths.opcode(t) in ("LDL", "STL") for _, t in sass_paths.parse(sass))
    cyc = sass_paths.stalls(sass)["cycles"]
    cyc0 = sass_paths.stalls(tilecore_cuda.CUDABackend().disassemble(base.binary, base.target))["cycles"]
    assert cyc <= cyc0, (cyc, cyc0)


@needs_toolchain
def test_scale_in_turn_named_in_the_notes():
    assert "scaled in the next turn" in repr(fa(**SIT).meta)


@needs_toolchain
@pytest.mark.parametrize("form,moved", [(dict(bn=176), True), (dict(bn=176, causal=True), True),
                                        (dict(), False), (dict(causal=True), False),
                                        (dict(bn=176, fast=True), False), (dict(fast=True), False),
                                        (dict(dim=64, bn=176), False), (dict(dim=256, bn=64), False)],
                         ids=["x176", "c176", "x128", "c128", "fx176", "f128", "d64x176", "d256"])
def test_auto_by_default_at_d128_128x176_in_the_exact_build(form, moved):
    """The default ("auto") moves the rescale where D83's two loops' form is (first gemm's accumulator 88 elements a
    thread or more, the last 64 or more: d128 at 128x176) in the exact build: there the default is the measured
    kernel (``True``); elsewhere the kernel of before (``False``)."""
    default = _src(**form)
    assert default == _src(**form, **(SIT if moved else OFF))
    assert (default != _src(**form, **OFF)) == moved


@needs_toolchain
def test_a_bad_scale_in_turn_value_is_refused():
    with pytest.raises(tilecore.errors.TilecoreError, match="tilecore.pipeline_scale_in_turn"):
        fa(**{"tilecore.pipeline_scale_in_turn": "maybe"})


# -- on an sm_90 GPU ------------------------------------------------------------------------------------------

@hopper_gpu
@pytest.mark.parametrize("seq", [1000, 300])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
def test_scale_in_turn_gives_the_defaults_bits_and_matches_float64(form, causal, seq, fast):
    """The rescale in the turn (alone, with four chains of the row maximum, and with descriptor offsets of P @ V or of
    both gemms) and off bit for bit the default of the same build, and against float64; sequences ragged (1000) and short (300: the unmasked loop empty
    for every block of a causal row). D74's two loops are the default under fast math and at 128x176 / d256."""
    import torch

    _, dim, bm, bn, kvh, stages = form
    heads, batch = 3, 2
    q, k, v = _inputs(dim, kvh, seq, heads, batch, 87)
    outs = {}
    for name, extra in (("default", {}), ("off", OFF), ("sit", SIT), ("ch4", CH4), ("ch4_sit", {**CH4, **SIT}),
                        ("rsc", {**REGS, **CH4, **SIT}), ("dsc", {**DESC, **CH4, **SIT})):
        outs[name] = fa(dim, bm, bn, causal, fast=fast, kv_heads=kvh, stages=stages, seq=seq, heads=heads,
                        batch=batch, **extra)(q, k, v)
    torch.cuda.synchronize()
    for name in ("off", "sit", "ch4", "ch4_sit", "rsc", "dsc"):  # each the same bits (D87's, D66's, D59's / D83's options)
        assert torch.equal(outs[name], outs["default"]), name
    kr, vr = (x.repeat_interleave(heads // (kvh or heads), dim=1) for x in (k, v))
    err = (outs["sit"].double() - _reference(q, kr, vr, causal)).abs().max().item()
    assert err < (4e-3 if fast else 2e-3), f"{form[0]} causal={causal} fast={fast}: max error {err}"
