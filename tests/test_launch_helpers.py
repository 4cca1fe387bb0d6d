"""The core launch helpers (tilecore.runtime.launch) the CPU, CUDA and WebGPU runtimes share."""
import pytest

from tilecore.errors import KernelAssertionError, KernelRuntimeError
from tilecore.runtime.launch import AssertionTable, shape_fn


def test_shape_fn_evaluates_host_expressions_once_compiled():
    f = shape_fn(["((ints[0] + 127) // 128)", "min(ints[1], 4)", "3"])
    assert f([1000, 9]) == (8, 4, 3) and f([128, 2]) == (1, 2, 3)
    assert shape_fn([])([5]) == ()
    with pytest.raises(NameError):  # nothing but min / max / int is reachable from an expression
        shape_fn(["open('x')"])([])


def test_assertion_table_numbers_from_one_and_formats_bounds_checks():
    table = AssertionTable({"asserts": ["X must be non-negative (at k.py:3)",
                                        {"message": "A[{0}] out of bounds (at k.py:4)", "values": 1}]})
    assert table and len(table) == 2 and not AssertionTable({})
    e = table.failure(1)
    assert isinstance(e, KernelAssertionError) and "X must be non-negative" in str(e)
    assert table.records_values(2) and not table.records_values(1)
    e = table.failure(2, [17, 99])
    assert isinstance(e, KernelRuntimeError) and str(e) == "A[17] out of bounds (at k.py:4)"
    assert "assertion 7" in str(table.failure(7))  # a code the table does not know still names itself
