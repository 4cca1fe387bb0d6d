"""FlashAttention's general path at the register program's bookkeeping (decision D66).

- ``tilecore.cuda.descriptor_offsets``: ``tc_wg_desc_at`` is one 64-bit add (UIADD3.64, the register programs'
  descriptor stepping), not a mask and an or of the low word (ptxas rebuilt the high word, a UMOV an HGMMA);
- ``tilecore.cuda.narrow_loop_counters``: a loop whose start and end are 32-bit values counts on 32 bits, its
  variable a 64-bit copy (the same values in the body);
- ``tilecore.reduce_chains`` (core): a fragment's per-thread row max / min / absmax as interleaved partial chains
  and a tree of their results (FMNMX depth 35 -> 12 at 128x128); the same results (max and min do not round).

Compile-only checks wherever a CUDA compiler exists (CI): source and SASS of the main loop (tests/sass_paths.py);
the row reductions bit for bit on the host emulator (signed zeros, NaN, infinities). On an sm_90 GPU: each option
and all together against float64 and bit for bit the defaults (exact build), fast math against float64, on the
benchmark's forms (d128 128x128 / 128x176, d64, d256 128x64, grouped-query), causal and not, ragged sequences.
"""
from __future__ import annotations

import collections
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
import sass_paths  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import GENERAL, HOPPER, hopper_gpu  # noqa: E402

import tilecore  # noqa: E402
import tilecore.language as T  # noqa: E402
from tilecore_conformance.composite import flash_attention_forward  # noqa: E402

#: D89: the general path through the run's kernel cache (private to the run, shared by its xdist workers, keyed by the
#: IR, options and the core's and plugin's code): a kernel that several tests (or test_cuda_general_attention) read
#: compiles once; nothing here monkeypatches the compiler
GENERAL = {k: v for k, v in GENERAL.items() if k != "tilecore.disable_cache"}

DESC = {"tilecore.cuda.descriptor_offsets": True}
NARROW = {"tilecore.cuda.narrow_loop_counters": True}
CHAINS = {"tilecore.reduce_chains": 4}
D66 = {**DESC, **NARROW, **CHAINS}
NODESC = {"tilecore.cuda.descriptor_offsets": False}
FIT = {"tilecore.cuda.descriptor_offsets": "fit"}  # D74: where the carried fragments fit (S + O + P <= 176 words)
OPTIONS = {"desc": DESC, "nodesc": NODESC, "narrow": NARROW, "chains": CHAINS, "d66": D66, "fit": FIT}
ONE_CHAIN = {"tilecore.reduce_chains": 1}  # one chain: the default before D70 ("auto" since)


def fa(dim=128, bm=128, bn=128, causal=False, fast=False, kv_heads=None, stages=2, seq=4096, heads=32, batch=8,
       **configs):
    func = flash_attention_forward(seq, dim, heads, bm, bn, "float16", causal, batch=batch, threads=256,
                                   num_stages=stages, kv_heads=kv_heads)
    return tilecore.compile(func, target=HOPPER, out_idx=[3],
                            pass_configs={**GENERAL, "tilecore.fast_math": fast, **configs})


def _loop(k) -> tuple:
    """(the main loop's fewest-instruction path, as an opcode Counter; the SASS text)."""
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    ins = sass_paths.parse(sass)
    paths = [c for _, c in sass_paths.paths(ins, sass_paths.main_loop(ins, 16))]
    return min(paths, key=lambda c: sum(v for n, v in c.items() if n[0].isupper())), sass


def _uniform(c) -> int:
    return sum(v for n, v in c.items() if n.startswith("U") and n != "UTMALDG")


def _ops(k) -> collections.Counter:
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    return collections.Counter(sass_paths.opcode(t) for _, t in sass_paths.parse(sass))


# -- compile-only -------------------------------------------------------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("fast", [False, True])
def test_descriptor_offsets_step_descriptors_by_one_add(fast):
    """With descriptor offsets the main loop's uniform bookkeeping is under two thirds of the bookkeeping without them
    (128x128: 50 against 103; the WGMMA register program, retired in D86, had 45), the high word not rebuilt per HGMMA (UMOV: 7, 16
    before D66's add); the helper is a 64-bit add."""
    on, off = fa(fast=fast, **DESC), fa(fast=fast)
    assert "return d + (unsigned long long)(long long)(off >> 4);" in on.get_kernel_source()
    (c_on, _), (c_off, _) = _loop(on), _loop(off)
    assert 3 * _uniform(c_on) < 2 * _uniform(c_off), (_uniform(c_on), _uniform(c_off))
    assert c_on["UMOV"] <= 8, c_on["UMOV"]
    assert c_on["HGMMA"] == c_off["HGMMA"] == 16
    assert _ops(on)["LDL"] + _ops(on)["STL"] == 0


@needs_toolchain
@pytest.mark.parametrize("causal", [False, True])
def test_narrow_loop_counters_count_on_32_bits(causal):
    """The rotated loop (start 1, end 32 or the causal ``loop``, an int) counts with an int, its variable a long long
    copy; no 64-bit compare or carry in the main loop (UISETP...EX, UIADD3.X); off by default."""
    on, off = fa(causal=causal, **DESC, **NARROW), fa(causal=causal, **DESC)
    src, src_off = on.get_kernel_source(), off.get_kernel_source()
    end = "loop" if causal else "32"
    assert f"for (int k_n = 1; k_n < {end}; ++k_n) {{" in src and "const long long k = k_n;" in src
    assert f"for (long long k = 1; k < {end}; ++k) {{" in src_off and "k_n" not in src_off
    (c_on, sass), (c_off, sass_off) = _loop(on), _loop(off)
    assert c_on["UIADD3"] + c_on["UISETP"] < c_off["UIADD3"] + c_off["UISETP"], (c_on, c_off)
    assert fa(causal=causal, **DESC, **{"tilecore.cuda.narrow_loop_counters": "auto"}).get_kernel_source() == src
    assert fa(causal=causal, **DESC, **{"tilecore.cuda.narrow_loop_counters": False}).get_kernel_source() == src_off


@needs_toolchain
def test_narrow_loop_counters_auto_leaves_a_gemm_alone():
    from test_general_gemm import gemm

    func = gemm(512, 512, 256)
    plain = tilecore.compile(func, target=HOPPER, pass_configs=GENERAL).get_kernel_source()
    assert tilecore.compile(func, target=HOPPER, pass_configs={
        **GENERAL, "tilecore.cuda.narrow_loop_counters": "auto"}).get_kernel_source() == plain
    forced = tilecore.compile(func, target=HOPPER, pass_configs={**GENERAL, **NARROW}).get_kernel_source()
    assert "_n = " in forced and forced != plain


@needs_toolchain
@pytest.mark.parametrize("fast", [False, True])
def test_reduce_chains_shorten_the_row_maximum(fast):
    """Four partial chains and a tree: the main loop's FMNMX dependency depth 35 -> at most 13 (the register
    program's), no more FMNMX than one chain; the row sum (it rounds) untouched: the same FADD count."""
    on, off = fa(fast=fast, **CHAINS), fa(fast=fast, **ONE_CHAIN)
    (c_on, s_on), (c_off, s_off) = _loop(on), _loop(off)
    assert sass_paths.chain_depth(s_on) <= 13 < sass_paths.chain_depth(s_off)
    assert c_on["FMNMX"] <= c_off["FMNMX"] and c_on["FADD"] == c_off["FADD"]
    src = on.get_kernel_source()
    assert "part_c" in src and "part_c" not in off.get_kernel_source()
    assert not any("part_c" in line and " + " in line for line in src.splitlines())  # no sum in chains


@needs_toolchain
def test_auto_takes_flash_attentions_form_only():
    """"auto" of descriptor offsets, narrow counters and chains: FlashAttention's two-consumer form as asked for; a
    general-path GEMM and the catalog's softmax (a row maximum of 16-element rows a thread... not that form) as off."""
    from test_general_gemm import gemm
    from tilecore_conformance.composite import softmax

    auto = {"tilecore.cuda.descriptor_offsets": "auto", "tilecore.cuda.narrow_loop_counters": "auto",
            "tilecore.reduce_chains": "auto"}
    # descriptor offsets' "auto" (the default since D66's round 3) takes d256 (16 k steps in Q K^T), not d128 (8)
    assert fa(**auto).get_kernel_source() == fa(**NARROW, **CHAINS).get_kernel_source()
    assert fa(**auto).get_kernel_source() != fa(**D66).get_kernel_source()
    assert fa(256, 128, 64, **auto).get_kernel_source() == fa(256, 128, 64, **D66).get_kernel_source()
    for func in (gemm(512, 512, 256), softmax("float32", rows=256, cols=2048, br=4)):
        plain = tilecore.compile(func, target=HOPPER, pass_configs=GENERAL).get_kernel_source()
        assert tilecore.compile(func, target=HOPPER, pass_configs={**GENERAL, **auto}).get_kernel_source() == plain
    forced = tilecore.compile(softmax("float32", rows=256, cols=2048, br=4), target=HOPPER,
                              pass_configs={**GENERAL, **CHAINS}).get_kernel_source()
    assert "part_c" in forced


@needs_toolchain
def test_the_two_consumer_form_stages_v_regardless_of_occupancy():
    """D66: d64 at 128x176 (V staged: one block an SM instead of two) is staged, specialized and rotated by default
    (tilecore.pipeline_stage_late "auto"); D61's rule ("occupancy") left V unstaged, the loop unrotated, no producer
    warpgroup; one consumer warpgroup (64x64 at d128) keeps D61's rule."""
    on, off = fa(64, 128, 176), fa(64, 128, 176, **{"tilecore.pipeline_stage_late": "occupancy"})
    p_on, p_off = on.meta["attrs"]["pipelines"][0], off.meta["attrs"]["pipelines"][0]
    assert "2 tiles x 2 buffers" in p_on and "1 tiles x 2 buffers" in p_off and "would leave 1 resident" in p_off
    assert "setmaxnreg" in on.get_kernel_source() and "setmaxnreg" not in off.get_kernel_source()
    assert _ops(on)["LDL"] + _ops(on)["STL"] == 0
    one = flash_attention_forward(4096, 128, 32, 64, 64, "float16", False, batch=8, threads=128)
    a, b = (tilecore.compile(one, target=HOPPER, out_idx=[3], pass_configs={**GENERAL, **x}).get_kernel_source()
            for x in ({}, {"tilecore.pipeline_stage_late": "occupancy"}))
    assert a == b


@needs_toolchain
@pytest.mark.parametrize("causal", [False, True])
def test_descriptor_offsets_are_the_default_at_d256_only(causal):
    """D66 round 3: descriptor offsets by default in FlashAttention's form where a wgmma k loop has 16 steps (d256's
    Q K^T); d128 and d64 (8 and 4 steps) as before; fewer uniform instructions at d256 than without them."""
    d66 = {"tilecore.pipeline_mask_unswitch": False}  # D66's form (D70's unswitched iteration: two paths)
    d256, off = fa(256, 128, 64, causal, **d66), fa(256, 128, 64, causal, **NODESC, **d66)
    assert "tc_wg_desc_at" in d256.get_kernel_source() and "tc_wg_desc_at" not in off.get_kernel_source()
    assert _uniform(_loop(d256)[0]) < _uniform(_loop(off)[0]) - 40
    for dim in (128, 64):
        assert "tc_wg_desc_at" not in fa(dim, 128, 128, causal).get_kernel_source()


@needs_toolchain
@pytest.mark.parametrize("form", [dict(causal=True), dict(causal=True, fast=True, kv_heads=8), dict(dim=64, bn=176),
                                  dict(dim=256, bn=64, causal=True)], ids=["d128-causal", "gqa-fast-causal", "d64-176", "d256-causal"])
def test_fit_puts_descriptor_offsets_where_the_carried_fragments_fit(form):
    """D74: "fit" takes descriptor offsets in FlashAttention's form where S + O + P are at most 176 words a thread
    (d128 128x128: 160, d64 128x176: 164, d256 128x64: 176), D70's unswitched iteration included: no spill, and
    fewer uniform instructions on the main loop's fewest-instruction path (the iteration without the mask; d128
    causal: 86 against "auto"'s 106, the register program's 52: ptxas steps P @ V's descriptors there as a 32-bit add,
    its carry and a move of the high word, not UIADD3.64)."""
    fit, auto = fa(**form, **FIT), fa(**form)
    assert "tc_wg_desc_at(" in fit.get_kernel_source()
    assert _ops(fit)["LDL"] + _ops(fit)["STL"] == 0  # no spill (the SASS: NVRTC's ptxas report may be absent)
    if form.get("dim", 128) == 256:  # "auto"'s kernel there (16 k steps): the same source
        assert fit.get_kernel_source() == auto.get_kernel_source()
    elif not form.get("fast"):  # (fast math's loop has too many branches to count paths)
        assert "tc_wg_desc_at(" not in auto.get_kernel_source()
        u_fit, u_auto = (_uniform(_loop(k)[0]) for k in (fit, auto))
        assert u_fit <= u_auto - 16, (u_fit, u_auto)


@needs_toolchain
@pytest.mark.parametrize("causal", [False, True])
def test_fit_leaves_the_196_word_form_without_offsets(causal):
    """d128 128x176 (S 88 + O 64 + P 44 = 196 words a thread, ragged at 4096 rows so unswitched): "fit" keeps "auto"'s
    kernel; with the offsets asked for (True) ptxas 13.0 spills there when causal (36 / 52 bytes a thread), the reason
    for the bound."""
    # (D83: the exact build's default there, "auto", takes P @ V's descriptors as offsets; "fit" takes none)
    # D87's rescale in ping-pong's turn ("auto" at this form's exact build) pinned off: it moves O's rescale and with
    # it ptxas's spills under the offsets (none with it); this test is about D83's bound, measured without it
    off = {"tilecore.pipeline_scale_in_turn": False}
    fit, auto, on = (fa(bn=176, causal=causal, **FIT, **off), fa(bn=176, causal=causal, **NODESC, **off),
                     fa(bn=176, causal=causal, **DESC, **off))
    assert fit.get_kernel_source() == auto.get_kernel_source()
    assert "tc_wg_desc_at(" not in fit.get_kernel_source()
    # spills read from the SASS (local loads and stores): on the GPU hosts NVRTC returns ptxas's report for a
    # program's first compile only (compiler.ptxas_report)
    assert _ops(auto)["STL"] + _ops(auto)["LDL"] == 0
    # causal (the mask's iteration and the diagonal): ptxas 13.0 spills with the offsets; ragged alone: it does not
    # (a bound on the fragments does not see that: "fit" leaves the offsets off on both)
    assert (_ops(on)["STL"] > 0) == causal


@needs_toolchain
def test_fit_leaves_kernels_without_register_operands_alone():
    """A GEMM (no gemm reads registers) compiles the same under "fit" as under "auto"; a bad value is refused."""
    from tilecore_conformance.catalog import catalog

    case = next(c for c in catalog() if c.id.startswith("gemm/") and "float16" in c.id)
    src = [tilecore.compile(case.build(**case.params), target=HOPPER,
                            pass_configs={**case.pass_configs, **NOCACHE, **x}).get_kernel_source() for x in ({}, FIT)]
    assert src[0] == src[1]
    with pytest.raises(tilecore.errors.TilecoreError, match="descriptor_offsets"):
        fa(**{"tilecore.cuda.descriptor_offsets": "yes"})


def test_a_bad_reduce_chains_value_is_refused():
    with pytest.raises(tilecore.errors.TilecoreError, match="tilecore.reduce_chains"):
        fa(**{"tilecore.reduce_chains": 0})


def _row_reduce(rows, cols, br, threads):
    @T.prim_func
    def k(X: T.Tensor((rows, cols), "float32"), Y: T.Tensor((rows, 3), "float32")):
        with T.Kernel(rows // br, threads=threads) as bx:
            x = T.alloc_fragment((br, cols), "float32")
            mx = T.alloc_fragment((br,), "float32")
            mn = T.alloc_fragment((br,), "float32")
            ab = T.alloc_fragment((br,), "float32")
            T.copy(X[bx * br, 0], x)
            T.reduce_max(x, mx, dim=1)
            T.reduce_min(x, mn, dim=1)
            T.reduce_absmax(x, ab, dim=1)
            for i in T.Parallel(br):
                Y[bx * br + i, 0] = mx[i]
                Y[bx * br + i, 1] = mn[i]
                Y[bx * br + i, 2] = ab[i]
    return k


@needs_toolchain
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")
@pytest.mark.parametrize("chains", [2, 3, 4])
def test_reduce_chains_give_the_same_bits_on_the_host(chains):
    """Row max / min / absmax of 512-element rows (16 elements of a row a thread) on sm_80's general path (the core's fragment lowering), run by the
    host emulator: bit for bit one chain and numpy, with rows of signed zeros, a NaN, infinities."""
    from cuda_host_emulator import run_on_host

    rows, cols = 32, 512
    rng = np.random.default_rng(5)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[1] = 0.0
    x[1, ::3] = -0.0
    x[2] = -0.0
    x[3, 17] = np.nan
    x[4, 5], x[4, 400] = np.inf, -np.inf
    x[5] = -np.inf
    outs = []
    for c in (chains, 1):
        k = tilecore.compile(_row_reduce(rows, cols, 16, 128), target="cuda:sm_80",
                             pass_configs={**GENERAL, "tilecore.reduce_chains": c})
        assert ("part_c" in k.get_kernel_source()) == (c != 1)
        outs.append(run_on_host(k, [x.copy(), np.full((rows, 3), 7.0, np.float32)])[1])
    assert outs[0].tobytes() == outs[1].tobytes()
    ok = ~np.isnan(x).any(1)
    np.testing.assert_array_equal(outs[0][ok, 0], x[ok].max(1))
    np.testing.assert_array_equal(outs[0][ok, 1], x[ok].min(1))
    np.testing.assert_array_equal(outs[0][ok, 2], np.abs(x[ok]).max(1))
    assert np.isnan(outs[0][3, :2]).all()


# -- on an sm_90 GPU ------------------------------------------------------------------------------------------

def _reference(q, k, v, causal):
    """softmax(q k^T / sqrt(d)) v in float64 on the tensors' device (a single K / V head broadcasts over Q's)."""
    from tilelang_corpus._driver import attention_ref

    return attention_ref(q, k, v, causal)


#: (name, dim, bm, bn, kv_heads, stages): the benchmark's forms, a ragged sequence of 1000
FORMS = [("d128", 128, 128, 128, None, 2), ("176", 128, 128, 176, None, 2), ("d64", 64, 128, 128, None, 2),
         ("d64-176", 64, 128, 176, None, 2),
         ("d256", 256, 128, 64, None, 2), ("gqa3", 128, 128, 128, 1, 3)]


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
def test_d66_options_give_the_defaults_bits_and_match_float64(form, causal):
    """Exact build: each D66 option and all three bit for bit the defaults (they change bookkeeping and the order of
    a max), and against float64."""
    import torch

    _, dim, bm, bn, kvh, stages = form
    seq, heads, batch = 1000, 3, 2
    g = torch.Generator(device="cuda").manual_seed(66)
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g)
    k, v = (torch.randn(batch, kvh or heads, seq, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    outs = {}
    for name, extra in [("default", {})] + list(OPTIONS.items()):
        kern = fa(dim, bm, bn, causal, kv_heads=kvh, stages=stages, seq=seq, heads=heads, batch=batch, **extra)
        outs[name] = kern(q, k, v)
    torch.cuda.synchronize()
    for name in OPTIONS:
        assert torch.equal(outs[name], outs["default"]), name
    kr, vr = (x.repeat_interleave(heads // (kvh or heads), dim=1) for x in (k, v))
    err = (outs["d66"].double() - _reference(q, kr, vr, causal)).abs().max().item()
    assert err < 2e-3, f"{form[0]} causal={causal}: max error {err}"


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("pingpong", [True, False], ids=["pp", "nopp"])
def test_d66_fast_math_matches_float64(form, causal, pingpong):
    """Fast math with all three options (and without ping-pong's turns: the benchmark's d66_nopp) against float64."""
    import torch

    _, dim, bm, bn, kvh, stages = form
    seq, heads, batch = 1000, 3, 2
    g = torch.Generator(device="cuda").manual_seed(67)
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g)
    k, v = (torch.randn(batch, kvh or heads, seq, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    extra = {} if pingpong else {"tilecore.pingpong": False}
    out = fa(dim, bm, bn, causal, fast=True, kv_heads=kvh, stages=stages, seq=seq, heads=heads, batch=batch,
             **D66, **extra)(q, k, v)
    torch.cuda.synchronize()
    kr, vr = (x.repeat_interleave(heads // (kvh or heads), dim=1) for x in (k, v))
    err = (out.double() - _reference(q, kr, vr, causal)).abs().max().item()
    assert err < 4e-3, f"{form[0]} causal={causal}: max error {err}"


@needs_toolchain
@pytest.mark.parametrize("route", [False], ids=["general"])
def test_auto_changes_no_catalog_kernel(route):
    """D66's options as "auto" against their defaults on every conformance catalog kernel of cuda:sm_90a: on the
    general path (D86: the only one for FlashAttention there) only the two catalog attention cases of
    FlashAttention's two-consumer form (warpgroup_tile) change."""
    from tilecore.compiler import lower
    from tilecore.errors import TilecoreError
    from tilecore_conformance.catalog import catalog

    auto = {"tilecore.cuda.descriptor_offsets": "auto", "tilecore.cuda.narrow_loop_counters": "auto",
            "tilecore.reduce_chains": "auto"}

    def text(case, extra):
        try:
            return lower(case.build(**case.params), HOPPER, {**case.pass_configs,
                                                             "tilecore.cuda.register_programs": route, **extra})[3].code
        except TilecoreError as e:
            return f"{type(e).__name__}: {e}"

    cases = catalog()
    assert len(cases) > 300
    differ = sorted(c.id for c in cases if text(c, auto) != text(c, {}))
    if route:  # D66's defaults (staging rule, descriptor offsets' auto) against before: no golden source changes
        before = {"tilecore.pipeline_stage_late": "occupancy", "tilecore.cuda.descriptor_offsets": False}
        assert [c.id for c in cases if text(c, before) != text(c, {})] == []
    # on the general path the catalog's two FlashAttention cases of the two-consumer form take them (by design)
    assert differ == ([] if route else ["attention/causal/float16/warpgroup_tile", "attention/full/float16/warpgroup_tile"])

