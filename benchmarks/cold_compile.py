"""Cold compile of the WGMMA GEMM (issue 17: at most 0.5 s), before and after D25, in one run.

    python benchmarks/cold_compile.py [--repeat 5] [--target cuda:sm_90a] [--kernel 4096,128,256,64,256,4]

Each measurement is one ``tilecore.compile`` (tilecore's cache off, NVRTC's own cache off with
``--no-cache``) in a fresh Python process that has imported torch and tilecore before the clock starts,
as any process that launches CUDA kernels has. The children get a bytecode cache (``PYTHONPYCACHEPREFIX``
in a temporary folder, warmed by one unmeasured run) even where ``PYTHONDONTWRITEBYTECODE`` is set:
installed packages have their ``.pyc`` files, and without them every fresh process compiles tilecore's
modules again (0.14 s on the 2-core dev machine). The children use a private cache directory. Variants,
one column per change of D25, each with the ones above it:

- ``before D25``: every epilogue check compiled (``tilecore.cuda.keep_epilogue_checks``), cuda_fp8.h in
  every kernel, no ``--minimal``, capability files parsed in every process;
- ``+ proven epilogue checks dropped``: the Hopper pipeline's epilogue stores without the row, column and
  alignment checks the shapes prove (hopper.epilogue_flags);
- ``+ cuda_fp8.h and cuda_bf16.h only where used, --minimal``: the NVRTC front end;
- ``+ capability documents remembered``: parsed documents from the cache directory (the default).

Prints the median (and range) of the whole compile, the same in the process's CPU time (whole, tilecore's part,
NVRTC: steadier than wall time on a shared machine; on an idle one the two agree, NVRTC being one thread),
tilecore's own part (whole minus NVRTC), NVRTC's time and its phases (``--time``: C++ front end, NVVM, ptxas)
and the SASS instruction count of the kernel.
Needs NVRTC (no GPU): exits with status 3 where there is none.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

NO_TOOLCHAIN_EXIT = 3

# the child: torch and tilecore imported, then one timed compile; prints one JSON line
CHILD = r"""
import json, sys, time
sys.path.insert(0, {bench!r})
import torch, tilecore
import tilecore_cuda.codegen as cg, tilecore_cuda.compiler as cc
from cuda_gemm import matmul
old_headers, keep_checks, timefile = {old_headers!r}, {keep_checks!r}, {timefile!r}
if old_headers:  # the prelude and NVRTC flags of before D25
    cc.NVRTC_FLAGS = ()
    _prelude = cg.prelude
    # every header, as before
    cg.prelude = lambda hopper=False, *a, tma=False, splitk=False, persistent=False: _prelude(
        hopper, tma=tma, splitk=splitk, persistent=persistent)
nvrtc_s, nvrtc_cpu = [], []
_build = cc.build_nvrtc
def timed(*a, **k):
    t, c = time.perf_counter(), time.process_time()
    try:
        return _build(*a, **k)
    finally:
        nvrtc_s.append(time.perf_counter() - t)
        nvrtc_cpu.append(time.process_time() - c)
cc.build_nvrtc = timed
f = matmul(*{kernel!r})
pc = {{"tilecore.disable_cache": True, "tilecore.extra_flags": ["--no-cache", "--time=" + timefile],
       "tilecore.cuda.keep_epilogue_checks": keep_checks, **{extra!r}}}
t, c = time.perf_counter(), time.process_time()
k = tilecore.compile(f, target={target!r}, pass_configs=pc)
whole, whole_cpu = time.perf_counter() - t, time.process_time() - c
print(json.dumps({{"whole": whole, "nvrtc": sum(nvrtc_s), "whole_cpu": whole_cpu, "nvrtc_cpu": sum(nvrtc_cpu),
                  "binary": k.binary.hex() if {want_binary!r} else ""}}))
"""

# name, label, (old headers and flags, keep every epilogue check, parsed capability documents remembered, more
# pass configs)
VARIANTS = [("before", "before D25", (True, True, False, {})),
            ("epilogue", "+ proven epilogue checks dropped", (True, False, False, {})),
            ("headers", "+ fp8 and bf16 headers only where used, --minimal", (False, False, False, {})),
            ("after", "+ capability documents remembered (after, the default)", (False, False, True, {})),
            # what the persistent grid (D43) and its TMA-store epilogue (D38), both default, cost to compile
            ("per-tile", "the default, one block per tile (tilecore.cuda.persistent=False)",
             (False, False, True, {"tilecore.cuda.persistent": False})),
            ("direct", "the default, persistent with direct stores (tilecore.cuda.tma_store=False)",
             (False, False, True, {"tilecore.cuda.tma_store": False}))]
SETTINGS = {name: how for name, _, how in VARIANTS}


def phases(path: Path) -> dict:
    """NVRTC's --time table (appended per compile): phase -> ms of the last compile."""
    out: dict = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[3] == "ms":
            out[parts[1]] = float(parts[2])
    return out


def child(variant: str, args, env: dict, tmp: Path, want_binary: bool = False) -> dict:
    timefile = tmp / f"time-{variant}-{os.getpid()}.csv"
    if timefile.exists():
        timefile.unlink()
    old_headers, keep_checks, memo, extra = SETTINGS[variant]
    env = dict(env)
    if not memo:  # a cache directory as before D25: documents remembered valid, none remembered parsed
        cache = tmp / "cache-no-memo"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(mode=0o700)
        for f in Path(env["TILECORE_CACHE_DIR"]).glob("capabilities-valid.txt"):
            shutil.copy(f, cache / f.name)
        env["TILECORE_CACHE_DIR"] = str(cache)
    code = CHILD.format(bench=str(Path(__file__).resolve().parent), old_headers=old_headers, keep_checks=keep_checks,
                        timefile=str(timefile), kernel=tuple(args.kernel), target=args.target,
                        want_binary=want_binary, extra=extra)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant}: {proc.stderr.strip()[-600:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["phases"] = phases(timefile)
    return res


def sass_count(binary: bytes, target: str) -> int:
    import tilecore_cuda

    text = tilecore_cuda.CUDABackend().disassemble(binary, target)
    return sum(1 for ln in text.splitlines() if ln.strip().startswith("/*") and ";" in ln)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="fresh processes per variant (median reported)")
    ap.add_argument("--target", default="cuda:sm_90a")
    ap.add_argument("--kernel", default="4096,4096,4096,128,256,64,256,4",
                    help="cuda_gemm.matmul arguments M,N,K,block_M,block_N,block_K,threads,stages")
    args = ap.parse_args()
    args.kernel = [int(x) for x in args.kernel.split(",")]

    import tilecore_cuda.compiler as cc

    if not cc.nvrtc_usable():
        print(f"cold_compile.py: NVRTC is not usable here ({cc.toolchain() or 'no CUDA compiler'}); it measures NVRTC.")
        return NO_TOOLCHAIN_EXIT
    with tempfile.TemporaryDirectory(prefix="tilecore-cold-") as tmpdir:
        tmp = Path(tmpdir)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pyc")
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the same tilecore as this process
        (tmp / "cache").mkdir(mode=0o700)
        env["TILECORE_CACHE_DIR"] = str(tmp / "cache")  # private: the user's is left alone
        for variant in ("after", "before"):  # warm the bytecode cache, the disk and the cache dir; not measured
            child(variant, args, env, tmp)
        runs: dict = {variant: [] for variant, _, _ in VARIANTS}
        binaries = {}
        for r in range(args.repeat):  # round robin: a change in the machine's load hits every variant alike
            for variant, _, _ in VARIANTS:
                res = child(variant, args, env, tmp, want_binary=(r == 0))
                if r == 0:
                    binaries[variant] = bytes.fromhex(res["binary"])
                runs[variant].append(res)
        rows = [(variant, label, runs[variant]) for variant, label, _ in VARIANTS]
        print(f"cold compile, {args.target}, matmul{tuple(args.kernel)}, {args.repeat} fresh processes per variant "
              f"({cc.toolchain()}, {os.cpu_count()} CPUs); median (min-max) seconds, NVRTC phases in ms")
        print()
        print("| variant | whole | CPU time: whole / tilecore's part / NVRTC | tilecore's part | NVRTC | front end | "
              "NVVM | ptxas | SASS instructions |")
        print("|---|---|---|---|---|---|---|---|---|")
        base = base_cpu = None
        for variant, label, runs in rows:
            whole = [r["whole"] for r in runs]
            nv = [r["nvrtc"] for r in runs]
            own = [r["whole"] - r["nvrtc"] for r in runs]
            ph = {k: statistics.median(r["phases"].get(k, float("nan")) for r in runs)
                  for k in ("CUDA C++ Frontend", "NVVM Optimizer", "PTX Translation")}
            med = statistics.median(whole)
            base = base or med
            try:
                n = sass_count(binaries[variant], args.target)
            except BaseException as e:  # noqa: BLE001 - cuobjdump missing: the table still stands
                n = f"n/a ({type(e).__name__})"
            cpu = [r["whole_cpu"] for r in runs]
            cpu_nv = [r["nvrtc_cpu"] for r in runs]
            cpu_own = [r["whole_cpu"] - r["nvrtc_cpu"] for r in runs]
            cpu_med = statistics.median(cpu)
            base_cpu = base_cpu or cpu_med
            print(f"| {label} | {med:.3f} ({min(whole):.3f}-{max(whole):.3f}); {base / med:.2f}x | "
                  f"{cpu_med:.3f} / {statistics.median(cpu_own):.3f} / {statistics.median(cpu_nv):.3f}; "
                  f"{base_cpu / cpu_med:.2f}x | "
                  f"{statistics.median(own):.3f} | {statistics.median(nv):.3f} | {ph['CUDA C++ Frontend']:.0f} | "
                  f"{ph['NVVM Optimizer']:.0f} | {ph['PTX Translation']:.0f} | {n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
