"""@tilecore.autotune and kernel.get_profiler(), through the TileLang-style API."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.errors import CompileError


def make_tuned(calls):
    @tilecore.autotune(configs=[{"block": 32}, {"block": 64}, {"block": 128}], warmup=1, rep=3)
    @tilecore.jit(out_idx=[-1], target="cpu")
    def scale(n, block=32):
        calls.append(block)

        @T.prim_func
        def scale_k(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
            with T.Kernel(T.ceildiv(n, block)) as bx:
                for i in T.Parallel(block):
                    if bx * block + i < n:
                        B[bx * block + i] = A[bx * block + i] * 3.0
        return scale_k
    return scale


def test_autotune_picks_a_config_and_remembers_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path))
    calls = []
    tuned = make_tuned(calls)
    k = tuned(1000)
    assert sorted(calls) == [32, 64, 128]
    assert k.config in ({"block": 32}, {"block": 64}, {"block": 128}) and k.latency > 0
    a = np.arange(1000, dtype=np.float32)
    np.testing.assert_array_equal(k(a), 3 * a)
    assert tuned(1000) is k                               # in memory
    records = list((tmp_path / "autotune").glob("*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["config"] == k.config
    calls2 = []
    again = make_tuned(calls2)(1000)                      # a new process would do the same: only the winner
    assert calls2 == [k.config["block"]] and again.config == k.config


def test_autotune_rejects_unknown_config_keys():
    calls = []

    @tilecore.autotune(configs=[{"blk": 32}])
    @tilecore.jit(out_idx=[-1], target="cpu")
    def f(n, block=32):
        calls.append(1)

    with pytest.raises(CompileError, match=r"names \['blk'\], which f does not take"):
        f(100)


def test_profiler_times_and_checks():
    from kernels_for_tests import vadd

    k = vadd(4096)
    prof = k.get_profiler()
    ms = prof.do_bench(warmup=2, rep=5)
    assert 0 < ms < 1000
    prof.assert_allclose(lambda a, b: a + b, atol=0, rtol=0)
    with pytest.raises(AssertionError):
        prof.assert_allclose(lambda a, b: a - b, atol=0, rtol=0)
