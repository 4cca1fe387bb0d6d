#!/usr/bin/env python
"""SASS of the main loops of benchmarks/mma_general.py's kernels (decision D63), no GPU needed: the mma.sync
register program against the core's general path, built for ``cuda:sm_80`` (or ``--target``, e.g. cuda:sm_90a,
with ``tilecore.cuda.disable_wgmma``), instructions a thread executes per iteration of the loop holding the HMMA
(tests/sass_paths.py; one count per path through the loop's forward branches, fewest first), by class.

    python scripts/mma_sass.py [--only gemm_epi,fa] [--variants regprog,general] [--target cuda:sm_80]
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

CLASSES = ("HMMA", "LDSM", "LDGSTS", "LDS", "LDG", "STS", "BAR", "DEPBAR", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX",
           "SHFL", "F2FP", "IMAD", "IADD3", "LEA", "LOP3", "ISETP", "SEL", "FSEL", "MOV", "BRA")


def counts(kernel) -> list:
    import sass_paths
    import tilecore_cuda

    sass = tilecore_cuda.CUDABackend().disassemble(kernel.binary, kernel.target)
    ins = sass_paths.parse(sass)
    total = collections.Counter(sass_paths.opcode(t) for _, t in ins)
    try:
        loop = sass_paths.main_loop(ins, 4, unit="HMMA")
    except ValueError:
        return [("kernel", total)]
    body = collections.Counter(sass_paths.opcode(ins[k][1]) for k in loop)
    try:
        out = [(f"loop path {''.join('T' if c else 'f' for c in ch) or '-'}", c)
               for ch, c in sass_paths.paths(ins, loop)]
    except ValueError:  # too many forward branches to walk each path: the loop's text, every instruction once
        out = [("loop text", body)]
    return sorted(out, key=lambda r: sum(r[1].values()))[:4] + [("kernel", total)]


def main(argv=None) -> int:
    import tilecore
    import mma_general

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="gemm_epi,fa,fa_causal,gemm777")
    ap.add_argument("--variants", default="regprog,general")
    ap.add_argument("--target", default="cuda:sm_80")
    ap.add_argument("--gemm", default="4096,4096,4096")
    ap.add_argument("--gemm777", default="4096,777,4096")
    ap.add_argument("--fa", default="8,32,4096,128")
    ap.add_argument("--rows", default="4096,8192")
    args = ap.parse_args(argv)
    for k in ("gemm", "gemm777", "fa", "rows"):
        setattr(args, k, tuple(int(v) for v in getattr(args, k).split(",")))
    print(f"{'kernel':10s} {'variant':12s} {'where':16s} {'total':>6s} " + " ".join(f"{c:>6s}" for c in CLASSES))
    for name in args.only.split(","):
        build, own, out_idx = mma_general.KERNELS[name]
        for var in args.variants.split(","):
            cfg = {**mma_general.BASE, **own, **mma_general.VARIANTS[var], "tilecore.disable_cache": True}
            k = tilecore.compile(build(args), out_idx=out_idx, target=args.target, pass_configs=cfg)
            for where, c in counts(k):
                total = sum(v for n, v in c.items() if n[:1].isupper())
                print(f"{name:10s} {var:12s} {where:16s} {total:6d} " + " ".join(f"{c.get(x, 0):6d}" for x in CLASSES),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
