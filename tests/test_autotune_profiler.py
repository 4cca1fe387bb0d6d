"""@tilecore.autotune and kernel.get_profiler(), through the TileLang-style API."""
from __future__ import annotations

import json
import multiprocessing
import os

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.errors import CompileError


def make_tuned(log):
    """The tuned factory; every call of it appends "<pid> <block>" to the file ``log`` (configs compile in
    worker processes, where a list of the test's would not see them)."""
    @tilecore.autotune(configs=[{"block": 32}, {"block": 64}, {"block": 128}], warmup=1, rep=3)
    @tilecore.jit(out_idx=[-1], target="cpu")
    def scale(n, block=32):
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()} {block}\n")

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
    log = tmp_path / "calls.txt"

    def calls():
        rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
        return [int(b) for _, b in rows], {int(p) for p, _ in rows}

    tuned = make_tuned(log)
    k = tuned(1000)
    blocks, pids = calls()
    assert sorted(blocks) == [32, 64, 128]
    if "fork" in multiprocessing.get_all_start_methods() and (os.cpu_count() or 1) > 1:
        assert os.getpid() not in pids  # every config compiled in a worker process
    assert k.config in ({"block": 32}, {"block": 64}, {"block": 128}) and k.latency > 0
    a = np.arange(1000, dtype=np.float32)
    np.testing.assert_array_equal(k(a), 3 * a)
    assert tuned(1000) is k                               # in memory
    records = list((tmp_path / "autotune").glob("*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["config"] == k.config
    log.unlink()
    again = make_tuned(log)(1000)                         # a new process would do the same: only the winner
    assert calls() == ([k.config["block"]], {os.getpid()}) and again.config == k.config


def test_autotune_workers_report_a_failing_config_and_keep_the_others(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path))

    @tilecore.autotune(configs=[{"block": 32}, {"block": 48}], warmup=1, rep=3)
    @tilecore.jit(out_idx=[-1], target="cpu")
    def f(n, block=32):
        if block == 48:
            raise CompileError("block 48 is not a power of two")
        return make_tuned(tmp_path / "log").factory(n, block)

    k = f(256)
    assert k.config == {"block": 32}
    a = np.arange(256, dtype=np.float32)
    np.testing.assert_array_equal(k(a), 3 * a)


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
