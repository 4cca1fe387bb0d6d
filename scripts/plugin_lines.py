#!/usr/bin/env python3
"""What each backend plugin writes, in lines, by role (issue 11's line count; docs/layout.md "What a backend writes").

    python scripts/plugin_lines.py [--rev REV] [--markdown]

Counts every ``backends/<vendor>/tilecore_<vendor>/`` file of a git revision (default: the working tree): physical
lines and code lines (neither blank, nor a comment, nor inside a docstring). Each file gets a role:

- ``matrix units``: the layouts of the vendor's matrix instructions, registered with the core (``units.py``);
- ``spellings``: emitter, intrinsic tables, compiler driver, runtime, registration: what every backend writes;
- ``matched forms``: whole-kernel passes that take fixed kernel forms before the core's general path sees them
  (CUDA's register programs and Hopper GEMM pipeline: what issue 11 retires as the general path reaches them);
- ``headers``: C/C++ prelude headers the generated source includes.
"""
from __future__ import annotations

import argparse
import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: files of the CUDA plugin that are whole-kernel passes over fixed forms (retired as the general path takes them)
MATCHED_FORMS = {"regprog.py", "hopper.py", "_lean.py", "_fold.py", "_prune.py"}  # (_tmastore.py: gone in D86)


def code_lines(text: str) -> int:
    """Lines with code: not blank, not only a comment, not inside a docstring."""
    doc = set()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return sum(1 for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                doc.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENDMARKER):
            continue
        lines.update(r for r in range(tok.start[0], tok.end[0] + 1) if r not in doc)
    return len(lines)


def role(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    if not name.endswith(".py"):
        return "headers"
    if name == "units.py":
        return "matrix units"
    if "/tilecore_cuda/" in path and name in MATCHED_FORMS:
        return "matched forms"
    return "spellings"


def files(rev: str | None):
    if rev is None:
        for p in sorted(ROOT.glob("backends/*/tilecore_*/**/*")):
            if p.is_file() and p.suffix in (".py", ".cuh", ".h", ".hpp", ".metal"):
                yield str(p.relative_to(ROOT)), p.read_text()
        return
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "backends"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for n in names:
        parts = n.split("/")
        if len(parts) >= 4 and parts[2].startswith("tilecore_") and n.rsplit(".", 1)[-1] in ("py", "cuh", "h",
                                                                                             "hpp", "metal"):
            text = subprocess.run(["git", "show", f"{rev}:{n}"], cwd=ROOT, check=True, capture_output=True,
                                  text=True).stdout
            yield n, text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", help="a git revision (default: the working tree)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    table: dict = {}
    for path, text in files(args.rev):
        vendor = path.split("/")[1]
        r = role(path)
        lines = text.count("\n")
        code = code_lines(text) if path.endswith(".py") else \
            sum(1 for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("//"))
        t = table.setdefault(vendor, {}).setdefault(r, [0, 0])
        t[0] += lines
        t[1] += code
    if not table:
        print(f"plugin_lines: no backend files found at {args.rev or 'the working tree'}", file=sys.stderr)
        return 1
    roles = ["matrix units", "spellings", "matched forms", "headers"]
    if args.markdown:
        print("| backend | " + " | ".join(roles) + " | total |")
        print("|---" * (len(roles) + 2) + "|")
    else:
        print(f"{'backend':10s} " + " ".join(f"{r:>17s}" for r in roles) + f" {'total':>13s}   (lines / code lines)")
    for vendor in sorted(table):
        cells = [table[vendor].get(r, [0, 0]) for r in roles]
        tot = [sum(c[0] for c in cells), sum(c[1] for c in cells)]
        fmt = [f"{c[0]} / {c[1]}" if c[0] else "-" for c in cells + [tot]]
        if args.markdown:
            print(f"| {vendor} | " + " | ".join(fmt) + " |")
        else:
            print(f"{vendor:10s} " + " ".join(f"{f:>17s}" for f in fmt[:-1]) + f" {fmt[-1]:>13s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
