"""The core layout model (tilecore.layout): fragment layouts are bijections, and compose lawfully."""
from __future__ import annotations

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
