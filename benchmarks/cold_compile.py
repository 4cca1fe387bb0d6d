"""Cold compile of the WGMMA GEMM (issue 17: at most 0.5 s in a fresh process with torch imported), per phase.

    python benchmarks/cold_compile.py [--repeat 7] [--cpus 1] [--variants default,per-tile,...] [--profile]
                                      [--target cuda:sm_90a] [--kernel 4096,4096,4096,128,256,64,256,4]

Each measurement is a fresh Python process that imports torch (before the clock: any process that launches CUDA
kernels has), then, timed: ``import tilecore`` and the kernel's module, the ``@T.prim_func`` (parse), and one
``tilecore.compile`` with tilecore's cache off and NVRTC's own cache off (``--no-cache``). On a machine with a
GPU the child also times the kernel's first launch (its CUDA context made before the clock, as torch's is in such
a process): the cubin load (``cuModuleLoadData``), the compiled launcher's build (from its cache) and the launch.

Steadiness (decision D48): every child is pinned to the same CPUs (``--cpus 1``: one core, the last this process
may use; ``--cpus 2``: the last two; ``--cpus all``: not pinned), the variants run round robin (a change in the
machine's load hits each alike), and each row gives the minimum, the median and the spread ((max - min) / median)
of ``--repeat`` processes, wall time and the process's CPU time. The children keep a bytecode cache
(``PYTHONPYCACHEPREFIX`` in a temporary folder, warmed by unmeasured runs) even where ``PYTHONDONTWRITEBYTECODE``
is set, as installed packages have their ``.pyc`` files, and a private tilecore cache directory.

The phase table (medians, ms, and each phase's share of the whole, from ``kernel.compile_times`` and NVRTC's
``--time``): import, parse, plugins (the backends' discovery), capabilities, toolchain (the device compiler's
library and version), key (cache key: IR text, code fingerprints), passes, codegen, build (NVRTC: C++ front end,
NVVM, ptxas, and what is left of the call), store, and on a GPU the first launch's parts. ``--profile`` runs one
more child of the first variant under cProfile (the Python part: the compile with NVRTC's call in it) and prints
its top functions.

Variants (``--variants``, a comma list; default all): the default build (the plain 16-bit GEMM on the core's general
path since D65), the plugin's Hopper pipeline (``plugin``: ``tilecore.cuda.general_plain_gemm=False``), the same with D48's changes undone
(``before D48``), the same with D50's undone (``peeled``: the persistent GEMM's last k step peeled off its loop,
the prelude's text rewritten as the plugin loads, benchmarks/persistent_peel.py), the tree before a change
(``before``, with ``--before-site DIR``: that tree's wheels installed in DIR; added when given), one block per tile, persistent with direct stores, NVRTC replaced by the nvcc subprocess, and
D25's columns (every epilogue check, every header, capability files parsed in every process).
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

# the child: its CPUs, torch (and a CUDA context where there is a GPU), then the timed part; prints one JSON line
CHILD = r"""
import json, os, sys, time
cfg = json.loads(sys.argv[1])
if cfg["cpus"]:
    os.sched_setaffinity(0, cfg["cpus"])
sys.path.insert(0, cfg["bench"])
import torch
gpu = cfg["gpu"] and torch.cuda.is_available()
if gpu:  # a process that launches CUDA kernels has its context already
    torch.cuda.init()
    torch.empty(1, device="cuda")
patch = cfg["patch"]
if "old_headers" in patch:  # the prelude and NVRTC flags of before D25 (the plugin imported before the clock)
    import tilecore_cuda.codegen as cg, tilecore_cuda.compiler as cc
    cc.NVRTC_FLAGS = ()
    _prelude = cg.prelude
    cg.prelude = lambda hopper=False, *a, tma=False, splitk=False, persistent=False: _prelude(
        hopper, tma=tma, splitk=splitk, persistent=persistent)
def after_load(name, change):  # change(module) as the module loads (in the timed part, as the default variant loads it)
    import importlib.util
    class _Hook:
        def find_spec(self, fullname, path=None, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            run = spec.loader.exec_module
            def exec_module(module):
                run(module)
                change(module)
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, _Hook())
if "before_d48" in patch:  # every plugin's distribution and version read as it loads
    after_load("tilecore.plugin.registry", lambda m: setattr(m, "LAZY_RECORDS", False))
if "peeled" in patch:  # D50 undone: the persistent GEMM's last k step peeled off its loop
    sys.path.insert(0, cfg["bench"])
    def _peel(module):
        from persistent_peel import peel
        module.prelude = peel(module.prelude)
    after_load("tilecore_cuda.codegen", _peel)
clock = time.perf_counter
cpu = lambda: time.process_time() + sum(os.times()[2:4])  # this process's CPU time and its finished children's (nvcc)
t0, c0 = clock(), cpu()
import tilecore, tilecore.language as T
from cuda_gemm import matmul
t1 = clock()
f = matmul(*cfg["kernel"])
t2 = clock()
prof = None
if cfg["profile"]:
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
k = tilecore.compile(f, target=cfg["target"], pass_configs=cfg["pass_configs"])
t3 = clock()
whole_cpu = cpu() - c0
if prof is not None:
    import pstats
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(20)
out = {"cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [], "import": t1 - t0, "parse": t2 - t1, "compile": t3 - t2, "whole": t3 - t0, "whole_cpu": whole_cpu,
       "phases": k.compile_times, "binary": k.binary.hex() if cfg["want_binary"] else ""}
if gpu:  # the first launch: cubin load, the compiled launcher, the launch
    import tilecore_cuda.runtime as rt
    parts = {}
    def timed(name, fn):
        def run(*a, **kw):
            t = clock()
            try:
                return fn(*a, **kw)
            finally:
                parts[name] = parts.get(name, 0.0) + clock() - t
        return run
    rt.CUDAProgram._function = timed("cubin load", rt.CUDAProgram._function)
    rt.CUDAProgram.fast_call = timed("launcher", rt.CUDAProgram.fast_call)
    M, N, K = cfg["kernel"][:3]
    A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    B = torch.randn(K, N, device="cuda", dtype=torch.float16)
    C = torch.empty(M, N, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    t = clock()
    k(A, B, C)
    torch.cuda.synchronize()
    parts["first launch"] = clock() - t
    out["launch"] = parts
print(json.dumps(out))
"""

# name -> (label, patches applied in the child, pass configs)
#: the plugin's Hopper pipeline, whatever the default routing of plain GEMMs (D65: routed to the general path again)
PLUGIN = {"tilecore.cuda.general_plain_gemm": False}
#: D76's warp-specialized form on the general path (benchmarks/general_gemm.py's ws-us-doff)
WS = {"tilecore.cuda.register_programs": False, "tilecore.cuda.uniform_warp_index": True,
      "tilecore.cuda.nonnegative_index_shifts": True, "tilecore.warp_specialize": True, "tilecore.persistent": True,
      "tilecore.bulk_store": True, "tilecore.cuda.descriptor_offsets": True}
VARIANTS = {
    "default": ("the default (the core's general path, D65)", [], {}),
    "plugin": ("the plugin's pipeline (persistent, TMA-store epilogue)", [], PLUGIN),
    "general": ("the core's general path (tilecore.cuda.general_plain_gemm=True, D62)", [],
                {"tilecore.cuda.general_plain_gemm": True}),
    "before-d48": ("the default, D48's changes undone", ["before_d48"], {}),
    "peeled": ("the plugin's pipeline, D50 undone (last k step peeled, loops unrolled)", ["peeled"], PLUGIN),
    "before": ("the tree before (--before-site)", [], {}),
    "per-tile": ("one block per tile (tilecore.cuda.persistent=False)", [], {"tilecore.cuda.persistent": False}),
    "direct": ("persistent, direct stores (tilecore.cuda.tma_store=False)", [], {"tilecore.cuda.tma_store": False}),
    "nvcc": ("the default through nvcc (tilecore.cuda.compiler=nvcc)", [], {"tilecore.cuda.compiler": "nvcc"}),
    # D80: the warp-specialized form (D76's ws-us-doff) and the same in block groups of two with B multicast
    "ws": ("the warp-specialized form (D76's ws-us-doff)", [], WS),
    "ws-mc": ("warp-specialized, block groups of 2, B multicast (D80's ws-mc)", [], {**WS, "tilecore.group_multicast": 2}),
    # the same two as the default route's form (tilecore.cuda.gemm_route_form, D80): what a default change would build
    "route-ws": ("the route's form \"ws\" (D80)", [], {"tilecore.cuda.gemm_route_form": "ws"}),
    "route-ws-mc": ("the route's form \"ws-mc\" (D80)", [], {"tilecore.cuda.gemm_route_form": "ws-mc"}),
    # D25's columns, each with the ones below it undone too
    "before-d25-memo": ("D25: capability documents parsed in every process", ["no_memo"], {}),
    "before-d25-headers": ("D25: + fp8 and bf16 headers always, no --minimal", ["no_memo", "old_headers"], {}),
    "before-d25": ("D25: + every epilogue check (per-tile, before D25)", ["no_memo", "old_headers"],
                   {"tilecore.cuda.keep_epilogue_checks": True, "tilecore.cuda.persistent": False}),
}
NVRTC_PHASES = (("CUDA C++ Frontend", "front end"), ("NVVM Optimizer", "NVVM"), ("PTX Translation", "ptxas"))
NVCC_PHASES = (("gcc (preprocessing 1)", "front end"), ("cicc", "NVVM"), ("ptxas", "ptxas"))
CORE_PHASES = ("plugins", "capabilities", "toolchain", "key", "passes", "codegen")


def cpu_set(spec: str) -> list:
    """The CPUs the children are pinned to: 'all' (not pinned), a count (the last ones this process may use) or a
    comma list of CPU numbers."""
    if spec == "all" or not hasattr(os, "sched_getaffinity"):
        return []
    mine = sorted(os.sched_getaffinity(0))
    if "," in spec or spec.startswith("="):
        return [int(c) for c in spec.lstrip("=").split(",")]
    return mine[-max(1, min(int(spec), len(mine))):]


def phases(path: Path) -> dict:
    """NVRTC's or nvcc's --time table (appended per compile): phase -> ms of the last compile."""
    out: dict = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[3] == "ms":  # NVRTC: name, phase, ms, unit
            out[parts[1]] = float(parts[2])
        elif len(parts) == 8 and parts[7] == "ms":  # nvcc: file, phase, inputs, output, arch, tool, ms, unit
            out[parts[1]] = float(parts[6])
    return out


def child(variant: str, args, env: dict, tmp: Path, want_binary: bool = False, profile: bool = False) -> dict:
    timefile = tmp / f"time-{variant}.csv"
    if timefile.exists():
        timefile.unlink()
    _, patch, extra = VARIANTS[variant]
    nvcc = extra.get("tilecore.cuda.compiler") == "nvcc"
    flags = ["--time", str(timefile)] if nvcc else ["--no-cache", f"--time={timefile}"]
    env = dict(env)
    if variant == "before":  # another tree's tilecore (its wheels installed in a folder), the same benchmark kernel
        env["PYTHONPATH"] = args.before_site
    if "no_memo" in patch:  # a cache directory as before D25: documents remembered valid, none remembered parsed
        cache = tmp / "cache-no-memo"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(mode=0o700)
        for f in Path(env["TILECORE_CACHE_DIR"]).glob("capabilities-valid.txt"):
            shutil.copy(f, cache / f.name)
        for f in Path(env["TILECORE_CACHE_DIR"]).glob("launchers"):  # the compiled launcher is not D25's
            if f.is_dir():
                shutil.copytree(f, cache / f.name)
        env["TILECORE_CACHE_DIR"] = str(cache)
    cfg = {"cpus": args.cpu_list, "bench": str(Path(__file__).resolve().parent), "gpu": not args.no_launch,
           "patch": patch, "kernel": list(args.kernel), "target": args.target, "want_binary": want_binary,
           "profile": profile,
           "pass_configs": {"tilecore.disable_cache": True, "tilecore.extra_flags": flags, **extra}}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True, env=env,
                          cwd=tmp)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant}: {proc.stderr.strip()[-1500:]}")
    if profile:
        print(proc.stderr)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    table = phases(timefile)
    res["device"] = {short: table.get(name, float("nan")) / 1e3 for name, short in (NVCC_PHASES if nvcc else NVRTC_PHASES)}
    return res


def sass_count(binary: bytes, target: str):
    import tilecore_cuda

    try:
        text = tilecore_cuda.CUDABackend().disassemble(binary, target)
    except BaseException as e:  # noqa: BLE001 - cuobjdump missing: the table still stands
        return f"n/a ({type(e).__name__})"
    return sum(1 for ln in text.splitlines() if ln.strip().startswith("/*") and ";" in ln)


def stats(xs: list) -> str:
    med = statistics.median(xs)
    return f"{min(xs):.3f} / {med:.3f} / {(max(xs) - min(xs)) / med * 100:.0f}%"


def run_phases(r: dict) -> list:
    """(phase, seconds) of one run, in the order the work happens; 'build: other' is NVRTC's call less its phases,
    'rest of compile' the whole less every phase above it (tilecore.compiler's import on first use, the kernel
    object)."""
    rows = [("import tilecore", r["import"]), ("parse (@T.prim_func)", r["parse"])]
    rows += [(p, r["phases"].get(p, 0.0)) for p in CORE_PHASES]
    rows += [(f"build: {p}", r["device"][p]) for _, p in NVRTC_PHASES]
    rows.append(("build: other", r["phases"].get("build", 0.0) - sum(r["device"].values())))
    rows.append(("store and warnings", r["phases"].get("store", 0.0)))
    rows.append(("rest of compile", r["whole"] - sum(s for _, s in rows)))
    if "launch" in r:
        rows += [(f"device: {p}", r["launch"].get(p, 0.0)) for p in ("cubin load", "launcher", "first launch")]
    return rows


def phase_rows(runs: list) -> list:
    """(phase, median seconds over the runs)."""
    per_run = [run_phases(r) for r in runs]
    return [(name, statistics.median(rows[i][1] for rows in per_run)) for i, (name, _) in enumerate(per_run[0])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="fresh processes per variant")
    ap.add_argument("--cpus", default="1", help="pin the children: a count of CPUs (the last ones), a comma list, "
                    "or 'all' (not pinned)")
    ap.add_argument("--variants", default=",".join(v for v in VARIANTS if v != "before"), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--profile", action="store_true", help="one more child of the first variant under cProfile")
    ap.add_argument("--no-launch", action="store_true", help="no first launch where there is a GPU")
    ap.add_argument("--before-site", default="", help="a folder with the tilecore of the tree before a change "
                    "(its wheels installed with pip --target): adds the variant 'before', run from there")
    ap.add_argument("--target", default="cuda:sm_90a")
    ap.add_argument("--kernel", default="4096,4096,4096,128,256,64,256,4",
                    help="cuda_gemm.matmul arguments M,N,K,block_M,block_N,block_K,threads,stages")
    args = ap.parse_args()
    args.kernel = [int(x) for x in args.kernel.split(",")]
    args.cpu_list = cpu_set(args.cpus)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if args.before_site and "before" not in variants:
        variants.insert(1, "before")
    if "before" in variants and not args.before_site:
        ap.error("the variant 'before' needs --before-site")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")

    import tilecore_cuda.compiler as cc

    if not cc.nvrtc_usable():
        print(f"cold_compile.py: NVRTC is not usable here ({cc.toolchain() or 'no CUDA compiler'}); it measures NVRTC.")
        return NO_TOOLCHAIN_EXIT
    if "nvcc" in variants and cc.find_nvcc() is None:
        print("cold_compile.py: no nvcc here: the nvcc variant is left out")
        variants.remove("nvcc")
    with tempfile.TemporaryDirectory(prefix="tilecore-cold-") as tmpdir:
        tmp = Path(tmpdir)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pyc")
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the same tilecore as this process
        (tmp / "cache").mkdir(mode=0o700)
        env["TILECORE_CACHE_DIR"] = str(tmp / "cache")  # private: the user's is left alone
        for v in variants:  # warms the bytecode (each tree's), the disk and the cache dir; not measured
            child(v, args, env, tmp)
        runs: dict = {v: [] for v in variants}
        binaries = {}
        for r in range(args.repeat):  # round robin
            for v in variants:
                res = child(v, args, env, tmp, want_binary=(r == 0))
                if r == 0:
                    binaries[v] = bytes.fromhex(res.pop("binary"))
                runs[v].append(res)
        ran_on = sorted({c for v in variants for r in runs[v] for c in r["cpus"]})  # as the children saw it
        pinned = (f"pinned to CPU {','.join(map(str, ran_on))} " if args.cpu_list else
                  f"not pinned (CPUs {','.join(map(str, ran_on))}) ")
        print(f"cold compile, {args.target}, matmul{tuple(args.kernel)}, {args.repeat} fresh processes per variant, "
              f"{pinned}({cc.toolchain()}, {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}); torch imported before the clock; seconds")
        print()
        print("| variant | whole: min / median / spread | CPU time: min / median | compile only: median | "
              "NVRTC (build): median | the rest (whole - build): min / median | SASS instructions |")
        print("|---|---|---|---|---|---|---|")
        base = None
        for v in variants:
            rs = runs[v]
            whole = [r["whole"] for r in rs]
            base = base or statistics.median(whole)
            cpu = [r["whole_cpu"] for r in rs]
            rest = [r["whole"] - r["phases"].get("build", 0.0) for r in rs]  # tilecore, Python: all but the compiler
            print(f"| {VARIANTS[v][0]} | {stats(whole)}; {base / statistics.median(whole):.2f}x | "
                  f"{min(cpu):.3f} / {statistics.median(cpu):.3f} | {statistics.median(r['compile'] for r in rs):.3f} | "
                  f"{statistics.median(r['phases'].get('build', 0.0) for r in rs):.3f} | "
                  f"{min(rest):.3f} / {statistics.median(rest):.3f} | {sass_count(binaries[v], args.target)} |")
        print()
        shown = variants[:3]
        print("Phases (median ms; share of the whole in brackets; 'build' is NVRTC's, or nvcc's: front end, NVVM "
              "(cicc), ptxas):")
        print()
        print("| phase | " + " | ".join(VARIANTS[v][0] for v in shown) + " |")
        print("|---|" + "---|" * len(shown))
        tables = {v: phase_rows(runs[v]) for v in shown}
        wholes = {v: statistics.median(r["whole"] for r in runs[v]) for v in shown}
        for i, (name, _) in enumerate(tables[shown[0]]):
            cells = []
            for v in shown:
                s = tables[v][i][1]
                cells.append(f"{s * 1e3:.1f}" + ("" if name.startswith("device") else f" ({s / wholes[v] * 100:.0f}%)"))
            print(f"| {name} | " + " | ".join(cells) + " |")
        if args.profile:
            print()
            print(f"cProfile of one more {variants[0]} child (the compile):")
            child(variants[0], args, env, tmp, profile=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
