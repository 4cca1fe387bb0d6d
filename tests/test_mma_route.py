"""sm_80's FlashAttention routed to the core's general path by form, decision D73.

On targets without wgmma (sm_80, sm_86, sm_89) the mma.sync register program leaves FlashAttention's form (two gemms,
the softmax between them, P @ V reading registers) to the general path at 128 rows or head dimension 128 (the shapes
D71 measured at 0.99-1.05x the register program), with the late copy and D55's options as the form's defaults there
(``PassContext.set_defaults``: the user's pass config wins either way); 64 rows at d64 stays on the register program.
Compile-only checks of the route, its notes and the defaults; the routed form on the host emulator against float64;
on a GPU (the sm_80 profile overlaid on the H100 / H200, D63) every row's default against float64.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_mma_general import Small, _emulate, _events, _k_loop, _path, device_attention_error, gpu  # noqa: E402

import mma_general  # noqa: E402
import tilecore  # noqa: E402
from lower_once import lower_once as lower  # noqa: E402  (D89: one lowering per distinct input)
from tilecore.errors import CompileError  # noqa: E402
from tilecore_cuda.regprog import (MMA_ATTENTION_DEFAULTS, MMA_ATTENTION_SHAPE_DEFAULTS, MMA_GENERAL_FORMS,  # noqa: E402
                                   form_defaults)

LATE = mma_general.LATE
PRUNE_FALSE = mma_general.PRUNE_FALSE
#: (kernel, head dimension) -> the path of the default route: the general path except 64 rows at d64
ROWS = {("fa", 128): "generic", ("fa_causal", 128): "generic", ("fa64", 128): "generic",
        ("fa64_causal", 128): "generic", ("fa", 64): "generic", ("fa_causal", 64): "generic",
        ("fa64", 64): "generic", ("fa64_causal", 64): "generic",  # 64x64 d64 since D79
        ("fa64", 256): "generic", ("fa64_causal", 256): "generic"}  # 64 rows at d256 since D82
#: an unmeasured shape the route leaves on the register program: 64 rows at head dimension 192
KEPT = ("fa64", 192)


def _off(name, d) -> dict:
    """Every option of the form's defaults off: D68's general path."""
    return {k: False for k in form_defaults((128 if name in ("fa", "fa_causal") else 64, d))}




def _size(d):
    class Size(Small):
        fa = (2, 2, 512, d)
    return Size


def _low(name, d, configs, target="cuda:sm_80"):
    build, own, _ = mma_general.KERNELS[name]
    return lower(build(_size(d)), target, {**NOCACHE, **own, **configs})


def _notes(low):
    return low[2].attrs.get("hopper_pipelines", ())


@pytest.mark.parametrize("target,extra", [("cuda:sm_80", {}), ("cuda:sm_90a", mma_general.BASE)])
@pytest.mark.parametrize("name,d", list(ROWS))
def test_the_route_by_form_and_its_note(name, d, target, extra):
    """The default route on sm_80 and on sm_90a with the sm_80 profile overlaid (how the device measures it): the
    general path at 128 rows or head dimension 128 and (D79) at 64 rows and d64; the note says which and why, with
    the form's defaults taken (D79's lead copy and joined group among them); an unmeasured shape (64 rows, d192)
    stays on the register program, its note saying where the route goes."""
    low = _low(name, d, extra, target)
    notes = _notes(low)
    assert _path(low[2].attrs) == ROWS[name, d], notes
    rows = 128 if name in ("fa", "fa_causal") else 64
    if ROWS[name, d] == "generic":
        note = next(n for n in notes if n.startswith("cuda.register_program: kernel not mapped"))
        assert f"its form (attention, {rows} rows, head dimension {d}) runs on the core's general path" in note
        assert "D79" in note and "the form's defaults on the general path: " + ", ".join(
            f"{k}={v!r}" for k, v in form_defaults((rows, d)).items()) in note, note
        assert ("tilecore.prune_false_comparisons=True" in note) == (rows == 128)
        assert "tilecore.pipeline_lead_copies=True" in note and "tilecore.pipeline_join_groups=True" in note
    kept = _low(*KEPT, extra, target)
    assert _path(kept[2].attrs) == "register program (mma.sync)"
    assert any("FlashAttention's form at 64 rows, head dimension 192 stays on the register program (the route takes "
               "it to the general path only at rows x head dimension 128x128, 64x128, 128x64, 64x64, 64x256" in n
               for n in _notes(kept)), _notes(kept)


@pytest.mark.parametrize("name,d", [k for k, v in ROWS.items() if v == "generic"])
def test_the_routed_kernel_is_the_measured_one(name, d):
    """The routed default's source is the row the device measured: D71's late-d55 (the general path with the late
    copy and D55's options), at 128 rows with the false comparisons folded (D73's default-false), with D79's lead
    copy (D79 round 1's default-lead row; at 64x64 d64, where V is staged, with the joined group too: the d79 row;
    elsewhere the join changes nothing); the lead copy and the join given False give D73's default back, every
    option given False D68's general path. D82: 64 rows at d256 with O's relay tile folded (the shape's own default,
    mma_general's attention-all-fold row; V then staged, so the join changes it too)."""
    default = _low(name, d, {})[3].code
    measured = "late-d55-false" if name in ("fa", "fa_causal") else "late-d55"
    shape = MMA_ATTENTION_SHAPE_DEFAULTS.get((128 if name in ("fa", "fa_causal") else 64, d), {})
    lead = {mma_general.LEAD: True, mma_general.JOIN: True}
    assert default == _low(name, d, {**mma_general.VARIANTS[measured], **lead, **shape})[3].code
    staged = name.startswith("fa64") and d in (64, 256)
    assert (_low(name, d, {mma_general.JOIN: False})[3].code == default) == (not staged)
    if d == 64 and name.startswith("fa64"):
        assert default == _low(name, d, mma_general.VARIANTS["d79"])[3].code
    if d == 256:
        assert shape and default == _low(name, d, mma_general.VARIANTS["attention-all-fold"])[3].code
    d73 = {mma_general.LEAD: False, mma_general.JOIN: False}
    assert _low(name, d, d73)[3].code == _low(name, d, {**mma_general.VARIANTS[measured], **shape})[3].code != default
    assert _low(name, d, {PRUNE_FALSE: False, **d73})[3].code == \
        _low(name, d, {**mma_general.VARIANTS["late-d55"], **shape})[3].code
    assert _low(name, d, _off(name, d))[3].code == _low(name, d, mma_general.VARIANTS["general"])[3].code != default


def test_the_users_config_wins_both_ways():
    """A value the pass config gives wins over the form's default, each option alone: the late copy off (D68's loop:
    V issued after the softmax) and "joint"; the masked iterations not split; a cast stored twice. The note names
    the options the config gave. On a shape the register program keeps the options' defaults stay the core's."""
    routed = _low("fa_causal", 128, {})
    assert _events(_k_loop(routed[3].code)) == [("wait", 0), "bar", "V", "commit", "K", "commit", "S", ("wait", 1),
                                                "bar", "O"]
    assert routed[2].attrs.get("masked_split"), routed[2].attrs.keys()
    off = _low("fa_causal", 128, {LATE: False})
    assert _events(_k_loop(off[3].code)) == [("wait", 0), "bar", "K", "commit", "S", "V", "commit", ("wait", 0),
                                             "bar", "O"]
    assert f"(given by the pass config: {LATE})" in next(n for n in _notes(off) if "not mapped" in n)
    joint = _low("fa_causal", 128, {LATE: "joint"})
    assert _events(_k_loop(joint[3].code))[7] == ("wait", 0)
    assert not _low("fa_causal", 128, {"tilecore.split_masked_iterations": False})[2].attrs.get("masked_split")
    assert _low("fa", 128, {"tilecore.store_cast_once": False})[3].code != routed[3].code
    # asked for on a kernel the route keeps on the register program: nothing set by the route
    kept = _low(*KEPT, {})
    assert _path(kept[2].attrs) == "register program (mma.sync)"
    assert _low(*KEPT, {mma_general.LEAD: True})[3].code == kept[3].code


def test_register_programs_true_and_false_keep_their_meaning():
    """True: every kernel of the form on the register program (no route, no note of it); False: every kernel on the
    general path with the core's own defaults (D68's FlashAttention: the form's defaults come with the route)."""
    for name, d in ROWS:
        forced = _low(name, d, {"tilecore.cuda.register_programs": True})
        assert _path(forced[2].attrs) == "register program (mma.sync)"
        assert not [n for n in _notes(forced) if "D73" in n], _notes(forced)
        general = _low(name, d, {"tilecore.cuda.register_programs": False})
        assert _path(general[2].attrs) == "generic"
        assert general[3].code == _low(name, d, {"tilecore.cuda.register_programs": False, **_off(name, d)})[3].code


def test_the_forms_option():
    """["gemm"]: FlashAttention stays on the register program at every shape (D63-D71's route; the note says the
    option names no attention form); ["gemm", "attention"]: every shape routed, an unmeasured one (64 rows, d192)
    with the form's defaults too; a bad value refused, naming the forms."""
    for name, d in ROWS:
        low = _low(name, d, {MMA_GENERAL_FORMS: ["gemm"]})
        assert _path(low[2].attrs) == "register program (mma.sync)"
    assert any('names neither "attention" nor "attention-measured"' in n
               for n in _notes(_low("fa", 128, {MMA_GENERAL_FORMS: ["gemm"]})))
    every = _low(*KEPT, {MMA_GENERAL_FORMS: ["gemm", "attention"]})
    assert _path(every[2].attrs) == "generic"
    assert every[3].code == _low(*KEPT, {**mma_general.VARIANTS["late-d55"], mma_general.LEAD: True,
                                         mma_general.JOIN: True})[3].code
    with pytest.raises(CompileError, match="'gemm', 'attention', 'attention-measured'"):
        _low("fa", 128, {MMA_GENERAL_FORMS: ["flash"]})
    # the GEMM form keeps D63's route, without the attention form's defaults
    build, own, _ = mma_general.KERNELS["gemm_epi"]
    low = lower(build(Small), "cuda:sm_80", {**NOCACHE, **own})
    assert _path(low[2].attrs) == "generic"
    assert not [n for n in _notes(low) if "the form's defaults" in n]


@pytest.mark.parametrize("target", ["cuda:sm_86", "cuda:sm_89"])
def test_the_route_with_less_block_memory(target):
    """sm_86 / sm_89 (99 KiB a block): since D85 the route's block-memory rule is the general path's least plan
    against the target's profile (tests/test_mma_route_sm86.py): 64x64 d128 fits and is routed with the form's
    defaults; ["gemm"] keeps it on the register program."""
    low = _low("fa64", 128, {}, target)
    assert _path(low[2].attrs) == "generic", _notes(low)
    assert any("D85" in n and "the form's defaults on the general path" in n for n in _notes(low)), _notes(low)
    low = _low("fa64", 128, {MMA_GENERAL_FORMS: ["gemm"]}, target)
    assert _path(low[2].attrs) == "register program (mma.sync)"


def test_no_route_where_the_general_path_takes_wgmma():
    """sm_90a with disable_wgmma alone (the general path would take wgmma there): the register program keeps every
    row, as before D73."""
    for name, d in ROWS:
        low = _low(name, d, {"tilecore.cuda.disable_wgmma": True}, "cuda:sm_90a")
        assert _path(low[2].attrs) == "register program (mma.sync)"


def test_the_ir_dump_says_where_the_kernel_went():
    """The IR dump (the function's attributes) carries the route's note and the planner's schedule."""
    from tilecore.ir.printer import func_str

    ir = func_str(_low("fa", 128, {})[2])
    assert "its form (attention, 128 rows, head dimension 128) runs on the core's general path" in ir
    assert "copy V_shared ; commit ; copy K_shared ; commit" in ir


def ptxas_of_both_paths(kernel, d, fast, target) -> dict:
    """``{"regprog" | "default": (registers, shared bytes)}``: ptxas's report of a benchmark kernel (``(build, pass
    configs, out_idx)`` of mma_general.py) at its b8 h32 s4096 size on the register program and on the routed default,
    each checked to take its path and to hold no stack and no spills (skips where the toolchain reports nothing)."""
    class Big(Small):
        fa = (8, 32, 4096, d)

    build, own, out_idx = kernel
    out = {}
    for var in ("regprog", "default"):
        cfg = {**NOCACHE, **own, "tilecore.fast_math": fast, **mma_general.VARIANTS[var]}
        kern = tilecore.compile(build(Big), out_idx=out_idx, target=target, pass_configs=cfg)
        rep = kern.source.meta["ptxas"]
        if rep.get("reported") is False:
            pytest.skip("this toolchain returned no ptxas report")
        assert tilecore_cuda.lowering_path(kern) == ("generic" if var == "default" else "register program (mma.sync)")
        out[var] = (rep["registers"], kern.source.meta["shared_bytes"])
        assert rep.get("stack", 0) == 0 and rep.get("spill_stores", 0) == 0, (var, rep)
    return out


@needs_toolchain
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("name,d", [k for k, v in ROWS.items() if v == "generic"])
def test_the_routed_kernels_registers(name, d, fast):
    """ptxas on sm_80 (NVRTC or nvcc) at the benchmark's size, b8 h32 s4096: each routed default holds no stack and
    no spills, in registers that leave at least the register program's blocks an SM (NVRTC 13.0, fast math, register
    program / routed default since D79: d128 232 / 237, causal 246 / 240, 64x64 168 / 168, causal 210 / 168; d64
    128x128 169 / 165, causal 176 / 167, 64x64 157 / 129, causal 159 / 138), in both builds."""
    regs = {var: r for var, (r, _) in ptxas_of_both_paths(mma_general.KERNELS[name], d, fast, "cuda:sm_80").items()}
    # D79: the lead copy holds a few more registers at 128x128 d128 (NVRTC 13.0: 237 against 232): the blocks an SM
    # the register file allows (65536 registers, a thread's rounded up to 8) are what count, at least the register
    # program's
    threads = 256 if name in ("fa", "fa_causal") else 128

    def blocks(r):
        return 65536 // (-(-r // 8) * 8 * threads)
    assert blocks(regs["default"]) >= blocks(regs["regprog"]), regs


def test_prune_false_comparisons():
    """tilecore.prune_false_comparisons (off in the core; the route's default at 128 rows): the non-causal mask's edge test ``k * bn + j >= seq``, false
    wherever the block divides the sequence, folds (its selects gone: one a score of the thread's, 64 at 128x128) and the loop keeps the
    rest; a ragged sequence keeps the test where it may hold; a bad value refused."""
    def selects(code):
        return code.count("? (-INFINITY) : 0.0f")

    assert selects(_low("fa", 128, {PRUNE_FALSE: False})[3].code) == 64
    assert selects(_low("fa", 128, {})[3].code) == 0  # the route's default at 128 rows (D73 round 1)
    assert selects(_low("fa64", 128, {})[3].code) == 32  # not at 64 rows
    assert selects(_low("fa64", 64, {MMA_GENERAL_FORMS: ["gemm", "attention"]})[3].code) == 32
    assert selects(_low("fa", 128, {PRUNE_FALSE: True})[3].code) == 0
    assert selects(_low("fa64", 64, {MMA_GENERAL_FORMS: ["gemm", "attention"], PRUNE_FALSE: True})[3].code) == 0
    build, own, _ = mma_general.KERNELS["fa"]
    ragged = lower(mma_general.flash(1, 2, 448, 128, False), "cuda:sm_80", {**NOCACHE, **own, PRUNE_FALSE: True})
    assert selects(ragged[3].code) == 32  # 448 keys: the thread's columns below 64 never reach the edge, the rest may
    with pytest.raises(CompileError, match="tilecore.prune_false_comparisons='yes': expected True or False"):
        _low("fa", 128, {PRUNE_FALSE: "yes"})


# -- D79: 64x64 d64 on the general path, the copy groups ---------------------------------------------------------

ALL = {MMA_GENERAL_FORMS: ["gemm", "attention"]}


def _prologue(code: str) -> list:
    """The copy events of the kernel body before the k loop (Q's copy as core cp.async: 'Q'; the plugin's
    whole-tile copy helper, which waits for itself: 'Qcopy')."""
    body = code.split('extern "C"')[1]
    head = body[:body.index("for (long long k = 0;")]
    out = _events(head)
    return (["Qcopy"] if "tc_copy_g2s_async<" in head else []) + out


@pytest.mark.parametrize("name", ["fa64", "fa64_causal"])
def test_d79_one_commit_group_and_the_lead_copy(name):
    """64x64 d64 on the general path with D73's defaults (the lead copy and the join given False): V staged, K and V
    committed apart, Q copied by the plugin's whole-tile helper (its own wait and barrier); tilecore.pipeline_join_groups
    issues the stage ahead's K and V under one test and commits them as one group (prologue and loop);
    tilecore.pipeline_lead_copies issues Q as the core's copy, its own group, landed by the loop's first wait
    ("grouped": its wait and barrier kept); the loop's top wait then leaves nothing pending (2 stages). Both are the
    route's defaults since D79."""
    D73 = {mma_general.JOIN: False, mma_general.LEAD: False}
    base = _low(name, 64, {**ALL, **D73})[3].code
    assert _events(_k_loop(base))[:7] == [("wait", 0), "bar", "K", "commit", "V", "commit", "S"]
    assert _prologue(base) == ["Qcopy", "bar", "K", "commit", "V", "commit"]
    join = _low(name, 64, {**ALL, mma_general.JOIN: True, mma_general.LEAD: False})
    assert _events(_k_loop(join[3].code))[:6] == [("wait", 0), "bar", "K", "V", "commit", "S"]
    assert _k_loop(join[3].code).count("if (((k + 1) < ") == 1
    assert _prologue(join[3].code) == ["Qcopy", "bar", "K", "V", "commit"]
    assert "the stage ahead's copies one commit group" in join[2].attrs["pipelines"][0]
    grouped = _low(name, 64, {**ALL, mma_general.LEAD: "grouped", mma_general.JOIN: False})[3].code
    assert _prologue(grouped) == ["Q", "commit", ("wait", 0), "bar", "K", "commit", "V", "commit"]
    lead = _low(name, 64, {**ALL, mma_general.LEAD: True, mma_general.JOIN: False})[3].code
    assert _prologue(lead) == ["Q", "commit", "K", "commit", "V", "commit"]
    assert _k_loop(lead) == _k_loop(grouped)
    both = _low(name, 64, {**ALL, mma_general.JOIN: True, mma_general.LEAD: True})[3].code
    assert _prologue(both) == ["Q", "commit", "K", "V", "commit"]
    assert both == _low(name, 64, {})[3].code  # the route's default since D79
    # neither option changes a kernel it does not apply to: the register program's, D68's general path (V staged
    # but waited for where it stands: no join)
    forced = {"tilecore.cuda.register_programs": True}
    assert _low(name, 64, {**forced, mma_general.JOIN: True, mma_general.LEAD: True})[3].code == \
        _low(name, 64, forced)[3].code
    assert _low(name, 64, {**mma_general.GENERAL, mma_general.JOIN: True})[3].code == \
        _low(name, 64, mma_general.GENERAL)[3].code
    with pytest.raises(CompileError, match="tilecore.pipeline_lead_copies='yes'"):
        _low(name, 64, {**ALL, mma_general.LEAD: "yes"})


# -- the routed form on the host emulator ----------------------------------------------------------------------

@pytest.mark.parametrize("d79", [{"tilecore.pipeline_join_groups": False, "tilecore.pipeline_lead_copies": False}, {}],
                         ids=["d73", "d79"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("per_sm", [None, 61440])
def test_the_routed_form_on_the_host_emulator_matches_float64(causal, per_sm, d79, tmp_path):
    """TileLang's forward at 64 rows, 32 keys a block, d64 (small enough for the emulator's static shared memory),
    routed by ``["gemm", "attention"]`` with the form's defaults: V staged (waited for with K at the top) and, with a
    per-SM limit through the capability overlay, unstaged (issued at the top of the iteration, one buffer); causal
    with the masked iterations split; with D79's lead copy and joined group (the defaults since D79) and without
    (D73's). The generated sm_80 source run on the host (threads concurrent, barriers real, cp.async landing at its
    wait) against float64."""
    import numpy as np

    run = _emulate()
    b, h, s, d = 1, 2, 192, 64
    f = mma_general.flash(b, h, s, d, causal, bm=64, bn=32, threads=128)
    cfg = {**NOCACHE, "tilecore.fast_math": True, MMA_GENERAL_FORMS: ["gemm", "attention"], **d79}
    if per_sm is not None:
        cfg["tilecore.capability_overlay"] = {"limits.max_shared_bytes_per_sm.value": per_sm}
    kern = tilecore.compile(f, out_idx=[3], target="cuda:sm_80", pass_configs=cfg)
    attrs = kern.meta["attrs"]
    assert _path(attrs) == "generic", attrs.get("hopper_pipelines")
    note = attrs["pipelines"][0]
    assert ("(one buffer) issued at the top" in note) == (per_sm is not None), note
    assert bool(attrs.get("masked_split")) == causal
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float16) for _ in range(3))
    out = run(kern, [q, k, v, np.zeros((b, h, s, d), np.float16)], tmp_path)[3].astype(np.float64)
    sc = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) / d ** 0.5
    if causal:
        sc = np.where(np.tril(np.ones((s, s), bool)), sc, -np.inf)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    err = np.abs(out - ref).max()
    assert err <= 2e-3, f"causal={causal} per_sm={per_sm}: max error {err}"


@pytest.mark.parametrize("s", [192, 176])
def test_prune_false_on_the_host_emulator_matches_float64(s, tmp_path):
    """The routed form with tilecore.prune_false_comparisons at 32 keys a block: 192 keys (the edge test folded) and
    176 (ragged: the test kept for the last block), non-causal, on the host emulator against float64."""
    import numpy as np

    run = _emulate()
    b, h, d = 1, 2, 64
    cfg = {**NOCACHE, "tilecore.fast_math": True, MMA_GENERAL_FORMS: ["gemm", "attention"], PRUNE_FALSE: True}
    kern = tilecore.compile(mma_general.flash(b, h, s, d, False, bm=64, bn=32, threads=128), out_idx=[3],
                            target="cuda:sm_80", pass_configs=cfg)
    assert (kern.source.code.count("? (-INFINITY)") > 0) == (s % 32 != 0)
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float16) for _ in range(3))
    out = run(kern, [q, k, v, np.zeros((b, h, s, d), np.float16)], tmp_path)[3].astype(np.float64)
    sc = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) / d ** 0.5
    p = np.exp(sc - sc.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    err = np.abs(out - ref).max()
    assert err <= 2e-3, f"{s} keys: max error {err}"


# -- on a GPU: the routed defaults against float64 -------------------------------------------------------------

@gpu
@pytest.mark.parametrize("variant", ["default", "default-false", "attention-all", "attention-all-false"])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("name,d", list(ROWS))
def test_device_routed_default_matches_float64(name, d, fast, variant):
    """Every D71 row with the plugin's defaults (the sm_80 profile overlaid), fast math and the exact build, also with
    the false comparisons folded and with every shape routed: the path the route gives and float64's numbers."""
    err, tol, kern = device_attention_error(name, d, {"tilecore.fast_math": fast, **mma_general.VARIANTS[variant]})
    assert tilecore_cuda.lowering_path(kern) == (ROWS[name, d] if variant.startswith("default") else "generic")
    assert err < tol, f"{name} d{d} fast={fast} {variant} ({tilecore_cuda.lowering_path(kern)}): max error {err}"


@gpu
@pytest.mark.parametrize("variant", ["join", "lead-grouped", "lead", "d79", "d79-narrow", "d79-fold"])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("name", ["fa64", "fa64_causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_device_d79_rows_match_float64(name, d, fast, variant):
    """D79's rows (the stage ahead one commit group, Q landed by the loop's first wait) on the device, both builds,
    d64 (V staged) and d128 (V unstaged at 64 rows: the join does not apply, the lead copy does)."""
    err, tol, kern = device_attention_error(name, d, {"tilecore.fast_math": fast, **mma_general.VARIANTS[variant]})
    assert tilecore_cuda.lowering_path(kern) == "generic"
    assert err < tol, f"{name} d{d} fast={fast} {variant}: max error {err}"


@gpu
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("name,d", list(ROWS))
def test_device_default_lead_matches_float64(name, d, fast):
    """The routed default with Q landed by the loop's first wait (D79's lead copy) on every D71 row, both builds."""
    err, tol, kern = device_attention_error(name, d, {"tilecore.fast_math": fast, **mma_general.VARIANTS["default-lead"]})
    assert tilecore_cuda.lowering_path(kern) == ROWS[name, d]
    assert err < tol, f"{name} d{d} fast={fast} default-lead: max error {err}"
