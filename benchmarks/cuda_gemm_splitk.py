"""Few-tile GEMMs (issue 17's LLM rows 128x4096x4096 and 16x8192x8192): the compiler's split-K before and after
D41, the user's split-K kernel, cuBLAS and Triton, in one run.

    python benchmarks/cuda_gemm_splitk.py [--shapes 128x4096x4096,16x8192x8192] [--dtypes float16] [--rounds 20]
    python benchmarks/cuda_gemm_splitk.py --general   # D67: + the core's general path, unsplit and the user's split-K

For every configuration the README GEMM (``cuda_gemm.matmul``, C in its own type) is compiled three ways:
``tilecore.cuda.split_k=1`` (not split), split over K by the compiler with the partials summed through the
global workspace by each tile's last block (``tilecore.cuda.split_k_reduce="global"``: D27/D31, the kernel
before D41) and with the tile's splits one thread-block cluster summing through DSMEM (``"cluster"``: D41, the
default where the clusters all fit on an H100 at once; asked for, up to 8), and as it comes without pass configs ("default"). Each split kernel is also timed at ``--split-k`` counts beside the rule's. The
user's split-K kernel (a third grid dimension over K, ``T.atomic_add`` into a float32 C that each timed call
zeroes first) is timed as before. torch.matmul (cuBLAS, C in its own type) and a plain Triton GEMM are the
references.

Times: per-call CUDA events around each launch, ``--batch`` calls per variant issued while the GPU sleeps
(``torch.cuda._sleep``, ``--sleep-cycles``: the host's launch path, 20-50 us a call on the H100's host, is slower
than these ~16 us kernels, so without the sleep the GPU idles between calls and every time holds the host's; the
first run of this benchmark did, cuBLAS included), so the GPU runs them back to back; the variants interleaved
round by round (``--rounds``), the median of all calls. B (32 MiB fp16 at 128x4096x4096) stays
partly in the 50 MiB L2 between calls, for every row alike. Each result is checked against a float32 product;
the cluster kernel's C must equal the global kernel's bit for bit (the same sums in the same order). Two more
columns tell a host-bound row: each batch's back-to-back time per call (first start to last end: what a batch
mean such as cuda_gemm.py's reports) and the host's time to issue one call; where the host is slower than the
GPU, the back-to-back time follows the host's, not the kernel's.
For each cluster kernel the driver's cuOccupancyMaxActiveClusters says how many of its clusters the GPU holds at
once (the tile count or more: one wave). Without a GPU it compiles one kernel of each kind and exits with status 3.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import tilecore
import tilecore.language as T

sys.path.insert(0, str(Path(__file__).parent))
from cuda_gemm import NO_GPU_EXIT, has_gpu, matmul, split_k_of, triton_matmul  # noqa: E402

#: (block_M, block_N, block_K, threads, stages) of the compiler's kernels: cuda_gemm.py's small-M set and its
#: best 128-row configuration at 128x4096x4096 (5 stages)
COMPILER_CONFIGS = [(64, 64, 64, 128, 4), (64, 128, 64, 128, 4), (64, 256, 64, 128, 3), (128, 128, 64, 256, 3),
                    (128, 128, 64, 256, 5)]
#: (block_M, block_N, block_K, threads, stages, splits) of the user's atomic split-K kernel (its best two before)
SPLIT_CONFIGS = [(128, 128, 64, 128, 3, 4), (64, 128, 64, 128, 4, 2)]


def matmul_splitk(M, N, K, bm, bn, bk, threads=128, stages=3, splits=4, dtype="float16"):
    """C (float32, zeroed by the caller) += A @ B, the K loop split over ``splits`` blocks per output tile."""
    k_tiles = T.ceildiv(K, bk * splits)  # k tiles per split

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), splits, threads=threads) as (bx, by, bz):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(k_tiles, num_stages=stages):
                T.copy(A[by * bm, (bz * k_tiles + ko) * bk], A_s)
                T.copy(B[(bz * k_tiles + ko) * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.atomic_add(C[by * bm, bx * bn], C_l)

    return gemm


def max_active_clusters(kernel) -> int | None:
    """cuOccupancyMaxActiveClusters for a kernel compiled with __cluster_dims__ (None where the driver says no)."""
    from tilecore_cuda.runtime import _LaunchConfig

    prog = getattr(kernel, "_program", None)
    if prog is None or not kernel.source.meta.get("cluster"):
        return None
    meta = kernel.source.meta
    grid = [int(g) for g in meta["grid"]]
    cfg = _LaunchConfig(grid[0], grid[1], grid[2], int(meta["threads"]), 1, 1, int(meta.get("dynamic_shared_bytes", 0)),
                        None, None, 0)
    n = ctypes.c_int(0)
    rc = prog.lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), prog._function(0)[1], ctypes.byref(cfg))
    return n.value if rc == 0 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="128x4096x4096,16x8192x8192")
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--rounds", type=int, default=20, help="rounds of --batch calls per variant, interleaved")
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--sleep-cycles", type=int, default=4_000_000,
                    help="GPU cycles of torch.cuda._sleep before each batch, so the host issues it ahead of the GPU "
                         "(0: none, the times then hold the host's launch time where it is the slower)")
    ap.add_argument("--split-k", default="", type=lambda v: [int(x) for x in v.split(",") if x],
                    help="also time each split configuration at these split counts (cluster and global), e.g. 2,4,8")
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--general", action="store_true",
                    help="D67: also the core's general path (tilecore.cuda.register_programs=False): every configuration "
                         "unsplit (the general path has no split-K), and the user's atomic split-K kernel on it")
    ap.add_argument("--configs", default="", help="block_M:block_N:block_K:threads:stages,... instead of the default set")
    args = ap.parse_args()
    configs = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",") if c] or COMPILER_CONFIGS
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    ok, why = has_gpu()
    if not ok:
        M, N, K = shapes[0]
        for fn, cfg in ((matmul(M, N, K, *COMPILER_CONFIGS[-1]), {}),
                        (matmul(M, N, K, *COMPILER_CONFIGS[-1]), {"tilecore.cuda.split_k_reduce": "global"}),
                        (matmul_splitk(M, N, K, *SPLIT_CONFIGS[0][:5], splits=SPLIT_CONFIGS[0][5]), {})):
            k = tilecore.compile(fn, target="cuda:sm_90a", pass_configs=cfg)
            print(f"compiled for cuda:sm_90a ({len(k.get_kernel_source())} bytes of CUDA): "
                  f"{k.meta['attrs'].get('hopper_pipelines', ('',))[-1][:160]}")
        print(f"no GPU: {why}")
        return NO_GPU_EXIT
    import torch

    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; tilecore {tilecore.__version__}")
    triton_mm = triton_matmul()
    summary = []
    for dtype in args.dtypes.split(","):
        tdt = getattr(torch, dtype)
        for M, N, K in shapes:
            g = torch.Generator(device="cuda").manual_seed(0)
            a = (torch.randn(M, K, device="cuda", generator=g) / 8).to(tdt)
            b = (torch.randn(K, N, device="cuda", generator=g) / 8).to(tdt)
            ref = a.float() @ b.float()
            flop = 2.0 * M * N * K
            name = f"{dtype} {M}x{N}x{K}"
            variants = {}  # label -> (kind, config, fn, output, kernel)
            c_t = torch.empty(M, N, device="cuda", dtype=tdt)
            variants["cuBLAS (torch.matmul)"] = ("cublas", None, lambda: torch.matmul(a, b, out=c_t), c_t, None)
            if triton_mm is not None:
                c_tr = torch.empty(M, N, device="cuda", dtype=tdt)
                variants["Triton"] = ("triton", None, lambda c=c_tr: triton_mm(a, b, c), c_tr, None)
            for cfg in configs:
                kinds = [("default", {}),  # what the compiler builds unasked (D41: the cluster sum at 2 splits)
                         ("split_k=1", {"tilecore.cuda.split_k": 1}),
                         ("global (D27/D31)", {"tilecore.cuda.split_k_reduce": "global"}),
                         ("cluster (D41)", {"tilecore.cuda.split_k_reduce": "cluster"})]
                if args.general:  # D67: the core's general path, not split (the split is the plugin's alone)
                    kinds.append(("general", {"tilecore.cuda.register_programs": False}))
                for n in args.split_k:
                    kinds += [(f"global, split_k={n}", {"tilecore.cuda.split_k": n, "tilecore.cuda.split_k_reduce": "global"}),
                              (f"cluster, split_k={n}", {"tilecore.cuda.split_k": n, "tilecore.cuda.split_k_reduce": "cluster"})]
                for kind, pc in kinds:
                    try:
                        k = tilecore.compile(matmul(M, N, K, *cfg, dtype=dtype), target=args.target, pass_configs=pc)
                    except Exception as e:  # noqa: BLE001 - a configuration that does not fit: said so
                        print(f"  {name} {cfg} {kind}: skipped ({type(e).__name__}: {str(e)[:140]})")
                        continue
                    splits = split_k_of(k)
                    if kind.startswith("cluster") and not k.source.meta.get("cluster"):
                        print(f"  {name} {cfg} {kind}: not a cluster kernel (splits {splits}): skipped")
                        continue
                    if kind.startswith("global") and splits == 1:
                        continue  # not split: the split_k=1 row is this kernel
                    c = torch.empty(M, N, device="cuda", dtype=tdt)
                    if kind == "default":
                        kind += " (cluster)" if k.source.meta.get("cluster") else " (global)" if splits > 1 else ""
                    variants[f"{cfg} {kind}, {splits} splits"] = (kind.split(",")[0].split(" ")[0], cfg,
                                                                  lambda k=k, c=c: k(a, b, c), c, k)
            for cfg in SPLIT_CONFIGS:
                for where, pc in (("", {}), (" on the general path", {"tilecore.cuda.register_programs": False}))[
                        :2 if args.general else 1]:
                    k = tilecore.compile(matmul_splitk(M, N, K, *cfg[:5], splits=cfg[5], dtype=dtype), target=args.target,
                                         pass_configs=pc)
                    c32 = torch.zeros(M, N, device="cuda", dtype=torch.float32)

                    def user(k=k, c32=c32):
                        c32.zero_()
                        k(a, b, c32)

                    variants[f"{cfg} user atomic split-K{where} (float32 C, zeroed per call)"] = (
                        "user-general" if where else "user", cfg, user, c32, k)
            for fn in (v[2] for v in variants.values()):  # warm up (compiles Triton's autotuning too)
                for _ in range(3):
                    fn()
            torch.cuda.synchronize()
            times = {label: [] for label in variants}
            spans = {label: [] for label in variants}  # a batch back to back: first start to last end, per call
            hosts = {label: [] for label in variants}  # the host's time to issue a call (events included)
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.batch)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.batch)]
            slept = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            cycles = args.sleep_cycles if hasattr(torch.cuda, "_sleep") else 0
            short = 0  # batches whose issue outlasted the GPU's sleep (their times may hold host time)
            for _ in range(args.rounds):
                for label, (_, _, fn, _, _) in variants.items():
                    # the GPU sleeps while the host issues the batch, then runs it back to back: the events time
                    # the GPU, not the host's launch path (which is slower than a 16 us kernel here)
                    if cycles:
                        slept[0].record()
                        torch.cuda._sleep(cycles)
                        slept[1].record()
                    t0 = time.perf_counter()
                    for i in range(args.batch):
                        starts[i].record()
                        fn()
                        ends[i].record()
                    host = (time.perf_counter() - t0) * 1e6
                    hosts[label].append(host / args.batch)
                    ends[-1].synchronize()
                    if cycles and slept[0].elapsed_time(slept[1]) * 1e3 < host:
                        short += 1
                        cycles *= 2  # sleep longer from now on
                    times[label] += [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
                    spans[label].append(starts[0].elapsed_time(ends[-1]) * 1e3 / args.batch)
            if short:
                print(f"  ({short} batches were issued slower than the GPU slept; the sleep grew to {cycles} cycles)")
            med = {label: statistics.median(ts) for label, ts in times.items()}
            t_cublas = med["cuBLAS (torch.matmul)"]
            print(f"\n{name}: median us per call over {args.rounds} x {args.batch} calls")
            print("| variant | us | TFLOP/s | / cuBLAS | back to back, us/call | host us/call | max err vs float32 | note |")
            print("|---|---|---|---|---|---|---|---|")
            best = {}
            globals_c = {}
            for label, (kind, cfg, fn, out, k) in variants.items():
                fn()
                torch.cuda.synchronize()
                err = float((out.float() - ref).abs().max())
                note = ""
                if kind == "global":
                    globals_c[(cfg, split_k_of(k))] = out.clone()
                if kind == "cluster":
                    same = globals_c.get((cfg, split_k_of(k)))
                    note = (f"same bits as global: {torch.equal(out, same)}; " if same is not None else "") + \
                        f"max active clusters {max_active_clusters(k)} for {int(k.source.meta['grid'][0]) * int(k.source.meta['grid'][1])} tiles"
                us = med[label]
                span, host = statistics.median(spans[label]), statistics.median(hosts[label])
                print(f"| {label} | {us:.2f} | {flop / us / 1e6:.1f} | {t_cublas / us:.2f}x | {span:.2f} | {host:.2f} | "
                      f"{err:.1e} | {note} |")
                if kind in ("split_k=1", "global", "cluster", "user", "default", "general", "user-general") and (kind not in best or us < best[kind][0]):
                    best[kind] = (us, label)
            t_tr = med.get("Triton")
            summary.append((name, t_cublas, t_tr, best))
            del a, b, ref
            torch.cuda.empty_cache()
    print("\n| shape | cuBLAS us | Triton us | best split_k=1 | best global (before, D27/D31) | best cluster (after, D41) "
          "| best default kernel | user atomic | after / cuBLAS | after / before |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, t_cublas, t_tr, best in summary:
        def cell(kind):
            if kind not in best:
                return "-"
            us, label = best[kind]
            return f"{us:.2f} us, {t_cublas / us:.2f}x ({label})"
        after, before = best.get("cluster", (float("nan"),))[0], best.get("global", (float("nan"),))[0]
        tr = "-" if t_tr is None else f"{t_tr:.2f}"
        print(f"| {name} | {t_cublas:.2f} | {tr} | {cell('split_k=1')} | {cell('global')} | {cell('cluster')} | "
              f"{cell('default')} | {cell('user')} | {t_cublas / after:.2f}x | {before / after:.2f}x |")
        if "general" in best:  # D67: the general path (unsplit) and the user's split-K on it
            print(f"|   general path: {name} | | | unsplit {cell('general')} | | | | user atomic {cell('user-general')} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
