"""FlashAttention's masked loop knows its bound (decision D81, ``tilecore.pipeline_masked_loop_bound``).

Where ``tilecore.pipeline_mask_unswitch`` puts the masked iterations in a loop of their own (``"loops"``, D74: the
default under fast math and at d256), that loop's variable runs over ``[max(E, 1), end)`` written as a start and a
trip count (``max(end - start, 0)``); the guard's interval prover lost the link between them, so the causal mask's
edge test ``k * bn + j < seq`` stayed in every masked iteration even where ``bn`` divides ``seq`` (128 comparisons and
their predicates at 128x128: the masked loop of d64's fast causal kernel 986 instructions against the register
program's 609). D81 starts the loop's body with the fact ``k < end`` (an ``Assume``: no code), so the prover folds
them (752). The same bits.

Compile-only wherever a CUDA compiler exists: the sources and the SASS. On an sm_90 GPU: the default bit for bit the
option off and against float64 on the forms that take the two loops, sequences 1000 (ragged: the edge test stays where
it can fail) and 1024.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
import sass_paths  # noqa: E402
from test_cuda_backend import needs_toolchain  # noqa: E402
from test_cuda_fa_parity import _reference, fa  # noqa: E402
from test_cuda_hopper import hopper_gpu  # noqa: E402

import tilecore  # noqa: E402

OFF = {"tilecore.pipeline_masked_loop_bound": False}
LOOPS = {"tilecore.pipeline_mask_unswitch": "loops"}


def _hgmma_loops(k) -> list:
    """Instruction counts of the SASS loops (backward branches) holding exactly one iteration's HGMMA (12 at d64
    128x128: 4 for Q K^T, 8 for P @ V), in address order: the unmasked loop, then the masked one."""
    ins = sass_paths.parse(tilecore_cuda.CUDABackend().disassemble(k.binary, k.target))
    ops = [sass_paths.opcode(t) for _, t in ins]
    out = []
    for a, t in ins:
        m = sass_paths._TARGET.search(t)
        if m and sass_paths.opcode(t) == "BRA" and int(m.group(1), 16) < a:
            body = [i for i, (b, _) in enumerate(ins) if int(m.group(1), 16) <= b <= a]
            if sum(ops[i] == "HGMMA" for i in body) == 12:
                out.append(len(body))
    return out


@needs_toolchain
def test_the_masked_loop_folds_the_edge_test():
    """d64 fast causal 128x128 (two loops): no `k * 128 + j < 4096` left; the option off keeps 128; the masked loop
    shorter by 200 or more instructions, the unmasked loop the same."""
    on, off = fa(64, 128, 128, causal=True, fast=True), fa(64, 128, 128, causal=True, fast=True, **OFF)
    assert on.get_kernel_source().count("< 4096") == 0
    assert off.get_kernel_source().count("< 4096") == 128
    (u_on, m_on), (u_off, m_off) = _hgmma_loops(on), _hgmma_loops(off)
    assert u_on == u_off and m_on <= m_off - 200, (u_on, m_on, u_off, m_off)


@needs_toolchain
@pytest.mark.parametrize("form", [dict(dim=128, causal=True, fast=True), dict(dim=128, causal=True, fast=True, kv_heads=8),
                                  dict(dim=256, bn=64, causal=True)], ids=["d128-fast", "gqa-fast", "d256-exact"])
def test_every_two_loop_form_folds_it(form):
    """The other forms "auto" puts in two loops: the edge tests folded at a key block dividing the sequence."""
    assert fa(**form).get_kernel_source().count("< 4096") == 0
    assert fa(**form, **OFF).get_kernel_source().count("< 4096") > 0


@needs_toolchain
def test_a_ragged_block_keeps_the_tests_that_can_fail():
    """128x176 causal at 4096 (ragged: the last key block runs past the sequence): the tests the bound does not imply
    stay (fewer than with the option off)."""
    on, off = (fa(128, 128, 176, causal=True, fast=True, **x).get_kernel_source().count("< 4096") for x in ({}, OFF))
    assert 0 < on < off


@needs_toolchain
def test_one_loop_forms_and_a_bad_value():
    """D70's one loop (the exact build at d128 / d64) and non-causal forms: the option changes nothing; a bad value
    is refused, naming the option."""
    for form in (dict(causal=True), dict(dim=64, causal=True), dict(dim=64, fast=True)):
        assert fa(**form).get_kernel_source() == fa(**form, **OFF).get_kernel_source()
    with pytest.raises(tilecore.errors.TilecoreError, match="pipeline_masked_loop_bound"):
        fa(64, causal=True, fast=True, **{"tilecore.pipeline_masked_loop_bound": "yes"})


# -- on an sm_90 GPU ------------------------------------------------------------------------------------------

#: (name, dim, bm, bn, kv_heads, fast, extra): the forms with D74's two loops (fast math; d256; d128 exact with "loops")
FORMS = [("d64-fast", 64, 128, 128, None, True, {}), ("d128-fast", 128, 128, 128, None, True, {}),
         ("gqa-fast", 128, 128, 128, 1, True, {}), ("d256", 256, 128, 64, None, False, {}),
         ("176-fast", 128, 128, 176, None, True, {}), ("d64-loops", 64, 128, 128, None, False, LOOPS)]


@hopper_gpu
@pytest.mark.parametrize("seq", [1000, 1024])
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
def test_the_bound_gives_the_same_bits_and_matches_float64(form, seq):
    import torch

    _, dim, bm, bn, kvh, fast, extra = form
    heads, batch = 3, 2
    g = torch.Generator(device="cuda").manual_seed(81)
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g)
    k, v = (torch.randn(batch, kvh or heads, seq, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    outs = [fa(dim, bm, bn, True, fast=fast, kv_heads=kvh, seq=seq, heads=heads, batch=batch, **extra, **x)(q, k, v)
            for x in ({}, OFF)]
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1])
    kr, vr = (x.repeat_interleave(heads // (kvh or heads), dim=1) for x in (k, v))
    err = (outs[0].double() - _reference(q, kr, vr, True)).abs().max().item()
    assert err < (4e-3 if fast else 2e-3), f"{form[0]} seq={seq}: max error {err}"
