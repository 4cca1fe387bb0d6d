#!/usr/bin/env python
"""Fragment census: where every block-level fragment of the conformance catalog and the TileLang corpus
lives after layout inference, per target: in registers (with a layout) or in shared memory (with the
reason the layout pass gave), and what layout conversions it inserted.

    python scripts/fragment_census.py                       # cuda:sm_80 and the made-up test unit (fakemu)
    python scripts/fragment_census.py -t hip:gfx942 -v      # one target, every shared fragment listed
    python scripts/fragment_census.py --json out.json       # the rows, for comparing two trees
    python scripts/fragment_census.py --no-convert          # as before layout conversion (D22)

It reads ``func.attrs["fragment_layouts"]`` of the lowered kernel (``tilecore.compiler.lower``: no device
compiler runs): ``"shared: <reason>"``, or a layout, followed by ``[converted for ...]`` where the layout pass
converted the fragment (into another layout for a statement that needs it: by registers, shuffle, index or shared). Reasons are grouped by their first words (the buffer-specific tail is cut). ``fakemu`` is the test
backend of tests/fake_matrix_backend.py (registered here in code).
"""
from __future__ import annotations

import argparse
import collections
import importlib
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TARGETS = ("cuda:sm_80", "fakemu")


def _register_fakemu():
    sys.path.insert(0, str(ROOT / "tests"))
    from fake_matrix_backend import register

    register(Path(tempfile.mkdtemp()))


def catalog_funcs():
    """(name, prim func builder, pass configs) of every catalog kernel (one per case)."""
    from tilecore_conformance.catalog import catalog

    for case in catalog():
        yield f"catalog/{case.id}", (lambda c=case: c.build(**c.params)), case.pass_configs


def corpus_funcs():
    """(name, builder, pass configs) of every kernel of the TileLang corpus (tests/tilelang_corpus)."""
    sys.path.insert(0, str(ROOT / "tests"))
    for p in sorted((ROOT / "tests" / "tilelang_corpus").glob("*.py")):
        if p.stem.startswith("_"):
            continue
        try:
            mod = importlib.import_module(f"tilelang_corpus.{p.stem}")
        except Exception as e:  # noqa: BLE001 - a corpus module that needs what is not here
            yield f"corpus/{p.stem}", e, None
            continue
        for n, (fn, args, kwargs) in enumerate(getattr(mod, "KERNELS", [])):
            fn = getattr(fn, "jit_fn", fn)

            def build(fn=fn, args=args, kwargs=kwargs):
                return fn.get_tir(*args, **kwargs) if hasattr(fn, "get_tir") else fn(*args, **kwargs)

            yield f"corpus/{p.stem}#{n}", build, None


def reason_key(text: str) -> str:
    """A reason without the parts that name one kernel's buffers, shapes or layouts."""
    text = re.sub(r"\(\d+(, \d+)*,?\)", "(..)", text)
    text = re.sub(r"\S+\(\d[^)]*\)\[[^\]]*\] \([^)]*\)", "<layout>", text)
    return text[:110]


def census(target: str, sources, extra: dict | None = None) -> list[dict]:
    from tilecore.compiler import lower

    rows = []
    for name, build, configs in sources:
        row = {"kernel": name, "target": target}
        if isinstance(build, Exception):
            row["error"] = f"import: {type(build).__name__}: {build}"[:200]
            rows.append(row)
            continue
        try:
            lowered = lower(build(), target, {**(configs or {}), **(extra or {}), "tilecore.disable_cache": True})[2]
        except Exception as e:  # noqa: BLE001 - a kernel the target refuses is counted, not fatal
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
            rows.append(row)
            continue
        row["fragments"] = dict(lowered.attrs.get("fragment_layouts") or {})
        rows.append(row)
    return rows


def summary(rows: list[dict], verbose: bool = False) -> str:
    regs = shared = 0
    reasons: collections.Counter = collections.Counter()
    convs: collections.Counter = collections.Counter()
    errors = 0
    where: dict = collections.defaultdict(list)
    for r in rows:
        if "error" in r:
            errors += 1
            continue
        for frag, lay in r["fragments"].items():
            if lay.startswith("shared:"):
                shared += 1
                k = reason_key(lay[len("shared:"):].strip())
                reasons[k] += 1
                where[k].append(f"{r['kernel']}:{frag}")
            else:
                regs += 1
                for how in re.findall(r" by (registers|shuffle|index|shared) ", lay):
                    convs[how] += 1
                    where[f"conv:{how}"].append(f"{r['kernel']}:{frag}")
    kernels = len(rows) - errors
    lines = [f"{rows[0]['target'] if rows else '?'}: {kernels} kernels lowered ({errors} refused or failed), "
             f"{regs + shared} fragments: {regs} in registers, {shared} in shared memory"]
    for k, n in reasons.most_common():
        lines.append(f"  {n:4d}  shared: {k}")
        if verbose:
            lines += [f"          {w}" for w in where[k][:12]] + (["          ..."] if len(where[k]) > 12 else [])
    for k, n in convs.most_common():
        lines.append(f"  {n:4d}  conversions by {k}")
        if verbose:
            w = where[f"conv:{k}"]
            lines += [f"          {x}" for x in w[:12]] + (["          ..."] if len(w) > 12 else [])
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--target", action="append", help=f"targets (default: {', '.join(DEFAULT_TARGETS)})")
    ap.add_argument("-v", "--verbose", action="store_true", help="list the fragments kept in shared memory")
    ap.add_argument("--only", choices=("catalog", "corpus"), help="one of the two kernel sets")
    ap.add_argument("--json", help="write every row to this file")
    ap.add_argument("--no-convert", action="store_true",
                    help="compile with tilecore.layout_conversion=False (a disagreement keeps a fragment in shared memory)")
    args = ap.parse_args(argv)
    targets = args.target or list(DEFAULT_TARGETS)
    if "fakemu" in targets:
        _register_fakemu()
    out = []
    for t in targets:
        srcs = []
        if args.only in (None, "catalog"):
            srcs += list(catalog_funcs())
        if args.only in (None, "corpus"):
            srcs += list(corpus_funcs())
        rows = census(t, srcs, {"tilecore.layout_conversion": False} if args.no_convert else None)
        out += rows
        print(summary(rows, args.verbose), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
