"""FlashAttention's general path: the masked iterations in a loop of their own (decision D74).

``tilecore.pipeline_mask_unswitch="loops"`` (core, pipeline.py): where D70 unswitched the rotated, warp-specialized
iteration on its split mask's condition ``k < E`` (both copies in one loop body), the iterations run as two loops,
``[start + 1, min(E, end))`` without the mask and ``[max(E, start + 1), end)`` with it: each loop body one straight
run, as the register program's two loops. With D70's one loop, ptxas 13.0 stepped the unmasked copy's descriptors in
3-4 uniform instructions each (a 32-bit add, its carry, moves of the high word) where the register program uses one
``UIADD3.64``: d128 causal 128x128 with descriptor offsets, 86 uniform instructions an iteration against 52; with the
two loops 52.

``tilecore.cuda.descriptor_offsets="fit"`` (CUDA plugin, the same decision): descriptor offsets in kernels with a
gemm reading registers wherever the gemms' carried fragments (S, O, P) are at most 176 32-bit words a thread.

``tilecore.cuda.descriptor_offsets="registers"`` (D83): the offsets only for a gemm reading its A from registers
(FlashAttention's P @ V: V's descriptors, rebuilt by 4-5 dependent uniform instructions each between the HGMMAs inside
ping-pong's turn otherwise; d128 128x176 the form it was made for, where offsets everywhere spill in the causal one
loop).

Compile-only checks wherever a CUDA compiler exists; on an sm_90 GPU the two loops and D83's offsets bit for bit D70's
defaults and against float64, causal and ragged, exact and fast math.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
import sass_paths  # noqa: E402
from test_cuda_backend import needs_toolchain  # noqa: E402
from test_cuda_hopper import hopper_gpu  # noqa: E402
# the forms, inputs and float64 reference of D70's device tests: the same kernels, the two loops against them
from test_cuda_fa_unswitch import FORMS, _inputs, _reference  # noqa: E402

import tilecore  # noqa: E402
from tilecore_conformance.composite import flash_attention_forward  # noqa: E402

HOPPER = "cuda:sm_90a"
#: D89: through the run's kernel cache (private to the run, shared by its xdist workers, keyed by the IR, options and
#: the core's and plugin's code): a kernel that several tests read compiles once; nothing here monkeypatches the compiler
GENERAL = {"tilecore.cuda.register_programs": False}
LOOPS = {"tilecore.pipeline_mask_unswitch": "loops"}
D70 = {"tilecore.pipeline_mask_unswitch": True}  # D70's one loop (the default's form in d128 / d64's exact build)
FIT = {"tilecore.cuda.descriptor_offsets": "fit"}
DESC = {"tilecore.cuda.descriptor_offsets": True}
REGS = {"tilecore.cuda.descriptor_offsets": "registers"}  # D83: offsets for P @ V's descriptors only
REUSE = {"tilecore.bulk_store_reuse": True}  # D83: O staged in Q's tile, dead after the loop
NODESC = {"tilecore.cuda.descriptor_offsets": False}


def fa(dim=128, bm=128, bn=128, causal=False, fast=False, kv_heads=None, stages=2, seq=4096, heads=32, batch=8,
       **configs):
    func = flash_attention_forward(seq, dim, heads, bm, bn, "float16", causal, batch=batch, threads=256,
                                   num_stages=stages, kv_heads=kv_heads)
    return tilecore.compile(func, target=HOPPER, out_idx=[3],
                            pass_configs={**GENERAL, "tilecore.fast_math": fast, **configs})


def _sass(k):
    return tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)


def _main_loop(k):
    """(instructions, uniform instructions but UTMALDG) of the main loop's paths (the shortest loop of 16 HGMMA or
    more: the unmasked iterations' loop under "loops")."""
    ins = sass_paths.parse(_sass(k))
    out = []
    for _, c in sass_paths.paths(ins, sass_paths.main_loop(ins, 16)):
        out.append((sum(c.values()), sum(v for n, v in c.items() if n.startswith("U") and n != "UTMALDG")))
    return out


def _spills(k) -> int:
    """Local loads and stores in the SASS (spills; on the GPU hosts NVRTC returns ptxas's report for a program's
    first compile only)."""
    return sum(sass_paths.opcode(t) in ("LDL", "STL") for _, t in sass_paths.parse(_sass(k)))


# -- compile-only -------------------------------------------------------------------------------------------

@needs_toolchain
def test_loops_split_the_iterations_on_the_masks_condition():
    """Causal 128x128: two loops after the peeled iteration, the second starting where the first stops (max(E, 1)),
    each with one wait for P @ V and one turn; the loop variable of the second a fresh one."""
    src = fa(causal=True, **LOOPS).get_kernel_source()
    d70 = fa(causal=True, **D70).get_kernel_source()
    assert "for (long long k = 1; k < " in src and "for (long long k_1 = tc_max(" in src
    # the same number of waits for P @ V and turns as D70's unswitched iteration (its two copies in one loop)
    assert src.count("tc_wg_wait<0>()") == d70.count("tc_wg_wait<0>()")
    assert src.count("tc_named_sync(") == d70.count("tc_named_sync(")
    # the stage and parity of the second loop's variable as shifts (its start max(E, 1) is at least 1)
    assert "tc_smem_addr(K_s_full + ((k_1 & 1))), ((k_1 >> 1) & 1))" in src


@needs_toolchain
@pytest.mark.parametrize("form", [dict(causal=True), dict(dim=256, bn=64, causal=True), dict(bn=176, causal=True),
                                  dict(bn=176)], ids=["d128-causal", "d256-causal", "176-causal", "176-ragged"])
def test_loops_give_the_unmasked_loop_the_register_programs_bookkeeping(form):
    """With descriptor offsets ("fit", True at 128x176), the unmasked iterations' loop: one path, its uniform
    instructions within 6 of the WGMMA register program's, measured before D86 retired it (d128 causal 52 / 52,
    128x176 54 / 56, d256 60 / 56: U_RP; D70's one loop, causal, 86, 95, 89 on its unmasked path)."""
    desc = DESC if form.get("bn") == 176 else FIT
    loops = fa(**form, **LOOPS, **desc)
    (n, u), = _main_loop(loops)
    u_rp = 56 if form.get("bn") == 176 or form.get("dim") == 256 else 52
    assert u <= u_rp + 6, (n, u, u_rp)
    if form.get("causal"):  # the unmasked path of D70's unswitched loop (the shorter; ragged alone: ptxas did well)
        d70 = min(_main_loop(fa(**form, **desc, **D70)))
        assert d70[1] >= u + 20, (d70, u)


@needs_toolchain
@pytest.mark.parametrize("form", [dict(causal=True), dict(causal=True, fast=True, kv_heads=8), dict(dim=64, bn=176),
                                  dict(dim=256, bn=64, causal=True, fast=True)],
                         ids=["d128-causal", "gqa-fast-causal", "d64-176", "d256-fast-causal"])
def test_loops_with_fit_do_not_spill(form):
    k = fa(**form, **LOOPS, **FIT)
    assert "tc_wg_desc_at(" in k.get_kernel_source() and _spills(k) == 0


@needs_toolchain
def test_loops_leave_forms_without_a_split_mask_alone():
    """Non-causal at a multiple of the block: no mask, the same source; the mask before the gemm: as "auto"."""
    assert fa(**LOOPS).get_kernel_source() == fa().get_kernel_source()
    pre = {"tilecore.pipeline_mask_after_gemm": False}
    assert fa(causal=True, **pre, **LOOPS).get_kernel_source() == fa(causal=True, **pre).get_kernel_source()


@needs_toolchain
@pytest.mark.parametrize("form,loops", [(dict(causal=True), False), (dict(causal=True, fast=True), True),
                                        (dict(causal=True, fast=True, kv_heads=8), True),
                                        (dict(dim=256, bn=64, causal=True), True), (dict(bn=176, causal=True), True),
                                        (dict(dim=64, causal=True), False)],
                         ids=["d128-exact", "d128-fast", "gqa-fast", "d256-exact", "176-exact", "d64-exact"])
def test_auto_takes_two_loops_under_fast_math_and_at_d256(form, loops):
    """The default ("auto"): the two loops under fast math, where O holds 128 elements a thread (d256) and (D83) where
    S holds 88 or more beside an O of 64 or more (d128 at 128x176), D70's one loop in the exact build below that
    (measured: d128 exact causal 128x128 -1.4 to -2.7% with two loops; d64 at 128x176, O 32, not measured)."""
    src = fa(**form).get_kernel_source()
    assert src == fa(**form, **{"tilecore.pipeline_mask_unswitch": "auto"}).get_kernel_source()
    assert src == fa(**form, **(LOOPS if loops else D70)).get_kernel_source()
    assert src != fa(**form, **(D70 if loops else LOOPS)).get_kernel_source()


@needs_toolchain
def test_a_bad_unswitch_value_names_loops():
    with pytest.raises(tilecore.errors.TilecoreError, match="\"loops\""):
        fa(causal=True, **{"tilecore.pipeline_mask_unswitch": "loop"})


def _turn_cycles(k) -> int:
    """ptxas's planned cycles of ping-pong's turn (BAR.SYNC to BAR.ARV: where a consumer warpgroup issues its gemms
    while the other one waits) in the main loop, the longest where D70's one loop holds two copies (the unmasked
    one's)."""
    sass = _sass(k)
    ins = sass_paths.parse(sass)
    ctrl = {int(m.group(1), 16): int(m.group(3), 16) for m in sass_paths._CONTROL.finditer(sass)}
    best = None
    loop = sass_paths.main_loop(ins, 16)
    starts = [i for i in loop if sass_paths.opcode(ins[i][1]) == "BAR" and ".SYNC" in ins[i][1]]
    for a in starts:
        cycles = 0
        for i in loop[loop.index(a):]:
            if sass_paths.opcode(ins[i][1]) == "BAR" and ".ARV" in ins[i][1]:
                break
            cycles += (ctrl.get(ins[i][0], 0) >> 41) & 0xF
        best = cycles if best is None else max(best, cycles)
    return best


@needs_toolchain
def test_registers_offsets_only_p_at_vs_descriptors():
    """D83: "registers" steps the descriptors of the gemm reading registers (P @ V's V: 11 k steps at 128x176) as
    offsets, not Q K^T's (offsets everywhere: True); a kernel without such a gemm as "auto"; the exact build's default
    at 128x176 is "registers" with the two loops (D83)."""
    regs, desc, off = (fa(bn=176, **x).get_kernel_source() for x in (REGS, DESC, NODESC))
    assert "tc_wg_desc_at(" not in off
    assert fa(bn=176).get_kernel_source() == fa(bn=176, **LOOPS, **REGS).get_kernel_source()  # D83's default
    n_regs, n_desc = regs.count("tc_wg_desc_at("), desc.count("tc_wg_desc_at(")
    assert 0 < n_regs < n_desc, (n_regs, n_desc)
    from test_cuda_hopper import gemm

    g = gemm(1024, 1024, 1024)
    plain = [tilecore.compile(g, target=HOPPER, pass_configs={**GENERAL, **x}).get_kernel_source()
             for x in ({}, REGS)]
    assert plain[0] == plain[1]


@needs_toolchain
@pytest.mark.parametrize("form", [dict(bn=176), dict(bn=176, causal=True), dict(bn=176, fast=True)],
                         ids=["176-ragged", "176-causal", "176-fast"])
def test_registers_offsets_shorten_the_turn_at_128x176(form):
    """d128 128x176 with the two loops and "registers" (D83's default in the exact build): no spill (offsets
    everywhere spill in the causal form), the unmasked loop's uniform instructions 30 or more below D77's kernel's
    (77 against 117-120 with NVRTC 13.0; the
    register program 50-56) and ping-pong's turn planned at least 50 cycles shorter (343 / 329 against 409 / 433
    non-causal / causal; the register program 312)."""
    # D77's kernel (the default before D83): no offsets, D70's one loop in the exact build (the two loops under fast
    # math)
    k, base = fa(**form, **LOOPS, **REGS), fa(**form, **NODESC, **({} if form.get("fast") else D70))
    assert _spills(k) == 0
    (n, u), = _main_loop(k)
    u_base = min(_main_loop(base))[1]
    assert u <= u_base - 30, (u, u_base)
    assert _turn_cycles(k) <= _turn_cycles(base) - 50, (_turn_cycles(k), _turn_cycles(base))


@needs_toolchain
def test_a_bad_descriptor_offsets_value_names_registers():
    with pytest.raises(tilecore.errors.TilecoreError, match="\"registers\""):
        fa(bn=176, **{"tilecore.cuda.descriptor_offsets": "register"})


@needs_toolchain
@pytest.mark.parametrize("bn", [176, 128])
def test_reuse_stages_o_in_qs_tile(bn):
    """D83: tilecore.bulk_store_reuse puts O's staging tile over Q's (written once before the loop, not named after
    it; ``Allocate.reuses``): no memory of its own (16 KiB less shared memory at 128x176, where O's own tile went in
    two halves; 32 KiB less at 128x128), the whole tile in one store behind three barriers of the consumers instead of
    five at 128x176, and no barrier added anywhere else (a barrier of both consumer warpgroups inside ping-pong's
    turns would deadlock them: Q stays a tile only bulk copies write); the note says so."""
    import re

    k, base = fa(bn=bn, **REUSE), fa(bn=bn)
    src, note = k.get_kernel_source(), k.meta["attrs"]["bulk_store"]
    assert any("over Q_s" in n and "tilecore.bulk_store_reuse" in n for n in note), note
    at = {name: re.search(rf"\b{name} = \(__half\*\)\(tc_smem \+ (\d+)\)", src).group(1) for name in ("Q_s", "acc_o_st")}
    assert at["Q_s"] == at["acc_o_st"], at
    saved = base.source.meta["shared_bytes"] - k.source.meta["shared_bytes"]
    assert saved == (16384 if bn == 176 else 32768), saved
    tail, base_tail = (x[x.rindex("tc_div_fast(acc_o[63]"):] for x in (src, base.get_kernel_source()))
    assert tail.count("tc_tma_store_4d(") == 2 and tail.count("bar.sync") == 3, tail.count("bar.sync")
    assert base_tail.count("bar.sync") == (5 if bn == 176 else 3)
    body, base_body = (x[:x.rindex("tc_div_fast(acc_o[63]")] for x in (src, base.get_kernel_source()))
    assert body.count("bar.sync") == base_body.count("bar.sync") and "tc_wg_fence_proxy" not in body.split("for (long long k = 1")[1]
    assert _spills(k) == 0


@needs_toolchain
def test_reuse_auto_only_where_the_whole_tile_would_not_fit():
    """"auto": over Q's tile at 128x176 (O's own tile would go in halves), its own tile at 128x128 (it fits whole)."""
    auto = {"tilecore.bulk_store_reuse": "auto"}
    assert fa(bn=176, **auto).get_kernel_source() == fa(bn=176, **REUSE).get_kernel_source()
    assert fa(bn=128, **auto).get_kernel_source() == fa(bn=128).get_kernel_source()


@needs_toolchain
def test_reuse_leaves_tiles_written_in_the_loop_or_read_after_it():
    """The GEMM's tiles are written in the loop: its own staging tile, the same source as without the option; a bad
    value is refused naming the option."""
    from test_cuda_hopper import gemm

    g = gemm(1024, 1024, 1024)
    plain = [tilecore.compile(g, target=HOPPER, pass_configs={**GENERAL, **x}).get_kernel_source()
             for x in ({}, REUSE)]
    assert plain[0] == plain[1]
    with pytest.raises(tilecore.errors.TilecoreError, match="tilecore.bulk_store_reuse"):
        fa(bn=176, **{"tilecore.bulk_store_reuse": "maybe"})


# -- on an sm_90 GPU ------------------------------------------------------------------------------------------

@hopper_gpu
@pytest.mark.parametrize("seq", [1000, 1024, 300])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
def test_loops_give_the_defaults_bits_and_match_float64(form, causal, seq):
    """Exact build: the two loops (alone, with fit, with offsets everywhere, with D83's offsets of P @ V), D83's
    offsets in D70's one loop and D83's O staged in Q's tile bit for bit D70's defaults (the same statements in the same order on every iteration),
    and against float64; sequences ragged and whole, and short
    (300: the unmasked loop empty for every block of a causal row)."""
    import torch

    _, dim, bm, bn, kvh, stages = form
    heads, batch = 3, 2
    q, k, v = _inputs(dim, kvh, seq, heads, batch, 74)
    outs = {}
    for name, extra in (("default", {}), ("loops", LOOPS), ("loops_fit", {**LOOPS, **FIT}),
                        ("loops_desc", {**LOOPS, **DESC}), ("regs", REGS), ("loops_regs", {**LOOPS, **REGS}),
                        ("reuse", REUSE)):
        outs[name] = fa(dim, bm, bn, causal, kv_heads=kvh, stages=stages, seq=seq, heads=heads, batch=batch,
                        **extra)(q, k, v)
    torch.cuda.synchronize()
    for name in ("loops", "loops_fit", "loops_desc", "regs", "loops_regs", "reuse"):
        assert torch.equal(outs[name], outs["default"]), name
    kr, vr = (x.repeat_interleave(heads // (kvh or heads), dim=1) for x in (k, v))
    err = (outs["loops"].double() - _reference(q, kr, vr, causal)).abs().max().item()
    assert err < 2e-3, f"{form[0]} causal={causal}: max error {err}"


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("pingpong", [True, False], ids=["pp", "nopp"])
def test_loops_fast_math_matches_float64(form, causal, pingpong):
    import torch

    _, dim, bm, bn, kvh, stages = form
    seq, heads, batch = 1000, 3, 2
    q, k, v = _inputs(dim, kvh, seq, heads, batch, 75)
    extra = {} if pingpong else {"tilecore.pingpong": False}
    out = fa(dim, bm, bn, causal, fast=True, kv_heads=kvh, stages=stages, seq=seq, heads=heads, batch=batch,
             **LOOPS, **FIT, **extra)(q, k, v)
    torch.cuda.synchronize()
    kr, vr = (x.repeat_interleave(heads // (kvh or heads), dim=1) for x in (k, v))
    err = (out.double() - _reference(q, kr, vr, causal)).abs().max().item()
    assert err < 4e-3, f"{form[0]} causal={causal}: max error {err}"
