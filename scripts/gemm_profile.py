"""Our 16-bit GEMM against cuBLAS's under Nsight Compute (decision D76): one launch of each kernel profiled
(``--launch-skip 2 --launch-count 1``, clocks locked to base, caches flushed: ncu's defaults), side by side.

    python scripts/gemm_profile.py [--size 4096] [--dtypes float16,bfloat16] [--variants cublas,t128x256,t256x128]
        [--ncu PATH] [--top 10]

Variants: ``cublas`` (``torch.matmul``; the kernel matched by ``--cublas-regex``, nvjet / xmma / cutlass), and the
README GEMM (``benchmarks/_bench.tile_gemm``) on the default route (the core's general path, D62 / D65) at the tiles of
:data:`TILES` (``bm:bn:bk:threads:stages:panel`` plus pass configs). ``--tile NAME=bm:bn:bk:threads:stages:panel``
adds one; ``--config NAME:KEY=VALUE`` adds a pass config to it.

Prints per dtype: (1) the launch (grid, block, cluster, registers, shared memory) and the kernel's name; (2) duration
and cycles at ncu's locked clock, the work per SM-cycle (dense FLOP / (SMs x cycles)), issue slots, tensor pipe
(gmma), dram / L2 bytes and throughput; (3) stall reasons (pc samples); (4) the samples by SASS region and class
(ours: the consumers' main loop, the producer's, the rest; cuBLAS's: by class only) and (5) the top instructions.

``--child DTYPE VARIANT OUTDIR``: the process ncu runs (builds the kernel, launches it 3 times, writes its SASS).
Exits 2 without ncu or a GPU.
"""
from __future__ import annotations

import argparse
import ast
import csv
import io
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import fa_profile as fp  # noqa: E402  (ncu's raw / source pages, the SASS regions and classes: D70's script)

#: name -> ((bm, bn, bk, threads, stages, panel), pass configs): the README GEMM on its default route
TILES = {"t128x256": ((128, 256, 64, 256, 3, 8), {}),  # the table's best (cuda_gemm.py CONFIGS[0])
         "t128x256s4": ((128, 256, 64, 256, 4, 8), {}),
         "t256x128": ((256, 128, 64, 256, 3, 8), {}),  # cuBLAS's tile: two warpgroups of 128 x 128
         "t128x128": ((128, 128, 64, 256, 4, 8), {}),
         "plugin": ((128, 256, 64, 256, 3, 8), {"tilecore.cuda.general_plain_gemm": False}),
         # D76's candidates: panels (the DRAM bytes), descriptor offsets, the warp-specialized form (a producer
         # warpgroup: cuBLAS's shape), at 3 and 4 stages
         "p4": ((128, 256, 64, 256, 3, 4), {}), "p16": ((128, 256, 64, 256, 3, 16), {}),
         "doff": ((128, 256, 64, 256, 3, 8), {"tilecore.cuda.descriptor_offsets": True}),
         "ws3": ((128, 256, 64, 256, 3, 8), "ws-us-doff"), "ws4": ((128, 256, 64, 256, 4, 8), "ws-us-doff"),
         "ws256x128": ((256, 128, 64, 256, 3, 8), "ws-us-doff"),
         # D80: the warp-specialized form in block groups of two, B multicast (clusters 2x1, cuBLAS's launch shape)
         "wsmc": ((128, 256, 64, 256, 3, 8), "ws-mc"), "wsmc4": ((128, 256, 64, 256, 4, 8), "ws-mc"),
         "wsmc256x128": ((256, 128, 64, 256, 3, 8), "ws-mc")}


def _tiles() -> dict:
    """TILES with the names of benchmarks/general_gemm.py's variants resolved to their pass configs."""
    from general_gemm import GENERAL, VARIANTS

    return {k: (t, {**GENERAL, **VARIANTS[c]} if isinstance(c, str) else c) for k, (t, c) in TILES.items()}
SECTIONS = fp.SECTIONS
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "sm__cycles_elapsed.avg",
           "sm__cycles_active.avg", "smsp__inst_executed.sum", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active")


def child(dtype: str, variant: str, size: int, tiles: dict, outdir: Path) -> int:
    import torch

    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn(size, size, device="cuda", generator=g) / 8).to(tdt)
    b = (torch.randn(size, size, device="cuda", generator=g) / 8).to(tdt)
    c = torch.empty(size, size, device="cuda", dtype=tdt)
    if variant == "cublas":
        fn = lambda: torch.matmul(a, b, out=c)  # noqa: E731
    else:
        import tilecore
        import tilecore_cuda
        from cuda_gemm import matmul

        (bm, bn, bk, threads, stages, panel), configs = tiles[variant]
        k = tilecore.compile(matmul(size, size, size, bm, bn, bk, threads, stages, panel, dtype), target="cuda",
                             pass_configs=configs)
        try:
            (outdir / "kernel.sass").write_text(tilecore_cuda.CUDABackend().disassemble(k.binary, k.target))
        except (SystemExit, OSError) as e:
            print(f"gemm_profile: no SASS for the regions ({e})", file=sys.stderr)
        fn = lambda: k(a, b, c)  # noqa: E731
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    err = (c.float() - (a.float() @ b.float())).abs().max().item()
    print(f"gemm_profile child {dtype} {variant}: max error {err:.3g}", file=sys.stderr)
    return 0


def strings(ncu: str, rep: str) -> dict:
    """The raw page's text cells (the kernel's name, grid and block sizes as ncu writes them)."""
    out = subprocess.run([ncu, "--import", rep, "--page", "raw", "--csv"], capture_output=True, text=True)
    rows = list(csv.reader(io.StringIO(out.stdout)))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None or len(rows) < head + 3:
        return {}
    return dict(zip(rows[head], rows[head + 2]))


LAUNCH = [("grid", r"^launch__grid_size$"), ("block", r"^launch__block_size$"),
          ("cluster x", r"^launch__cluster_dim_x$"), ("cluster y", r"^launch__cluster_dim_y$"),
          ("cluster size", r"^launch__cluster_size$|^launch__cluster_max_active_clusters$"),
          ("registers / thread", r"^launch__registers_per_thread$"),
          ("shared dyn B / block", r"^launch__shared_mem_per_block_dynamic$"),
          ("shared static B", r"^launch__shared_mem_per_block_static$"),
          ("waves / SM", r"^launch__waves_per_multiprocessor$"),
          ("occupancy limit blocks", r"^launch__occupancy_limit_shared_mem$")]
PERF = [("duration us", r"^gpu__time_duration\.sum$", 1e-3),
        ("SM cycles elapsed", r"^sm__cycles_elapsed\.avg$", 1),
        ("SM cycles active", r"^sm__cycles_active\.avg$", 1),
        ("SM clock MHz (locked)", r"^sm__cycles_elapsed\.avg\.per_second$|^smsp__cycles_elapsed\.avg\.per_second$", 1e-6),
        ("issue slots busy %", r"^sm__inst_issued\.avg\.pct_of_peak_sustained_active$|"
                               r"^smsp__issue_active\.avg\.pct_of_peak_sustained_active$", 1),
        ("instructions (M)", r"^smsp__inst_executed\.sum$", 1e-6),
        ("tensor pipe gmma %", r"^sm__pipe_tensor_op_gmma_cycles_active\.avg\.pct_of_peak_sustained_active$", 1),
        ("SM throughput %", r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$", 1),
        ("achieved occupancy %", r"^sm__warps_active\.avg\.pct_of_peak_sustained_active$", 1),
        ("dram read MB", r"^dram__bytes_read\.sum$", 1e-6),
        ("dram write MB", r"^dram__bytes_write\.sum$", 1e-6),
        ("dram %", r"^dram__throughput\.avg\.pct_of_peak_sustained_elapsed$", 1),
        ("L2 bytes MB", r"^lts__t_bytes\.sum$", 1e-6),
        ("L2 %", r"^lts__throughput\.avg\.pct_of_peak_sustained_elapsed$", 1),
        ("L2 hit %", r"^lts__t_sector_hit_rate\.pct$", 1),
        ("L1/shared %", r"^l1tex__throughput\.avg\.pct_of_peak_sustained_active$", 1),
        ("warp cycles / issue", r"^smsp__average_warp_latency_per_inst_issued\.ratio$", 1)]


def value(met: dict, pattern: str, scale: float = 1.0) -> float | None:
    for n, (v, u) in met.items():
        if re.match(pattern, n) and v is not None:
            u = u.strip()
            if "duration" in n:
                scale = {"usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3, "ns": 1e-3}.get(u, scale)
            elif u in ("Kbyte", "KB") and "bytes" in n:
                return v * 1e3 * scale
            elif u in ("Mbyte", "MB") and "bytes" in n:
                return v * 1e6 * scale
            elif u in ("Gbyte", "GB") and "bytes" in n:
                return v * 1e9 * scale
            elif u in ("Ghz", "GHz") and "per_second" in n:
                return v * 1e9 * scale
            elif u in ("Mhz", "MHz") and "per_second" in n:
                return v * 1e6 * scale
            return v * scale
    return None


def report(dtype: str, size: int, results: dict, texts: dict, top: int) -> None:
    names = list(results)
    w = 26
    print(f"\n=== {dtype} {size}^3 (ncu: one launch, clocks locked to base, caches flushed) ===")
    print("metric".ljust(w) + "".join(n.rjust(16) for n in names))
    for n in names:
        print(f"  {n}: {texts[n].get('Kernel Name', '?')[:150]}")
    for label, pat in LAUNCH:
        vals = [texts[n].get(next((k for k in texts[n] if re.match(pat, k)), ""), "-") or "-" for n in names]
        if any(v != "-" for v in vals):
            print(label.ljust(w) + "".join(str(v)[:15].rjust(16) for v in vals))
    seen = {k for n in names for k in texts[n] for _, pat in LAUNCH if re.match(pat, k)}
    extra = sorted({k for n in names for k in texts[n] if k.startswith("launch__cluster") and k not in seen})
    for k in extra:  # whatever this ncu calls the cluster's shape
        print(k[len("launch__"):][:w - 1].ljust(w) + "".join(str(texts[n].get(k, "-") or "-")[:15].rjust(16)
                                                            for n in names))
    cyc = {}
    for label, pat, sc in PERF:
        vals = [value(results[n]["metrics"], pat, sc) for n in names]
        if label == "SM cycles elapsed":
            cyc = dict(zip(names, vals))
        print(label.ljust(w) + "".join((f"{v:.1f}" if v is not None else "-").rjust(16) for v in vals))
    sms = None
    try:
        import torch

        sms = torch.cuda.get_device_properties(0).multi_processor_count
    except Exception:  # noqa: BLE001 (the parent needs no GPU of its own: 132, the H100 SXM's, then)
        pass
    sms = sms or 132
    flop = 2.0 * size ** 3
    base = next(iter(names))
    print("FLOP / SM-cycle".ljust(w) + "".join(
        (f"{flop / (sms * cyc[n]):.0f}" if cyc.get(n) else "-").rjust(16) for n in names))
    if cyc.get(base):
        print(f"cycles vs {base}".ljust(w) + "".join(
            (f"{cyc[base] / cyc[n]:.3f}x" if cyc.get(n) else "-").rjust(16) for n in names))
    tens = sorted({k for n in names for k, (v, _) in results[n]["metrics"].items()
                   if v is not None and ("tensor" in k or "gmma" in k) and "pct" in k})
    if tens:
        print("-- the tensor pipe's metrics (%)")
        for k in tens[:10]:
            print(f"  {k[:w + 20]}")
            print(" " * w + "".join((f"{results[n]['metrics'][k][0]:.1f}" if results[n]["metrics"].get(k, (None,))[0]
                                     is not None else "-").rjust(16) for n in names))
    shares = {n: fp.stall_shares(results[n]["metrics"]) for n in names}
    keys = sorted({k for s in shares.values() for k in s}, key=lambda k: -max(s.get(k, 0) for s in shares.values()))
    print("-- stall reasons, % of samples (kernel-wide)")
    for k in keys[:12]:
        print(f"  {k}".ljust(w) + "".join(f"{shares[n].get(k, 0):.1f}".rjust(16) for n in names))
    print("-- samples by region / class, % of all samples")
    cells = sorted({rc for n in names for rc in results[n]["by"]},
                   key=lambda rc: -max(results[n]["by"].get(rc, 0) / (results[n]["total"] or 1) for n in names))
    for rc in cells[:18]:
        vals = [100.0 * results[n]["by"].get(rc, 0) / (results[n]["total"] or 1) for n in names]
        if max(vals) >= 0.5:
            print(f"  {rc[0][:8]}: {rc[1]}".ljust(w) + "".join(f"{v:.1f}".rjust(16) for v in vals))
    for n in names:
        print(f"-- {n}: top instructions (offset, region, % samples)")
        for off, region, text, share in results[n]["top"]:
            print(f"  {off:#07x} {region[:8]:8s} {100 * share:5.1f}%  {text.strip()[:90]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--variants", default="cublas,t128x256,t256x128")
    ap.add_argument("--tile", action="append", default=[], metavar="NAME=bm:bn:bk:threads:stages:panel")
    ap.add_argument("--config", action="append", default=[], metavar="NAME:KEY=VALUE")
    ap.add_argument("--cublas-regex", default="nvjet|xmma|cutlass|sm90_|gemm")
    ap.add_argument("--ncu", default=None)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp") + "/gemmprof")
    ap.add_argument("--timeout", type=int, default=60, help="seconds for one profiled process")
    ap.add_argument("--child", nargs=3, metavar=("DTYPE", "VARIANT", "OUTDIR"))
    ap.add_argument("--tiles", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    tiles = _tiles()
    for t in args.tile:
        name, _, spec = t.partition("=")
        tiles[name] = (tuple(int(x) for x in spec.split(":")), {})
    tiles = fp.parse_configs(args.config, tiles, error=ap.error)
    if args.child:
        if args.tiles:
            tiles = ast.literal_eval(args.tiles)
        return child(args.child[0], args.child[1], args.size, tiles, Path(args.child[2]))
    names = [n for n in args.variants.split(",") if n]
    bad = [n for n in names if n != "cublas" and n not in tiles]
    if bad:
        ap.error(f"unknown variants {', '.join(bad)}; of cublas, {', '.join(tiles)}")
    ncu = fp.ncu_or_none(args.ncu, "gemm_profile")
    if ncu is None:
        return 2
    for n in names:
        if n != "cublas":
            print(f"  {n}: {tiles[n][0]} (bm, bn, bk, threads, stages, panel) {tiles[n][1] or ''}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rc = 0
    for i, dtype in enumerate(args.dtypes.split(",")):
        results, texts = {}, {}
        for n in (names if i % 2 == 0 else names[::-1]):
            d = out / f"{dtype}-{n}"
            d.mkdir(exist_ok=True)
            rep = str(d / "prof")
            argv = [sys.executable, str(Path(__file__).resolve()), "--size", str(args.size), "--child", dtype, n,
                     str(d), "--tiles", repr(tiles)]
            if not fp.profile(ncu, args.cublas_regex if n == "cublas" else "tc_kernel", argv, rep, args.timeout,
                              f"{dtype} {n}", METRICS):
                rc = 1
                continue
            sass = (d / "kernel.sass").read_text() if (d / "kernel.sass").exists() else None
            results[n] = fp.analyse(ncu, rep + ".ncu-rep", sass, args.top)
            texts[n] = strings(ncu, rep + ".ncu-rep")
        if results:
            order = [n for n in names if n in results]
            report(dtype, args.size, {n: results[n] for n in order}, texts, args.top)
            sys.stdout.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main())
