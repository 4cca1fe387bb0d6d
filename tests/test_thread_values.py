"""tilecore.ir.thread_values: the one evaluator of thread-index arithmetic (the core's vectorizer and the CUDA
emitter's matrix-store offsets both decide from it): every thread's value exactly as the IR means it, or None."""

import numpy as np

from tilecore.ir import BinOp, Cast, Cmp, FloatImm, IntImm, Select, ThreadIndex, Var
from tilecore.ir.thread_values import thread_values

T = np.arange(256, dtype=np.int64)
TID = ThreadIndex()


def c(v):
    return IntImm(v, "int32")


def op(name, a, b):
    return BinOp(name, a, b, "int32")


def test_lane_row_and_column_of_a_fragment():
    lane = op("floormod", TID, c(32))
    row = op("add", op("mul", op("floordiv", TID, c(32)), c(16)), op("floordiv", lane, c(4)))
    col = op("mul", op("floormod", lane, c(4)), c(2))
    assert (thread_values(row, T) == (T // 32) * 16 + (T % 32) // 4).all()
    assert (thread_values(col, T) == (T % 32 % 4) * 2).all()


def test_select_compare_and_bit_operations():
    e = Select(Cmp("lt", op("bitand", TID, c(7)), c(4)), op("bitor", TID, c(1)), op("xor", TID, c(3)))
    assert (thread_values(e, T) == np.where((T & 7) < 4, T | 1, T ^ 3)).all()


def test_division_semantics():
    neg = op("sub", TID, c(100))  # negative at threads 0..99
    # floor division and modulo of a negative dividend are exact under numpy's floor semantics
    assert (thread_values(op("floordiv", neg, c(8)), T) == np.floor_divide(T - 100, 8)).all()
    assert (thread_values(op("floormod", neg, c(8)), T) == np.mod(T - 100, 8)).all()
    # C's truncating division / remainder of a negative dividend would differ from numpy's: refused
    assert thread_values(op("div", neg, c(8)), T) is None
    assert thread_values(op("mod", neg, c(8)), T) is None
    assert (thread_values(op("div", TID, c(8)), T) == T // 8).all()
    # a divisor that is zero or negative at some thread: refused
    assert thread_values(op("floordiv", c(64), op("sub", TID, c(3))), T) is None


def test_anything_but_the_thread_index_and_constants_is_refused():
    assert thread_values(op("add", TID, Var("n", "int32")), T) is None
    assert thread_values(Cast("int32", FloatImm(2.5, "float32")), T) is None
    assert thread_values(Cast("float32", TID), T) is None
    assert (thread_values(Cast("int64", TID), T) == T).all()


def test_memo_evaluates_a_shared_part_once():
    part = op("floordiv", TID, c(32))
    memo = {}
    first = thread_values(op("add", part, c(1)), T, memo)
    assert id(part) in memo and memo[id(part)][0] is part
    assert thread_values(part, T, memo) is memo[id(part)][1]
    assert (first == T // 32 + 1).all()
