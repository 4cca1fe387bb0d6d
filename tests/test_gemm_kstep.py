"""The general path's GEMM k step (docs/decisions.md D62, issue 11 item 4): the 128x128x64/4 tile's bookkeeping.

``tilecore.pipeline_release_stages`` (core, off by default): in the thread-0 form of a pipelined loop whose gemm's
wait is deferred (bulk copies issued by one thread, no producer group), no block barrier in the loop. Every thread
releases the stage the previous iteration's gemm read on that stage's own barrier (a tile's last iteration, which
waits for every group, its own stage too), and the issuing thread alone waits for that release before refilling the
stage (``CopyBarrierWait(issuer=True)``, run on thread 0 with the copies; the CUDA emitter reconverges its warp
after it with ``__syncwarp``).

Checked here without a GPU:

- the lowered schedule, evaluated for every block, tile and k step (persistent and not, ragged, K shorter than the
  stages): each use of a stage released exactly once, after the gemm that read it finished; the issuing thread's
  wait before refilling stage ``j`` is for the barrier phase of use ``j - S``'s release, which an iteration at or
  before it performed (the first stages: the phase before a fresh barrier's first, which passes at once); the
  stage ahead's slot and coordinates as without the option; no block barrier in the loop; the barrier's count the
  block's threads. Mutations (a release dropped, the issuer waiting for the wrong phase) are caught;
- the option off leaves the source as it was (the catalog's golden sources unchanged); the CUDA source waits on
  thread 0 only and reconverges its warp;
- SASS on sm_90a (NVRTC): no BAR.SYNC in the main loop; with D59's uniform warp index and shifts the consumers'
  k step in at most the plugin's 79 instructions (nvcc 13.0: 75).

On an sm_90 GPU (skipped here): every option and combination D62 measured against float64 and bit for bit against
the default general path (4096^3 panel 8, ragged shapes, bf16, 3 and 4 stages, persistent and not).
"""
from __future__ import annotations

import re

import sys
from pathlib import Path

import pytest

import tilecore
from tilecore.ir import (Barrier, BulkCopy, CopyBarrierInit, CopyBarrierWait, For, If, KernelLaunch, MatrixSync,
                         StageRelease, as_expr, binary, collect, const_value, rewrite, simplify)
from tilecore.passes import persistent as persistent_pass

sys.path.insert(0, str(Path(__file__).parent))

from test_cuda_backend import needs_toolchain  # noqa: E402
from test_cuda_hopper import hopper_gpu  # noqa: E402
from test_general_gemm import BULK, GENERAL, _lower, _value, check_stage_ahead, gemm  # noqa: E402

REL = {"tilecore.pipeline_release_stages": True}
US = {"tilecore.cuda.uniform_warp_index": True, "tilecore.cuda.nonnegative_index_shifts": True}

CASES = {  # (M, N, K, bm, bn, bk, stages, threads, blocks (None: not persistent), swizzle)
    "3-stage": (1024, 1024, 512, 128, 256, 64, 3, 256, 7, None),
    "ragged": (1000, 1800, 1000, 128, 256, 64, 3, 256, 5, None),
    "k-shorter-than-stages": (512, 512, 128, 128, 128, 64, 4, 256, 3, None),
    "128x128x64/4 panel": (1024, 2048, 512, 128, 128, 64, 4, 256, 6, 3),
    "not persistent": (1000, 1800, 1000, 128, 128, 64, 4, 256, None, None),
}


def _lowered(case, **extra):
    M, N, K, bm, bn, bk, stages, threads, blocks, swz = CASES[case]
    cfg = {**BULK, **REL, "tilecore.persistent": blocks if blocks else False, **extra}
    return _lower(gemm(M, N, K, bm, bn, bk, stages, threads, swizzle=swz), **cfg)


def _kloop(func):
    return min((f for f in collect(func.body, For) if collect(f.body, BulkCopy) and collect(f.body, StageRelease)),
               key=lambda f: len(collect(f.body, For)))


def check_release_schedule(func, M, N, K, bm, bn, bk, stages, blocks):
    """Every block's releases and the issuing thread's waits, evaluated over every tile and k step (see the module
    docstring). ``blocks`` None: one tile a block (the launch's grid)."""
    launch = collect(func.body, KernelLaunch)[0]
    kloop = _kloop(func)
    assert not collect(kloop.body, Barrier), "a block barrier left in the loop"
    empty_inits = [i for i in collect(func.body, CopyBarrierInit) if i.barrier.name.endswith("_empty")]
    assert len(empty_inits) == 1 and empty_inits[0].count == int(launch.threads[0]), empty_inits
    empty = empty_inits[0].barrier
    body = list(kloop.body.body)
    rels = [(x.cond, x.then) for x in body if isinstance(x, If) and isinstance(x.then, StageRelease)]
    assert len(rels) == 2 and all(r.barrier is empty for _, r in rels)
    waits_all = [x.cond for x in collect(kloop.body, If) if any(m.phase == "wait" for m in collect(x.then, MatrixSync))]
    guard = next(x for x in collect(kloop.body, If) if collect(x.then, BulkCopy) and not _reads_thread(x.cond))
    issuer = [w for w in collect(guard.then, CopyBarrierWait)]
    assert len(issuer) == 1 and issuer[0].issuer and issuer[0].barrier is empty, issuer
    issuer = issuer[0]
    k_steps = -(-K // bk)
    if blocks is None:
        pid_env = [{id(v): 0 for v in launch.block_vars}]  # every block the same: one tile
        tiles, count_of = None, lambda env: 1
    else:
        tiles = next(f for f in collect(func.body, For) if f.annotations.get(persistent_pass.ANNOTATION))
        pid = launch.block_vars[0]
        pid_env = [{id(pid): p} for p in range(blocks)]
        count_of = lambda env: _value(tiles.extent, env)  # noqa: E731
    for penv in pid_env:
        count = count_of(penv)
        total = count * k_steps
        released = {}  # use -> the iteration that released it
        for i in range(count):
            for ko in range(k_steps):
                env = {**penv, id(kloop.var): ko}
                if tiles is not None:
                    env[id(tiles.var)] = i
                it = i * k_steps + ko
                full = any(_value(c, env) for c in waits_all)
                for cond, r in rels:
                    if not _value(cond, env):
                        continue
                    slot = _value(r.index, env)
                    left = [u for u in range(it + 1) if u % stages == slot and u not in released]
                    assert left, f"{penv}: stage {slot} released at {it} with no use left"
                    use = max(left)
                    assert use < it or (use == it and full), \
                        f"{penv}: use {use} released at iteration {it} while its gemm may still read it"
                    assert all(u in released for u in range(use) if u % stages == slot), \
                        f"{penv}: use {use} of stage {slot} released before an earlier use"
                    released[use] = it
                j = it + stages - 1
                if not _value(guard.cond, env):
                    assert j >= total, f"{penv}: stage {j} never issued"
                    continue
                assert j < total
                slot, parity = _value(issuer.index, env), _value(issuer.parity, env)
                assert slot == j % stages, (penv, it, slot)
                # the phase the wait is for: the (j // S - 1)-th completion of the slot's barrier (-1: the phase
                # before a fresh barrier's first, which the wait passes at once)
                assert parity == (j // stages - 1) % 2, (penv, it, parity)
                if j >= stages:
                    assert j - stages in released and released[j - stages] <= it, \
                        f"{penv}: stage {j} refilled at iteration {it} before use {j - stages} was released"
        missing = [u for u in range(total - stages) if u not in released]
        assert not missing, f"{penv}: uses {missing[:4]} never released (the issuing thread waits forever)"


def _reads_thread(e) -> bool:
    from tilecore.ir import ThreadIndex, walk_expr

    found = []
    walk_expr(e, lambda x: found.append(x) if isinstance(x, ThreadIndex) else None)
    return bool(found)


def issuing_thread(func) -> int:
    """The thread whose test holds the loop's bulk copies (checked: one such test, on one thread)."""
    tests = [x for x in collect(_kloop_any(func).body, If) if collect(x.then, BulkCopy) and _reads_thread(x.cond)]
    assert len(tests) == 1 and tests[0].cond.op == "eq", [x.cond for x in tests]
    return const_value(tests[0].cond.b)


def _kloop_any(func):
    return min((f for f in collect(func.body, For) if collect(f.body, BulkCopy) and collect(f.body, MatrixSync)),
               key=lambda f: len(collect(f.body, For)))


def _without_thread_tests(func):
    """``func`` with the loop's `if thread == c` around its stage ahead dropped (check_stage_ahead evaluates the
    copies' guard, which may then be the first test holding them)."""
    def drop(x):
        if isinstance(x, If) and _reads_thread(x.cond) and collect(x.then, BulkCopy) and x.orelse is None:
            return x.then
        return None
    return func.with_body(rewrite(func.body, drop))


@pytest.mark.parametrize("thread", [0, 224])
@pytest.mark.parametrize("case", CASES)
def test_each_stage_is_released_once_and_refilled_after_its_release(case, thread):
    """(``tilecore.pipeline_issue_thread``: the stage ahead on thread 224, the last warp's first lane, the same
    schedule)"""
    M, N, K, bm, bn, bk, stages, threads, blocks, swz = CASES[case]
    low, src = _lowered(case, **{"tilecore.pipeline_issue_thread": thread})
    check_release_schedule(low, M, N, K, bm, bn, bk, stages, blocks)
    assert issuing_thread(low) == thread
    if blocks is not None:  # the stage ahead's slot and tile as in the thread-0 form with the block barrier
        check_stage_ahead(_without_thread_tests(low), M, N, K, bm, bn, bk, stages, blocks, swz)
    note = " ".join(low.attrs["pipelines"])
    assert "released by every thread on its own barrier" in note, note


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][8] is not None])
def test_another_thread_issues_the_stage_ahead_between_the_block_barriers(case):
    """``tilecore.pipeline_issue_thread`` without the release barriers: the block barrier, then thread 224 issues
    what thread 0 issued (the same stages, slots and tiles); the prologue's stages stay on thread 0."""
    M, N, K, bm, bn, bk, stages, threads, blocks, swz = CASES[case]
    cfg = {**BULK, "tilecore.persistent": blocks}
    low0, src0 = _lower(gemm(M, N, K, bm, bn, bk, stages, threads, swizzle=swz), **cfg)
    low, src = _lower(gemm(M, N, K, bm, bn, bk, stages, threads, swizzle=swz), **cfg,
                      **{"tilecore.pipeline_issue_thread": 224})
    assert issuing_thread(low0) == 0 and issuing_thread(low) == 224
    assert collect(_kloop_any(low).body, Barrier)
    check_stage_ahead(_without_thread_tests(low), M, N, K, bm, bn, bk, stages, blocks, swz)
    pre = src.code[:src.code.index("for (long long ko")]
    assert pre == src0.code[:src0.code.index("for (long long ko")]


def test_an_issue_thread_outside_the_block_is_refused():
    with pytest.raises(tilecore.errors.CompileError, match="pipeline_issue_thread=256: expected a thread of the block"):
        _lowered("3-stage", **{"tilecore.pipeline_issue_thread": 256})


@pytest.mark.parametrize("mutation", ["the previous stage's release dropped", "the issuer waits one phase late"])
def test_mutations_of_the_release_schedule_are_caught(mutation):
    M, N, K, bm, bn, bk, stages, threads, blocks, swz = CASES["3-stage"]
    low, _ = _lowered("3-stage")
    kloop = _kloop(low)
    if mutation == "the previous stage's release dropped":
        prev = next(x for x in kloop.body.body if isinstance(x, If) and isinstance(x.then, StageRelease))
        mutated = low.with_body(rewrite(low.body, lambda x: x.with_(cond=as_expr(False))
                                        if isinstance(x, If) and x.then is prev.then else None))
    else:
        w = next(x for x in collect(kloop.body, CopyBarrierWait) if x.issuer)
        late = w.with_(parity=simplify(binary("floormod", binary("add", w.parity, 1), 2)))
        mutated = low.with_body(rewrite(low.body, lambda x: late if x is w else None))
    check_release_schedule(low, M, N, K, bm, bn, bk, stages, blocks)  # unmutated: passes
    with pytest.raises(AssertionError):
        check_release_schedule(mutated, M, N, K, bm, bn, bk, stages, blocks)


def test_the_option_off_leaves_the_source_and_the_issuer_alone_waits():
    fn = lambda: gemm(4096, 4096, 4096, 128, 128, 64, 4, 256, swizzle=8)  # noqa: E731
    _, default = _lower(fn())
    _, off = _lower(fn(), **{"tilecore.pipeline_release_stages": False})
    assert off.code == default.code
    assert "_empty" not in default.code and "__syncwarp" not in default.code
    _, on = _lower(fn(), **REL)
    code = on.code
    k = code.index("for (long long ko")
    loop = code[k:code.index("tc_wg_wait<0>(); tc_wg_fence_regs", code.index("__syncwarp", k))]
    assert "__syncthreads" not in loop and "bar.sync" not in loop
    issue = loop.index("if ((((int)threadIdx.x) == 0)) {\n")
    assert loop.index("tc_mbar_wait(tc_smem_addr(A_s_empty", issue) < loop.index("tc_mbar_expect_tx", issue)
    assert loop.count("tc_mbar_wait(") == 2  # the stage's full barrier (every thread), the release (thread 0)
    assert loop.count("tc_mbar_arrive(tc_smem_addr(A_s_empty") == 2
    assert "__syncwarp();" in loop[issue:]


def test_the_option_leaves_the_warp_specialized_form_alone():
    fn = lambda: gemm(4096, 4096, 4096, 128, 128, 64, 4, 256, swizzle=8)  # noqa: E731
    ws = {"tilecore.warp_specialize": True, "tilecore.persistent": True, **BULK}
    assert _lower(fn(), **ws, **REL)[1].code == _lower(fn(), **ws)[1].code


NO_US = {"tilecore.cuda.uniform_warp_index": False, "tilecore.cuda.nonnegative_index_shifts": False}


@pytest.mark.parametrize("tile", [(128, 128, 64, 4), (128, 256, 64, 3), (128, 256, 64, 4)])
def test_persistent_gemms_take_the_uniform_warp_index_and_the_shifts_by_default(tile):
    """D62: ``tilecore.cuda.uniform_warp_index`` / ``nonnegative_index_shifts`` "auto" (the default) also on in a
    persistent launch of wgmma gemms: the plugin's three tiles with a panel over more than one wave get the same
    source as with both asked for, and not D58's; a launch of one wave (not persistent: the catalog's) keeps D58's
    source; False still turns them off."""
    bm, bn, bk, stages = tile
    big = lambda: gemm(4096, 4096, 4096, bm, bn, bk, stages, 256, swizzle=8)  # noqa: E731
    low, src = _lower(big())
    assert low.attrs.get("persistent"), "persistent by default (a panel over more than one wave)"
    assert src.code == _lower(big(), **US)[1].code != _lower(big(), **NO_US)[1].code
    assert "tc_warp_u" in src.code and re.search(r"& \d+\)", src.code.split("__global__")[-1])  # a mask: the shifts
    one_wave = lambda: gemm(1024, 1024, 1024, bm, bn, bk, stages, 256, swizzle=8)  # noqa: E731
    low1, src1 = _lower(one_wave())
    assert not low1.attrs.get("persistent")
    assert src1.code == _lower(one_wave(), **NO_US)[1].code and "tc_warp_u" not in src1.code


@needs_toolchain
def test_sm90a_no_block_barrier_in_the_main_loop_and_the_consumers_k_step_at_the_plugins():
    """nvcc 13.0, 128x128x64/4 panel 8: the plugin's consumers 79 SASS instructions a k step; D58's general default
    96, with D59's uniform warp index and shifts (D62's default) 80, with those and the release barriers 75 (thread
    0: 148)."""
    import sass_paths
    import tilecore_cuda

    def loop_of(cfg):
        k = tilecore.compile(gemm(4096, 4096, 4096, 128, 128, 64, 4, 256, swizzle=8), target="cuda:sm_90a",
                             pass_configs={**GENERAL, **cfg})
        ins = sass_paths.parse(tilecore_cuda.CUDABackend().disassemble(k.binary, k.target))
        loop = sass_paths.main_loop(ins, 4)
        return ins, loop, sorted(sum(v for op, v in c.items() if op[0].isupper()) for _, c in sass_paths.paths(ins, loop))

    ins, loop, counts = loop_of({**US, **REL})
    assert not any(sass_paths.opcode(ins[i][1]) == "BAR" for i in loop)
    assert not any(sass_paths.opcode(ins[i][1]) == "R2UR" for i in loop[:40])  # descriptors stay uniform
    assert counts[0] <= 79, counts
    _ins, _loop, before = loop_of(NO_US)
    _ins, _loop, default = loop_of({})
    assert counts[0] < default[0] < before[0] and default[0] <= 80, (counts, default, before)


# -- on an sm_90 GPU ---------------------------------------------------------------------------------------

DEVICE = {  # (M, N, K, dtype, tile (bm, bn, bk, stages, threads), swizzle)
    "128x128/4 4096^3 panel 8": (4096, 4096, 4096, "float16", (128, 128, 64, 4, 256), 8),
    "128x128/4 ragged bf16": (1000, 1800, 1000, "bfloat16", (128, 128, 64, 4, 256), 3),
    "128x256/3 ragged": (1000, 1800, 1000, "float16", (128, 256, 64, 3, 256), None),
    "128x256/4 halves bf16": (2048, 3072, 1024, "bfloat16", (128, 256, 64, 4, 256), 8),
    "k shorter than stages": (512, 640, 128, "float16", (128, 128, 64, 4, 256), 2),
}
WS = {"tilecore.warp_specialize": True, "tilecore.persistent": True, **BULK}
DOFF = {"tilecore.cuda.descriptor_offsets": True}
VARIANTS = {
    "d58 (us off)": NO_US,
    "release": REL,
    "us": US,
    "us+release": {**US, **REL},
    "us+release+doff": {**US, **REL, **DOFF},
    "release, not persistent": {**REL, "tilecore.persistent": False},
    "us+release, thread 224": {**US, **REL, "tilecore.pipeline_issue_thread": 224},
    "thread 224": {"tilecore.pipeline_issue_thread": 224},
    "ws+us": {**WS, **US},
    "ws+us+doff": {**WS, **US, **DOFF},
}


@hopper_gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", DEVICE)
def test_device_each_option_matches_float64_and_the_default_bit_for_bit(case, variant):
    import torch

    M, N, K, dtype, (bm, bn, bk, stages, threads), swz = DEVICE[case]
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(7)
    a = (torch.randn(M, K, device="cuda", generator=g) / 8).to(tdt)
    b = (torch.randn(K, N, device="cuda", generator=g) / 8).to(tdt)
    out = []
    for cfg in ({}, VARIANTS[variant]):
        k = tilecore.compile(gemm(M, N, K, bm, bn, bk, stages, threads, dtype, swizzle=swz), target="cuda",
                             pass_configs={**GENERAL, **cfg})
        c = torch.full((M, N), float("nan"), device="cuda", dtype=tdt)
        k(a, b, c)
        k(a, b, c)  # twice: barriers' phases from a fresh launch each time
        torch.cuda.synchronize()
        out.append((k, c))
    (_k0, c0), (k1, c1) = out
    ref = a.double() @ b.double()
    assert not torch.isnan(c1).any()
    assert float((c1.double() - ref).abs().max()) < 3e-2 * max(1.0, float(ref.abs().max()) / 8), k1.meta["attrs"]
    assert torch.equal(c0, c1), k1.meta["attrs"]


# -- the plain GEMM routed to the general path by default (D62) ----------------------------------------------------

ROUTE_NOTE = "left to the core's general path"


def _route_notes(fn, cfg):
    _b, _t, low, _src, _o = tilecore.compiler.lower(fn, target="cuda:sm_90a",
                                                    pass_configs={"tilecore.disable_cache": True, **cfg})
    return " ".join(low.attrs.get("hopper_pipelines", ())), low


AUTO = {"tilecore.cuda.general_plain_gemm": "auto"}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_plain_16_bit_gemm_is_routed_by_default_and_kept_with_false(dtype):
    """D62's rule ("auto") routes the plain 16-bit GEMM, and it is the default again since D65 (the eleventh session's
    addendum had turned it off: the cold compile doubled); False keeps the plugin's pipeline."""
    fn = lambda: gemm(4096, 4096, 4096, 128, 128, 64, 4, 256, dtype, swizzle=8)  # noqa: E731
    for cfg in ({}, AUTO):
        notes, low = _route_notes(fn(), cfg)
        assert ROUTE_NOTE in notes and low.attrs.get("persistent") and low.attrs.get("bulk_store"), notes
    notes, low = _route_notes(fn(), {"tilecore.cuda.general_plain_gemm": False})
    assert ROUTE_NOTE not in notes and "cuda.hopper_gemm_pipeline: 128x128x64" in notes, notes


@pytest.mark.parametrize("opt", ["tilecore.cuda.persistent", "tilecore.cuda.tma_store", "tilecore.cuda.stream_k",
                                 "tilecore.cuda.stage_release", "tilecore.cuda.cluster_multicast"])
def test_a_gemm_asking_for_the_pipelines_own_options_keeps_the_pipeline(opt):
    """Under "auto", the routing leaves the GEMM to the plugin's pipeline where one of its own options is asked for (they
    mean nothing on the general path); asked for explicitly, the routing wins."""
    value = {"tilecore.cuda.stage_release": "thread", "tilecore.cuda.cluster_multicast": "off"}.get(opt, False)
    fn = lambda: gemm(4096, 4096, 4096, 128, 256, 64, 3, 256, swizzle=8)  # noqa: E731
    notes, low = _route_notes(fn(), {opt: value, **AUTO})
    assert ROUTE_NOTE not in notes and "cuda.hopper_gemm_pipeline: 128x256x64" in notes, notes
    notes, _low = _route_notes(fn(), {opt: value, "tilecore.cuda.general_plain_gemm": True})
    assert ROUTE_NOTE in notes, notes


@pytest.mark.parametrize("dtype", ["float8_e4m3", "float8_e5m2"])
def test_an_8_bit_gemm_is_routed_under_auto_and_by_default(dtype):
    """D67: with wgmma's 8-bit unit on the general path (B as (N, K) by TMA and descriptor), "auto" routes the 8-bit
    GEMM too, and since D72 so does the unset default; "auto" with one of the pipeline's own options keeps it on the
    plugin's pipeline, as does False."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    from cuda_gemm import matmul

    fn = lambda: matmul(1024, 1024, 1024, 128, 256, 128, 256, 3, 8, dtype=dtype, out_dtype="float16",  # noqa: E731
                        b_transposed=True)
    for cfg in (AUTO, {}):
        notes, low = _route_notes(fn(), cfg)
        assert ROUTE_NOTE in notes and low.attrs["fragment_layouts"]["C_local"].startswith("wgmma_m64n256k32"), notes
    for cfg in ({"tilecore.cuda.general_plain_gemm": False}, {**AUTO, "tilecore.cuda.tma_store": False}):
        notes, _low = _route_notes(fn(), cfg)
        assert ROUTE_NOTE not in notes and "cuda.hopper_gemm_pipeline: 128x256x128" in notes, notes
    notes, _low = _route_notes(fn(), {"tilecore.cuda.general_plain_gemm": True})
    assert ROUTE_NOTE in notes, notes
