"""The core's general path catches the Hopper pipeline's schedule on GEMM (docs/decisions.md D46, issue 11 item 4).

- ``tilecore.warp_specialize`` together with ``tilecore.persistent``: the producer group walks the block's tiles
  itself (one running count of stages over every tile) and runs ahead into the next tile's stages; the
  consumers' waits and releases use the same count, so their barriers carry across tiles;
- ``tilecore.bulk_store``: the epilogue's copy of a register fragment to a global tile goes through a shared tile
  in a paneled layout and one asynchronous bulk store per panel, its wait placed before the shared tile is
  written again (under the persistent loop: while the next tile's main loop runs).

Checked through ``tilecore.compile`` / ``tilecore.compiler.lower``:

- the schedule in the lowered IR, evaluated for every block and stage: the producer issues stage ``j`` of the
  block's tiles into the slot and barrier phase the consumers wait on at tile ``j / K``, iteration ``j % K``, with
  the block indices that tile binds; mutations (the next tile's copies addressed with this tile's block indices,
  the producer's loop one tile short) are caught;
- the CUDA spelling on sm_90a through NVRTC: SASS with HGMMA, UTMALDG (and UTMASTG with the bulk store),
  setmaxnreg, no local-memory spills;
- on an sm_90 GPU (skipped here): against float64 and bit for bit against the plain general path, 4096^3,
  ragged, bf16.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tilecore
from tilecore.ir import (BulkCopy, CopyBarrierWait, For, Specialized, Bind, as_expr, collect, const_value,
                         simplify, walk)
from tilecore.passes import persistent as persistent_pass
from tilecore.passes.pipeline import substitute

sys.path.insert(0, str(Path(__file__).parent))

from test_cuda_backend import needs_toolchain  # noqa: E402
from test_cuda_hopper import gemm as hopper_gemm, hopper_gpu  # noqa: E402
from test_persistent import _eval  # noqa: E402

GENERAL = {"tilecore.disable_cache": True, "tilecore.cuda.register_programs": False,
           "tilecore.matrix_unit_families": ["wgmma"]}
WS = {"tilecore.warp_specialize": True}


def gemm(M, N, K, bm=128, bn=256, bk=64, stages=3, threads=256, dtype="float16", out=None, swizzle=None):
    """test_cuda_hopper's TileLang GEMM in this file's argument order (C in ``dtype`` unless ``out``)."""
    return hopper_gemm(M, N, K, bm, bn, bk, threads, stages, dtype, out or dtype, panel=swizzle or 0)


def _value(e, env: dict):
    """``e`` evaluated with the variables of ``env`` (``id(var) -> int``)."""
    v = const_value(simplify(substitute(as_expr(e), {k: as_expr(x) for k, x in env.items()})))
    if v is None:  # a select (a ragged T.use_swizzle panel's rows, D56), which simplify leaves as it is
        v = _eval(simplify(substitute(as_expr(e), {k: as_expr(x) for k, x in env.items()})), {})
    assert isinstance(v, int), e
    return v


def _schedule(func):
    """(the launch, the producer's stage loop, its bulk copies, the consumers' tile loop, k loop, full wait)."""
    spec = collect(func.body, Specialized)
    assert len(spec) == 1, "no producer group"
    spec = spec[0]
    stage = next(f for f in collect(spec.producer, For))
    copies = collect(stage, BulkCopy)
    tiles = next(f for f in collect(spec.consumer, For) if f.annotations.get(persistent_pass.ANNOTATION))
    kloop = next(f for f in collect(tiles.body, For) if collect(f.body, CopyBarrierWait) and f is not tiles
                 and any(w.barrier is copies[0].barrier for w in collect(f.body, CopyBarrierWait)))
    wait = next(w for w in collect(kloop.body, CopyBarrierWait) if w.barrier is copies[0].barrier)
    return spec, stage, copies, tiles, kloop, wait


def check_schedule(func, M, N, K, bm, bn, bk, stages, blocks, grid_order=None):
    """Every block's producer issues stage j (its slot, the barrier phase, A's and B's coordinates) exactly as the
    consumers of tile j / K, iteration j % K wait for and read it, over every stage of every tile."""
    from tilecore.ir import KernelLaunch

    launch = collect(func.body, KernelLaunch)[0]
    pid = launch.block_vars[0]
    _spec, stage, copies, tiles, kloop, wait = _schedule(func)
    gx, gy = -(-N // bn), -(-M // bm)
    k_steps = -(-K // bk)
    binds = [b for b in (tiles.body.body if hasattr(tiles.body, "body") else [tiles.body]) if isinstance(b, Bind)]
    seen = set()
    for p in range(blocks):
        count = _value(tiles.extent, {id(pid): p})
        assert _value(stage.extent, {id(pid): p}) == count * k_steps, "the producer runs every stage of the block's tiles"
        for i in range(count):
            env = {id(pid): p, id(tiles.var): i}
            for b in binds:
                env[id(b.var)] = _value(b.value, env)
            bx, by = env[id(binds[1].var)], env[id(binds[2].var)]
            assert (bx, by) not in seen and 0 <= bx < gx and 0 <= by < gy
            seen.add((bx, by))
            for ko in range(k_steps):
                j = i * k_steps + ko
                cenv = {**env, id(kloop.var): ko}
                slot, parity = _value(wait.index, cenv), _value(wait.parity, cenv)
                penv = {id(pid): p, id(stage.var): j}
                assert (slot, parity) == (j % stages, (j // stages) % 2)
                for c in copies:
                    assert _value(c.index, penv) == slot and _value(c.dst_indices[0], penv) == slot
                    got = tuple(_value(e, penv) for e in c.starts)
                    want = (by * bm, ko * bk) if c.src.name == "A" else (ko * bk, bx * bn)
                    assert got == want, (c.src.name, p, i, ko, got, want)
    assert len(seen) == gx * gy, "every tile once"


def _lower(fn, **cfg):
    _b, _t, low, src, _o = tilecore.compiler.lower(fn, target="cuda:sm_90a", pass_configs={**GENERAL, **cfg})
    return low, src


# -- the producer group walks the tiles ---------------------------------------------------------------------

SCHEDULES = {  # (M, N, K, bm, bn, bk, stages, threads, blocks, swizzle)
    "3-stage": (1024, 1024, 512, 128, 256, 64, 3, 256, 7, None),
    "ragged": (1000, 1800, 1000, 128, 256, 64, 3, 256, 5, None),
    "k-shorter-than-stages": (512, 512, 128, 128, 128, 64, 4, 256, 3, None),  # 2 k-steps, 4 stages
    "use_swizzle": (1024, 2048, 256, 128, 128, 64, 4, 128, 6, 3),
}


@pytest.mark.parametrize("case", SCHEDULES)
def test_the_producer_walks_the_tiles_and_the_consumers_barriers_carry_across_them(case):
    M, N, K, bm, bn, bk, stages, threads, blocks, swz = SCHEDULES[case]
    low, src = _lower(gemm(M, N, K, bm, bn, bk, stages, threads, swizzle=swz), **WS, **{"tilecore.persistent": blocks})
    notes = low.attrs["pipelines"][0]
    assert "warp-specialized" in notes and "the producer walks the block's tiles" in notes, notes
    assert low.attrs["persistent"][0].startswith(f"persistent: {blocks} blocks"), low.attrs["persistent"]
    check_schedule(low, M, N, K, bm, bn, bk, stages, blocks)


def check_stage_ahead(func, M, N, K, bm, bn, bk, stages, blocks, swz=None):
    """The non-specialized carried form (thread 0 issues the stage ahead between the block's barriers), evaluated
    in the lowered IR for every block, tile and k step: k step ``ko`` of tile ``i`` issues the block's stage
    ``it + S - 1`` (``it = i K + ko``) into slot ``(it + S - 1) % S`` with A's and B's coordinates of the tile
    ``(it + S - 1) / K`` of the block and its iteration ``(it + S - 1) % K``, and nothing past the block's last stage
    (D36; D56's ``per_tile`` indices: bound once per tile before the k loop, selected in each step)."""
    from tilecore.ir import If, KernelLaunch

    launch = collect(func.body, KernelLaunch)[0]
    pid = launch.block_vars[0]
    tiles = next(f for f in collect(func.body, For) if f.annotations.get(persistent_pass.ANNOTATION))
    kloop = next(f for f in collect(tiles.body, For) if collect(f.body, BulkCopy) and f is not tiles)
    guard = next(x for x in collect(kloop.body, If) if collect(x.then, BulkCopy))
    copies = collect(guard.then, BulkCopy)
    binds = [b for b in tiles.body.body if isinstance(b, Bind)]
    walk_ = persistent_pass.tile_indices
    gx, gy = -(-N // bn), -(-M // bm)
    k_steps = -(-K // bk)
    for p in range(blocks):
        count = _value(tiles.extent, {id(pid): p})
        order = [tuple(_eval(e, {}) for e in walk_(as_expr(p + i * blocks), [gx, gy], swz and (swz, "row")))
                 for i in range(count)]
        for i in range(count):
            env = {id(pid): p, id(tiles.var): i}
            for b in binds:
                env[id(b.var)] = _value(b.value, env)
            for ko in range(k_steps):
                cenv = {**env, id(kloop.var): ko}
                it = i * k_steps + ko + stages - 1
                live = bool(_value(guard.cond, cenv))
                assert live == (it < count * k_steps), (p, i, ko)
                if not live:
                    continue
                bx, by = order[it // k_steps]
                kk = it % k_steps
                for c in copies:
                    assert _value(c.index, cenv) == it % stages
                    got = tuple(_value(e, cenv) for e in c.starts)
                    want = (by * bm, kk * bk) if c.src.name == "A" else (kk * bk, bx * bn)
                    assert got == want, (c.src.name, p, i, ko, got, want)


@pytest.mark.parametrize("indices", ["per_step", "per_tile"])
@pytest.mark.parametrize("case", SCHEDULES)
def test_thread_zero_issues_each_stage_ahead_of_the_right_tile(case, indices):
    M, N, K, bm, bn, bk, stages, threads, blocks, swz = SCHEDULES[case]
    low, src = _lower(gemm(M, N, K, bm, bn, bk, stages, threads, swizzle=swz), **BULK,
                      **{"tilecore.persistent": blocks, "tilecore.persistent_next_indices": indices})
    check_stage_ahead(low, M, N, K, bm, bn, bk, stages, blocks, swz)
    hoisted = "_next = " in src.code
    assert hoisted == (indices == "per_tile" and stages - 1 <= -(-K // bk)), src.code.count("_next")


def test_mutation_the_next_tile_indices_of_this_tile_are_caught(monkeypatch):
    orig = persistent_pass.TileWalk.at

    def broken(self, i_expr):
        return orig(self, self.i)  # the next tile's indices bound as this tile's

    monkeypatch.setattr(persistent_pass.TileWalk, "at", broken)
    M, N, K, bm, bn, bk, stages, threads, blocks, swz = SCHEDULES["3-stage"]
    low, _ = _lower(gemm(M, N, K, bm, bn, bk, stages, threads), **BULK,
                    **{"tilecore.persistent": blocks, "tilecore.persistent_next_indices": "per_tile"})
    with pytest.raises(AssertionError, match=r"^\('[AB]'"):
        check_stage_ahead(low, M, N, K, bm, bn, bk, stages, blocks)


def check_releases(func, blocks, k_steps, stages):
    """The consumers' stage releases, evaluated for every block, tile and k step: each use ``u`` of a stage (the
    block's running count) is released exactly once, after it was read: at a later iteration (one gemm group left
    in flight: ``u``'s has finished), or at ``u`` itself only where that iteration waits for every group (a tile's
    last). The producer refills stage ``j`` after use ``j - stages``'s release, so every use the block's stages
    reuse is released. Returns the uses released at their own iteration (D56: each tile's last)."""
    from tilecore.ir import If, KernelLaunch, MatrixSync, StageRelease

    pid = collect(func.body, KernelLaunch)[0].block_vars[0]
    _spec, _stage, _copies, tiles, kloop, wait = _schedule(func)
    body = list(kloop.body.body) if hasattr(kloop.body, "body") else [kloop.body]
    rels = [(x.cond, x.then) for x in body if isinstance(x, If) and isinstance(x.then, StageRelease)] + \
        [(as_expr(True), x) for x in body if isinstance(x, StageRelease)]
    waits_all = [x.cond for x in collect(kloop.body, If)
                 if any(m.phase == "wait" for m in collect(x.then, MatrixSync))]
    assert rels and waits_all
    own = []
    for p in range(blocks):
        count = _value(tiles.extent, {id(pid): p})
        released = {}  # use -> the iteration that released it
        for i in range(count):
            for ko in range(k_steps):
                env = {id(pid): p, id(tiles.var): i, id(kloop.var): ko}
                it = i * k_steps + ko
                full = any(_value(c, env) for c in waits_all)
                for cond, r in rels:
                    if not _value(cond, env):
                        continue
                    slot = _value(r.index, env)
                    # the use of `slot` it releases: the latest use at or before `it` not yet released
                    use = max(u for u in range(it + 1) if u % stages == slot and u not in released) \
                        if any(u % stages == slot and u not in released for u in range(it + 1)) else None
                    assert use is not None, f"block {p}: stage {slot} released at {it} with no use left"
                    assert use < it or (use == it and full), \
                        f"block {p}: use {use} released at iteration {it} while its gemm may still read it"
                    assert all(u in released for u in range(use) if u % stages == slot), \
                        f"block {p}: use {use} of stage {slot} released before an earlier use"
                    released[use] = it
                    own += [use] if use == it else []
        total = count * k_steps
        missing = [u for u in range(total - stages) if u not in released]
        assert not missing, f"block {p}: uses {missing[:4]} never released (the producer waits forever)"
    return own


@pytest.mark.parametrize("release_last", [True, False])
@pytest.mark.parametrize("case", SCHEDULES)
def test_each_stage_use_is_released_once_after_it_was_read(case, release_last):
    """D56: by default a tile's last stage is released in the tile's last iteration (after its wait for every
    gemm group), so the producer refills it under the epilogue; ``tilecore.release_last_stage=False`` keeps
    D46's release in the next tile's first iteration. Both release every use once, after it was read."""
    M, N, K, bm, bn, bk, stages, threads, blocks, swz = SCHEDULES[case]
    low, _ = _lower(gemm(M, N, K, bm, bn, bk, stages, threads, swizzle=swz), **WS,
                    **{"tilecore.persistent": blocks, "tilecore.release_last_stage": release_last})
    k_steps = -(-K // bk)
    own = check_releases(low, blocks, k_steps, stages)
    assert bool(own) == release_last and all(u % k_steps == k_steps - 1 for u in own), own


@pytest.mark.parametrize("mutation", ["every stage at its own iteration", "the first iteration releases again"])
def test_mutations_of_the_stage_releases_are_caught(mutation):
    from tilecore.ir import If, StageRelease, rewrite

    M, N, K, bm, bn, bk, stages, threads, blocks, swz = SCHEDULES["3-stage"]
    low, _ = _lower(gemm(M, N, K, bm, bn, bk, stages, threads), **WS, **{"tilecore.persistent": blocks})
    _spec, _stage, _copies, _tiles, kloop, _wait = _schedule(low)
    ifs = [x for x in kloop.body.body if isinstance(x, If) and isinstance(x.then, StageRelease)]
    prev, cur = ifs
    if mutation == "every stage at its own iteration":
        target, new = cur, cur.with_(cond=as_expr(True))
    else:
        target, new = prev, prev.with_(cond=as_expr(True))
    mutated = low.with_body(rewrite(low.body, lambda x: new if isinstance(x, If) and x.then is target.then else None))
    check_releases(low, blocks, -(-K // bk), stages)  # unmutated: passes
    with pytest.raises(AssertionError):
        check_releases(mutated, blocks, -(-K // bk), stages)


def test_mutation_the_next_tile_addressed_as_this_tile_is_caught(monkeypatch):
    orig = persistent_pass.TileWalk.at

    def broken(self, i_expr):
        return orig(self, as_expr(0))  # every stage with the block's first tile

    monkeypatch.setattr(persistent_pass.TileWalk, "at", broken)
    M, N, K, bm, bn, bk, stages, threads, blocks, swz = SCHEDULES["3-stage"]
    low, _ = _lower(gemm(M, N, K, bm, bn, bk, stages, threads), **WS, **{"tilecore.persistent": blocks})
    with pytest.raises(AssertionError):
        check_schedule(low, M, N, K, bm, bn, bk, stages, blocks)


def test_mutation_a_producer_one_tile_short_is_caught():
    M, N, K, bm, bn, bk, stages, threads, blocks, swz = SCHEDULES["3-stage"]
    low, _ = _lower(gemm(M, N, K, bm, bn, bk, stages, threads), **WS, **{"tilecore.persistent": blocks})
    spec = collect(low.body, Specialized)[0]
    stage = collect(spec.producer, For)[0]
    from tilecore.ir import binary, rewrite

    short = stage.with_(extent=simplify(binary("sub", stage.extent, 8)))  # one tile (8 k-steps) short
    mutated = low.with_body(rewrite(low.body, lambda x: short if isinstance(x, For) and x.var is stage.var else None))
    check_schedule(low, M, N, K, bm, bn, bk, stages, blocks)  # unmutated: passes
    with pytest.raises(AssertionError, match="every stage"):
        check_schedule(mutated, M, N, K, bm, bn, bk, stages, blocks)


def test_resident_blocks_count_the_producer_group():
    """With the producer group the block has 384 threads: the resident-block estimate counts them (1 block of
    128x256 a multiprocessor: its 168 registers x 384 threads), and the launch is the profile's 132 SMs."""
    low, src = _lower(gemm(4096, 4096, 4096), **WS, **{"tilecore.persistent": True})
    assert low.attrs["persistent"][0].startswith("persistent: 132 blocks over 512 tiles"), low.attrs["persistent"]
    assert src.meta["threads"] == 384


@needs_toolchain
@pytest.mark.parametrize("stages", [3, 4])
def test_sm90a_specialized_persistent_gemm_compiles_without_spills(stages):
    import tilecore_cuda

    bn = 256 if stages == 3 else 128
    k = tilecore.compile(gemm(4096, 4096, 4096, 128, bn, 64, stages), target="cuda:sm_90a",
                         pass_configs={**GENERAL, **WS, "tilecore.persistent": True})
    code = k.source.code
    assert "setmaxnreg.dec" in code and "setmaxnreg.inc" in code
    assert code.count("tc_mbar_init(tc_smem_addr") == 2  # the full and empty barriers, once before the producer forks
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "HGMMA" in sass and "UTMALDG" in sass and "SYNCS" in sass and "USETMAXREG" in sass
    assert "STL" not in sass and "LDL" not in sass


# -- the epilogue as one bulk store -------------------------------------------------------------------------

BULK = {"tilecore.bulk_store": True}
NOBULK = {"tilecore.bulk_store": False}  # the general path before D51's default
COMBOS = {"bulk": {**BULK, "tilecore.persistent": False}, "persistent+bulk": {**BULK, "tilecore.persistent": 7},
          "ws+persistent+bulk": {**BULK, **WS, "tilecore.persistent": 7}}


def _persistent(cfg) -> bool:
    return cfg.get("tilecore.persistent", None) not in (None, False)


def epilogue_events(func) -> list:
    """The lowered kernel's statements that make the bulk store's protocol, in program order: ``wait-read`` /
    ``wait-done`` (a BulkStoreWait, ``@0`` when only thread 0 runs it), ``barrier``, ``write`` (a per-thread
    program storing into the store's shared tile), ``fence``, ``store`` (``@0``), ``tile-loop`` / ``end-loop``
    around the persistent tile loop."""
    from tilecore.ir import (Barrier, BulkFence, BulkStore, BulkStoreWait, If, PerThread, Store, ThreadIndex)

    tiles = {id(b.src) for b in collect(func.body, BulkStore)}
    out: list = []

    def thread0(path):
        return any(isinstance(p, If) and isinstance(p.cond.a, ThreadIndex) and const_value(p.cond.b) == 0
                   for p in path if hasattr(p, "cond") and hasattr(p.cond, "a"))

    def visit(x, path):
        if isinstance(x, BulkStoreWait):
            out.append(("wait-read" if x.read else "wait-done") + ("@0" if thread0(path) else ""))
        elif isinstance(x, Barrier):
            out.append("barrier")
        elif isinstance(x, BulkFence):
            out.append("fence")
        elif isinstance(x, BulkStore):
            out.append("store" + ("@0" if thread0(path) else ""))
        elif isinstance(x, PerThread):
            if any(isinstance(y, Store) and id(y.buffer) in tiles for y in collect(x, Store)):
                out.append("write")
            return
        is_tiles = isinstance(x, For) and x.annotations.get(persistent_pass.ANNOTATION)
        if is_tiles:
            out.append("tile-loop")
        from tilecore.ir.visit import children

        for c in children(x):
            visit(c, path + [x])
        if is_tiles:
            out.append("end-loop")

    visit(func.body, [])
    return out


def check_epilogue(func, persistent: bool, parts: int = 1):
    """Per tile (and per part of it, D58): thread 0 waits until the previous store has read the tile, the threads
    meet, write the tile, each fences its writes, they meet, thread 0 issues the store (and nothing waits for it
    there); once, after the tile loop, thread 0 waits for the stores to finish."""
    ev = epilogue_events(func)
    want = ["wait-read@0", "barrier", "write", "fence", "barrier", "store@0"] * parts
    at = next((i for i in range(len(ev)) if ev[i:i + len(want)] == want), None)
    assert at is not None, ev
    assert ev.count("store@0") == parts and ev.count("wait-read@0") == parts, ev
    rest = ev[at + len(want):]
    if persistent:
        assert ev.index("tile-loop") < at and rest[:1] == ["end-loop"], ev
    assert "wait-done@0" in rest and "write" not in rest, ev


@pytest.mark.parametrize("combo", COMBOS)
def test_the_bulk_store_protocol_in_the_lowered_kernel(combo):
    low, src = _lower(gemm(1024, 1024, 512), **COMBOS[combo])
    assert low.attrs["bulk_store"][0].startswith("bulk store: C_l -> C through C_l_st (128x256, 4 x 128-byte panel"), \
        low.attrs["bulk_store"]
    assert "C_l_st" in low.attrs["shared_layouts"] and "128-byte panels" in low.attrs["shared_layouts"]["C_l_st"]
    check_epilogue(low, _persistent(COMBOS[combo]))
    from tilecore.ir import Store

    assert not [s for s in collect(low.body, Store) if s.buffer.name == "C"], "no element stores of C are left"
    code = src.code[src.code.index('extern "C"'):]  # the kernel (the prelude defines the functions)
    assert code.count("tc_tma_store_2d(&") == 4 and code.count("tc_bulk_commit();") == 1  # 4 panels, one group
    # the fragment's register pairs into the tile as four 8x8 matrices a warp (stmatrix, D51): 16 a thread
    assert code.count("tc_stsm_x4(") == 16 and "tc_vst<__half2>(&C_l_st[" not in code


PARTS = {  # (tile (bm, bn, bk, stages, threads), configs, parts, the part's columns, persistent)
    # by default, where the whole 64 KiB tile does not fit beside 4 stages (the plugin's D38 form): two halves
    "4 stages, default": ((128, 256, 64, 4, 256), {}, 2, 128, False),
    "4 stages, persistent, panel": ((128, 256, 64, 4, 256), {"tilecore.persistent": True}, 2, 128, True),
    "4 stages, ws+persistent": ((128, 256, 64, 4, 256), {**WS, "tilecore.persistent": True}, 2, 128, True),
    # asked for where the whole would fit
    "3 stages, 4 parts": ((128, 256, 64, 3, 256), {"tilecore.bulk_store_parts": 4}, 4, 64, False),
}


@pytest.mark.parametrize("case", PARTS)
def test_a_tile_that_does_not_fit_beside_the_stages_is_stored_in_parts(case):
    """D58: the tile's columns in parts through one staging tile of a part: per part the read-wait, the writes (the
    fragment's registers of that part only: 16-bit pairs as stmatrix, 128/parts columns a thread's 8x8 matrices), the
    fence and one bulk store at the part's columns; the parts' stores cover the tile's columns once."""
    from tilecore.ir import BulkStore, MatrixStore

    (bm, bn, bk, stages, threads), cfg, parts, cols, persistent = PARTS[case]
    low, src = _lower(gemm(4096, 4096, 1024, bm, bn, bk, stages, threads, swizzle=8), **cfg)
    note = low.attrs["bulk_store"][0]
    assert note.startswith(f"bulk store: C_l -> C through C_l_st ({bm}x{cols}, ") and f"in {parts} parts" in note, note
    check_epilogue(low, persistent, parts)
    stores = collect(low.body, BulkStore)
    assert len(stores) == parts and {tuple(s.src.static_shape()) for s in stores} == {(bm, cols)}
    from tilecore.ir import binary, expr_str

    c0 = stores[0].starts[-1]
    assert f"* {bn})" in expr_str(c0), expr_str(c0)  # the tile's first column
    offs = [const_value(simplify(binary("sub", s.starts[-1], c0))) for s in stores]
    assert offs == [k * cols for k in range(parts)], offs
    assert all(expr_str(s.starts[0]) == expr_str(stores[0].starts[0]) for s in stores)
    ms = collect(low.body, MatrixStore)
    assert len(ms) == 16 * (threads // 128) // 2 and check_matrix_stores(low, threads) == len(ms)
    assert low.attrs["shared_layouts"]["C_l_st"] and "stages" in low.attrs["pipelines"][0]
    assert f"{stages} stages" in low.attrs["pipelines"][0]
    code = src.code[src.code.index('extern "C"'):]
    assert code.count("tc_bulk_commit();") == parts and "tc_vst<__half2>(&C_l_st[" not in code
    assert "if ((bs_j" not in code, "every guard of a part resolved per register"
    assert src.meta["shared_bytes"] <= 232448


def test_the_parts_can_be_turned_off():
    """``tilecore.bulk_store_parts=1``: the 4-stage tile keeps its direct stores (D51's note), as before D58."""
    low, src = _lower(gemm(4096, 4096, 1024, 128, 256, 64, 4, 256, swizzle=8), **{"tilecore.bulk_store_parts": 1})
    assert low.attrs["bulk_store"][0].startswith("not a bulk store: C: its 64 KiB shared tile does not fit")
    assert "tc_tma_store_2d(&" not in src.code
    with pytest.raises(tilecore.errors.CompileError, match="bulk_store_parts=3"):
        _lower(gemm(4096, 4096, 1024, 128, 256, 64, 4, 256), **{"tilecore.bulk_store_parts": 3})


@pytest.mark.parametrize("mutation", ["no fence barrier", "no read wait", "no final wait"])
def test_mutations_of_the_bulk_store_protocol_are_caught(monkeypatch, mutation):
    from tilecore.ir import Barrier, BulkFence, BulkStoreWait, rewrite
    from tilecore.passes import simt

    low, _ = _lower(gemm(1024, 1024, 512), **COMBOS["ws+persistent+bulk"])
    check_epilogue(low, True)  # unmutated: passes
    if mutation == "no fence barrier":  # thread distribution forgets the barrier after the fence
        orig = simt._drop_double_barriers

        def drop(s):
            s = orig(s)

            def fix(x):
                from tilecore.ir import Seq

                if isinstance(x, Seq):
                    body = [c for i, c in enumerate(x.body)
                            if not (isinstance(c, Barrier) and i and isinstance(x.body[i - 1], BulkFence))]
                    return Seq(body, span=x.span) if len(body) != len(x.body) else None
                return None

            return rewrite(s, fix)

        monkeypatch.setattr(simt, "_drop_double_barriers", drop)
        low, _ = _lower(gemm(1024, 1024, 512), **COMBOS["ws+persistent+bulk"])
    else:
        read = mutation == "no read wait"
        low = low.with_body(rewrite(low.body, lambda x: tilecore.ir.Seq([]) if isinstance(x, BulkStoreWait)
                                    and x.read == read else None))
    with pytest.raises(AssertionError):
        check_epilogue(low, True)


REFUSED = {  # (M, N, K, tile (bm, bn, bk, stages, threads), out dtype, the note, configs)
    "rows": (1024, 1001, 512, (128, 256, 64, 3, 256), "float16", "C's rows are not proven whole 16-byte units", {}),
    # (without parts, D58: by default this tile is stored in two halves)
    "room": (1024, 1024, 512, (128, 256, 64, 4, 256), "float16",
             "its 64 KiB shared tile does not fit beside the 4 stages (limit 232448 bytes); num_stages=3 makes room "
             "(tilecore.bulk_store_parts=1)", {"tilecore.bulk_store_parts": 1}),
    "parts": (1024, 1024, 512, (128, 64, 64, 3, 256), "float16",
              "tilecore.bulk_store_parts=8: 64 columns are not 8 parts of whole 32-byte panels",
              {"tilecore.bulk_store_parts": 8}),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_store_that_is_not_a_bulk_store_keeps_its_element_stores_with_a_note(case):
    M, N, K, (bm, bn, bk, stages, threads), out, why, cfg = REFUSED[case]
    low, src = _lower(gemm(M, N, K, bm, bn, bk, stages, threads, out=out), **BULK, **cfg)
    assert low.attrs["bulk_store"] == (f"not a bulk store: C: {why}",), low.attrs["bulk_store"]
    assert "tc_tma_store_2d(&" not in src.code and f"{stages} stages" in low.attrs["pipelines"][0]


def test_a_target_without_bulk_copies_says_so_and_computes_the_same():
    import numpy as np

    fn = lambda: gemm(64, 96, 40, 32, 32, 16, 2, 128, dtype="float32")  # noqa: E731
    on = tilecore.compile(fn(), target="cpu", pass_configs={"tilecore.disable_cache": True, **BULK})
    off = tilecore.compile(fn(), target="cpu", pass_configs={"tilecore.disable_cache": True, "tilecore.bulk_store": False})
    assert "no bulk tile copies" in on.meta["attrs"]["bulk_store"][0]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 40), dtype=np.float32), rng.standard_normal((40, 96), dtype=np.float32)
    c1, c2 = np.zeros((64, 96), np.float32), np.zeros((64, 96), np.float32)
    on(a, b, c1)
    off(a, b, c2)
    assert np.array_equal(c1, c2)


def test_a_target_whose_emitter_spells_no_bulk_store_says_so():
    """MUSA's Pinghu profile declares bulk tile copies (TME) but its emitter spells no bulk store: the kernel keeps
    its element stores, with the note."""
    pytest.importorskip("tilecore_musa")
    _b, _t, low, src, _o = tilecore.compiler.lower(gemm(256, 256, 128, 32, 32, 32, 2, 128), target="musa:mp_31",
                                                   pass_configs={"tilecore.disable_cache": True, **BULK})
    assert "spells no bulk tile store" in low.attrs["bulk_store"][0], low.attrs["bulk_store"]


def test_the_default_bulk_store_on_the_general_path_only_where_it_applies():
    """D51: with no pass config the general path's GEMM on sm_90a gets the bulk store (not the persistent loop, which
    measured slower with it than without); a kernel the plugin's Hopper pipeline takes keeps that pipeline (the pass
    runs after the plugins' tile-lowering passes); targets without bulk tile copies (CPU) or whose emitter spells no
    bulk store (MUSA Pinghu) get none and no note; the option's values are checked."""
    low, src = _lower(gemm(4096, 4096, 512))
    assert low.attrs["bulk_store"][0].startswith("bulk store: C_l -> C"), low.attrs["bulk_store"]
    assert "persistent" not in low.attrs and "persistent" not in src.meta and src.meta["grid"][:2] == ["16", "32"]
    assert "tc_tma_store_2d(&" in src.code
    low, src = _lower(gemm(4096, 4096, 512), **NOBULK)
    assert "bulk_store" not in low.attrs and "tc_tma_store_2d(&" not in src.code
    # the persistent loop asked for takes the default bulk store along (D46's persistent + bulk)
    low, _src = _lower(gemm(4096, 4096, 512), **{"tilecore.persistent": True})
    assert low.attrs["persistent"][0].startswith("persistent: 132 blocks"), low.attrs["persistent"]
    assert low.attrs["bulk_store"][0].startswith("bulk store: C_l -> C"), low.attrs["bulk_store"]
    # the plugin's Hopper pipeline keeps its kernels (where the plain GEMM is not routed to the general path, D58)
    _b, _t, low, src, _o = tilecore.compiler.lower(gemm(1024, 1024, 512), target="cuda:sm_90a",
                                                   pass_configs={"tilecore.disable_cache": True,
                                                                 "tilecore.cuda.general_plain_gemm": False})
    assert "bulk_store" not in low.attrs
    assert "cuda.hopper_gemm_pipeline: 128x256x64" in low.attrs["hopper_pipelines"][0]
    fn = lambda: gemm(64, 96, 40, 32, 32, 16, 2, 128, dtype="float32")  # noqa: E731
    _b, _t, low, _src, _o = tilecore.compiler.lower(fn(), target="cpu", pass_configs={"tilecore.disable_cache": True})
    assert "bulk_store" not in low.attrs
    if pytest.importorskip("tilecore_musa"):
        _b, _t, low, _src, _o = tilecore.compiler.lower(gemm(256, 256, 128, 32, 32, 32, 2, 128), target="musa:mp_31",
                                                       pass_configs={"tilecore.disable_cache": True})
        assert "bulk_store" not in low.attrs
    with pytest.raises(tilecore.errors.CompileError, match="tilecore.bulk_store='maybe': expected True or False"):
        _lower(gemm(1024, 1024, 512), **{"tilecore.bulk_store": "maybe"})


@needs_toolchain
@pytest.mark.parametrize("combo,out,tile", [("bulk", "float16", (128, 256, 64, 3, 256)),
                                            ("ws+persistent+bulk", "float16", (128, 256, 64, 3, 256)),
                                            ("ws+persistent+bulk", "float32", (128, 128, 64, 4, 256)),
                                            ("persistent+bulk", "bfloat16", (128, 128, 64, 4, 256))])
def test_sm90a_bulk_store_compiles_to_utmastg_without_spills(combo, out, tile):
    import tilecore_cuda

    bm, bn, bk, stages, threads = tile
    dtype = "bfloat16" if out == "bfloat16" else "float16"
    cfg = {**COMBOS[combo], **({"tilecore.persistent": True} if _persistent(COMBOS[combo]) else {})}
    k = tilecore.compile(gemm(4096, 4096, 4096, bm, bn, bk, stages, threads, dtype=dtype, out=out),
                         target="cuda:sm_90a", pass_configs={**GENERAL, **cfg})
    assert k.meta["attrs"]["bulk_store"][0].startswith("bulk store:"), k.meta["attrs"]["bulk_store"]
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "HGMMA" in sass and "UTMALDG" in sass and "UTMASTG" in sass and "STS" in sass
    assert "STL" not in sass and "LDL" not in sass
    assert " STG" not in sass.replace("UTMASTG", "")  # C leaves by TMA only
    # 16-bit C: its tile by stmatrix (D51), 16 a thread for 128x256, 8 for 128x128
    assert sass.count("STSM") == (0 if out == "float32" else bm * bn // 2048), sass.count("STSM")


@needs_toolchain
@pytest.mark.parametrize("ws", [False, True])
def test_sm90a_a_swizzle_panel_adds_no_division_to_the_persistent_main_loop(ws):
    """D56: with T.use_swizzle(8) the persistent loop's stage ahead (the next tile's block indices, evaluated in
    every k step) divides by constants only: no division subroutine (CALL) in the main loop, and thread 0's
    longest path through it within 32 instructions of the launch without a panel (before: a CALL to the 64-bit
    division and 260 instructions against 195, the 8-9% D51 measured with the panel)."""
    import tilecore_cuda
    import sass_paths

    counts = []
    for panel in (None, 8):
        cfg = {**BULK, **(WS if ws else {}), "tilecore.persistent": True}
        k = tilecore.compile(gemm(4096, 4096, 4096, swizzle=panel), target="cuda:sm_90a",
                             pass_configs={**GENERAL, **cfg})
        assert any(n.startswith("persistent:") for n in k.meta["attrs"]["persistent"]), k.meta["attrs"]["persistent"]
        ins = sass_paths.parse(tilecore_cuda.CUDABackend().disassemble(k.binary, k.target))
        loop = sass_paths.main_loop(ins, 4)
        assert not any(sass_paths.opcode(ins[i][1]) == "CALL" for i in loop), "a division subroutine in the loop"
        counts.append(max(sum(c.values()) for _, c in sass_paths.paths(ins, loop)))
    assert counts[1] <= counts[0] + 32, counts


@needs_toolchain
def test_the_next_tiles_indices_per_tile_by_default_where_the_accumulator_is_small():
    """``tilecore.persistent_next_indices="auto"`` (the default, D58): a 128x128 float accumulator over 256 threads (64
    words a thread) gets ``per_tile``'s source, a 128x256 one (128 words) ``per_step``'s; other values refused."""
    def code(bn, how=None):
        cfg = {"tilecore.persistent_next_indices": how} if how else {}
        return _lower(gemm(4096, 4096, 1024, 128, bn, 64, 4, 256, swizzle=8), **cfg)[1].code

    assert code(128) == code(128, "per_tile") != code(128, "per_step")
    assert code(256) == code(256, "per_step") != code(256, "per_tile")
    assert "_next" in code(128) and "_next" not in code(256)
    with pytest.raises(tilecore.errors.CompileError, match="persistent_next_indices='sometimes'"):
        code(128, "sometimes")


def test_sm90a_the_next_tiles_indices_per_tile_shorten_thread_zeros_k_step():
    """``tilecore.persistent_next_indices="per_tile"`` (D56): thread 0's longest path through the main loop of the
    persistent + bulk kernel with T.use_swizzle(8) is shorter than with the indices per step (nvcc 13.0: 180 against
    216 SASS instructions; the launch without the persistent loop: 169)."""
    import tilecore_cuda
    import sass_paths

    counts = {}
    for how in ("per_step", "per_tile"):
        k = tilecore.compile(gemm(4096, 4096, 4096, swizzle=8), target="cuda:sm_90a",
                             pass_configs={**GENERAL, **BULK, "tilecore.persistent": True,
                                           "tilecore.persistent_next_indices": how})
        ins = sass_paths.parse(tilecore_cuda.CUDABackend().disassemble(k.binary, k.target))
        loop = sass_paths.main_loop(ins, 4)
        counts[how] = max(sum(c.values()) for _, c in sass_paths.paths(ins, loop))
    assert counts["per_tile"] + 16 <= counts["per_step"], counts


@pytest.mark.parametrize("auto", [{"tilecore.persistent": "auto"}, {}])
def test_persistent_auto_takes_only_kernels_with_a_bulk_store_and_a_panel_over_more_than_one_wave(auto):
    """``tilecore.persistent="auto"``, the default (D56): the tile loop where the kernel has the bulk-store epilogue,
    a T.use_swizzle panel and more tiles than resident blocks (the same source as ``True`` there), nothing and no
    note elsewhere: one wave, no panel, the bulk store off, a target without bulk stores."""
    big = gemm(4096, 4096, 4096, swizzle=8)
    low, src = _lower(big, **auto)
    assert low.attrs["persistent"][0].startswith("persistent: 132 blocks over 512 tiles"), low.attrs["persistent"]
    assert src.code == _lower(gemm(4096, 4096, 4096, swizzle=8), **{"tilecore.persistent": True})[1].code
    for fn, cfg in ((gemm(1024, 1024, 1024, swizzle=8), auto),  # 32 tiles: one wave
                    (gemm(4096, 4096, 4096), auto),  # no panel
                    (gemm(4096, 4096, 4096, swizzle=8), {**auto, **NOBULK})):
        low, src = _lower(fn, **cfg)
        assert "persistent" not in low.attrs, low.attrs.get("persistent")
        assert src.code == _lower(fn, **{**cfg, "tilecore.persistent": False})[1].code
    low = tilecore.compiler.lower(gemm(4096, 4096, 4096, swizzle=8), target="cpu",
                                  pass_configs={**auto, "tilecore.disable_cache": True})[2]
    assert "persistent" not in low.attrs


def test_the_plain_hopper_gemm_can_be_routed_to_the_general_path_and_split_k_stays():
    """``tilecore.cuda.general_plain_gemm`` (D51; "auto" D62, the default again since D65): a GEMM the plugin's Hopper
    pipeline would run without split-K compiles to exactly the general path's kernel (the register programs pass it by
    too), unset as under "auto"; one it splits over K keeps the pipeline; False keeps the pipeline."""
    fn = lambda: gemm(4096, 4096, 1024)  # noqa: E731
    route = {"tilecore.disable_cache": True, "tilecore.cuda.general_plain_gemm": "auto"}
    _b, _t, _low, src_default, _o = tilecore.compiler.lower(fn(), target="cuda:sm_90a",
                                                            pass_configs={"tilecore.disable_cache": True})
    _b, _t, low, src, _o = tilecore.compiler.lower(fn(), target="cuda:sm_90a", pass_configs=route)
    assert low.attrs["hopper_pipelines"] == ("cuda.hopper_gemm_pipeline: loop over ko left to the core's general "
                                             "path (tilecore.cuda.general_plain_gemm; split-K GEMMs stay here)",)
    _low, general = _lower(fn(), **{"tilecore.matrix_unit_families": None})
    assert src.code == general.code and low.attrs["matrix_stores"] and low.attrs["bulk_store"]
    assert src_default.code == general.code  # the default routes as "auto" does
    _b, _t, low, src, _o = tilecore.compiler.lower(gemm(1024, 1024, 8192), target="cuda:sm_90a", pass_configs=route)
    assert "; split-K " in low.attrs["hopper_pipelines"][0] and "bulk_store" not in low.attrs
    for off in ({"tilecore.cuda.general_plain_gemm": False}, {"tilecore.cuda.general_plain_gemm": "false"}):
        _b, _t, low, src, _o = tilecore.compiler.lower(fn(), target="cuda:sm_90a", pass_configs={**route, **off})
        assert "cuda.hopper_gemm_pipeline: 128x256x64" in low.attrs["hopper_pipelines"][0] and "bulk_store" not in low.attrs
    with pytest.raises(tilecore.errors.CompileError, match="general_plain_gemm='maybe'"):
        tilecore.compiler.lower(fn(), target="cuda:sm_90a", pass_configs={**route, "tilecore.cuda.general_plain_gemm":
                                                                          "maybe"})


# -- the bulk store's tile written as four 8x8 matrices a warp (tilecore.matrix_stores, D51) ------------------

def _np(e, t, env: dict):
    """``e`` at the block's threads ``t`` (a numpy array): integer arithmetic over the thread index, constants and
    the scalars bound before it (``env``: ``id(var) -> array``)."""
    import numpy as np

    from tilecore.ir import BinOp, Cast, Cmp, IntImm, Select, ThreadIndex, Var

    if isinstance(e, IntImm):
        return np.full_like(t, int(e.value))
    if isinstance(e, ThreadIndex):
        return t
    if isinstance(e, Var):
        return env[id(e)]
    if isinstance(e, Cast):
        return _np(e.value, t, env)
    if isinstance(e, Select):
        return np.where(_np(e.cond, t, env), _np(e.t, t, env), _np(e.f, t, env))
    if isinstance(e, Cmp):
        return {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
                "ge": np.greater_equal}[e.op](_np(e.a, t, env), _np(e.b, t, env))
    assert isinstance(e, BinOp), e
    a, b = _np(e.a, t, env), _np(e.b, t, env)
    ops = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "floordiv": np.floor_divide, "div": np.floor_divide,
           "floormod": np.mod, "mod": np.mod, "min": np.minimum, "max": np.maximum, "xor": np.bitwise_xor}
    return ops[e.op](a, b)


def check_matrix_stores(func, threads: int) -> int:
    """Each MatrixStore of the lowered kernel, run as the instruction runs (thread ``l`` of a 32-thread group gives
    the address of row ``l % 8`` of matrix ``l / 8``; register pair ``k`` of thread ``l`` lands at row ``l / 4``,
    columns ``2 (l % 4)``, ``+ 1`` of matrix ``k``), writes for every thread of the block exactly the elements and
    values its fallback's pair stores write. Returns how many there are."""
    import numpy as np

    from tilecore.ir import MatrixStore, PerThread, VectorStore, expr_str

    t = np.arange(threads)
    lane, first = t % 32, t - t % 32
    n = 0
    for pt in collect(func.body, PerThread):
        body = pt.body.body if hasattr(pt.body, "body") else [pt.body]
        env: dict = {}
        for s in body:
            if isinstance(s, Bind):
                env[id(s.var)] = _np(s.value, t, env)
            elif isinstance(s, MatrixStore):
                n += 1
                ar, ac = (_np(i, t, env) for i in s.indices)
                assert not (ac % 8).any(), "a matrix row starts inside a 16-byte unit"
                pairs = s.fallback.body
                assert len(pairs) == 4 and all(isinstance(p, VectorStore) and p.lanes == 2 for p in pairs)
                for k, p in enumerate(pairs):
                    giver = first + 8 * k + lane // 4  # the thread that gives the address of this thread's row of k
                    got = (ar[giver], ac[giver] + 2 * (lane % 4))
                    want = tuple(_np(i, t, env) for i in p.indices)
                    assert (got[0] == want[0]).all() and (got[1] == want[1]).all(), f"pair {k} lands elsewhere"
                    assert [expr_str(v) for v in s.values[2 * k:2 * k + 2]] == [expr_str(v) for v in p.values]
    return n


MATRIX = {  # (tile (bm, bn, bk, stages, threads), dtype, config, matrix stores a thread)
    "fp16 128x256 default": ((128, 256, 64, 3, 256), "float16", {}, 16),
    "bf16 128x128 default": ((128, 128, 64, 4, 256), "bfloat16", {}, 8),
    "fp16 ws+persistent+bulk": ((128, 256, 64, 3, 256), "float16", {**BULK, **WS, "tilecore.persistent": 7}, 16),
    "fp16 bulk alone": ((128, 256, 64, 3, 256), "float16", COMBOS["bulk"], 16),
}


@pytest.mark.parametrize("case", MATRIX)
def test_the_bulk_store_tile_is_written_by_matrix_stores_that_store_what_the_pairs_store(case):
    (bm, bn, bk, stages, threads), dtype, cfg, want = MATRIX[case]
    low, src = _lower(gemm(4096, 4096, 1024, bm, bn, bk, stages, threads, dtype=dtype), **cfg)
    assert low.attrs["matrix_stores"] == (f"{want} matrix stores (4 x 8x8) into the bulk-store tile",)
    assert check_matrix_stores(low, threads) == want
    body = src.code.split("__global__")[-1]
    assert body.count("tc_stsm_x4(") == want and "tc_vst<" not in body  # no pair store of the tile left
    off, src = _lower(gemm(4096, 4096, 1024, bm, bn, bk, stages, threads, dtype=dtype), **cfg,
                      **{"tilecore.matrix_stores": False})
    assert "matrix_stores" not in off.attrs and "tc_stsm_x4(" not in src.code
    pair = "__half2" if dtype == "float16" else "__nv_bfloat162"
    assert src.code.split("__global__")[-1].count(f"tc_vst<{pair}>(&C_l_st[") == 4 * want


def test_a_float32_tile_keeps_its_pair_stores():
    """stmatrix moves 16-bit elements: a float32 C's tile is written by 8-byte pair stores as before."""
    low, src = _lower(gemm(4096, 4096, 1024, 128, 128, 64, 4, 256, out="float32"))
    assert low.attrs["bulk_store"][0].startswith("bulk store:") and "matrix_stores" not in low.attrs
    assert "tc_stsm_x4(" not in src.code


@pytest.mark.parametrize("mutation", ["matrices 1 and 2 swapped in the lane addresses",
                                      "matrices 1 and 2 swapped in the general lane addresses", "offsets misread"])
def test_mutations_of_the_matrix_stores_are_caught(monkeypatch, mutation):
    from tilecore.passes import vectorize

    cfg = {}
    if mutation.startswith("matrices"):
        orig, orig_c = vectorize._lane_address, vectorize._lane_address_compact
        swap = lambda offs: (offs[0], offs[2], offs[1], offs[3])  # noqa: E731
        monkeypatch.setattr(vectorize, "_lane_address", lambda idx0, offs: orig(idx0, swap(offs)))
        monkeypatch.setattr(vectorize, "_lane_address_compact", lambda idx0, offs, n: orig_c(idx0, swap(offs), n))
        if "general" in mutation:  # D65's compact form off: the address as before it
            cfg = {"tilecore.matrix_store_lanes": "general"}
    else:
        orig_atoms = vectorize._atoms
        monkeypatch.setattr(vectorize, "_atoms",
                            lambda g, n: (lambda o: o and tuple((c, r) for r, c in o))(orig_atoms(g, n)))
    low, _src = _lower(gemm(4096, 4096, 1024), **cfg)
    assert low.attrs["matrix_stores"][0].startswith("16 matrix stores")
    with pytest.raises(AssertionError, match="lands elsewhere"):
        check_matrix_stores(low, 256)


# -- D65: the matrix stores' addresses as emitted, evaluated for every thread ----------------------------------------

def _emitted_stsm_offsets(code: str, threads: int) -> list:
    """The element offset each ``tc_stsm_x4`` of the CUDA source names in its tile, for every thread (numpy arrays,
    in source order): the C expressions of the ``tc_msN`` declarations and of the stores evaluated in Python (the
    thread index, ``/`` of non-negative values, tc_floormod / tc_floordiv, ``^``, ``&``, ``>>``, ``+``, ``*``)."""
    import re

    import numpy as np

    t = np.arange(threads, dtype=np.int64)
    env = {"t": t, "tc_floormod": lambda a, b: a % b, "tc_floordiv": lambda a, b: a // b}

    def py(c_expr: str) -> str:
        return c_expr.replace("((int)threadIdx.x)", "t").replace("(int)threadIdx.x", "t").replace(" / ", " // ")

    body = code.split("__global__")[-1]
    out = []
    for line in body.splitlines():
        m = re.match(r"\s*const int (tc_ms\d+) = (.*);$", line)
        if m:
            env[m.group(1)] = eval(py(m.group(2)), {}, env)  # noqa: S307 - the test's own generated text
            continue
        m = re.search(r"tc_stsm_x4\(tc_smem_addr\(&\w+\[(.*?)\]\), tc_stsm_u32", line)
        if m:
            v = eval(py(m.group(1)), {}, env)  # noqa: S307
            out.append(np.broadcast_to(v, t.shape))
    return out


def _ir_stsm_offsets(func, threads: int) -> list:
    """The element offset of each MatrixStore of the lowered kernel in its (swizzled) tile, for every thread."""
    import numpy as np

    from tilecore.ir import KernelLaunch, MatrixStore

    t = np.arange(threads, dtype=np.int64)
    layouts = {id(b): lay for k in collect(func.body, KernelLaunch) for b, lay in k.attrs.get("shared_layouts", ())}
    out = []
    for s in collect(func.body, MatrixStore):
        lay = layouts[id(s.buffer)]
        out.append(_np(lay.offset_expr(s.indices[0], s.indices[1]), t, {}))
    return out


@pytest.mark.parametrize("case", MATRIX)
def test_the_emitted_matrix_store_addresses_are_the_stores_elements_for_every_thread(case):
    """D65: the matrix stores of a per-thread block are addressed from the first one's offset (``tc_msN``, computed
    once), each later one at ``(tc_msN ^ X) + Y``: evaluated from the emitted text for every thread of the block, the
    offsets are the IR's (the lane addresses through the tile's swizzled layout), store by store."""
    import numpy as np

    (bm, bn, bk, stages, threads), dtype, cfg, want = MATRIX[case]
    low, src = _lower(gemm(4096, 4096, 1024, bm, bn, bk, stages, threads, dtype=dtype), **cfg)
    body = src.code.split("__global__")[-1]
    assert "const int tc_ms0 = " in body and "(tc_ms0 ^ 16)" in body, "later stores from the first one's offset"
    emitted, ir = _emitted_stsm_offsets(src.code, threads), _ir_stsm_offsets(low, threads)
    assert len(emitted) == len(ir) == want
    for k, (a, b) in enumerate(zip(emitted, ir)):
        assert np.array_equal(a, b), f"matrix store {k} lands elsewhere"
    # before D65: the whole offset at every store, no tc_msN
    _low, off = _lower(gemm(4096, 4096, 1024, bm, bn, bk, stages, threads, dtype=dtype), **cfg,
                       **{"tilecore.cuda.matrix_store_offsets": False, "tilecore.matrix_store_lanes": "general"})
    off_body = off.code.split("__global__")[-1]
    assert "tc_ms0" not in off_body and off_body.count("tc_stsm_x4(") == body.count("tc_stsm_x4(")


def test_a_misfitted_matrix_store_offset_is_caught(monkeypatch):
    """The check above fails where the emitter takes a later store's offset as the first one's plus a constant without
    looking at every thread (a swizzle's column step is an XOR: thread 0's difference is not the others')."""
    import numpy as np

    import tilecore_cuda.codegen as cg

    monkeypatch.setattr(cg, "_fit_offset", lambda first, off: (0, int(off[0] - first[0])))
    low, src = _lower(gemm(4096, 4096, 1024))
    pairs = list(zip(_emitted_stsm_offsets(src.code, 256), _ir_stsm_offsets(low, 256)))
    assert len(pairs) == 16 and not all(np.array_equal(a, b) for a, b in pairs)


def test_the_general_gemm_source_binds_only_what_it_reads():
    """D65: no coordinate binding the emitted source does not read: the accumulators' clear binds none (its stores
    name registers), the bulk store's parts none (the matrix stores' fallbacks have them inlined)."""
    import re

    _low, src = _lower(gemm(4096, 4096, 1024))
    body = src.code.split("__global__")[-1]
    for name in re.findall(r"const int (\w+) = ", body):
        assert len(re.findall(rf"\b{name}\b", body)) > 1, f"{name} is bound and never read"
    assert "C_l[0] = 0.0f;" in body and not re.search(r"const int (bs_)?[ij](_\d+)? = ", body)


# -- the bulk store run on the host: the made-up 64-thread matrix unit with bulk stores -------------------------

#: the host emulation of the test backend's bulk-store spelling. A store writes C from a snapshot of the shared tile
#: taken when it is issued (decoding the panels' swizzle from the address bits: 16-byte chunk bits 4.. XOR the bits
#: from 7 up, as the hardware's 32/64/128-byte swizzles do) and clips at C's dimensions; the issuing thread's wait
#: then checks that nothing wrote the tile since (a store may read it any time until its read-wait retires it):
#: a tile rewritten before the wait fails the run.
BulkEmitterClass = None  # set by the fakebulk fixture
BULK_SHIM = r"""
#include <deque>
struct tc_bs_group { const unsigned char* tile; std::vector<unsigned char> snap; };
thread_local std::deque<tc_bs_group> tc_bs_groups;
template <typename T> inline void tc_fake_bulk_store(T* dst, long long d0, long long d1, const T* tile, long long r0,
                                                     long long c0, int rows, int cols, int panel, int swz) {
  if (reinterpret_cast<uintptr_t>(tile) % (8 * swz)) tc_fail("bulk store tile not aligned to its swizzle pattern");
  const int es = (int)sizeof(T), bytes = rows * cols * es;
  tc_bs_group g{(const unsigned char*)tile, std::vector<unsigned char>((const unsigned char*)tile,
                                                                        (const unsigned char*)tile + bytes)};
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const long long gr = r0 + r, gc = c0 + c;
      if (gr < 0 || gc < 0 || gr >= d0 || gc >= d1) continue;
      const long long addr = (long long)(c / panel) * rows * panel * es + (long long)r * panel * es + (c % panel) * es;
      const long long phys = addr ^ (((addr >> 7) & (swz / 16 - 1)) << 4);
      std::memcpy((unsigned char*)(dst + gr * d1 + gc), g.snap.data() + phys, es);
    }
  tc_bs_groups.push_back(std::move(g));
}
inline void tc_fake_bulk_wait(int pending) {
  while ((int)tc_bs_groups.size() > pending) {
    const tc_bs_group& g = tc_bs_groups.front();
    if (std::memcmp(g.tile, g.snap.data(), g.snap.size())) tc_fail("a bulk store's tile was written before its read-wait");
    tc_bs_groups.pop_front();
  }
}
"""


@pytest.fixture(scope="module")
def fakebulk(tmp_path_factory):
    """The made-up 64-thread matrix unit (tests/fake_matrix_backend.py) on a profile that also declares bulk tile
    copies, its emitter spelling the bulk store for the host emulator (``tc_fake_bulk_*``)."""
    import types

    from fake_matrix_backend import CAPS, backend_class
    from tilecore.plugin import Target, get_registry, hookimpl, reset_registry

    reset_registry()
    base = backend_class()
    caps = tmp_path_factory.mktemp("fakebulk") / "fakebulk_x1.yaml"
    caps.write_text(CAPS.replace("id: fakemu/x1", "id: fakebulk/x1") + "features: {bulk_tensor_copy: true}\n")
    Emitter = type(base().emitter(None))

    class BulkEmitter(Emitter):  # (module-level name: the mutation test patches its spelling)
        def bulk_store_maps(self, st, func, add_map):  # the host spelling takes C's pointer and shape instead
            pass

        def stmt_BulkStore(self, st, s):
            lay = s.layout
            d0, d1 = (self.expr(st, simplify(as_expr(d))) for d in s.dst.shape)
            r0, c0 = (self.expr(st, simplify(e)) for e in s.starts)
            self.line(st, f"tc_fake_bulk_store({self.name(st, s.dst)}, (long long)({d0}), (long long)({d1}), "
                          f"{self.name(st, s.src)}, (long long)({r0}), (long long)({c0}), {lay.rows}, {lay.cols}, "
                          f"{lay.panel_elems}, {lay.swizzle_bytes});")

        def stmt_BulkStoreWait(self, st, s):
            self.line(st, f"tc_fake_bulk_wait({int(s.pending)});")

        def stmt_BulkFence(self, st, s):
            self.line(st, "/* bulk fence: nothing on the host */")

    class FakeBulk(base):
        name = "fakebulk"
        distribution = "tilecore-fakebulk"

        def parse_target(self, spec):
            return Target("fakebulk", "fakebulk", "sm_80", (), "fakebulk/x1") if spec == "fakebulk" else None

        def targets(self):
            return ["fakebulk"]

        def capability_files(self):
            return [caps]

        def emitter(self, target):
            return BulkEmitter()

    global BulkEmitterClass
    BulkEmitterClass = BulkEmitter
    mod = types.ModuleType("tc_fake_bulk")

    @hookimpl
    def tilecore_backends():
        return [FakeBulk()]

    mod.tilecore_backends = tilecore_backends
    sys.modules.setdefault("tc_fake_bulk", mod)
    get_registry().register(mod, name="fakebulk")
    yield "fakebulk"
    reset_registry()


def _emulate(k, a, b, out):
    import numpy as np

    import cuda_host_emulator as emu

    orig = emu.host_source
    try:
        emu.host_source = lambda src: (lambda t: t.replace(emu.SHIM, emu.SHIM + BULK_SHIM, 1))(orig(src))
        return emu.run_on_host(k, [a, b, np.full((a.shape[0], b.shape[1]), np.nan, out)])[2]
    finally:
        emu.host_source = orig


EMU = {  # (M, N, K, bm, bn, bk, stages, threads, out dtype, blocks): ragged on every edge
    "64-byte panels": (100, 136, 72, 32, 32, 16, 3, 64, "float16", None),
    "persistent, 64-byte panels": (100, 136, 72, 32, 32, 16, 3, 64, "float16", 4),
    "persistent, 128-byte panels, float32": (100, 72, 40, 32, 32, 16, 2, 128, "float32", 3),
    "persistent, 2 panels": (72, 200, 48, 32, 128, 16, 2, 128, "float16", 2),
    # D58: the tile in parts (asked for: the made-up profile's shared memory holds the whole), each part's store in
    # flight while the next part is written into the same staging tile after its read-wait
    "persistent, 2 parts": (72, 200, 48, 32, 128, 16, 2, 128, "float16", 2),
    "4 parts, float32": (100, 136, 40, 32, 128, 16, 2, 128, "float32", None),
}
EMU_CFG = {"persistent, 2 parts": {"tilecore.bulk_store_parts": 2}, "4 parts, float32": {"tilecore.bulk_store_parts": 4}}


@needs_toolchain
@pytest.mark.parametrize("case", EMU)
def test_the_made_up_matrix_unit_runs_the_bulk_store_on_the_host(fakebulk, case):
    """The test backend's 64-thread unit (its C layout nothing like wgmma's) through the bulk store: its registers
    into the swizzled shared tile (vector stores), the store clipped at C's edges, one tile's store in flight while
    the next tile computes; against float64 and bit for bit the element stores."""
    import numpy as np

    M, N, K, bm, bn, bk, stages, threads, out, blocks = EMU[case]
    fn = lambda: gemm(M, N, K, bm, bn, bk, stages, threads, dtype="float16", out=out)  # noqa: E731
    extra = {**({"tilecore.persistent": blocks} if blocks else {}), **EMU_CFG.get(case, {})}
    on = tilecore.compile(fn(), target=fakebulk, pass_configs={"tilecore.disable_cache": True, **BULK, **extra})
    off = tilecore.compile(fn(), target=fakebulk, pass_configs={"tilecore.disable_cache": True, **extra,
                                                                "tilecore.bulk_store": False})
    assert on.meta["attrs"]["bulk_store"][0].startswith("bulk store: C_l -> C"), on.meta["attrs"]["bulk_store"]
    assert on.meta["attrs"]["fragment_layouts"]["C_l"].startswith("fakemu")
    code = on.source.code
    kernel = code[code.index('extern "C"'):]
    parts = EMU_CFG.get(case, {}).get("tilecore.bulk_store_parts", 1)
    assert kernel.count("tc_fake_bulk_store(C, ") == parts and "C_l_st[" in kernel and "  C[" not in kernel
    if parts > 1:
        assert f"in {parts} parts" in on.meta["attrs"]["bulk_store"][0]
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((M, K)) / 4).astype(np.float16)
    b = (rng.standard_normal((K, N)) / 4).astype(np.float16)
    dt = np.dtype(out)
    c_on, c_off = _emulate(on, a, b, dt), _emulate(off, a, b, dt)
    np.testing.assert_allclose(c_on.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64),
                               rtol=2e-2, atol=2e-2)
    assert np.array_equal(c_on, c_off)


@needs_toolchain
@pytest.mark.parametrize("mutation", ["no read wait", "no swizzle", "panels read as one row-major tile"])
def test_mutations_of_the_bulk_store_fail_on_the_host(fakebulk, monkeypatch, mutation):
    """The same run with the generated code broken one way: the read-wait removed (the next tile rewrites the tile
    under its store), the shared tile stored row-major while the store decodes panels, every panel stored at the
    first panel's columns. Each fails (an error or wrong numbers); unmutated it passes (above)."""
    from tilecore.passes import bulkstore

    M, N, K, bm, bn, bk, stages, threads, out, blocks = EMU["persistent, 2 panels"]
    if mutation == "no read wait":
        orig = bulkstore.BulkStoreWait
        monkeypatch.setattr(bulkstore, "BulkStoreWait", lambda pending, read, span=None:
                            tilecore.ir.Seq([]) if read else orig(pending, read, span=span))
    elif mutation == "no swizzle":
        from tilecore.passes import matrix

        monkeypatch.setattr(matrix, "BulkStore", type("NoBulkStore", (), {}))  # its tile not given the layout
    else:
        monkeypatch.setattr(BulkEmitterClass, "stmt_BulkStore", _first_panel_only)
    k = tilecore.compile(gemm(M, N, K, bm, bn, bk, stages, threads, out=out), target=fakebulk,
                         pass_configs={"tilecore.disable_cache": True, **BULK, "tilecore.persistent": blocks})
    # (a tile without the layout is not aligned to the pattern the store decodes either)
    _mutant_fails(k, M, N, K, out, {"no read wait": "written before its read-wait",
                                    "no swizzle": "not aligned to its swizzle pattern"}.get(mutation))


@needs_toolchain
@pytest.mark.parametrize("mutation", ["every part writes the first part's columns", "branches refuted wrongly",
                                      "no read wait between the parts"])
def test_mutations_of_the_parts_fail_on_the_host(fakebulk, monkeypatch, mutation):
    """D58's parts broken one way each: every part's writes taken from the first part's columns (the stores at the
    right places), a register's guard resolved false where it holds, the next part written before the last part's
    store has read the staging tile. Each fails (an error or wrong numbers); unmutated it passes (above)."""
    from tilecore.passes import bulkstore, layout

    assert layout._Subst.decide  # (patched below)
    M, N, K, bm, bn, bk, stages, threads, out, blocks = EMU["persistent, 2 parts"]
    if mutation.startswith("every part"):
        orig = bulkstore._part_copy
        monkeypatch.setattr(bulkstore, "_part_copy", lambda x, tile, part, width: orig(x, tile, 0, width))
    elif mutation.startswith("branches"):
        monkeypatch.setattr(layout._Subst, "decide", lambda self, cond: False if self.fold else None)
    else:
        orig_wait = bulkstore.BulkStoreWait
        seen = []

        def wait(pending, read, span=None):  # the first part's read-wait kept, the second's dropped
            seen.append(read)
            return tilecore.ir.Seq([]) if read and seen.count(True) == 2 else orig_wait(pending, read, span=span)

        monkeypatch.setattr(bulkstore, "BulkStoreWait", wait)
    k = tilecore.compile(gemm(M, N, K, bm, bn, bk, stages, threads, out=out), target=fakebulk,
                         pass_configs={"tilecore.disable_cache": True, **BULK, "tilecore.persistent": blocks,
                                       **EMU_CFG["persistent, 2 parts"]})
    _mutant_fails(k, M, N, K, out, "written before its read-wait" if mutation.startswith("no read wait") else None)


def _mutant_fails(k, M, N, K, out, error):
    """A mutated kernel ``k`` run on the host emulator fails: with a RuntimeError saying ``error`` where one is
    expected (None: any error is a failure of the test), else with numbers away from float64's."""
    import numpy as np

    rng = np.random.default_rng(7)
    a = (rng.standard_normal((M, K)) / 4).astype(np.float16)
    b = (rng.standard_normal((K, N)) / 4).astype(np.float16)
    try:
        c = _emulate(k, a, b, np.dtype(out))
    except RuntimeError as e:
        assert error is not None and error in str(e), e
        return
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert not np.allclose(c.astype(np.float64), ref, rtol=2e-2, atol=2e-2)


def _first_panel_only(self, st, s):
    """The bulk store spelled with every panel's columns read from the first panel (a mutation)."""
    lay = s.layout
    d0, d1 = (self.expr(st, simplify(as_expr(d))) for d in s.dst.shape)
    r0, c0 = (self.expr(st, simplify(e)) for e in s.starts)
    self.line(st, f"tc_fake_bulk_store({self.name(st, s.dst)}, (long long)({d0}), (long long)({d1}), "
                  f"{self.name(st, s.src)}, (long long)({r0}), (long long)({c0}), {lay.rows}, {lay.cols}, "
                  f"{lay.cols}, {lay.swizzle_bytes});")


# -- on an sm_90 GPU ---------------------------------------------------------------------------------------

DEVICE = {  # (M, N, K, dtype, out, tile (bm, bn, bk, stages, threads), swizzle)
    "4096^3": (4096, 4096, 4096, "float16", "float16", (128, 256, 64, 3, 256), None),
    "ragged": (1000, 1800, 1000, "float16", "float16", (128, 256, 64, 3, 256), None),
    "bf16": (2048, 3072, 1024, "bfloat16", "bfloat16", (128, 128, 64, 4, 256), 4),
    # T.use_swizzle's panels walked by the persistent loop (D56): whole panels, and a ragged last panel (8 rows of
    # tiles in panels of 3)
    "panel": (4096, 4096, 4096, "float16", "float16", (128, 256, 64, 3, 256), 8),
    "ragged-panel": (1000, 1800, 1000, "float16", "float16", (128, 256, 64, 3, 256), 3),
    # D58: 4 stages, the tile in two halves by default (whole panels; ragged, panels of 3)
    "halves": (4096, 4096, 4096, "float16", "float16", (128, 256, 64, 4, 256), 8),
    "ragged-halves": (1000, 1800, 1000, "bfloat16", "bfloat16", (128, 256, 64, 4, 256), 3),
}
VARIANTS = {
    "ws+persistent": {**WS, **NOBULK, "tilecore.persistent": True},
    "bulk": {**BULK, "tilecore.persistent": False},
    "default": {},  # D51: the bulk store (with stmatrix) where it applies
    "persistent+bulk": {**BULK, "tilecore.persistent": True},
    "persistent+bulk-per-tile": {**BULK, "tilecore.persistent": True, "tilecore.persistent_next_indices": "per_tile"},
    "ws+persistent+bulk": {**BULK, **WS, "tilecore.persistent": True},
    # D65 undone: each matrix store's lane address as pair 0's coordinates at another thread plus a select, its whole
    # swizzled offset computed at every store (the default: a few operations of the thread index, later stores at
    # the first one's offset XOR / plus constants)
    "d65-off": {"tilecore.matrix_store_lanes": "general", "tilecore.cuda.matrix_store_offsets": False},
}


def _device_case(case, cfg):
    import torch

    M, N, K, dtype, out, (bm, bn, bk, stages, threads), swz = DEVICE[case]
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    g = torch.Generator(device="cuda").manual_seed(5)
    a = (torch.randn(M, K, device="cuda", generator=g) / 8).to(tdt[dtype])
    b = (torch.randn(K, N, device="cuda", generator=g) / 8).to(tdt[dtype])
    fn = lambda: gemm(M, N, K, bm, bn, bk, stages, threads, dtype, out, swz)  # noqa: E731
    runs = []
    for extra in (NOBULK, cfg):
        k = tilecore.compile(fn(), target="cuda", pass_configs={**GENERAL, **extra})
        c = torch.full((M, N), float("nan"), device="cuda", dtype=tdt[out])
        k(a, b, c)
        torch.cuda.synchronize()
        runs.append((k, c))
    ref = a.double() @ b.double()
    return runs, ref


#: D58's cases: the halves by default, with the next tile's indices per tile and warp-specialized; 2 and 4 parts
#: asked for at 3 stages
PARTS_DEVICE = [(c, v) for c in ("halves", "ragged-halves") for v in ("default", "default-per-tile", "persistent+bulk",
                                                                        "ws+persistent+bulk")] + \
    [(c, v) for c in ("panel", "ragged") for v in ("parts-2", "parts-4")]
PARTS_VARIANTS = {**VARIANTS, "default-per-tile": {"tilecore.persistent_next_indices": "per_tile"},
                  "parts-2": {"tilecore.bulk_store_parts": 2}, "parts-4": {"tilecore.bulk_store_parts": 4}}


@hopper_gpu
@pytest.mark.parametrize("case,variant", PARTS_DEVICE)
def test_device_the_tile_in_parts_matches_float64_and_the_plain_general_path(case, variant):
    import torch

    [(_plain, c0), (k, c1)], ref = _device_case(case, PARTS_VARIANTS[variant])
    assert " parts of the tile's columns" in k.meta["attrs"]["bulk_store"][0], k.meta["attrs"]["bulk_store"]
    assert float((c1.double() - ref).abs().max()) < 3e-2 * max(1.0, float(ref.abs().max()) / 8), k.meta["attrs"]
    assert torch.equal(c0, c1), k.meta["attrs"]


@hopper_gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", [c for c in DEVICE if "halves" not in c])
def test_device_general_gemm_matches_float64_and_the_plain_general_path(case, variant):
    import torch

    [(_plain, c0), (k, c1)], ref = _device_case(case, VARIANTS[variant])
    assert float((c1.double() - ref).abs().max()) < 3e-2 * max(1.0, float(ref.abs().max()) / 8), k.meta["attrs"]
    assert torch.equal(c0, c1), k.meta["attrs"]
