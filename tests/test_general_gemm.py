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
import tilecore.language as T
from tilecore.ir import (BulkCopy, CopyBarrierWait, For, Specialized, Bind, as_expr, collect, const_value,
                         simplify, walk)
from tilecore.passes import persistent as persistent_pass
from tilecore.passes.pipeline import substitute

sys.path.insert(0, str(Path(__file__).parent))

from test_cuda_backend import needs_toolchain  # noqa: E402
from test_cuda_hopper import hopper_gpu  # noqa: E402

GENERAL = {"tilecore.disable_cache": True, "tilecore.cuda.register_programs": False,
           "tilecore.matrix_unit_families": ["wgmma"]}
WS = {"tilecore.warp_specialize": True}


def gemm(M, N, K, bm=128, bn=256, bk=64, stages=3, threads=256, dtype="float16", out=None, swizzle=None):
    out = out or dtype

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), "float32")
            if swizzle:
                T.use_swizzle(swizzle)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])

    return main


def _value(e, env: dict):
    """``e`` evaluated with the variables of ``env`` (``id(var) -> int``)."""
    v = const_value(simplify(substitute(as_expr(e), {k: as_expr(x) for k, x in env.items()})))
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
COMBOS = {"bulk": BULK, "persistent+bulk": {**BULK, "tilecore.persistent": 7},
          "ws+persistent+bulk": {**BULK, **WS, "tilecore.persistent": 7}}


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


def check_epilogue(func, persistent: bool):
    """Per tile: thread 0 waits until the previous store has read the tile, the threads meet, write the tile, each
    fences its writes, they meet, thread 0 issues the store (and nothing waits for it there); once, after the tile
    loop, thread 0 waits for the stores to finish."""
    ev = epilogue_events(func)
    want = ["wait-read@0", "barrier", "write", "fence", "barrier", "store@0"]
    at = next((i for i in range(len(ev)) if ev[i:i + len(want)] == want), None)
    assert at is not None, ev
    assert ev.count("store@0") == 1 and ev.count("wait-read@0") == 1, ev
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
    check_epilogue(low, "tilecore.persistent" in COMBOS[combo])
    from tilecore.ir import Store

    assert not [s for s in collect(low.body, Store) if s.buffer.name == "C"], "no element stores of C are left"
    code = src.code[src.code.index('extern "C"'):]  # the kernel (the prelude defines the functions)
    assert code.count("tc_bs_store_2d(") == 4 and code.count("tc_bs_commit();") == 1  # 4 panels, one group
    assert "tc_vst<__half2>(&C_l_st[" in code  # the fragment's register pairs as vector stores into the tile


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


REFUSED = {  # (M, N, K, tile (bm, bn, bk, stages, threads), out dtype, the note)
    "rows": (1024, 1001, 512, (128, 256, 64, 3, 256), "float16", "C's rows are not proven whole 16-byte units"),
    "room": (1024, 1024, 512, (128, 256, 64, 4, 256), "float16",
             "its 64 KiB shared tile does not fit beside the 4 stages (limit 232448 bytes); num_stages=3 makes room"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_store_that_is_not_a_bulk_store_keeps_its_element_stores_with_a_note(case):
    M, N, K, (bm, bn, bk, stages, threads), out, why = REFUSED[case]
    low, src = _lower(gemm(M, N, K, bm, bn, bk, stages, threads, out=out), **BULK)
    assert low.attrs["bulk_store"] == (f"not a bulk store: C: {why}",), low.attrs["bulk_store"]
    assert "tc_bs_" not in src.code and f"{stages} stages" in low.attrs["pipelines"][0]


def test_a_target_without_bulk_copies_says_so_and_computes_the_same():
    import numpy as np

    fn = lambda: gemm(64, 96, 40, 32, 32, 16, 2, 128, dtype="float32")  # noqa: E731
    on = tilecore.compile(fn(), target="cpu", pass_configs={"tilecore.disable_cache": True, **BULK})
    off = tilecore.compile(fn(), target="cpu", pass_configs={"tilecore.disable_cache": True})
    assert "no bulk tile copies" in on.meta["attrs"]["bulk_store"][0]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 40), dtype=np.float32), rng.standard_normal((40, 96), dtype=np.float32)
    c1, c2 = np.zeros((64, 96), np.float32), np.zeros((64, 96), np.float32)
    on(a, b, c1)
    off(a, b, c2)
    assert np.array_equal(c1, c2)


def test_the_option_is_off_by_default_and_checked():
    low, src = _lower(gemm(1024, 1024, 512))
    assert "bulk_store" not in low.attrs and "tc_bs_" not in src.code
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
    cfg = {**COMBOS[combo], **({"tilecore.persistent": True} if "tilecore.persistent" in COMBOS[combo] else {})}
    k = tilecore.compile(gemm(4096, 4096, 4096, bm, bn, bk, stages, threads, dtype=dtype, out=out),
                         target="cuda:sm_90a", pass_configs={**GENERAL, **cfg})
    assert k.meta["attrs"]["bulk_store"][0].startswith("bulk store:"), k.meta["attrs"]["bulk_store"]
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "HGMMA" in sass and "UTMALDG" in sass and "UTMASTG" in sass and "STS" in sass
    assert "STL" not in sass and "LDL" not in sass
    assert " STG" not in sass.replace("UTMASTG", "")  # C leaves by TMA only


# -- on an sm_90 GPU ---------------------------------------------------------------------------------------

DEVICE = {  # (M, N, K, dtype, out, tile (bm, bn, bk, stages, threads), swizzle)
    "4096^3": (4096, 4096, 4096, "float16", "float16", (128, 256, 64, 3, 256), None),
    "ragged": (1000, 1800, 1000, "float16", "float16", (128, 256, 64, 3, 256), None),
    "bf16": (2048, 3072, 1024, "bfloat16", "bfloat16", (128, 128, 64, 4, 256), 4),
}
VARIANTS = {
    "ws+persistent": {**WS, "tilecore.persistent": True},
    "bulk": BULK,
    "persistent+bulk": {**BULK, "tilecore.persistent": True},
    "ws+persistent+bulk": {**BULK, **WS, "tilecore.persistent": True},
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
    for extra in ({}, cfg):
        k = tilecore.compile(fn(), target="cuda", pass_configs={**GENERAL, **extra})
        c = torch.full((M, N), float("nan"), device="cuda", dtype=tdt[out])
        k(a, b, c)
        torch.cuda.synchronize()
        runs.append((k, c))
    ref = a.double() @ b.double()
    return runs, ref


@hopper_gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", DEVICE)
def test_device_general_gemm_matches_float64_and_the_plain_general_path(case, variant):
    import torch

    [(_plain, c0), (k, c1)], ref = _device_case(case, VARIANTS[variant])
    assert float((c1.double() - ref).abs().max()) < 3e-2 * max(1.0, float(ref.abs().max()) / 8), k.meta["attrs"]
    assert torch.equal(c0, c1), k.meta["attrs"]
