"""CUDA GEMM: tilecore's CUDA backend against torch.matmul (cuBLAS), in the same run.

    python benchmarks/cuda_gemm.py [--sizes 4096,8192] [--dtypes float16,bfloat16] [--rep 20] [--configs ...]

Prints, per dtype and size, the best TFLOP/s of the README-style kernel (T.copy to shared, T.gemm into a
float32 fragment, T.Pipelined over K) over a few block configurations, torch.matmul's TFLOP/s and the
ratio (ours / torch; higher is better). Then cold compile time (no cache), warm load time (cache hit +
module load + first launch) and the host time per launch of a small kernel against torch.add.

Times are CUDA events around ``--rep`` back-to-back launches after warm-up (the same for both sides).
Without a GPU it says so, prints the compile times only, and exits with status 3.

Shapes with few output tiles (the LLM rows 128x4096x4096 and 16x8192x8192) are split over K by the compiler
(docs/decisions.md D27): for every configuration it split, the same kernel with ``tilecore.cuda.split_k=1``
is timed too, and a second table gives the best kernel against cuBLAS and against the best without split-K
(every configuration at ``split_k=1``), in the same run:

    python benchmarks/cuda_gemm.py --sizes "" --shapes 128x4096x4096,16x8192x8192 --no-fp8 --check

``--split-k 2,3,4,6,8`` also times every split configuration at those split counts, one line each, so the
automatic rule (D31) can be checked against its neighbours in the same run.

``--persistent off,on`` times every configuration with ``tilecore.cuda.persistent`` off and on (docs/decisions.md
D34: a grid of one block per SM, each looping over its tiles, the next tile's loads under this tile's epilogue),
one line each, says whether the two results are the same bits, and adds a table of the best of each against
cuBLAS in the same run:

    python benchmarks/cuda_gemm.py --sizes 4096,8192 --persistent off,on,pingpong --no-fp8 --triton

``pingpong`` (``tilecore.cuda.persistent="pingpong"``) gives each of the two consumer warpgroups whole tiles in
turn; it takes tiles of at most 128 accumulators a thread (128x128), so the 128x128 configurations are the ones
to compare (the 128x256 ones stay plain persistent, said so on their line).

``--tma-store off,on`` times every configuration with ``tilecore.cuda.tma_store`` off and on (docs/decisions.md
D38: the persistent kernel's epilogue through shared memory and TMA stores, under the next tile's main loop;
it needs a persistent grid, so without ``--persistent`` the kernels are persistent), one line each, says whether
the two results are the same bits, and adds a table of the best of each against cuBLAS in the same run:

    python benchmarks/cuda_gemm.py --sizes 4096,8192 --tma-store off,on --no-fp8 --configs 128:256:64:256:3:8,...

``--cluster-multicast off,2x1,1x2`` times every configuration with ``tilecore.cuda.cluster_multicast`` off and at
each cluster shape (docs/decisions.md D44: the persistent kernel in clusters of two blocks on neighbouring tiles,
"2x1" side by side in M sharing B, "1x2" in N sharing A, each block loading half of the shared box and multicasting
it to both), one line each, says whether each result is the same bits as off's, and adds a table of the best of
each against cuBLAS and Triton in the same run (give ``--triton``):

    python benchmarks/cuda_gemm.py --sizes 4096,8192 --no-fp8 --triton --cluster-multicast off,2x1,1x2 \
        --configs 128:256:64:256:3:8,128:256:64:256:4:8,256:128:64:256:3:8

``--stage-release thread,warp,d44`` times each of those with ``tilecore.cuda.stage_release`` (docs/decisions.md D49:
how the consumers release a stage: every thread, or each warp's first lane; "d44" is D44's remote release at cluster
scope, a MEMBAR.ALL.GPU before each; clusters only), one line and one table column each. ``--profile`` then runs
each (cluster_multicast, stage_release) pair once more, built with ``tilecore.cuda.pipeline_profile`` (cycle counts
per block: the producer's waits for a free stage, the consumers' waits for a full one, their releases), on the
first configuration, and prints where each block's time went and how far apart the two blocks of a cluster ran:

    python benchmarks/cuda_gemm.py --sizes 4096 --dtypes float16 --no-fp8 --cluster-multicast off,2x1 \
        --stage-release thread,warp,d44 --profile --configs 128:256:64:256:3:8
"""
from __future__ import annotations

import argparse
import sys
import time

import tilecore
import tilecore.language as T
from _bench import tile_gemm  # noqa: E402  (this folder is on sys.path: scripts run from it, tests add it)

NO_GPU_EXIT = 3

# (block_M, block_N, block_K, threads, num_stages). On sm_90a the first three become TMA + WGMMA pipelines
# (cuda.hopper_gemm_pipeline); the last is the best mma.sync configuration of earlier runs.
# A sixth number is T.use_swizzle's panel size (block rasterization for L2 reuse; 0 = off).
CONFIGS = [(128, 256, 64, 256, 3, 8), (128, 256, 64, 256, 3), (128, 256, 64, 256, 4, 8), (128, 128, 64, 256, 5, 8),
           (128, 64, 64, 128, 3)]
# for shapes with few rows (M <= 256): 64-row tiles (one consumer warpgroup) give more blocks to fill the SMs
SMALL_M_CONFIGS = [(64, 64, 64, 128, 4), (64, 128, 64, 128, 4), (64, 256, 64, 128, 3), (128, 128, 64, 256, 3)]
FP8_CONFIGS = [(128, 256, 128, 256, 3, 8), (128, 256, 128, 256, 3), (128, 256, 128, 256, 4, 8)]


def matmul(M, N, K, block_M, block_N, block_K, threads=128, num_stages=3, panel=0, dtype="float16", accum="float32",
           out_dtype=None, b_transposed=False):
    """The README GEMM (``_bench.tile_gemm``) in this script's argument order, which the configuration tuples and
    the other benchmarks use; ``b_transposed``: B is given as (N, K) (the layout 8-bit WGMMA needs); ``panel``:
    T.use_swizzle(panel) when not 0."""
    return tile_gemm(M, N, K, block_M, block_N, block_K, threads, num_stages, dtype=dtype, transpose_b=b_transposed,
                     panel=panel, accum=accum, out_dtype=out_dtype)


def split_k_of(kernel) -> int:
    """Over how many blocks the compiler split each output tile's K loop (1: not split; D27)."""
    import re

    for note in kernel.meta.get("attrs", {}).get("hopper_pipelines", ()):
        m = re.search(r"split-K (\d+) ", note)
        if m:
            return int(m.group(1))
    return 1


def vadd(n, blk=256, dtype="float32"):
    @T.prim_func
    def add(A: T.Tensor((n,), dtype), B: T.Tensor((n,), dtype), C: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, blk), threads=blk) as bx:
            for i in T.Parallel(blk):
                if bx * blk + i < n:
                    C[bx * blk + i] = A[bx * blk + i] + B[bx * blk + i]

    return add


def triton_matmul():
    """A plain Triton GEMM (the tutorial's blocked kernel with grouped ordering and a few autotuned
    configs), as a peer column: ``f(a, b, c)`` writes ``a @ b`` into ``c``. None without Triton."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    cfgs = [triton.Config({"BM": bm, "BN": bn, "BK": bk, "G": 8}, num_stages=st, num_warps=w)
            for bm, bn, bk, st, w in ((128, 256, 64, 3, 8), (128, 128, 64, 4, 4), (64, 128, 64, 4, 4),
                                      (128, 128, 32, 4, 4), (64, 64, 64, 4, 4), (16, 128, 128, 4, 4))]

    @triton.autotune(configs=cfgs, key=["M", "N", "K"])
    @triton.jit
    def kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, G: tl.constexpr):
        pid = tl.program_id(0)
        npm, npn = tl.cdiv(M, BM), tl.cdiv(N, BN)
        group = pid // (G * npn)
        first = group * G
        size = min(npm - first, G)
        pm = first + (pid % (G * npn)) % size
        pn = (pid % (G * npn)) // size
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        pa = a + rm[:, None] * sam + rk[None, :] * sak
        pb = b + rk[:, None] * sbk + rn[None, :] * sbn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, tl.cdiv(K, BK)):
            x = tl.load(pa, mask=(rm[:, None] < M) & (rk[None, :] < K - k0 * BK), other=0.0)
            y = tl.load(pb, mask=(rk[:, None] < K - k0 * BK) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(x, y, acc)
            pa += BK * sak
            pb += BK * sbk
        pc = c + rm[:, None] * scm + rn[None, :] * scn
        tl.store(pc, acc.to(c.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))

    def run(a, b, c):
        M, K = a.shape
        N = b.shape[1]
        grid = lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)  # noqa: E731
        kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))

    return run


def has_gpu() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    try:
        import tilecore_cuda
    except ImportError:
        return False, "tilecore-cuda is not installed (pip install -e backends/cuda[nvrtc])"
    probe = tilecore_cuda.CUDABackend().probe()
    if probe.status != "ok":
        return False, f"the CUDA backend reports {probe.status}: {probe.detail}"
    return True, ""


def event_ms(fn, rep: int, warmup: int = 3) -> float:
    """Milliseconds per call: CUDA events around ``rep`` back-to-back calls on the current stream."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):  # best of three batches: clocks and other tenants move things
        start.record()
        for _ in range(rep):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / rep)
    return best


#: tc_persistent.cuh's profile words per block (TC_PROF_WORDS) and their places (D49)
PROF_WORDS = 16


def profile_line(k, run, label: str) -> str:
    """One run of ``k`` (built with tilecore.cuda.pipeline_profile) after two warm-ups, and where each block's time
    went (tc_persistent.cuh's TC_PROF words): medians over the blocks (min-max), shares of the block's own loop."""
    import statistics as st

    run()
    run()
    prog = k._load()
    prog.global_words("tc_pipe_prof", clear=True)
    run()
    words = prog.global_words("tc_pipe_prof", clear=True)
    blocks = [words[i:i + PROF_WORDS] for i in range(0, len(words), PROF_WORDS)]
    blocks = [(b, w) for b, w in enumerate(blocks) if w[2] or w[5]]  # the blocks that ran
    if not blocks:
        return f"  profile {label}: no block recorded anything"

    def med(vals, fmt="{:.3f}"):
        vals = sorted(vals)
        return f"{fmt.format(st.median(vals))} ({fmt.format(vals[0])}-{fmt.format(vals[-1])})"

    ws = [w for _, w in blocks]
    start, end = min(w[0] for w in ws), max(max(w[1], w[9]) for w in ws)
    out = [f"  profile {label}: {len(ws)} blocks on {len({w[12] for w in ws})} SMs, {(end - start) / 1e3:.1f} us "
           f"first start to last end; starts spread {(max(w[0] for w in ws) - start) / 1e3:.1f} us, consumer ends "
           f"spread {(max(w[9] for w in ws) - min(w[9] for w in ws)) / 1e3:.1f} us",
           f"    producer: k steps {med([w[4] for w in ws], '{:.0f}')}, waiting for a free stage "
           f"{med([w[3] / max(w[2], 1) for w in ws])} of its loop",
           f"    consumer 0: cycles a k step {med([w[5] / max(w[8], 1) for w in ws], '{:.0f}')}, waiting for a full "
           f"stage {med([w[6] / max(w[5], 1) for w in ws])} of its loop, releasing "
           f"{med([w[7] / max(w[8], 1) for w in ws], '{:.1f}')} cycles a k step",
           f"    consumer 1: waiting for a full stage {med([w[10] / max(w[5], 1) for w in ws])}, releasing "
           f"{med([w[11] / max(w[8], 1) for w in ws], '{:.1f}')} cycles a k step"]
    pairs = {}
    for b, w in blocks:
        pairs.setdefault(b // 2, []).append(w)
    pairs = [p for p in pairs.values() if len(p) == 2 and any(w[13] for w in p)]
    if pairs:
        out.append(f"    clusters: {len(pairs)}; the two blocks' starts apart {med([abs(p[0][0] - p[1][0]) / 1e3 for p in pairs], '{:.2f}')} us, "
                   f"consumer ends apart {med([abs(p[0][9] - p[1][9]) / 1e3 for p in pairs], '{:.2f}')} us, "
                   f"on SMs {sorted({(min(p[0][12], p[1][12]), max(p[0][12], p[1][12])) for p in pairs})[:4]}...")
    return "\n".join(out)


def _pass_configs(args) -> dict:
    return {"tilecore.cuda.disable_wgmma": True} if getattr(args, "no_wgmma", False) else {}


def fp8_row(torch, args):
    """float8_e4m3 8192^3 (B as (N, K), float16 out) against torch._scaled_mm (cuBLAS fp8, unit scales)."""
    n = 8192
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    c = torch.empty(n, n, device="cuda", dtype=torch.float16)
    one = torch.ones((), device="cuda")
    flops = 2.0 * n * n * n
    best = None
    for cfg in FP8_CONFIGS:
        try:
            k = tilecore.compile(matmul(n, n, n, *cfg, dtype="float8_e4m3", out_dtype="float16", b_transposed=True),
                                 target=args.target, pass_configs=_pass_configs(args))
            ms = event_ms(lambda: k(a, b, c), args.rep)
        except Exception as e:  # noqa: BLE001
            print(f"  float8_e4m3 {n}^3 config {cfg}: skipped ({type(e).__name__}: {str(e)[:120]})")
            continue
        tf = flops / ms / 1e9
        print(f"  float8_e4m3 {n}^3 config {cfg}: {ms:.3f} ms, {tf:.1f} TFLOP/s")
        if args.check:
            ref = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float16)
            print(f"    max |ours - torch| = {(c.float() - ref.float()).abs().max().item():.3g}")
        if best is None or tf > best[0]:
            best = (tf, cfg)
    try:
        ms_t = event_ms(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float16),
                        args.rep)
        tf_t = flops / ms_t / 1e9
    except Exception as e:  # noqa: BLE001
        print(f"  torch._scaled_mm failed: {e}")
        tf_t = float("nan")
    return ("float8_e4m3 (torch._scaled_mm)", n, best, tf_t)


def cold_compile_fresh_process(target: str, repeat: int = 3) -> str:
    """Seconds for one tilecore.compile (tilecore's cache off, NVRTC's with ``--no-cache``) in a new Python
    process: NVRTC's start-up included, interpreter start and imports (torch, tilecore) not; the median of
    ``repeat`` processes. The children keep a bytecode cache (as installed packages have) even where
    PYTHONDONTWRITEBYTECODE is set; ``benchmarks/cold_compile.py`` has the before/after table (D25)."""
    import os
    import statistics
    import subprocess
    import tempfile
    from pathlib import Path

    # torch is imported first, as in any process that launches CUDA kernels (the CUDA backend imports it
    # before NVRTC on GPU machines, and that import would otherwise land inside the timed compile)
    code = ("import sys, time; sys.path.insert(0, %r); import torch, tilecore; from cuda_gemm import matmul; "
            "f = matmul(4096, 4096, 4096, 128, 256, 64, 256, 4); t = time.perf_counter(); "
            "tilecore.compile(f, target=%r, pass_configs={'tilecore.disable_cache': True, "
            "'tilecore.extra_flags': ['--no-cache']}); "
            "print(time.perf_counter() - t)") % (str(Path(__file__).parent), target)
    with tempfile.TemporaryDirectory(prefix="tilecore-cold-") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pyc")
        times = []
        for r in range(repeat + 1):  # the first run fills the bytecode cache and is not counted
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=env)
            if proc.returncode != 0:
                return f"failed: {proc.stderr.strip()[-200:]}"
            if r:
                times.append(float(proc.stdout.strip().splitlines()[-1]))
    return f"{statistics.median(times):.2f} s (median of {repeat}; {min(times):.2f}-{max(times):.2f})"


def compile_times(target: str) -> tuple[float, float]:
    """(cold compile s, warm load s) for the 128x128x32 fp16 kernel at 4096^3."""
    fn = matmul(4096, 4096, 4096, 128, 128, 32, 256, 3)
    t0 = time.perf_counter()
    tilecore.compile(fn, target=target, pass_configs={"tilecore.disable_cache": True})
    cold = time.perf_counter() - t0
    tilecore.compile(fn, target=target)  # make sure the cache holds it
    t0 = time.perf_counter()
    k = tilecore.compile(fn, target=target)
    warm = time.perf_counter() - t0
    return cold, warm, k


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096,8192", help="square sizes M=N=K")
    ap.add_argument("--shapes", default="", help="more shapes, MxNxK,... (e.g. the LLM set "
                    "4096x4096x14336,4096x14336x4096,128x4096x4096,16x8192x8192)")
    ap.add_argument("--triton", action="store_true", help="add a plain Triton GEMM column (same run)")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--configs", default="", help="block_M:block_N:block_K:threads:stages[:panel],... (default: a few)")
    ap.add_argument("--check", action="store_true", help="compare each result with torch.matmul")
    ap.add_argument("--no-fp8", dest="fp8", action="store_false", help="skip the float8_e4m3 8192^3 row")
    ap.add_argument("--split-k", default="", type=lambda v: [int(x) for x in v.split(",") if x],
                    help="for every configuration the compiler split over K, also time these split counts "
                         "(tilecore.cuda.split_k), e.g. 2,3,4,6,8: the rule's choice beside its neighbours (D31)")
    ap.add_argument("--persistent", default="",
                    type=lambda v: [{"on": True, "off": False}.get(x.strip(), x.strip()) for x in v.split(",") if x.strip()],
                    help="time each configuration with tilecore.cuda.persistent off, on and/or pingpong, e.g. "
                         "off,on,pingpong (D34)")
    ap.add_argument("--tma-store", default="",
                    type=lambda v: [{"on": True, "off": False}[x.strip()] for x in v.split(",") if x.strip()],
                    help="time each configuration with tilecore.cuda.tma_store off and/or on, e.g. off,on (D38; "
                         "the kernels are persistent unless --persistent says)")
    ap.add_argument("--cluster-multicast", default="",
                    type=lambda v: [{"off": False}.get(x.strip(), x.strip()) for x in v.split(",") if x.strip()],
                    help="time each configuration with tilecore.cuda.cluster_multicast off, 2x1 and/or 1x2 (D44; the "
                         "kernels are persistent)")
    ap.add_argument("--stage-release", default="", type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
                    help="with --cluster-multicast: time each with tilecore.cuda.stage_release thread, warp and/or "
                         "d44 (D49; d44 only in clusters)")
    ap.add_argument("--profile", action="store_true",
                    help="with --cluster-multicast: each (cluster_multicast, stage_release) once more with "
                         "tilecore.cuda.pipeline_profile, the first configuration: per-block wait cycles (D49)")
    ap.add_argument("--no-wgmma", action="store_true",
                    help="switch the Hopper passes off (tilecore.cuda.disable_wgmma): measures the sm_80 path "
                         "(mma.sync register program with cp.async stages) on an sm_90 GPU")
    args = ap.parse_args()
    configs = CONFIGS
    if args.configs:
        configs = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",")]

    ok, why = has_gpu()
    if not ok:
        print(f"cuda_gemm.py: no GPU to measure on ({why}).")
        try:
            cold, warm, _ = compile_times("cuda:sm_90a")
            print(f"compile-only here: cold compile {cold:.2f} s, warm (cached) compile {warm * 1e3:.1f} ms "
                  "(cuda:sm_90a, 128x128x32 fp16 GEMM kernel). No TFLOP/s without a GPU.")
        except Exception as e:  # noqa: BLE001 - a report, not a test
            print(f"(compiling for cuda:sm_90a failed too: {type(e).__name__}: {e})")
        return NO_GPU_EXIT

    import torch

    dev = torch.cuda.get_device_name(0)
    print(f"device: {dev}; torch {torch.__version__}; tilecore {tilecore.__version__}; target {args.target}")
    rows, split_rows, persist_rows, tma_rows, mc_rows = [], [], [], [], []
    cfgs = _pass_configs(args)
    shapes = [(n, n, n) for n in (int(x) for x in args.sizes.split(",") if x)]
    shapes += [tuple(int(v) for v in x.split("x")) for x in args.shapes.split(",") if x]
    triton_mm = triton_matmul() if args.triton else None
    for dtype in [d for d in args.dtypes.split(",") if d]:
        tdt = getattr(torch, dtype)
        for m, n, kk in shapes:
            a = torch.randn(m, kk, device="cuda").to(tdt)
            b = torch.randn(kk, n, device="cuda").to(tdt)
            c = torch.empty(m, n, device="cuda", dtype=tdt)
            flops = 2.0 * m * n * kk
            name = f"{m}^3" if m == n == kk else f"{m}x{n}x{kk}"
            best = None
            unsplit = None  # the best of every configuration with tilecore.cuda.split_k=1 (the kernel before D27)
            any_split = False
            best_by = {}  # tilecore.cuda.persistent -> (TFLOP/s, config) of the best configuration (--persistent)
            best_tma = {}  # tilecore.cuda.tma_store -> (TFLOP/s, config) of the best persistent configuration
            best_mc = {}  # tilecore.cuda.cluster_multicast -> (TFLOP/s, config) (--cluster-multicast)
            persists = args.persistent or ([True] if args.tma_store else [None])  # TMA stores need a persistent grid
            variants = [(cfg, p, ts, mc, rel)
                        for cfg in configs + (SMALL_M_CONFIGS if m <= 256 and not args.configs else [])
                        for p in persists for ts in (args.tma_store or [None]) for mc in (args.cluster_multicast or [None])
                        for rel in (args.stage_release or [None]) if not (rel == "d44" and not mc)]
            last_c = None
            last_mc = None  # (config, C) of the last cluster_multicast=off run: the same-bits check
            last_tma = None  # (config, persistent, C) of the last tma_store=off run: the same-bits check
            for cfg, persist, tma, mc, rel in variants:
                pc = cfgs if persist is None else {**cfgs, "tilecore.cuda.persistent": persist}
                if tma is not None:
                    pc = {**pc, "tilecore.cuda.tma_store": tma}
                if mc is not None:
                    pc = {**pc, "tilecore.cuda.cluster_multicast": mc}
                if rel is not None:
                    pc = {**pc, "tilecore.cuda.stage_release": rel}
                names = {False: "off", True: "on", "pingpong": "pingpong"}
                label = "" if persist is None else f", persistent {names.get(persist, persist)}"
                if tma is not None:
                    label += f", tma_store {names[tma]}"
                if mc is not None:
                    label += f", cluster_multicast {mc or 'off'}"
                if rel is not None:
                    label += f", stage_release {rel}"
                try:
                    k = tilecore.compile(matmul(m, n, kk, *cfg, dtype=dtype), target=args.target, pass_configs=pc)
                    if mc is not None:  # a tile left unwritten shows as NaN, not as the last run's value
                        c.fill_(float("nan"))
                    ms = event_ms(lambda: k(a, b, c), args.rep)
                except Exception as e:  # noqa: BLE001 - a config that does not fit is skipped, said so
                    print(f"  {dtype} {name} config {cfg}{label}: skipped ({type(e).__name__}: {str(e)[:120]})")
                    continue
                tf = flops / ms / 1e9
                splits = split_k_of(k)
                same = ""
                if mc is not None:
                    note = " ".join(k.meta["attrs"].get("hopper_pipelines", ()))
                    took = not mc or f"cluster_multicast {mc}:" in note
                    if not took:
                        label += " (kept single blocks: see the kernel's hopper_pipelines note)"
                    if (mc or rel) and last_mc is not None and last_mc[0] == cfg:
                        same = f"; same bits as cluster_multicast off: {torch.equal(c, last_mc[1])}"
                    if not mc and (last_mc is None or last_mc[0] != cfg):
                        last_mc = (cfg, c.clone())  # the config's first off run (its default release)
                    key = mc if rel is None else (mc, rel)
                    if took and (key not in best_mc or tf > best_mc[key][0]):
                        best_mc[key] = (tf, cfg)
                if persist is not None:
                    note = " ".join(k.meta["attrs"].get("hopper_pipelines", ()))
                    took = True  # the kernel runs as asked (the table compares only those)
                    if persist and "persistent: at most" not in note:
                        label += " (kept one block per tile: see the kernel's hopper_pipelines note)"
                        took = False
                    elif persist == "pingpong" and "; ping-pong:" not in note:
                        label += " (persistent, not ping-pong: see the note)"
                        took = False
                    if persist and last_c is not None and last_c[0] == cfg and tma is None:
                        same = f"; same bits as off: {torch.equal(c, last_c[1])}"
                    if not persist:
                        last_c = (cfg, c.clone())
                    if tma and "tma_store: the epilogue through" not in note:
                        label += " (kept the direct stores: see the kernel's hopper_pipelines note)"
                        took = False
                    if tma and last_tma is not None and last_tma[:2] == (cfg, persist):
                        same = f"; same bits as tma_store off: {torch.equal(c, last_tma[2])}"
                    if tma is False:
                        last_tma = (cfg, persist, c.clone())
                    if took and tma is None and (persist not in best_by or tf > best_by[persist][0]):
                        best_by[persist] = (tf, cfg)
                    if took and persist and tma is not None and (tma not in best_tma or tf > best_tma[tma][0]):
                        best_tma[tma] = (tf, cfg if persist is True else (*cfg, persist))
                print(f"  {dtype} {name} config {cfg}{label}: {ms:.3f} ms, {tf:.1f} TFLOP/s"
                      + (f" (split-K {splits})" if splits > 1 else "") + same)
                if args.check:
                    ref = torch.matmul(a, b)
                    err = (c.float() - ref.float()).abs().max().item()
                    print(f"    max |ours - torch| = {err:.3g}")
                if best is None or tf > best[0]:
                    best = (tf, cfg, splits)
                tf1 = tf  # a configuration the compiler did not split is its own split_k=1 kernel
                if splits > 1 and not persist:
                    any_split = True
                    k1 = tilecore.compile(matmul(m, n, kk, *cfg, dtype=dtype), target=args.target,
                                          pass_configs={**cfgs, "tilecore.cuda.split_k": 1})
                    tf1 = flops / event_ms(lambda: k1(a, b, c), args.rep) / 1e9
                    print(f"  {dtype} {name} config {cfg}, tilecore.cuda.split_k=1: {tf1:.1f} TFLOP/s")
                    for n_split in (x for x in args.split_k if x > 1 and x != splits):  # the rule's neighbours
                        try:
                            kn = tilecore.compile(matmul(m, n, kk, *cfg, dtype=dtype), target=args.target,
                                                  pass_configs={**cfgs, "tilecore.cuda.split_k": n_split})
                            tfn = flops / event_ms(lambda: kn(a, b, c), args.rep) / 1e9
                        except Exception as e:  # noqa: BLE001 - e.g. more splits than k tiles: said so
                            print(f"  {dtype} {name} config {cfg}, tilecore.cuda.split_k={n_split}: skipped "
                                  f"({type(e).__name__}: {str(e)[:120]})")
                            continue
                        err = ""
                        if args.check:
                            diff = (c.float() - torch.matmul(a, b).float()).abs().max().item()
                            err = f", max |ours - torch| = {diff:.3g}"
                        print(f"  {dtype} {name} config {cfg}, tilecore.cuda.split_k={n_split}: {tfn:.1f} TFLOP/s "
                              f"(the rule chose {splits}){err}")
                if unsplit is None or tf1 > unsplit[0]:
                    unsplit = (tf1, cfg)
            ms_t = event_ms(lambda: torch.matmul(a, b, out=c), args.rep)
            tf_t = flops / ms_t / 1e9
            tf_tr = float("nan")
            if triton_mm is not None:
                try:
                    ms_tr = event_ms(lambda: triton_mm(a, b, c), args.rep)
                    tf_tr = flops / ms_tr / 1e9
                except Exception as e:  # noqa: BLE001
                    print(f"  triton {dtype} {name}: failed ({type(e).__name__}: {str(e)[:120]})")
            rows.append((dtype, name, best, tf_t, tf_tr))
            if best_by:
                persist_rows.append((dtype, name, best_by, tf_t))
            if best_tma:
                tma_rows.append((dtype, name, best_tma, tf_t))
            if best_mc:
                mc_rows.append((dtype, name, best_mc, tf_t, tf_tr))
            if args.profile and args.cluster_multicast:
                for mc in args.cluster_multicast:
                    for rel in (args.stage_release or [None]):
                        if rel == "d44" and not mc:
                            continue
                        pc = {**cfgs, "tilecore.cuda.cluster_multicast": mc, "tilecore.cuda.pipeline_profile": True}
                        if rel is not None:
                            pc["tilecore.cuda.stage_release"] = rel
                        k = tilecore.compile(matmul(m, n, kk, *configs[0], dtype=dtype), target=args.target,
                                             pass_configs=pc)
                        label = (f"{dtype} {name} {configs[0]} cluster_multicast {mc or 'off'}"
                                 + (f", stage_release {rel}" if rel else ""))
                        try:
                            print(profile_line(k, lambda: k(a, b, c), label))
                        except Exception as e:  # noqa: BLE001 - the timings above stand; said so
                            print(f"  profile {label}: failed ({type(e).__name__}: {str(e)[:160]})")
            if any_split:
                split_rows.append((dtype, name, best, unsplit, tf_t))
            del a, b, c
            torch.cuda.empty_cache()
    if args.fp8 and not args.no_wgmma:  # fp8 has no mma.sync path here
        rows.append(fp8_row(torch, args))

    print()
    print("| dtype | shape | tilecore TFLOP/s | best config (bM,bN,bK,threads,stages[,panel]) | torch (cuBLAS) TFLOP/s "
          "| ratio | Triton TFLOP/s | ratio to Triton |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        dtype, n, best, tf_t = row[:4]
        tf_tr = row[4] if len(row) > 4 else float("nan")
        tr = "-" if tf_tr != tf_tr else f"{tf_tr:.1f}"
        if best is None:
            print(f"| {dtype} | {n} | - | (no config compiled) | {tf_t:.1f} | - | {tr} | - |")
        else:
            vs = "-" if tf_tr != tf_tr else f"{best[0] / tf_tr:.2f}x"
            print(f"| {dtype} | {n} | {best[0]:.1f} | {best[1]} | {tf_t:.1f} | {best[0] / tf_t:.2f}x | {tr} | {vs} |")

    if split_rows:
        print()
        print("| dtype | shape | split-K TFLOP/s (config, splits) | tilecore.cuda.split_k=1 TFLOP/s (config) "
              "| torch (cuBLAS) TFLOP/s | split-K / cuBLAS | split_k=1 / cuBLAS | split-K / split_k=1 |")
        print("|---|---|---|---|---|---|---|---|")
        for dtype, n, best, unsplit, tf_t in split_rows:
            print(f"| {dtype} | {n} | {best[0]:.1f} ({best[1]}, {best[2]}) | {unsplit[0]:.1f} ({unsplit[1]}) "
                  f"| {tf_t:.1f} | {best[0] / tf_t:.2f}x | {unsplit[0] / tf_t:.2f}x | {best[0] / unsplit[0]:.2f}x |")

    if persist_rows:
        print()
        print("| dtype | shape | persistent off TFLOP/s (config) | on (config) | pingpong (config) | torch (cuBLAS) "
              "TFLOP/s | off / cuBLAS | on / cuBLAS | pingpong / cuBLAS | on / off | pingpong / off |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for dtype, n, by, tf_t in persist_rows:
            off, on, pp = by.get(False), by.get(True), by.get("pingpong")
            cell = lambda x: "-" if x is None else f"{x[0]:.1f} ({x[1]})"  # noqa: E731
            ratio = lambda x: "-" if x is None else f"{x[0] / tf_t:.2f}x"  # noqa: E731
            vs = lambda x: "-" if off is None or x is None else f"{x[0] / off[0]:.3f}x"  # noqa: E731
            print(f"| {dtype} | {n} | {cell(off)} | {cell(on)} | {cell(pp)} | {tf_t:.1f} | {ratio(off)} | {ratio(on)} "
                  f"| {ratio(pp)} | {vs(on)} | {vs(pp)} |")

    if tma_rows:
        print()
        print("| dtype | shape | tma_store off TFLOP/s (config) | on (config) | torch (cuBLAS) TFLOP/s | off / cuBLAS "
              "| on / cuBLAS | on / off |")
        print("|---|---|---|---|---|---|---|---|")
        for dtype, n, by, tf_t in tma_rows:
            off, on = by.get(False), by.get(True)
            cell = lambda x: "-" if x is None else f"{x[0]:.1f} ({x[1]})"  # noqa: E731
            ratio = lambda x: "-" if x is None else f"{x[0] / tf_t:.2f}x"  # noqa: E731
            vs = "-" if off is None or on is None else f"{on[0] / off[0]:.3f}x"
            print(f"| {dtype} | {n} | {cell(off)} | {cell(on)} | {tf_t:.1f} | {ratio(off)} | {ratio(on)} | {vs} |")

    if mc_rows and args.stage_release:  # one column per (cluster_multicast, stage_release), D49
        keys = list(dict.fromkeys(k for row in mc_rows for k in row[2]))
        name_of = lambda k: f"{k[0] or 'off'}/{k[1]}"  # noqa: E731
        print()
        print("| dtype | shape | " + " | ".join(f"{name_of(k)} TFLOP/s (config)" for k in keys) + " | torch (cuBLAS) "
              "TFLOP/s | Triton TFLOP/s | " + " | ".join(f"{name_of(k)} / cuBLAS" for k in keys) + " | best / Triton |")
        print("|---|---|" + "---|" * (2 * len(keys) + 3))
        for dtype, n, by, tf_t, tf_tr in mc_rows:
            cells = " | ".join("-" if by.get(k) is None else f"{by[k][0]:.1f} ({by[k][1]})" for k in keys)
            ratios = " | ".join("-" if by.get(k) is None else f"{by[k][0] / tf_t:.3f}x" for k in keys)
            top = max(v[0] for v in by.values())
            tr = "-" if tf_tr != tf_tr else f"{tf_tr:.1f}"
            vs = "-" if tf_tr != tf_tr else f"{top / tf_tr:.3f}x"
            print(f"| {dtype} | {n} | {cells} | {tf_t:.1f} | {tr} | {ratios} | {vs} |")
    elif mc_rows:
        print()
        print("| dtype | shape | cluster_multicast off TFLOP/s (config) | 2x1 (config) | 1x2 (config) | torch (cuBLAS) "
              "TFLOP/s | Triton TFLOP/s | off / cuBLAS | 2x1 / cuBLAS | 1x2 / cuBLAS | best / Triton |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for dtype, n, by, tf_t, tf_tr in mc_rows:
            cell = lambda x: "-" if x is None else f"{x[0]:.1f} ({x[1]})"  # noqa: E731
            ratio = lambda x: "-" if x is None else f"{x[0] / tf_t:.3f}x"  # noqa: E731
            top = max(v[0] for v in by.values())
            tr = "-" if tf_tr != tf_tr else f"{tf_tr:.1f}"
            vs = "-" if tf_tr != tf_tr else f"{top / tf_tr:.3f}x"
            print(f"| {dtype} | {n} | {cell(by.get(False))} | {cell(by.get('2x1'))} | {cell(by.get('1x2'))} "
                  f"| {tf_t:.1f} | {tr} | {ratio(by.get(False))} | {ratio(by.get('2x1'))} | {ratio(by.get('1x2'))} "
                  f"| {vs} |")

    # compile and launch costs
    cold, _, _ = compile_times(args.target)
    fresh = cold_compile_fresh_process(args.target)
    a = torch.randn(4096, 4096, device="cuda").half()
    b = torch.randn(4096, 4096, device="cuda").half()
    c = torch.empty(4096, 4096, device="cuda").half()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    k = tilecore.compile(matmul(4096, 4096, 4096, 128, 128, 32, 256, 3), target=args.target)  # cache hit
    k(a, b, c)  # loads the module (cuModuleLoadData) on first use
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    n = 1 << 12
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    z = torch.empty(n, device="cuda")
    kv = tilecore.compile(vadd(n), target=args.target)
    launches = 2000

    def host_us(fn):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(launches):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / launches * 1e6

    ours = host_us(lambda: kv(x, y, z))
    theirs = host_us(lambda: torch.add(x, y, out=z))
    print()
    print("| measure | tilecore | torch |")
    print("|---|---|---|")
    print(f"| cold compile (128x128x32 fp16 GEMM, no cache, after other compiles in this process) | {cold:.2f} s | - |")
    print(f"| cold compile in a fresh process (128x256x64 fp16 WGMMA GEMM, no cache, NVRTC start-up included, "
          "torch already imported) | "
          f"{fresh} | - |")
    print(f"| warm load (cache hit + module load + first launch) | {warm * 1e3:.1f} ms | - |")
    print(f"| host time per launch (4096-element add) | {ours:.1f} us | {theirs:.1f} us (torch.add) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
