"""Thread distribution's coordinates (tilecore.passes.simt): where the flat element ``it * n + tid`` splits
between the trip and thread indices, each coordinate is written in them directly (``i = it``, ``j = tid``);
it must be the same integer as ``idx / stride % extent`` for every thread and trip that runs the element."""
from __future__ import annotations

import itertools
import math

import pytest

from tilecore.ir import BinOp, ThreadIndex, Var, const_value
from tilecore.passes.simt import _coordinate


def _eval(e, it: int, tid: int) -> int:
    if isinstance(e, ThreadIndex):
        return tid
    if isinstance(e, Var):
        return it
    v = const_value(e)
    if isinstance(v, int):
        return v
    assert isinstance(e, BinOp), e
    a, b = _eval(e.a, it, tid), _eval(e.b, it, tid)
    if e.op == "div":
        assert a >= 0 and b > 0  # C division of non-negative operands is floor division
        return a // b
    return {"add": a + b, "sub": a - b, "mul": a * b}[e.op]


SHAPES = [(32, 128), (128, 4), (4, 128), (3, 5, 7), (2, 64, 2), (1000,), (16, 8, 8), (5, 96), (64, 2, 3)]


@pytest.mark.parametrize("n", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("shape", SHAPES)
def test_coordinates_match_the_flat_division(n, shape):
    total = math.prod(shape)
    single = total <= n
    it_var = Var("it")
    for d, extent in enumerate(shape):
        stride = math.prod(shape[d + 1:])
        q = _coordinate(it_var, ThreadIndex(), n, total, stride, extent, d == 0, single)
        if q is None:
            continue  # the general form (not rewritten)
        for it, tid in itertools.product(range(-(-total // n)), range(n)):
            idx = it * n + tid
            if idx >= total:
                continue  # guarded off: the element does not exist
            want = idx // stride if d == 0 else idx // stride % extent
            assert _eval(q, it, tid) == want, (shape, n, d, it, tid)


def test_the_common_tiles_are_rewritten():
    """A 32x128 tile over 128 threads: i = it, j = tid (no division at run time)."""
    it = Var("it")
    i = _coordinate(it, ThreadIndex(), 128, 4096, 128, 32, True, False)
    j = _coordinate(it, ThreadIndex(), 128, 4096, 1, 128, False, False)
    assert i is it and isinstance(j, ThreadIndex)
    assert _coordinate(it, ThreadIndex(), 96, 4096, 128, 32, True, False) is None  # 128 and 96: no split
