"""Timing (TileLang's ``tilelang.profiler``): ``do_bench(fn)`` and the kernel ``Profiler``."""
from __future__ import annotations

import statistics
import sys
import time

__all__ = ["do_bench", "Profiler"]


def _sync() -> None:
    """Wait for torch's accelerator work (queued asynchronously), if torch is loaded and has one."""
    torch = sys.modules.get("torch")
    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available():
        acc.synchronize()


def do_bench(fn, warmup: float = 25, rep: float = 100, _n_warmup: int = 0, _n_repeat: int = 0, quantiles=None,
             fast_flush: bool = True, backend: str = "event", return_mode: str = "mean", **_ignored):
    """Time ``fn()`` in milliseconds with the host clock, waiting for torch's accelerator work after each run.

    As in TileLang, ``warmup`` and ``rep`` are milliseconds of running (the counts follow from a first
    estimate) unless ``_n_warmup`` / ``_n_repeat`` give counts. ``backend`` ("event", "cupti",
    "cudagraph") is accepted; every backend is timed the same way here. L2 flushing is not done.
    """
    if return_mode not in ("min", "max", "mean", "median"):
        raise ValueError(f"do_bench: return_mode must be min, max, mean or median, got {return_mode!r}")
    fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(5):
        fn()
    _sync()
    estimate_ms = max((time.perf_counter() - t0) * 1e3 / 5, 1e-6)
    n_warmup = _n_warmup or max(1, int(warmup / estimate_ms))
    n_repeat = _n_repeat or max(1, int(rep / estimate_ms))
    from ..runtime.profiler import timed_runs

    times = timed_runs(fn, _sync, n_warmup, n_repeat, time.perf_counter)
    if quantiles is not None:
        ordered = sorted(times)
        return [ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in quantiles]
    return {"min": min, "max": max, "mean": statistics.fmean, "median": statistics.median}[return_mode](times)


def __getattr__(name):
    if name == "Profiler":
        from ..runtime.profiler import Profiler

        return Profiler
    from ..errors import not_provided

    raise not_provided("tilecore.profiler", name)
