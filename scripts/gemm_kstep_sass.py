"""The general path's GEMM k step against the CUDA plugin's, in SASS (no GPU; docs/decisions.md D62).

For the README GEMM at one tile (default 128x128x64, 4 stages, 256 threads, T.use_swizzle(8), 4096^3 fp16) on
cuda:sm_90a: the main loop's instructions a thread executes per k step, by class, for the consumer threads
(the shortest path through the loop) and for thread 0 (the longest: the stage ahead's issue), and ptxas's planned
stall cycles along the loop (tests/sass_paths.py). The plugin's row is its Hopper pipeline (a producer warpgroup
issues the stages: its consumers' loop only). A loop NVVM unrolled twice is counted per k step (halved).

    python scripts/gemm_kstep_sass.py [--tile 128:128:64:256:4:8] [--dtype float16]
    python scripts/gemm_kstep_sass.py --tile 128:256:128:256:3:8 --dtype float8_e4m3 --size 8192 --rows plugin,+\ uni

8-bit operands (D67): B given as (N, K), float16 out (the benchmark's fp8 GEMM).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

GENERAL = {"tilecore.cuda.register_programs": False}
US = {"tilecore.cuda.uniform_warp_index": True, "tilecore.cuda.nonnegative_index_shifts": True}
#: D62 made US the default of persistent GEMMs: D58's default, to compare against
NO_US = {"tilecore.cuda.uniform_warp_index": False, "tilecore.cuda.nonnegative_index_shifts": False}
REL = {"tilecore.pipeline_release_stages": True}
WS = {"tilecore.warp_specialize": True, "tilecore.persistent": True, "tilecore.bulk_store": True}
DOFF = {"tilecore.cuda.descriptor_offsets": True}
ROWS = {
    "plugin (Hopper pipeline)": {"tilecore.cuda.general_plain_gemm": False},
    "general, D58's default (us off)": {**GENERAL, **NO_US},
    "+ uniform warp index, shifts (us; D62's default)": {**GENERAL, **US},
    "+ release barriers (no block barrier)": {**GENERAL, **NO_US, **REL},
    "+ us + release barriers": {**GENERAL, **US, **REL},
    "+ us + release + descriptor offsets": {**GENERAL, **US, **REL, **DOFF},
    "ws+persistent+bulk": {**GENERAL, **WS, **NO_US},
    "ws + us": {**GENERAL, **WS, **US},
    "ws + us + descriptor offsets": {**GENERAL, **WS, **US, **DOFF},
}
CLASSES = ("HGMMA", "R2UR", "uniform", "vector int", "BAR", "SYNCS", "WARPGROUP", "UTMALDG", "BRA")
VECTOR_INT = ("IMAD", "LOP3", "SHF", "IADD3", "VIADD", "LEA", "ISETP", "PLOP3", "SEL", "MOV")


def classify(c) -> dict:
    row = {k: 0 for k in CLASSES}
    for op, n in c.items():
        op = "HGMMA" if op == "QGMMA" else op
        if not op[0].isupper():
            continue
        if op in row:
            row[op] += n
        elif op.startswith("U") and op not in ("UTMALDG",):
            row["uniform"] += n
        elif op in VECTOR_INT:
            row["vector int"] += n
    row["total"] = sum(n for op, n in c.items() if op[0].isupper())
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tile", default="128:128:64:256:4:8", help="block_M:block_N:block_K:threads:stages:panel")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--rows", default="", help="comma-separated prefixes of the rows to build (default: all)")
    args = ap.parse_args()
    import sass_paths
    import tilecore
    import tilecore_cuda
    from cuda_gemm import matmul

    bm, bn, bk, th, st, pn = (int(x) for x in args.tile.split(":"))
    n = args.size
    print(f"{args.dtype} {n}^3, {bm}x{bn}x{bk}, {st} stages, {th} threads, panel {pn}: SASS a thread executes per k "
          "step in the main loop (consumers: the shortest path; thread 0: the longest), ptxas's planned stall cycles")
    print("| kernel | k steps / loop | consumers | thread 0 | " + " | ".join(CLASSES) + " | planned cycles / k step |")
    print("|---" * (5 + len(CLASSES)) + "|")
    # 8-bit operands (D67): B given as (N, K) (wgmma reads 8-bit operands K-major only), float16 out; k per HGMMA 32
    eight = args.dtype.startswith("float8")
    kw = {"out_dtype": "float16", "b_transposed": True} if eight else {}
    kstep, unit = (32, "QGMMA") if eight else (16, "HGMMA")  # (8-bit wgmma's SASS: QGMMA, counted as HGMMA)
    wanted = [w for w in args.rows.split(",") if w]
    for name, cfg in ROWS.items():
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        k = tilecore.compile(matmul(n, n, n, bm, bn, bk, th, st, pn, dtype=args.dtype, **kw), target="cuda:sm_90a",
                             pass_configs={**cfg, "tilecore.disable_cache": True})
        sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
        ins = sass_paths.parse(sass)
        # 8-bit: NVVM unrolls the 128x128 tile's k loop twice, and the shortest "loop" of 4 QGMMA is then the out-of-line
        # barrier wait's branch back into the loop's middle: look for the twice-unrolled loop first
        least = 4
        if eight:
            try:
                sass_paths.main_loop(ins, 2 * bk // kstep, unit)
                least = 2 * bk // kstep
            except ValueError:
                pass
        loop = sass_paths.main_loop(ins, least, unit)
        per = max(1, sum(sass_paths.opcode(ins[i][1]) == unit for i in loop) // (bk // kstep))
        rows = sorted((classify(c) for _, c in sass_paths.paths(ins, loop)), key=lambda r: r["total"])
        lo, hi = rows[0], rows[-1]
        cyc = sass_paths.stalls(sass, least, unit)["cycles"]
        cells = " | ".join(f"{lo[c] / per:g}" for c in CLASSES)
        print(f"| {name} | {per} | {lo['total'] / per:g} | {hi['total'] / per:g} | {cells} | {cyc / per:g} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
