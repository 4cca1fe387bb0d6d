#!/usr/bin/env python
"""The sm_80 (mma.sync) register program against the core's general path: which kernels take
``cuda.register_program`` and whether the general path reaches registers for them (decision D63).

    python scripts/mma_census.py                 # the catalog and the mma_general benchmark's kernels
    python scripts/mma_census.py --json out.json
    python scripts/mma_census.py --corpus          # the TileLang corpus's kernels too

Each kernel is lowered (``tilecore.compiler.lower``, no device compiler) several ways: ``cuda:sm_80`` with
``tilecore.cuda.register_programs=True`` (the register program wherever it can: what sm_80 ran before D63), with the
defaults (D63 routes the GEMM form to the general path) and with ``tilecore.cuda.register_programs=False`` (the
general path), ``cuda:sm_90a`` with
``tilecore.cuda.disable_wgmma=True`` with and without register programs (the general path then still takes wgmma:
marked), and ``cuda:sm_90a`` with the sm_80 profile overlaid (benchmarks/mma_general.py's ``BASE``). A row
gives the path taken (``tilecore_cuda.lowering_path``; ``kernel.meta["attrs"]["hopper_pipelines"]`` has the notes)
and, on the general path, how many fragments are in registers (``fragment_layouts``).
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from mma_general import BASE as SM80_ON_H100  # noqa: E402  (disable_wgmma + the sm_80 profile overlaid)
MODES = {
    "sm_80 forced": ("cuda:sm_80", {"tilecore.cuda.register_programs": True}),  # where the register program can
    "sm_80": ("cuda:sm_80", {}),
    "sm_80 general": ("cuda:sm_80", {"tilecore.cuda.register_programs": False}),
    "sm_90a nowgmma": ("cuda:sm_90a", {"tilecore.cuda.disable_wgmma": True}),
    "sm_90a nowgmma general": ("cuda:sm_90a", {"tilecore.cuda.disable_wgmma": True,
                                               "tilecore.cuda.register_programs": False}),
    "sm_90a as sm_80 general": ("cuda:sm_90a", {**SM80_ON_H100, "tilecore.cuda.register_programs": False}),
}

#: D85: sm_86 / sm_89 (99 KiB a block): the register program where it can (before D85 the route kept every attention
#: form there), the default route (D85's block-memory rule), every attention form routed ("attention")
MODES_SM86 = {
    "sm_86 forced": ("cuda:sm_86", {"tilecore.cuda.register_programs": True}),
    "sm_86": ("cuda:sm_86", {}),
    "sm_86 attention": ("cuda:sm_86", {"tilecore.cuda.mma_general_forms": ["gemm", "attention"]}),
    "sm_89": ("cuda:sm_89", {}),
}


def classify(target: str, build, configs: dict) -> str:
    import tilecore_cuda
    from tilecore.compiler import lower

    try:
        attrs = lower(build(), target, {**configs, "tilecore.disable_cache": True})[2].attrs
    except Exception as e:  # noqa: BLE001 - a refusal is a row
        return f"refused ({type(e).__name__})"

    class _K:
        meta = {"attrs": attrs}

    path = tilecore_cuda.lowering_path(_K)
    if path != "generic":
        return path.replace("register program", "regprog")
    frags = dict(attrs.get("fragment_layouts") or {})
    if not frags:
        return "general, no fragments"
    shared = [f for f, lay in frags.items() if str(lay).startswith("shared")]
    unit = " (wgmma)" if any(str(lay).startswith("wgmma") for lay in frags.values()) else ""
    out = ("general, registers" if not shared else f"general, {len(frags) - len(shared)}/{len(frags)} in registers") + unit
    if any("serialized" in p for p in attrs.get("pipelines", ())):
        out += ", loop serialized"
    return out + (f", {attrs['shared_bytes']} B" if SHOW_BYTES and attrs.get("shared_bytes") is not None else "")


SHOW_BYTES = False


def sources(corpus: bool = False):
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fragment_census import catalog_funcs, corpus_funcs

    for name, build, configs in catalog_funcs():
        yield name, build, configs or {}
    if corpus:
        for name, build, configs in corpus_funcs():
            if not isinstance(build, Exception):
                yield name, build, configs or {}
    import mma_general

    for name, build in mma_general.census_kernels():
        yield f"bench/{name}", build, {}


def _census_size(d):
    class A:
        fa = (1, 2, 512, d)
    return A


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("-k", help="only kernels whose name contains this")
    ap.add_argument("--corpus", action="store_true", help="the TileLang corpus (tests/tilelang_corpus) too")
    ap.add_argument("--sm86", action="store_true",
                    help="sm_86 / sm_89 (D85): the register program forced, the default route, every attention form "
                         "routed; block memory in bytes on each row")
    args = ap.parse_args(argv)
    global MODES, SHOW_BYTES
    if args.sm86:
        MODES, SHOW_BYTES = MODES_SM86, True
        import mma_general

        sources_ = list(sources(args.corpus)) + [
            (f"bench/{n}@d{d}", (lambda b=b, d=d: b(_census_size(d))), {})
            for n, (b, _, _) in mma_general.KERNELS_D85.items() for d in (64, 128)]
    else:
        sources_ = sources(args.corpus)
    rows = []
    for name, build, configs in sources_:
        if args.k and args.k not in name:
            continue
        row = {"kernel": name}
        for mode, (target, extra) in MODES.items():
            row[mode] = classify(target, build, {**configs, **extra})
        rows.append(row)
    # kernels a register program takes in either mma.sync mode: one line each; the rest counted by their paths
    taken = [r for r in rows if any(r[m].startswith("regprog") for m in MODES if m.endswith(("forced", "nowgmma"))
                                    or m in ("sm_80", "sm_86"))]
    print("| kernel | " + " | ".join(MODES) + " |")
    print("|---" * (len(MODES) + 1) + "|")
    for r in taken:
        print(f"| {r['kernel']} | " + " | ".join(r[m] for m in MODES) + " |")
    print()
    rest = collections.Counter(tuple(r[m] for m in MODES) for r in rows if r not in taken)
    print(f"{len(rows) - len(taken)} kernels no register program takes (paths per mode, counts):")
    for key, n in rest.most_common():
        print(f"  {n:4d}  " + " | ".join(key))
    bench = [r for r in rows if r["kernel"].startswith("bench/") and r not in taken]
    for r in bench:
        print(f"| {r['kernel']} | " + " | ".join(r[m] for m in MODES) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
