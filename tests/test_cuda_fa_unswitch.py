"""FlashAttention's general path: the softmax beside P @ V on the masked forms (decision D70).

``tilecore.pipeline_mask_unswitch`` (core, pipeline.py): in a warp-specialized loop that tilecore.pipeline_overlap
rotates, with D59's split mask after the first gemm, the iteration after its stage waits is emitted twice under the
mask's condition (``if k < E: the iteration else: the iteration with the mask``). Without it the mask's branch lies
between the gemms' issue and the softmax, and ptxas schedules the wait for P @ V (``WARPGROUP.DEPBAR.LE gsb0, 0x0``)
right after that branch: a handful of instructions run beside P @ V instead of the register program's ~100.

Compile-only checks wherever a CUDA compiler exists (the source's shape; the SASS's window between the wait for
S = Q K^T and the wait for P @ V, on both paths, without a branch). On an sm_90 GPU: bit for bit the defaults
(exact build) and against float64 on the causal and ragged forms, fast math against float64.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
import sass_paths  # noqa: E402
from test_cuda_backend import needs_toolchain  # noqa: E402
from test_cuda_hopper import GENERAL, HOPPER, hopper_gpu  # noqa: E402

import tilecore  # noqa: E402
from tilecore_conformance.composite import flash_attention_forward  # noqa: E402

#: D89: the general path through the run's kernel cache (private to the run, shared by its xdist workers, keyed by the
#: IR, options and the core's and plugin's code): a kernel that several tests (or test_cuda_general_attention) read
#: compiles once; nothing here monkeypatches the compiler
GENERAL = {k: v for k, v in GENERAL.items() if k != "tilecore.disable_cache"}

UNSWITCH = {"tilecore.pipeline_mask_unswitch": True}
#: before D70's defaults: D59's mask after the first gemm under its own branch, the row maximum as one chain
BEFORE = {"tilecore.pipeline_mask_unswitch": False, "tilecore.reduce_chains": 1}
CHAINS = {"tilecore.reduce_chains": 4}  # D66's row maximum as four chains: with it fast math's window too
DESC = {"tilecore.cuda.descriptor_offsets": True}  # D66's descriptor offsets: the gemms issued back to back


def fa(dim=128, bm=128, bn=128, causal=False, fast=False, kv_heads=None, stages=2, seq=4096, heads=32, batch=8,
       **configs):
    func = flash_attention_forward(seq, dim, heads, bm, bn, "float16", causal, batch=batch, threads=256,
                                   num_stages=stages, kv_heads=kv_heads)
    return tilecore.compile(func, target=HOPPER, out_idx=[3],
                            pass_configs={**GENERAL, "tilecore.fast_math": fast, **configs})


def windows(k) -> list:
    """For each wait for S = Q K^T (``WARPGROUP.DEPBAR.LE gsb0, 0x1``) in the main loop: ``(instructions before the
    next wait for P @ V on the path that skips every forward branch's block, a forward branch met)``."""
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    ins = sass_paths.parse(sass)
    # the mbarrier waits' retry stubs after the kernel's end (TRYWAIT; @!P BRA itself; BRA back) left out: their
    # branches back are not the loop's
    stubs = {i + d for i in range(len(ins) - 2) if "TRYWAIT" in ins[i][1] and ins[i + 1][1].startswith("@")
             and sass_paths.opcode(ins[i + 2][1]) == "BRA" and not ins[i + 2][1].startswith("@")
             and int(sass_paths._TARGET.search(ins[i + 1][1]).group(1), 16) <= ins[i][0] for d in range(3)}
    ins = [x for i, x in enumerate(ins) if i not in stubs]
    head = ins[sass_paths.main_loop(ins, 16)[0]][0]
    # every path back to the main loop's head (the unswitched iteration's two paths may each branch back)
    end = max(a for a, t in ins if sass_paths.opcode(t) == "BRA" and sass_paths._TARGET.search(t)
              and int(sass_paths._TARGET.search(t).group(1), 16) == head)
    loop = [(a, t) for a, t in ins if head <= a <= end]
    out = []
    for i, (_, t) in enumerate(loop):
        if "DEPBAR.LE gsb0, 0x1" not in t:
            continue
        n, branch, j = 0, False, i + 1
        while j < len(loop) and "DEPBAR.LE gsb0, 0x0" not in loop[j][1]:
            a, u = loop[j]
            m = sass_paths._TARGET.search(u)
            if u.startswith("@") and sass_paths.opcode(u) == "BRA" and m and int(m.group(1), 16) > a:
                branch = True
                j = next(x for x, (b, _) in enumerate(loop) if b >= int(m.group(1), 16))
                continue
            n, j = n + 1, j + 1
        out.append((n, branch))
    return out


# -- compile-only -------------------------------------------------------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("form", [dict(causal=True), dict(bn=176, **{"tilecore.cuda.descriptor_offsets": False}),
                                  dict(dim=256, bn=64, causal=True), dict(causal=True, fast=True, kv_heads=8)],
                         ids=["causal", "ragged176", "d256-causal", "gqa-fast-causal"])
def test_unswitch_puts_the_softmax_beside_p_at_v(form):
    """Default: the split mask's branch right after the wait for S, then the wait for P @ V within 50 instructions
    (before D70's default; ptxas, nvcc 13.0: 11-44 on these forms; the WGMMA register program's main loop, retired in
    D86, which had no mask: 105-192, no branch). Unswitched: two paths, neither window with a branch, the longer at
    least 70 instructions (here 81-153, 0.7x the register program's least) and both longer than the default's. (128x176 without D83's offsets of P @ V, the
    exact build's default there since: D70's kernel.)"""
    default, unswitched = fa(**form, **BEFORE), fa(**form, **UNSWITCH)
    (n_def, branch), = windows(default)
    assert branch and n_def < 50, (n_def, branch)
    got = windows(unswitched)
    assert len(got) == 2 and not any(b for _, b in got), got
    assert max(n for n, _ in got) >= 70 and min(n for n, _ in got) > n_def, (got, n_def)


@needs_toolchain
def test_unswitch_emits_the_iteration_twice_under_the_masks_condition():
    src = fa(causal=True, **UNSWITCH).get_kernel_source()
    off = fa(causal=True, **{"tilecore.pipeline_mask_unswitch": False}).get_kernel_source()
    # the steady loop's waits for P @ V: one in the iteration, two unswitched (plus the peeled iteration's and the
    # last gemm's after the loop, the same in both)
    assert src.count("tc_wg_wait<0>()") == off.count("tc_wg_wait<0>()") + 1
    assert src.count("tc_named_sync(") == off.count("tc_named_sync(") + 1
    assert fa(causal=True, **{"tilecore.pipeline_mask_unswitch": "auto"}).get_kernel_source() == src
    assert fa(causal=True).get_kernel_source() == src  # D70: "auto" by default


@needs_toolchain
def test_a_bad_unswitch_value_is_refused():
    with pytest.raises(tilecore.errors.TilecoreError, match="pipeline_mask_unswitch"):
        fa(causal=True, **{"tilecore.pipeline_mask_unswitch": "yes"})


@needs_toolchain
def test_unswitch_leaves_unmasked_forms_and_the_mask_before_the_gemm_alone():
    """No split mask (non-causal, the sequence a multiple of the block): nothing to unswitch. With D59's mask after
    the gemm off (the mask before it, in the iteration's first statements) the option does nothing either."""
    assert fa(**UNSWITCH).get_kernel_source() == fa().get_kernel_source()
    pre = {"tilecore.pipeline_mask_after_gemm": False}
    assert fa(causal=True, **pre, **UNSWITCH).get_kernel_source() == fa(causal=True, **pre).get_kernel_source()


# -- on an sm_90 GPU ------------------------------------------------------------------------------------------

def _reference(q, k, v, causal):
    import torch

    q, k, v = (x.double() for x in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return s.softmax(-1) @ v


#: (name, dim, bm, bn, kv_heads, stages); sequences of 1000 (ragged) and 1024
FORMS = [("d128", 128, 128, 128, None, 2), ("176", 128, 128, 176, None, 2), ("d64-176", 64, 128, 176, None, 2),
         ("d256", 256, 128, 64, None, 2), ("gqa3", 128, 128, 128, 1, 3)]


def _inputs(dim, kvh, seq, heads, batch, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g)
    k, v = (torch.randn(batch, kvh or heads, seq, dim, device="cuda", dtype=torch.float16, generator=g)
            for _ in range(2))
    return q, k, v


@hopper_gpu
@pytest.mark.parametrize("seq", [1000, 1024])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
def test_unswitch_gives_the_defaults_bits_and_matches_float64(form, causal, seq):
    """Exact build: the unswitched iteration (alone, with four chains of the row maximum, with descriptor offsets)
    and D70's defaults bit for bit the defaults before D70; all and the mask before the gemm against float64."""
    import torch

    _, dim, bm, bn, kvh, stages = form
    heads, batch = 3, 2
    q, k, v = _inputs(dim, kvh, seq, heads, batch, 70)
    outs = {}
    for name, extra in (("default", {}), ("before", BEFORE), ("unswitch", {**UNSWITCH, "tilecore.reduce_chains": 1}),
                        ("unswitch_c", {**UNSWITCH, **CHAINS}), ("unswitch_cd", {**UNSWITCH, **CHAINS, **DESC}),
                        ("maskpre", {"tilecore.pipeline_mask_after_gemm": False})):
        outs[name] = fa(dim, bm, bn, causal, kv_heads=kvh, stages=stages, seq=seq, heads=heads, batch=batch,
                        **extra)(q, k, v)
    torch.cuda.synchronize()
    for name in ("default", "unswitch", "unswitch_c", "unswitch_cd"):  # D70's defaults too: bit for bit before
        assert torch.equal(outs[name], outs["before"]), name
    kr, vr = (x.repeat_interleave(heads // (kvh or heads), dim=1) for x in (k, v))
    ref = _reference(q, kr, vr, causal)
    for name, out in outs.items():
        err = (out.double() - ref).abs().max().item()
        assert err < 2e-3, f"{form[0]} causal={causal} {name}: max error {err}"


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
def test_unswitch_fast_math_matches_float64(form, causal):
    import torch

    _, dim, bm, bn, kvh, stages = form
    seq, heads, batch = 1000, 3, 2
    q, k, v = _inputs(dim, kvh, seq, heads, batch, 71)
    out = fa(dim, bm, bn, causal, fast=True, kv_heads=kvh, stages=stages, seq=seq, heads=heads, batch=batch,
             **UNSWITCH, **CHAINS, **DESC)(q, k, v)
    torch.cuda.synchronize()
    kr, vr = (x.repeat_interleave(heads // (kvh or heads), dim=1) for x in (k, v))
    err = (out.double() - _reference(q, kr, vr, causal)).abs().max().item()
    assert err < 4e-3, f"{form[0]} causal={causal}: max error {err}"


@needs_toolchain
@pytest.mark.parametrize("route", ["auto", False], ids=["default", "general"])
def test_d70_defaults_change_no_catalog_kernel(route):
    """D70's defaults (the unswitched iteration, the row maximum's chains "auto") against before on every conformance
    catalog kernel of cuda:sm_90a: the same source on the default route (the golden sources') and on the general path (the catalog's FlashAttention cases are not of the forms they change: no
    split mask in a warp-specialized rotated loop, rows of fewer than 16 elements a thread)."""
    from tilecore.compiler import lower
    from tilecore.errors import TilecoreError
    from tilecore_conformance.catalog import catalog

    def text(case, extra):
        try:
            return lower(case.build(**case.params), HOPPER, {**case.pass_configs,
                                                             "tilecore.cuda.register_programs": route, **extra})[3].code
        except TilecoreError as e:
            return f"{type(e).__name__}: {e}"

    cases = catalog()
    assert len(cases) > 300
    assert sorted(c.id for c in cases if text(c, BEFORE) != text(c, {})) == []


@needs_toolchain
def test_the_default_chains_the_row_maximum_under_fast_math_only():
    """tilecore.reduce_chains "fast" (D70's default): four chains in FlashAttention's two-consumer form under fast
    math ("auto"), one chain in the exact build (its causal rows lost 2-3% with chains on the H200 and the H100);
    "auto" as D66 defined it (chains in both); a bad value names the option."""
    assert "part_c" in fa(fast=True).get_kernel_source()
    assert fa(fast=True).get_kernel_source() == fa(fast=True, **CHAINS).get_kernel_source()
    assert fa().get_kernel_source() == fa(**{"tilecore.reduce_chains": 1}).get_kernel_source()
    assert "part_c" in fa(**{"tilecore.reduce_chains": "auto"}).get_kernel_source()
    with pytest.raises(tilecore.errors.TilecoreError, match="tilecore.reduce_chains"):
        fa(**{"tilecore.reduce_chains": "slow"})
