#!/usr/bin/env python
"""The sm_90a (WGMMA) register program against the core's general path: which kernels take
``cuda.hopper_register_program`` and whether the general path reaches registers for them (decision D77).

    python scripts/wgmma_census.py                # the catalog, the TileLang corpus and the attention benchmark's forms
    python scripts/wgmma_census.py --json out.json
    python scripts/wgmma_census.py -k attention

Each kernel is lowered for ``cuda:sm_90a`` (``tilecore.compiler.lower``, no device compiler) with
``tilecore.cuda.register_programs=True`` (the register program wherever it can: the route before D77), with the
defaults and with ``tilecore.cuda.register_programs=False`` (the general path). A row gives the path taken
(``tilecore_cuda.lowering_path``; ``kernel.meta["attrs"]["hopper_pipelines"]`` has the notes) and, on the general
path, how many fragments are in registers (``fragment_layouts``) and whether a matrix unit's layout holds them
(``wgmma``). Kernels no WGMMA register program takes in any mode are counted by their paths.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))

TARGET = "cuda:sm_90a"
MODES = {"forced": {"tilecore.cuda.register_programs": True}, "default": {},
         "general": {"tilecore.cuda.register_programs": False}}
#: FlashAttention's forms the attention benchmark times (benchmarks/cuda_attention.py; D77's device step), at a small
#: sequence: (head dimension, KV heads or None, block rows, key block, threads)
BENCH_FORMS = [(64, None, 128, 128, 256), (64, None, 128, 176, 256), (128, None, 128, 128, 256),
               (128, None, 128, 176, 256), (128, 8, 128, 128, 256), (256, None, 128, 64, 256),
               (128, None, 64, 64, 128), (64, None, 64, 64, 128), (256, None, 64, 64, 128)]


def classify(build, configs: dict) -> tuple:
    """(path, notes): the path one kernel takes on cuda:sm_90a with ``configs``."""
    import tilecore_cuda
    from tilecore.compiler import lower

    try:
        attrs = lower(build(), TARGET, {**configs, "tilecore.disable_cache": True})[2].attrs
    except Exception as e:  # noqa: BLE001 - a refusal is a row
        return f"refused ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})", ()

    class _K:
        meta = {"attrs": attrs}

    notes = tuple(attrs.get("hopper_pipelines", ()))
    path = tilecore_cuda.lowering_path(_K)
    if path != "generic":
        return path.replace("register program", "regprog"), notes
    frags = dict(attrs.get("fragment_layouts") or {})
    if not frags:
        return "general, no fragments", notes
    shared = [f for f, lay in frags.items() if str(lay).startswith("shared")]
    unit = " (wgmma)" if any(str(lay).startswith("wgmma") for lay in frags.values()) else ""
    why = ""
    if shared:
        why = ": " + "; ".join(f"{f} {str(frags[f])[:90]}" for f in shared[:2])
    return ("general, registers" if not shared else
            f"general, {len(frags) - len(shared)}/{len(frags)} in registers{why}") + unit, notes


def bench_funcs():
    """The attention benchmark's kernel (the catalog's, at benchmark blocks) for each form of BENCH_FORMS, causal and
    not, the exact build and fast math, at b1 h4 s512."""
    from tilecore_conformance.composite import flash_attention_forward

    for d, kv, bm, bn, threads in BENCH_FORMS:
        for causal in (False, True):
            for fast in (False, True):
                name = (f"bench/d{d}{'-gqa' if kv else ''} {bm}x{bn}{' causal' if causal else ''}"
                        f"{' fast' if fast else ''}")
                heads = 32 if kv else 4

                def build(d=d, kv=kv, bm=bm, bn=bn, threads=threads, causal=causal, heads=heads):
                    return flash_attention_forward(512, d, heads, bm, bn, "float16", causal, batch=1, threads=threads,
                                                   num_stages=2, kv_heads=kv)

                yield name, build, {"tilecore.fast_math": fast}


def sources(corpus: bool = True):
    from fragment_census import catalog_funcs, corpus_funcs

    for name, build, configs in catalog_funcs():
        yield name, build, configs or {}
    for name, build, configs in bench_funcs():
        yield name, build, configs
    if corpus:
        for name, build, configs in corpus_funcs():
            if not isinstance(build, Exception):
                yield name, build, configs or {}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("-k", help="only kernels whose name contains this")
    ap.add_argument("--no-corpus", action="store_true", help="leave the TileLang corpus out")
    args = ap.parse_args(argv)
    rows = []
    for name, build, configs in sources(not args.no_corpus):
        if args.k and args.k not in name:
            continue
        row = {"kernel": name}
        forced, _ = classify(build, {**configs, **MODES["forced"]})
        row["forced"] = forced
        if forced.startswith("regprog (wgmma)"):
            for mode in ("default", "general"):
                row[mode], _ = classify(build, {**configs, **MODES[mode]})
        rows.append(row)
    taken = [r for r in rows if r["forced"].startswith("regprog (wgmma)")]
    print("| kernel | " + " | ".join(MODES) + " |")
    print("|---" * (len(MODES) + 1) + "|")
    for r in taken:
        print(f"| {r['kernel']} | " + " | ".join(r[m] for m in MODES) + " |")
    print()
    rest = collections.Counter(r["forced"].split(":")[0] for r in rows if r not in taken)
    print(f"{len(rows) - len(taken)} kernels the WGMMA register program does not take (their path with "
          "register_programs=True, counts):")
    for key, n in rest.most_common():
        print(f"  {n:4d}  {key}")
    served = [r for r in taken if r["general"].startswith("general, registers")]
    print(f"\n{len(taken)} kernels the WGMMA register program takes; the default route leaves "
          f"{sum(not r['default'].startswith('regprog') for r in taken)} to the general path; with "
          f"register_programs=False {len(served)} of them reach registers with every fragment "
          f"({sum('(wgmma)' in r['general'] for r in served)} on the matrix unit's layout)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
