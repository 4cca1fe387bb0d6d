"""GEMM under the power cap: throughput, SM clock, board power and work per clock cycle, cuBLAS beside.

    python benchmarks/gemm_power.py [--sizes 4096,8192] [--dtypes float16,bfloat16] [--seconds 4] [--triton]

Issue 17 asks for 1.05x cuBLAS on large GEMMs. A large GEMM on an H100 / H200 runs into the board's power limit
long before its tensor cores run out: the SM clock drops until the power fits. Then throughput is
``(work per cycle) x (cycles per second)``, and a kernel can gain by doing more work per cycle (a better schedule)
or by spending less energy per unit of work (fewer shared-memory reads per flop, fewer instructions), which lets the
clock rise. This script tells the two apart: each kernel runs back to back for ``--seconds`` while ``nvidia-smi``
samples the GPU's SM clock, power draw and clock-event reasons every 50 ms; the table gives, per kernel, TFLOP/s,
the mean SM clock and power over the steady part of the run (the first 20% dropped), the work per SM and cycle
(dense FLOP / (SMs x clock)), the energy per PFLOP, and the ratio of each to cuBLAS's in the same run. The reasons
column names what held the clock back (``sw_power_cap``, ``hw_slowdown``, ``sw_thermal``...).

Kernels: cuBLAS (torch.matmul), tilecore's README GEMM at its best Hopper blocks (``--configs``, the cuda_gemm.py
format ``bm:bn:bk:threads:stages:panel``), and with ``--triton`` the plain Triton GEMM of cuda_gemm.py. Without a
GPU it says so and exits with status 3.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cuda_gemm import NO_GPU_EXIT, has_gpu, triton_matmul  # noqa: E402
from _gemm_rows import parse_variants, square_rows  # noqa: E402

#: nvidia-smi's clocks_event_reasons bits (nvml's clocksEventReason*), the ones that name a limit
REASONS = {0x1: "idle", 0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal",
           0x40: "hw_thermal", 0x80: "hw_power_brake"}


class Sampler:
    """``nvidia-smi -lms 50`` on one GPU in the background, its CSV lines in a file; ``window(t0, t1)`` gives the
    samples taken between two ``time.time()`` stamps."""

    def __init__(self, gpu: str):
        reasons = "clocks_event_reasons.active"  # the older drivers' name: clocks_throttle_reasons.active
        probe = subprocess.run(["nvidia-smi", "-i", gpu, f"--query-gpu={reasons}", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
        if probe.returncode != 0:
            reasons = "clocks_throttle_reasons.active"
        self.FIELDS = f"timestamp,clocks.sm,power.draw,{reasons}"
        self.file = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
        self.proc = subprocess.Popen(["nvidia-smi", "-i", gpu, f"--query-gpu={self.FIELDS}",
                                      "--format=csv,noheader,nounits", "-lms", "50"],
                                     stdout=self.file, stderr=subprocess.DEVNULL)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()

    def window(self, t0: float, t1: float) -> list:
        from datetime import datetime

        self.file.flush()
        with open(self.file.name) as f:
            rows = [line.strip().split(", ") for line in f if line.count(",") == 3]
        out = []
        for stamp, clock, power, reasons in rows:
            try:  # nvidia-smi prints local time as "2026/11/27 09:12:34.567"
                t = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
                out.append((t, float(clock), float(power), int(reasons, 16)))
            except ValueError:
                continue
        return [r for r in out if t0 <= r[0] <= t1]


def gpu_id(props) -> tuple:
    """(the ``nvidia-smi -i`` argument naming torch's device 0, "power limit, max SM clock"), or (None, why): by UUID
    (CUDA_VISIBLE_DEVICES renumbers torch's devices, not nvidia-smi's), else the first visible index."""
    ids = [f"GPU-{props.uuid}"] if getattr(props, "uuid", None) else []
    ids.append(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0")
    why = "no answer"
    for gpu in ids:
        try:
            p = subprocess.run(["nvidia-smi", "-i", gpu, "--query-gpu=power.limit,clocks.max.sm",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError) as e:
            return None, str(e)
        if p.returncode == 0 and p.stdout.strip():
            return gpu, p.stdout.strip()
        why = (p.stdout + p.stderr).strip() or f"exit status {p.returncode}"
    return None, why


def sustained(fn, seconds: float) -> tuple:
    """Run ``fn`` back to back for about ``seconds``; (ms per call over the last 80%, start, end stamps of that
    part)."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t_begin = time.time()
    t_steady = t_begin + 0.2 * seconds
    calls, ms = 0, 0.0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    while time.time() < t_steady:  # warm the clock and the power loop
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    t0 = time.time()
    while time.time() < t_begin + seconds:
        start.record()
        for _ in range(10):
            fn()
        end.record()
        end.synchronize()
        ms += start.elapsed_time(end)
        calls += 10
    return ms / calls, t0, time.time()


def kernel_names(fn) -> str:
    """The CUDA kernels one call of ``fn`` launches (torch's profiler): which cuBLAS kernel (tile, cluster) ran."""
    import torch

    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if str(e.device_type).endswith("CUDA")]
    except (RuntimeError, AttributeError) as e:  # a profiler another tool holds, or an older torch
        return f"(not known: the profiler said {e})"
    return ", ".join(dict.fromkeys(names)) or "(none seen)"


def row(label, flop, ms, samples, sms) -> dict:
    tflops = flop / ms / 1e9
    if not samples:
        return {"label": label, "tflops": tflops, "mhz": float("nan"), "watts": float("nan"), "per_cycle": float("nan"),
                "j_per_pflop": float("nan"), "reasons": "no samples"}
    mhz = sum(s[1] for s in samples) / len(samples)
    watts = sum(s[2] for s in samples) / len(samples)
    seen = 0
    for s in samples:
        seen |= s[3]
    names = [n for bit, n in REASONS.items() if seen & bit] or ["none"]
    return {"label": label, "tflops": tflops, "mhz": mhz, "watts": watts,
            "per_cycle": tflops * 1e12 / (sms * mhz * 1e6),  # dense FLOP per SM and clock cycle
            "j_per_pflop": watts / tflops * 1e3, "reasons": "+".join(names)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4096,8192", help="square GEMM sizes M=N=K, comma-separated")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--seconds", type=float, default=4.0, help="how long each kernel runs back to back")
    ap.add_argument("--configs", default="128:256:64:256:3:8,128:256:64:256:4:8",
                    help="tilecore blocks bm:bn:bk:threads:stages:panel, comma-separated (each its own row)")
    ap.add_argument("--variants", default="default={}",
                    help="pass configs each tilecore block runs under, ';'-separated NAME=JSON or the name of a "
                         "benchmarks/general_gemm.py variant, e.g. 'default={};ws-mc'")
    ap.add_argument("--triton", action="store_true", help="add cuda_gemm.py's plain Triton GEMM")
    args = ap.parse_args()
    # "default" names the block's own row (no suffix in its label)
    variants = [("" if n == "default" else n, pc) for n, pc in parse_variants(args.variants, ap.error)]

    ok, why = has_gpu()
    if not ok:
        print(f"no GPU: {why}")
        return NO_GPU_EXIT
    import torch

    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    gpu, limit = gpu_id(props)
    if gpu is None:
        print(f"nvidia-smi is not usable here ({limit}): this benchmark needs it for the clock and power samples")
        return 2
    print(f"{props.name}, {sms} SMs; power limit W, max SM MHz: {limit}")
    triton = triton_matmul() if args.triton else None
    if args.triton and triton is None:
        print("(Triton is not installed: its rows are left out)")
    sampler = Sampler(gpu)
    time.sleep(0.5)
    try:
        for dtype in args.dtypes.split(","):
            for size in (int(s) for s in args.sizes.split(",") if s):
                M = N = K = size
                flop, kernels = square_rows(size, dtype, args.configs, variants, triton)
                rows = []
                for label, fn, _match in kernels:
                    ms, t0, t1 = sustained(fn, args.seconds)
                    time.sleep(0.3)  # the last samples of the window written
                    rows.append(row(label, flop, ms, sampler.window(t0, t1), sms))
                    time.sleep(1.0)  # cool down a little between kernels: each starts from a similar state
                base = rows[0]
                print(f"\n{dtype} {M}x{N}x{K} ({args.seconds:g} s each, the last 80% sampled); cuBLAS ran "
                      f"{kernel_names(kernels[0][1])}")
                print("| kernel | TFLOP/s | vs cuBLAS | SM MHz | W | FLOP per SM-cycle | vs cuBLAS | J per PFLOP "
                      "| vs cuBLAS | clock held by |")
                print("|---|---|---|---|---|---|---|---|---|---|")
                for r in rows:
                    print(f"| {r['label']} | {r['tflops']:.1f} | {r['tflops'] / base['tflops']:.3f}x | {r['mhz']:.0f} "
                          f"| {r['watts']:.0f} | {r['per_cycle']:.0f} | {r['per_cycle'] / base['per_cycle']:.3f}x "
                          f"| {r['j_per_pflop']:.1f} | {r['j_per_pflop'] / base['j_per_pflop']:.3f}x | {r['reasons']} |")
                sys.stdout.flush()
    finally:
        sampler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
