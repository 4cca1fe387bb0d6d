"""Reports: results.jsonl, manifest.json, matrix.md, matrix.html; merging runs from several devices."""
from __future__ import annotations

import hashlib
import html
import json
import platform
import time
from collections import Counter
from pathlib import Path

from .model import STATES

COLORS = {"PASS": "#2e7d32", "FAIL": "#c62828", "NOT_SUPPORTED": "#9e9e9e", "EXPECTED_FAIL": "#ef6c00",
          "UNEXPECTED_PASS": "#ad1457", "CRASH": "#6a1b9a", "TIMEOUT": "#4e342e", "HARNESS_ERROR": "#000000"}


def manifest(t) -> dict:
    import tilecore
    from tilecore.plugin import get_registry

    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "target": t.name, "mode": t.mode, "core_version": tilecore.__version__,
        "backend": {"name": t.backend.name, "distribution": t.backend.distribution, "version": t.backend.version(),
                    "plugin_api": t.backend.plugin_api},
        "plugins": {r.name: {"version": r.version, "status": r.status_text} for r in get_registry().plugins()},
        "toolchain": t.backend.toolchain_version(t.target) or t.probe.toolchain,
        "capability_profile": t.caps.id, "capability_hash": t.caps.hash(),
        "device": {"status": t.probe.status, "devices": [d.name for d in t.probe.devices], "detail": t.probe.detail},
        "capability_mismatches": list(t.mismatches),
        "host": {"python": platform.python_version(), "platform": platform.platform()},
        "seeds": "sha256(case id)[:4] little-endian",
    }


def write(report_dir: Path, results: list, man: dict) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    results = sorted(results, key=lambda r: r["id"])
    with open(report_dir / "results.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    man = {**man, "counts": dict(Counter(r["state"] for r in results)), "cases": len(results),
           "results_sha256": hashlib.sha256((report_dir / "results.jsonl").read_bytes()).hexdigest()}
    (report_dir / "manifest.json").write_text(json.dumps(man, indent=2, sort_keys=True))
    runs = [(column(man), {r["id"]: r for r in results})]
    write_matrix(report_dir, runs)


def column(man: dict) -> str:
    """One column per target and mode: reports never merge modes."""
    return f"{man['target']} ({man['mode']})"


def write_matrix(out: Path, runs: list) -> None:
    ids = sorted({i for _, res in runs for i in res})
    cols = [c for c, _ in runs]
    lines = ["# tilecore conformance matrix", "", "| case | " + " | ".join(cols) + " |",
             "|---|" + "---|" * len(cols)]
    for cid in ids:
        lines.append(f"| {cid} | " + " | ".join(res.get(cid, {}).get("state", "-") for _, res in runs) + " |")
    lines += ["", "## Totals", "", "| state | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for s in STATES:
        lines.append(f"| {s} | " + " | ".join(str(sum(1 for r in res.values() if r["state"] == s)) for _, res in runs) + " |")
    (out / "matrix.md").write_text("\n".join(lines) + "\n")
    rows = []
    for cid in ids:
        cells = []
        for _, res in runs:
            r = res.get(cid)
            if r is None:
                cells.append("<td>-</td>")
            else:
                tip = html.escape(r.get("error") or f"max abs err {r.get('max_abs_err')}")
                cells.append(f'<td style="background:{COLORS[r["state"]]};color:#fff" title="{tip}">{r["state"]}</td>')
        rows.append(f"<tr><td>{html.escape(cid)}</td>{''.join(cells)}</tr>")
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    (out / "matrix.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>tilecore conformance</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;font-size:12px}</style>"
        f"<table><tr><th>case</th>{head}</tr>{''.join(rows)}</table>\n")


def read_run(d: Path) -> tuple:
    man = json.loads((d / "manifest.json").read_text())
    res = {}
    for line in (d / "results.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            res[r["id"]] = r
    return column(man), res


def merge(dirs: list, out: Path) -> None:
    runs = [read_run(Path(d)) for d in dirs]
    cols = [c for c, _ in runs]
    dup = {c for c in cols if cols.count(c) > 1}
    if dup:
        raise SystemExit(f"tilecore conformance merge: several runs for {sorted(dup)}; merge one run per target and mode")
    out.mkdir(parents=True, exist_ok=True)
    write_matrix(out, runs)
