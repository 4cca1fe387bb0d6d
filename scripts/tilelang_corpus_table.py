"""Regenerates the "Corpus" section of docs/tilelang-compat.md from the corpus test results.

    python scripts/tilelang_corpus_table.py            # runs tests/test_tilelang_corpus.py (-n 2), then writes
    python scripts/tilelang_corpus_table.py RESULTS    # from a TILECORE_CORPUS_RESULTS file of an earlier run

One row per example: category, cpu status, cuda:sm_90a compile and the path the CUDA backend took, and the
reason for any failure (the test's xfail reason, or the first pass note saying why a kernel stayed generic).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "tilelang-compat.md"
BEGIN, END = "<!-- corpus table: begin (scripts/tilelang_corpus_table.py) -->", "<!-- corpus table: end -->"


def run_tests() -> Path:
    out = Path(tempfile.mkdtemp()) / "corpus.jsonl"
    env = {**os.environ, "TILECORE_CORPUS_RESULTS": str(out)}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "tests/test_tilelang_corpus.py"], cwd=ROOT,
                   env=env, check=False)
    return out


def source_of(name: str) -> str:
    head = (ROOT / "tests" / "tilelang_corpus" / f"{name}.py").read_text().splitlines()[0]
    m = re.match(r"# TileLang (\S+) @ tile-ai/tilelang (\w+)", head)
    return f"`{m.group(1)}` @ {m.group(2)}" if m else ""


def table(rows: list[dict]) -> str:
    by = {}
    for r in rows:
        by.setdefault(r["example"], {})[r["target"]] = r
    lines = ["| example | category | TileLang source | cpu | cuda:sm_90a compile | CUDA path | reason |",
             "|---|---|---|---|---|---|---|"]
    counts = {"cpu": 0, "cuda": 0}
    for name in sorted(by):
        cpu, cuda = by[name].get("cpu"), by[name].get("cuda:sm_90a")
        cpu_s = "-" if cpu is None else ("pass" if cpu["ok"] else "xfail" if cpu.get("xfail") else "FAIL")
        cuda_s = "-" if cuda is None else ("yes" if cuda["ok"] else "xfail" if cuda.get("xfail") else "FAIL")
        counts["cpu"] += cpu_s == "pass"
        counts["cuda"] += cuda_s == "yes"
        paths = ", ".join(dict.fromkeys(cuda.get("paths") or [])) if cuda else ""
        reason = (cpu or {}).get("xfail") or (cuda or {}).get("xfail") or ""
        if not reason and cuda and cuda["ok"] and "generic" in (cuda.get("paths") or []):
            why = [n for n in cuda.get("notes") or [] if "not mapped" in n or "not pipelined" in n
                   or "retired (D86)" in n]
            # why not registers first: the register program's own reason, then the GEMM pipeline's
            why.sort(key=lambda n: not n.startswith("cuda.register_program:"))
            reason = f"generic: {why[0]}" if why else "generic: no T.Pipelined loop the CUDA passes take"
        lines.append(f"| {name} | {name.split('_')[0]} | {source_of(name)} | {cpu_s} | {cuda_s} | {paths or '-'} | "
                     f"{reason.replace('|', '/')} |")
    n = len(by)
    summary = (f"{n} examples; cpu: {counts['cpu']} pass ({100 * counts['cpu'] // max(n, 1)}%); "
               f"cuda:sm_90a: {counts['cuda']} compile.")
    return summary + "\n\n" + "\n".join(lines)


def main(argv):
    results = Path(argv[1]) if len(argv) > 1 else run_tests()
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    text = DOC.read_text()
    block = f"{BEGIN}\n{table(rows)}\n{END}"
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}: {table(rows).splitlines()[0]}")


if __name__ == "__main__":
    main(sys.argv)
