"""Row reductions of register fragments on WebGPU: subgroup shuffles against workgroup memory, one run.

    python benchmarks/webgpu_row_reductions.py [--rows 4096] [--cols 1024] [--br 16] [--threads 128]
                                               [--rep 20] [--rounds 3]

Softmax and RMSNorm from the conformance catalog (float32, ``br`` rows a block), each compiled three ways
and timed by the kernel's profiler (device timestamps where the adapter has them) on the same adapter, the
best of ``--rounds`` rounds that take every variant in turn:

- ``webgpu:desktop``: no subgroups in the profile; a row's partials meet in workgroup memory (the lowering
  every WebGPU target had before decision D21);
- ``webgpu`` capped at width 1 (``tilecore.webgpu.max_shuffle_width``): the two-path code with the
  run-time width forced to 1, so the workgroup-memory path (plus the entry's vote) runs;
- ``webgpu``: shuffles below the adapter's subgroup size, workgroup memory above it.

torch's CPU softmax / RMSNorm is listed for scale (on lavapipe the adapter is the same CPU).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import tilecore


def variants():
    return [("webgpu:desktop (workgroup memory)", "webgpu:desktop", None),
            ("webgpu, width capped at 1", "webgpu", {"tilecore.webgpu.max_shuffle_width": 1}),
            ("webgpu (subgroup shuffles)", "webgpu", None)]


def main() -> int:
    from tilecore_conformance import composite

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--br", type=int, default=16)
    ap.add_argument("--threads", type=int, default=128)
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((args.rows, args.cols)).astype(np.float32)
    refs = {"softmax": composite.softmax_ref([x], "float32")[0], "rmsnorm": composite.rmsnorm_ref([x], "float32")[0]}
    gbytes = 2 * x.nbytes / 1e9
    kernels = {}
    for name in ("softmax", "rmsnorm"):
        for label, target, configs in variants():
            make = getattr(composite, name)
            kern = tilecore.compile(make("float32", args.rows, args.cols, args.br, args.threads), target=target,
                                    pass_configs=configs)
            y = np.full_like(x, np.nan)
            kern(x, y)
            kernels[name, label] = (kern, float(np.abs(y - refs[name]).max()))
    # rounds over every variant in turn (the best of each is kept): the clock of a GPU that has just woken
    # up does not favour whichever variant runs last
    best: dict = {}
    for _ in range(args.rounds):
        for key, (kern, _err) in kernels.items():
            ms = kern.get_profiler().do_bench(warmup=3, rep=args.rep)
            best[key] = min(best.get(key, ms), ms)
    rows = []
    for name in ("softmax", "rmsnorm"):
        for label, _target, _configs in variants():
            kern, err = kernels[name, label]
            ms, shuffles = best[name, label], kern.get_kernel_source().count("subgroupShuffleXor(")
            rows.append((name, label, f"{ms:.3f}", f"{gbytes / (ms / 1e3):.2f}", str(shuffles), f"{err:.1e}"))
        try:
            import time

            import torch

            t = torch.from_numpy(x)
            fn = (lambda: torch.softmax(t, 1)) if name == "softmax" else \
                (lambda: t * torch.rsqrt((t * t).mean(1, keepdim=True) + 1e-6))
            fn()
            t0 = time.perf_counter()
            for _ in range(args.rep):
                fn()
            ms = (time.perf_counter() - t0) / args.rep * 1e3
            rows.append((name, f"torch CPU ({torch.get_num_threads()} threads)", f"{ms:.3f}",
                         f"{gbytes / (ms / 1e3):.2f}", "-", "-"))
        except ImportError:
            pass
    print(f"{args.rows}x{args.cols} float32, {args.br} rows a block, {args.threads} threads")
    print("| kernel | variant | ms | GB/s | subgroupShuffleXor in WGSL | max abs error |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
