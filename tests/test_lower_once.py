"""tests/lower_once.py (D89): the memo the compile-only CUDA tests lower through serves a result only for the same
inputs, lowers again for any input ``tilecore.compiler.lower`` reads, and keeps no error."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import lower_once as memo  # noqa: E402
from kernels_for_tests import vadd as _vadd  # noqa: E402

from tilecore.compiler import lower  # noqa: E402
from tilecore.errors import TilecoreError  # noqa: E402


def vadd(n, **kw):
    return _vadd.get_tir(n, **kw)  # a new @T.prim_func each call


def _counts():
    return dict(memo.STATS)


def test_the_same_inputs_are_served_and_equal_a_fresh_lowering():
    before = _counts()
    a = memo.lower_once(vadd(1000), "cpu", {"tilecore.disable_cache": True})
    b = memo.lower_once(vadd(1000), "cpu", {})  # a new but identical kernel; the cache's switch is not an input
    assert b is a
    assert memo.STATS["lowered"] - before["lowered"] == 1 and memo.STATS["served"] - before["served"] == 1
    assert a[3].code == lower(vadd(1000), "cpu", {})[3].code
    assert memo.lower_once(vadd(1000), "cpu", {}, fresh=True) is not a


def test_each_input_that_lower_reads_lowers_again(monkeypatch):
    base = memo.lower_once(vadd(1000), "cpu", {})
    others = [memo.lower_once(vadd(1001), "cpu", {}),                        # the kernel's IR
              memo.lower_once(vadd(1000, block=64), "cpu", {}),              # the same shape, another kernel
              memo.lower_once(vadd(1000), "cpu", {"tilecore.checked": True})]  # a pass config
    monkeypatch.setenv("TILECORE_PASS_CONFIGS", '{"tilecore.checked": true}')  # the process's configs
    others.append(memo.lower_once(vadd(1000), "cpu", {}))
    assert all(o is not base for o in others) and len({id(o) for o in others}) == len(others)
    assert others[-1][3].code == others[2][3].code  # the configs the process gives are the compile's own


def test_an_error_is_raised_each_time_and_not_kept():
    before = _counts()
    for _ in range(2):
        with pytest.raises(TilecoreError):
            memo.lower_once(vadd(1000), "nosuchtarget:x", {})
    assert memo.STATS == before
