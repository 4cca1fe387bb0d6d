"""Host-side costs of the CUDA backend, each against its reference in the same run (issue 17's host rows):

    python benchmarks/host_costs.py [--target cuda] [--launches 5000]

- host time per launch of a small 3-tensor kernel (a 4096-element add, ``kernel(x, y, z)``) against
  ``torch.add(x, y, out=z)``: wall time of back-to-back calls, the GPU work being smaller than the host's;
  with the compiled launcher (tilecore/runtime/launcher.c) reading tensors through torch's C shim (D57, the
  default), the same launcher reading them through torch's getters (``TILECORE_C_LAUNCHER=getters``, D23's path),
  and the Python binder (``TILECORE_C_LAUNCHER=0``), in interleaved rounds; and the parts of a launch timed
  alone (tensor metadata reads, the device and stream queries, cuLaunchKernel through ctypes);
- the same calls' host cost alone: 400 calls while the GPU is held busy (``torch.cuda._sleep``), so the launch
  queue never fills and no call waits for the GPU (the back-to-back row becomes the GPU's time per tiny kernel
  once the queue is full, wherever that is longer than the host's cost);
- the same launch captured in a CUDA graph and replayed (``kernel`` inside ``torch.cuda.graph``);
- cold compile of the WGMMA GEMM (128x256x64, 4 stages) in a fresh process, torch already imported, no
  cache, split into NVRTC and the rest;
- ``@tilecore.autotune`` compiling 8 GEMM configs with worker threads against worker processes, each in a
  fresh process with an empty cache (1024^3, warmup=1, rep=1: the timing of the 8 kernels is noise).

Without a GPU it prints the compile rows only (NVRTC compiles for the target without one) and exits 3.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
NO_GPU_EXIT = 3

COLD = """
import sys, time
sys.path.insert(0, {here!r})
import torch, tilecore
import tilecore_cuda.compiler as cc
from cuda_gemm import matmul
orig, spent = cc.build_nvrtc, [0.0]
def timed(*a, **k):
    t = time.perf_counter(); r = orig(*a, **k); spent[0] += time.perf_counter() - t; return r
cc.build_nvrtc = timed
f = matmul(4096, 4096, 4096, 128, 256, 64, 256, 4)
t = time.perf_counter()
tilecore.compile(f, target={target!r}, pass_configs={{'tilecore.disable_cache': True,
                                                  'tilecore.extra_flags': ['--no-cache']}})
total = time.perf_counter() - t
print(total, spent[0])
"""

PROFILE = """
import sys, cProfile, pstats
sys.path.insert(0, {here!r})
import torch, tilecore
from cuda_gemm import matmul
f = matmul(4096, 4096, 4096, 128, 256, 64, 256, 4)
pr = cProfile.Profile(); pr.enable()
tilecore.compile(f, target={target!r}, pass_configs={{'tilecore.disable_cache': True}})
pr.disable()
pstats.Stats(pr).sort_stats("cumulative").print_stats(40)
"""

TUNE = """
import sys, time
sys.path.insert(0, {here!r})
import torch, tilecore
import tilecore.language as T
from cuda_gemm import matmul
CONFIGS = [dict(bm=bm, bn=bn, bk=bk, st=st) for bm in (64, 128) for bn in (64, 128) for bk in (32, 64) for st in (3,)]

@tilecore.autotune(configs=CONFIGS, warmup=1, rep=1, verbose=False)
@tilecore.jit(target={target!r})
def gemm(n, bm=64, bn=64, bk=32, st=3):
    return matmul(n, n, n, bm, bn, bk, 128, st)

t = time.perf_counter()
gemm(1024)
print(time.perf_counter() - t)
"""


def fresh(code: str, env: dict | None = None, text: bool = False):
    # run from / : with `python -c` the current directory comes first on sys.path, and the repository root
    # would shadow the installed wheels with the tree's own packages (whose bytecode may not be cached)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip()[-600:])
    if text:
        return proc.stdout
    # the numbers of the last line (NVRTC has been seen to write a NUL byte to stdout)
    return [float(x) for x in re.findall(r"[0-9.]+(?:e-?[0-9]+)?", proc.stdout.strip().splitlines()[-1])]


def breakdown(k, x, torch, host_us) -> list:
    """Where a launch's host time goes: each part timed alone (the GPU held busy, the queue never full), less the
    loop's own cost (an empty lambda), on the kernel's program after its Python-path launches."""
    import ctypes

    prog = k._program
    empty = host_us(lambda: None)
    parts = {
        "tensor metadata, 3 tensors (dtype, shape, is_cuda, is_contiguous(), data_ptr())":
            lambda: (x.dtype, x.shape, x.is_cuda, x.is_contiguous(), x.data_ptr()),
        "current device + current stream (torch._C)":
            lambda: prog._get_stream(prog._get_device()),
    }
    out = []
    for what, fn in parts.items():
        per = host_us(fn) - empty
        out.append((f"  of which: {what}", f"{per * (3 if what.startswith('tensor') else 1):.2f} us", ""))
    nb, ni, nf, store, dbl, params = prog._last_slots
    grid, stream = prog._grid or prog.grid_fn([]), ctypes.c_void_p(prog._get_stream(prog._get_device()))
    launch = prog._cuLaunchKernel
    per = host_us(lambda: launch(prog._func, grid[0], grid[1], grid[2], prog.threads, 1, 1, prog.dyn_shared, stream,
                                 params, None)) - empty
    out.append(("  of which: cuLaunchKernel called through ctypes (arguments ready)", f"{per:.2f} us",
                "the driver's own cost plus about 0.8 us of ctypes"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--launches", type=int, default=5000)
    ap.add_argument("--profile-compile", action="store_true", help="print where a cold compile's time goes (cProfile)")
    ap.add_argument("--launch-only", action="store_true", help="only the launch rows (no cold compile, no autotune)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the launch rows (best of each)")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from cuda_gemm import has_gpu, vadd

    ok, why = has_gpu()
    target = args.target if ok else "cuda:sm_90a"
    rows = []
    # three fresh processes after an unmeasured one, NVRTC's own cache off (--no-cache), with a bytecode cache
    # as installed packages have even where PYTHONDONTWRITEBYTECODE is set (0.14 s per process otherwise; D25)
    if not args.launch_only:
        with tempfile.TemporaryDirectory(prefix="tilecore-pyc-") as pyc:
            benv = {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": pyc}
            runs = [fresh(COLD.format(here=str(HERE), target=target), env=benv) for _ in range(4)][1:]
        total, nvrtc = sorted(runs)[1]
        rows.append(("cold compile, WGMMA GEMM 128x256x64, fresh process (torch imported), median of 3",
                     f"{total:.2f} s", f"NVRTC {nvrtc:.2f} s + tilecore {total - nvrtc:.2f} s; each run: "
                     + ", ".join(f"{t:.2f}/{n:.2f}" for t, n in runs)))
    if args.profile_compile:
        print(fresh(PROFILE.format(here=str(HERE), target=target), text=True))
    times = {}
    for mode in (("0", "1") if ok and not args.launch_only else ()):  # autotune times its kernels: a GPU is needed
        with tempfile.TemporaryDirectory() as cache:
            times[mode] = fresh(TUNE.format(here=str(HERE), target=target),
                                {"TILECORE_CACHE_DIR": cache, "TILECORE_AUTOTUNE_PROCESSES": mode})[0]
    if ok and times:
        rows.append((f"@tilecore.autotune, 8 GEMM configs, {os.cpu_count()} CPUs: worker processes", f"{times['1']:.2f} s",
                     f"worker threads {times['0']:.2f} s ({times['0'] / times['1']:.1f}x)"))
    if ok:
        import torch

        import tilecore

        n = 1 << 12
        x, y, z = (torch.randn(n, device="cuda") for _ in range(3))
        k = tilecore.compile(vadd(n), target=target)

        def host_us(fn, loops=3):
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            best = float("inf")
            for _ in range(loops):
                t0 = time.perf_counter()
                for _ in range(args.launches):
                    fn()
                best = min(best, (time.perf_counter() - t0) / args.launches * 1e6)
                torch.cuda.synchronize()
            return best

        def host_only_us(fn, launches=400, loops=5):
            """Host time per call with the GPU held busy (``torch.cuda._sleep``) and fewer calls than the launch
            queue holds: no call waits for the GPU to drain the queue, so this is the host's cost alone. Back-to-back
            calls (``host_us``, 5000 of them) fill the queue, and from then on each call waits for the GPU to finish
            a kernel: there the row is the larger of the host's cost and the GPU's time per tiny kernel."""
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            best = float("inf")
            for _ in range(loops):
                torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles: longer than the timed loop
                t0 = time.perf_counter()
                for _ in range(launches):
                    fn()
                best = min(best, (time.perf_counter() - t0) / launches * 1e6)
                torch.cuda.synchronize()
            return best

        try:
            from tilecore.runtime.clauncher import why_unavailable
        except ImportError:  # a tree before the compiled launcher (device_check.sh's before-* steps)
            def why_unavailable():
                return "this tilecore has none"

        def first_call(mode):  # TILECORE_C_LAUNCHER is read at a kernel's first call
            kk = tilecore.compile(vadd(n), target=target)
            os.environ["TILECORE_C_LAUNCHER"] = mode
            try:
                kk(x, y, z)
            finally:
                os.environ.pop("TILECORE_C_LAUNCHER")
            return kk

        k_py, k_get = first_call("0"), first_call("getters")
        k(x, y, z)  # the default (D57 where this tree has it: tensors read through torch's C shim)
        compiled = getattr(k, "_native", None) is not None and getattr(k_py, "_native", None) is None
        reads = getattr(k._native, "reads", "getters") if compiled else "-"
        how = f"tensors through torch's {'C shim (D57)' if reads == 'shim' else 'getters'}" if compiled else "none here"
        variants = [(f"compiled launcher, {how}", lambda: k(x, y, z))]
        if reads == "shim" and getattr(k_get._native, "reads", None) == "getters":
            variants.append(("the same, before: torch's getters (TILECORE_C_LAUNCHER=getters: D23's path)",
                             lambda: k_get(x, y, z)))
        variants.append(("the same, Python binder (TILECORE_C_LAUNCHER=0)", lambda: k_py(x, y, z)))
        variants.append(("torch.add(x, y, out=z)", lambda: torch.add(x, y, out=z)))
        # interleaved rounds, best of each: the host's load and clocks drift over a run, and the rows are compared
        b2b, alone = {}, {}
        for _ in range(args.rounds):
            for name, fn in variants:
                b2b[name] = min(b2b.get(name, float("inf")), host_us(fn, 1))
                alone[name] = min(alone.get(name, float("inf")), host_only_us(fn, loops=2))
        ref = "torch.add(x, y, out=z)"
        first = variants[0][0]
        rows.append((f"host time per launch, 3-tensor add (4096 elements): back-to-back ({args.launches} calls) / the host's cost "
                     f"alone (GPU held busy, 400 calls: the launch queue never full); {args.rounds} interleaved rounds, best",
                     "", f"torch.add {b2b[ref]:.2f} / {alone[ref]:.2f} us"))
        for name, _ in variants[:-1]:
            note = f"torch.add / this: {b2b[ref] / b2b[name]:.2f}x / {alone[ref] / alone[name]:.2f}x"
            if name != first:
                note += f"; the first row saves {b2b[name] - b2b[first]:.2f} / {alone[name] - alone[first]:.2f} us"
            if name == first and not compiled:
                note += f"; NO compiled launcher here: {why_unavailable() or 'off'}"
            rows.append((name, f"{b2b[name]:.2f} / {alone[name]:.2f} us", note))
        try:
            rows += breakdown(k_py, x, torch, host_only_us)  # parts timed with the queue never full
        except (AttributeError, TypeError, ValueError) as e:  # an older tree's program keeps other state
            rows.append(("  the parts of a launch", "-", f"not measured with this tree: {e}"))
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            k(x, y, z)  # warm-up on the capture stream
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for _ in range(100):
                k(x, y, z)
        x.copy_(torch.randn(n, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        right = bool(torch.equal(z, x + y))
        per = host_us(g.replay) / 100
        rows.append(("the same launch, 100 per CUDA graph replay", f"{per:.2f} us", f"result right: {right}"))
    print("| measure | tilecore | reference, same run |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    if not ok:
        print(f"no GPU: {why}; launch rows skipped", file=sys.stderr)
        return NO_GPU_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
