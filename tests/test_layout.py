"""The core layout model (tilecore.layout): fragment layouts are bijections, and compose lawfully."""
from __future__ import annotations

import math

import pytest

from tilecore.layout import Digit, FragmentLayout, SharedLayout, blocked

#: a 16x8 warp accumulator in the digit notation of tilecore/layout/fragment.py (a made-up-free example:
#: row = r0 + 8 r1 with r0 on threads (stride 4), r1 on registers; col = c0 + 2 c1, c0 on registers, c1 on threads)
ACC = FragmentLayout((16, 8), [[("thread", 8, 4), ("reg", 2, 2)], [("reg", 2, 1), ("thread", 4, 1)]], name="acc")


def test_locate_and_element_are_inverse():
    ACC.check()
    assert (ACC.threads, ACC.regs) == (32, 4)
    assert ACC.locate((9, 3)) == ((5,), 3)
    assert ACC.element(5, 3) == (9, 3)


def test_a_layout_that_is_not_a_mixed_radix_is_refused():
    with pytest.raises(ValueError, match="mixed radix"):
        FragmentLayout((4, 4), [[("thread", 4, 1)], [("thread", 4, 2)]])
    with pytest.raises(ValueError, match="multiply to"):
        FragmentLayout((4, 4), [[("thread", 2, 1)], [("reg", 4, 1)]])


def test_reduction_pattern_and_projection():
    assert ACC.reduce_masks(1) == (1, 2)          # the 4 threads of a row differ in their 2 low bits
    assert ACC.reduce_masks(0) == (4, 8, 16)
    row = ACC.project(1)
    row.check()
    assert row.replication == 4 and row.regs == 2
    assert row.owns_same(ACC, dropped=1)
    for r in range(ACC.regs):                     # the row value sits where the row's elements are
        t = 6
        assert row.element(t, row.reg_of(ACC, r, dropped=1)) == (ACC.element(t, r)[0],)


@pytest.mark.parametrize("shape,threads,vec", [((128, 128), 128, 4), ((64, 32), 128, 1), ((4, 4), 128, 1),
                                               ((256,), 64, 1), ((8, 96), 32, 2)])
def test_blocked_layouts_are_bijections(shape, threads, vec):
    lay = blocked(shape, threads, vec)
    assert lay is not None
    lay.check()
    assert lay.threads == threads


def test_tiling_and_transposition_keep_bijections():
    big = ACC.tile(0, 4, "thread").tile(1, 4, "reg")
    big.check()
    assert big.shape == (64, 32) and big.threads == 128 and big.regs == 16
    t = big.transpose()
    t.check()
    assert all(t.element(th, r) == tuple(reversed(big.element(th, r))) for th in (0, 77) for r in range(16))
    assert big.replicate_over(2).replication == 2


@pytest.mark.parametrize("sw", [0, 32, 64, 128])
def test_shared_layouts_are_bijections(sw):
    SharedLayout(64, 64, 2, swizzle_bytes=sw).check()


def test_digit_validation():
    with pytest.raises(ValueError):
        Digit("smem", 2, 1)


# -- laws, over every registered layout ---------------------------------------------------------------------
def _registered():
    """(name, layout) of every matrix unit of every installed backend's targets, and of the test backend's."""
    from fake_matrix_backend import fake_unit
    from tilecore.plugin import get_registry

    units = {fake_unit().spelling: fake_unit()}
    for name, backend in sorted(get_registry().backends().items()):
        for spec in backend.targets():
            tgt = backend.parse_target(spec)
            for u in getattr(backend, "matrix_units", lambda t: [])(tgt):
                units[u.spelling] = u
    out, seen = [], set()
    for s, u in sorted(units.items()):
        for role, lay in u.layouts().items():
            if lay not in seen:          # wgmma units share their A layout
                seen.add(lay)
                out.append((f"{s}.{role}", lay))
    return out + [("acc", ACC), ("blocked", blocked((8, 16), 32, 2)), ("blocked-rep", blocked((4, 4), 128))]


REGISTERED = _registered()
CLEAR = [(n, lay) for n, lay in REGISTERED if not lay.opaque]


def test_the_registry_has_the_cuda_and_the_made_up_units():
    names = {n for n, _ in REGISTERED}
    assert {"mma_sync_m16n8k16.c", "wgmma_m64n256k16.c", "fakemu_16x16x8.c"} <= names
    # opaque layouts are only the operands an instruction reads from memory itself (WGMMA's B) and the
    # fragments whose placement the hardware hides (Metal's simdgroup matrices, every role)
    assert all((n.startswith("wgmma_") and n.endswith(".b")) or n.startswith("simdgroup_matrix_")
               for n, lay in REGISTERED if lay.opaque)


@pytest.mark.parametrize("name,lay", CLEAR, ids=lambda x: x if isinstance(x, str) else "")
def test_registered_layouts_are_bijections_or_declared_replication(name, lay):
    lay.check()     # every slot of threads x regs holds exactly one element (replicas counted)
    assert lay.threads * lay.regs == lay.replication * math.prod(lay.shape)


_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "div": lambda a, b: a // b, "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b,
        "xor": lambda a, b: a ^ b}


def _eval(e, thread):
    from tilecore.ir import BinOp, Cast, IntImm, ThreadIndex

    if isinstance(e, IntImm):
        return e.value
    if isinstance(e, ThreadIndex):
        return thread
    if isinstance(e, Cast):
        return _eval(e.value, thread)
    if isinstance(e, BinOp):
        a, b = _eval(e.a, thread), _eval(e.b, thread)
        return _OPS[e.op](a, b)
    raise NotImplementedError(type(e).__name__)


@pytest.mark.parametrize("name,lay", [c for c in CLEAR if c[1].threads * c[1].regs <= 4096],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_laws(name, lay):
    from tilecore.ir import ThreadIndex

    # transposing twice is the identity; once, swaps coordinates
    assert lay.transpose().transpose() == lay
    t = lay.transpose()
    assert all(t.element(th, r) == tuple(reversed(lay.element(th, r)))
               for th in range(0, lay.threads, 7) for r in range(lay.regs))
    # coords_expr, evaluated for every thread, is element()
    for r in range(lay.regs):
        exprs = lay.coords_expr(ThreadIndex(), r)
        for th in range(lay.threads):
            assert tuple(_eval(e, th) for e in exprs) == lay.element(th, r), (th, r)
    if len(lay.shape) != 2:
        return
    for dim in (0, 1):
        p = lay.project(dim)
        p.check()
        # the projection holds each line's value where the line's elements are (reg_of), on the same threads
        assert p.owns_same(lay, dropped=dim)
        for th in range(0, lay.threads, 5):
            for r in range(lay.regs):
                coords = list(lay.element(th, r))
                coords.pop(dim)
                assert p.element(th, p.reg_of(lay, r, dropped=dim)) == tuple(coords)
        # tiling the other dimension commutes with the projection
        other = 1 - dim
        for space in ("thread", "reg"):
            tiled = lay.tile(other, 2, space)
            tiled.check()
            assert tiled.project(dim) == p.tile(other - (other > dim), 2, space)


@pytest.mark.parametrize("elem_bytes", [1, 2, 4, 8])
@pytest.mark.parametrize("sw", [0, 32, 64, 128])
def test_shared_layouts_are_bijections_for_every_swizzle_and_size(elem_bytes, sw):
    from tilecore.ir import IntImm

    cols = 256 // elem_bytes
    for lay in [SharedLayout(16, cols, elem_bytes, swizzle_bytes=sw)] + (
            [SharedLayout(16, cols, elem_bytes, pad=16 // elem_bytes or 1)] if not sw else []):
        lay.check()
        for r in range(0, 16, 3):
            for c in range(0, cols, 5):
                e = lay.offset_expr(IntImm(r), IntImm(c))
                assert _eval_xor(e) == lay.offset(r, c)


@pytest.mark.parametrize("sw,rows,row_bytes", [(sw, r, rb) for sw in (32, 64, 128)
                                                for r, rb in ((8, 32), (64, 64), (16, 128), (24, 256), (32, 512))
                                                if rb % sw == 0])
def test_paneled_layouts_swizzle_by_address_bits(sw, rows, row_bytes):
    """The paneled form is the descriptor-readable one: element (r, c) sits in panel c*e / sw at byte
    ``r * sw + chunk`` of it, and its 16-byte chunk is XORed with the byte address's bits 7.. (the rule
    stated as the address function, independently of the implementation); offset_expr agrees."""
    from tilecore.ir import IntImm

    e = 2
    cols = row_bytes // e
    lay = SharedLayout(rows, cols, e, swizzle_bytes=sw, panels=True)
    lay.check()
    assert lay.align_bytes == 8 * sw
    units = sw // 16
    for r in range(rows):
        for c in range(0, cols, 3):
            panel, within = divmod(c * e, sw)
            plain = panel * rows * sw + r * sw + within  # byte address, unswizzled
            chunk = (plain >> 4) % units ^ (plain >> 7) % units
            want = (plain & ~(16 * units - 1)) + chunk * 16 + plain % 16
            assert lay.offset(r, c) * e == want
            assert _eval_xor(lay.offset_expr(IntImm(r), IntImm(c))) == lay.offset(r, c)
    with pytest.raises(ValueError):
        SharedLayout(12, cols, e, swizzle_bytes=sw, panels=True)


def _eval_xor(e):
    from tilecore.ir import BinOp, IntImm

    if isinstance(e, IntImm):
        return e.value
    return _OPS[e.op](_eval_xor(e.a), _eval_xor(e.b))


def test_layout_pictures_are_up_to_date(tmp_path):
    """docs/layouts/*.svg are what scripts/draw_layouts.py draws from the registered layouts today."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("draw_layouts", root / "scripts" / "draw_layouts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main([str(tmp_path)])
    drawn = sorted(p.name for p in tmp_path.glob("*.svg"))
    committed = sorted(p.name for p in (root / "docs" / "layouts").glob("*.svg"))
    assert drawn == committed
    stale = [n for n in drawn if (tmp_path / n).read_text() != (root / "docs" / "layouts" / n).read_text()]
    assert not stale, f"re-run scripts/draw_layouts.py: {stale} changed"


@pytest.mark.parametrize("rows,cols,span", [(32, 64, 128), (64, 32, 64), (16, 16, 32)])
def test_swizzle_spreads_one_column_of_rows_over_the_span(rows, cols, span):
    """The rows a cooperative 8x8 operand load reads at one 16-byte column (8 consecutive rows) land in
    distinct 16-byte units of the span: what makes a 128-byte swizzle of 16-bit tiles free of bank conflicts
    (a shorter span repeats after span / 16 rows)."""
    lay = SharedLayout(rows, cols, 2, swizzle_bytes=span)
    lay.check()
    units = span // 16
    for col in range(0, cols, 8):
        for r0 in range(0, rows, units):
            got = {(lay.offset(r, col) * 2 // 16) % units for r in range(r0, r0 + units)}
            assert len(got) == units, (col, r0, got)


@pytest.mark.parametrize("shape,threads,regs", [((1, 8192), 256, 32), ((4, 256), 256, 4), ((3, 64), 128, 3),
                                                ((2, 16), 128, 1)])
def test_blocked_gives_idle_row_threads_more_columns(shape, threads, regs):
    # rows fewer than the threads' row groups: the idle threads take columns (replicas only where even the
    # columns run out: (2, 16) over 128 threads, (3, 64) over 128 keeps 2 copies)
    lay = blocked(shape, threads)
    lay.check()
    assert lay.regs == regs and lay.threads == threads
    held = lay.threads * lay.regs // (shape[0] * shape[1])
    assert held == {(1, 8192): 1, (4, 256): 1, (3, 64): 2, (2, 16): 4}[shape]
