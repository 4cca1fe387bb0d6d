"""The burst the GEMM table times, launch by launch: each kernel's own duration and the gap before it (D76).

    python benchmarks/gemm_burst.py [--sizes 4096,8192] [--dtypes float16,bfloat16] [--launches 30]
        [--configs 128:256:64:256:3:8] [--cycles NAME=CYCLES ...]

``benchmarks/cuda_gemm.py`` (the issue's table) times 10 back-to-back launches between two CUDA events, best of three
batches. In so short a burst the SM clock starts high and the power loop lowers it within milliseconds (D64), and a
launch costs more than its kernel: the gap from one kernel's end to the next one's start. This script runs each
kernel ``--launches`` times back to back after a second of idle GPU (the clock back up) under torch's profiler (CUPTI
timestamps) and prints, per kernel: the duration of launches 1, 2, 3, 5, 10, 20, ... (the clock's fall shows as
longer kernels), the mean of the first 10 (what the table's batch sees), the median duration and the median gap
between kernels (a launch's own cost: cuBLAS's includes the memset torch.matmul issues before its GEMM); the same
for cuBLAS (torch.matmul) in the same run, and the ratios (kernel alone; kernel and gap: what back-to-back calls
see). ``--variants NAME=JSON;...`` adds rows of each tilecore block under other pass configs. A programmatic
dependent launch (``--pdl``, D76) starts before the kernel ahead of it ends: CUPTI's duration counts from its start,
so its durations overlap (negative gaps) and only the "median + gap" column compares it. ``--cycles NAME=N`` (the kernel's cycles from ncu at a
locked clock, ``scripts/gemm_profile.py``) adds the clock each launch ran at: N / duration.

Needs a GPU (exits 3 without one, saying so); never asserts timings.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cuda_gemm import NO_GPU_EXIT, has_gpu, triton_matmul  # noqa: E402
from _gemm_rows import parse_variants, square_rows  # noqa: E402


def burst(fn, launches: int, match) -> tuple[list, list]:
    """(durations, gaps) in microseconds of the ``launches`` kernels of one back-to-back burst of ``fn``: CUDA
    kernels whose name ``match`` accepts, in start order; gaps[i]: start of kernel i + 1 - end of kernel i."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    time.sleep(1.0)  # an idle second: the clock back up, as at the start of the table's timing
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(launches):
            fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile("w+", suffix=".json", delete=False) as f:
        path = f.name
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    ev = sorted((float(e["ts"]), float(e["dur"])) for e in trace.get("traceEvents", [])
                if e.get("ph") == "X" and e.get("cat", "").lower() == "kernel" and match(e.get("name", "")))
    durs = [d for _, d in ev]
    gaps = [ev[i + 1][0] - (ev[i][0] + ev[i][1]) for i in range(len(ev) - 1)]
    return durs, gaps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--launches", type=int, default=30)
    ap.add_argument("--configs", default="128:256:64:256:3:8", help="tilecore blocks bm:bn:bk:threads:stages:panel")
    ap.add_argument("--triton", action="store_true", help="add cuda_gemm.py's plain Triton GEMM")
    ap.add_argument("--pdl", action="store_true",
                    help="each tilecore block also as a programmatic dependent launch (tilecore.cuda.programmatic_launch)")
    ap.add_argument("--variants", default="",
                    help="more rows: each tilecore block under these pass configs, ';'-separated NAME=JSON or the "
                         "name of a benchmarks/general_gemm.py variant")
    ap.add_argument("--cycles", action="append", default=[], metavar="LABEL@DTYPE@SIZE=CYCLES",
                    help="a kernel's cycles (ncu, locked clock) for the clock column, e.g. cuBLAS@float16@4096=312000")
    args = ap.parse_args()
    variants = parse_variants(args.variants, ap.error)
    ok, why = has_gpu()
    if not ok:
        print(f"no GPU: {why}")
        return NO_GPU_EXIT
    import torch

    cycles = {}
    for c in args.cycles:
        k, _, v = c.partition("=")
        cycles[k] = float(v)
    triton = triton_matmul() if args.triton else None
    print(f"device: {torch.cuda.get_device_name()}; {args.launches} launches a burst, each after 1 s idle")
    show = [i for i in (1, 2, 3, 5, 10, 20, 30, 50, 100) if i <= args.launches]
    rows = [("", {})] + ([("pdl", {"tilecore.cuda.programmatic_launch": True})] if args.pdl else []) + variants
    for dtype in args.dtypes.split(","):
        for size in (int(s) for s in args.sizes.split(",") if s):
            # each burst runs its kernel alone: cuBLAS's and Triton's are any kernel their call launched
            flop, kernels = square_rows(size, dtype, args.configs, rows, triton)
            print(f"\n{dtype} {size}^3: kernel durations in us by launch (CUPTI), gaps between kernels")
            head = "| kernel | " + " | ".join(f"#{i}" for i in show) + " | mean 1-10 | median | TFLOP/s (median) | " + \
                "gap us median / max | median vs cuBLAS | median + gap vs cuBLAS | clock MHz #1 / #10 |"
            print(head)
            print("|" + "---|" * (head.count("|") - 1))
            base = None
            for label, fn, match in kernels:
                try:
                    durs, gaps = burst(fn, args.launches, match)
                except Exception as e:  # noqa: BLE001 (a profiler another tool holds)
                    print(f"| {label} | profiler failed: {type(e).__name__}: {str(e)[:120]} |")
                    continue
                if len(durs) < min(10, args.launches):
                    print(f"| {label} | only {len(durs)} kernels seen |")
                    continue
                m10 = sum(durs[:10]) / 10
                med = statistics.median(durs)
                gap = statistics.median(gaps) if gaps else float("nan")
                if base is None:
                    base = (med, gap)
                cyc = cycles.get(f"{label.split()[0]}@{dtype}@{size}")
                clk = f"{cyc / durs[0]:.0f} / {cyc / durs[9]:.0f}" if cyc else "-"
                print(f"| {label} | " + " | ".join(f"{durs[i - 1]:.1f}" for i in show) +
                      f" | {m10:.1f} | {med:.1f} | {flop / med / 1e6:.1f} | {gap:.2f} / {max(gaps or [0]):.1f} | "
                      f"{base[0] / med:.3f}x | {(base[0] + base[1]) / (med + gap):.3f}x | {clk} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
