#!/usr/bin/env python
"""Path census: which CUDA path every kernel of the TileLang corpus and the conformance catalog takes, and why.

    python scripts/path_census.py                      # corpus table + catalog summary, cuda:sm_90a and cuda:sm_80
    python scripts/path_census.py --only corpus        # the corpus table alone (seconds)
    python scripts/path_census.py --markdown out.md    # the tables as docs/performance.md shows them
    python scripts/path_census.py --json out.json      # every row, for comparing two trees

A kernel is lowered (``tilecore.compiler.lower``: no device compiler runs) and put in one of:

- ``register program (mma.sync)``: ``cuda.register_program`` took the whole kernel (regprog.py; sm_80; the WGMMA
  register program of sm_90a, ``cuda.hopper_register_program``, was retired in D86);
- ``hopper pipeline``: ``cuda.hopper_gemm_pipeline`` took its GEMM loop (hopper.py);
- ``general, registers``: the core's general path, every fragment in registers with a layout
  (``kernel.meta["attrs"]["fragment_layouts"]``);
- ``general, N shared``: the core's general path with N fragments in shared memory (each with the layout
  pass's reason);
- ``general, no fragments``: the core's general path, a kernel without fragments (copies, elementwise);
- ``refused``: the target refuses the kernel (the error's first line).

The reason column is the register program's own note for that target (``cuda.register_program``), i.e. why the
kernel did not take it (on sm_90a: the retired WGMMA program's form, D86, or why the mma.sync one does not); on
sm_90a a kernel the Hopper GEMM pipeline took says so instead.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("cuda:sm_90a", "cuda:sm_80")
REGPROG = {"cuda:sm_90a": "cuda.register_program", "cuda:sm_80": "cuda.register_program"}


def _sources(only):
    sys.path.insert(0, str(ROOT / "scripts"))
    from fragment_census import catalog_funcs, corpus_funcs

    out = []
    if only in (None, "corpus"):
        out += list(corpus_funcs())
    if only in (None, "catalog"):
        out += list(catalog_funcs())
    return out


def classify(target: str, name: str, build, configs) -> dict:
    """One kernel on one target: its path, the register program's reason and what the general path did."""
    import tilecore_cuda
    from tilecore.compiler import lower

    row = {"kernel": name, "target": target}
    if isinstance(build, Exception):
        row.update(path="refused", reason=f"import: {type(build).__name__}: {build}"[:160])
        return row
    try:
        lowered = lower(build(), target, {**(configs or {}), "tilecore.disable_cache": True})[2]
    except Exception as e:  # noqa: BLE001 - a kernel the target refuses is counted, not fatal
        first = (str(e).splitlines()[0] if str(e) else "").replace(str(ROOT) + "/", "")
        first = re.sub(r"^\S+\.py:\d+ in \w+: ", "", first)  # the user's line: the kernel column names it
        row.update(path="refused", reason=f"{type(e).__name__}: {first}"[:160])
        return row
    attrs = lowered.attrs

    class _K:  # lowering_path reads kernel.meta["attrs"]
        meta = {"attrs": attrs}

    path = tilecore_cuda.lowering_path(_K)
    notes = list(attrs.get("hopper_pipelines", ()))
    frags = dict(attrs.get("fragment_layouts") or {})
    shared = sorted(f for f, lay in frags.items() if lay.startswith("shared:"))
    if path == "generic":
        path = ("general, no fragments" if not frags else
                "general, registers" if not shared else f"general, {len(shared)} shared")
    prefix = REGPROG[target] + ":"
    mine = [n[len(prefix):].strip() for n in notes if n.startswith(prefix)]
    if path.startswith("register program"):
        reason = ""
    elif path == "hopper pipeline":
        reason = "the Hopper GEMM pipeline took its loop"
    elif mine:
        reason = re.sub(r"^kernel not mapped to registers \((.*)\)$", r"\1", mine[0])
    else:
        reason = "-"
    row.update(path=path, reason=reason, shared=shared, notes=notes, pipelines=list(attrs.get("pipelines", ())))
    return row


def census(targets, only=None) -> list[dict]:
    rows = []
    for name, build, configs in _sources(only):
        for t in targets:
            rows.append(classify(t, name, build, configs))
    return rows


def _cell(r: dict) -> str:
    return r["path"] + (f": {r['reason']}" if r.get("reason") and not r["path"].startswith(("register", "hopper")) else "")


def corpus_table(rows: list[dict], targets) -> str:
    by = collections.defaultdict(dict)
    for r in rows:
        if r["kernel"].startswith("corpus/"):
            by[r["kernel"][len("corpus/"):]][r["target"]] = r
    head = "| kernel | " + " | ".join(f"`{t}`" for t in targets) + " |"
    lines = [head, "|---" * (len(targets) + 1) + "|"]
    for k in sorted(by, key=lambda x: (x.split("#")[0], int(x.split("#")[1]) if "#" in x else 0)):
        lines.append(f"| {k} | " + " | ".join(_cell(by[k][t]).replace("|", "\\|") if t in by[k] else "-"
                                                 for t in targets) + " |")
    return "\n".join(lines)


def summary_table(rows: list[dict], targets, prefix: str) -> str:
    """Counts per path and, for kernels off the register program, per reason (buffer names cut)."""
    lines = []
    for t in targets:
        mine = [r for r in rows if r["target"] == t and r["kernel"].startswith(prefix)]
        paths = collections.Counter(re.sub(r"general, \d+ shared", "general, some shared", r["path"]) for r in mine)
        lines.append(f"`{t}`, {len(mine)} kernels: " + ", ".join(f"{p} {n}" for p, n in paths.most_common()))
        lines.append("")
        reasons = collections.Counter((r["reason"] if r["path"] == "refused" else
                                       re.sub(r"^\w+: ", "<buffer>: ", r["reason"]))
                                      for r in mine if not r["path"].startswith("register program") and r.get("reason"))
        lines += ["| kernels | why not the register program |", "|---|---|"]
        lines += [f"| {n} | {k.replace('|', chr(92) + '|')} |" for k, n in reasons.most_common()]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--target", action="append", help=f"targets (default: {', '.join(TARGETS)})")
    ap.add_argument("--only", choices=("catalog", "corpus"), help="one of the two kernel sets")
    ap.add_argument("--markdown", help="write the tables to this file")
    ap.add_argument("--json", help="write every row to this file")
    args = ap.parse_args(argv)
    targets = args.target or list(TARGETS)
    rows = census(targets, args.only)
    parts = []
    if args.only in (None, "corpus"):
        parts += ["TileLang corpus (tests/tilelang_corpus, `#n` = the n-th entry of the module's KERNELS):", "",
                  corpus_table(rows, targets), "", summary_table(rows, targets, "corpus/")]
    if args.only in (None, "catalog"):
        parts += ["Conformance catalog:", "", summary_table(rows, targets, "catalog/")]
    text = "\n".join(parts)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
