"""``tilecore conformance run|merge`` (wired into the ``tilecore`` command when this package is installed)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .report import FILES


def add_commands(sub) -> None:
    c = sub.add_parser("conformance", help="run the cross-backend conformance suite, or merge reports",
                       description="Run the conformance catalog against one target, or merge reports from "
                       "several devices into one matrix.")
    csub = c.add_subparsers(dest="action", metavar="ACTION")
    r = csub.add_parser("run", help="run the catalog on a target (pytest underneath)")
    r.add_argument("--target", required=True, help="target string, e.g. cpu")
    r.add_argument("-n", dest="workers", default=None, help="pytest-xdist workers (a number or auto)")
    r.add_argument("--report", help="folder for junit.xml, results.jsonl, manifest.json, matrix.md/html")
    r.add_argument("-k", dest="keyword", help="only cases whose id matches this pytest -k expression")
    r.add_argument("--expectations", help="expectations YAML (default: the packaged one for the target)")
    r.add_argument("--timeout", type=float, default=120.0, help="seconds per case (default 120)")
    r.add_argument("--pass-config", dest="pass_configs", action="append", default=[], metavar="KEY=VALUE",
                   help="compile every case with this pass config (repeatable; VALUE is JSON where it parses, "
                   "e.g. tilecore.cuda.register_programs=false, else a string); the report's manifest records "
                   "them. Same as TILECORE_PASS_CONFIGS, which it extends")
    r.set_defaults(fn=cmd_run)
    m = csub.add_parser("merge", help="join reports of several runs (one per target and mode) into one report")
    m.add_argument("dirs", nargs="+", help="report folders written by `conformance run --report`")
    m.add_argument("--out", required=True, help="folder for the merged junit.xml, results.jsonl, manifest.json, "
                   "matrix.md and matrix.html")
    m.set_defaults(fn=cmd_merge)


def cmd_run(args) -> int:
    import pytest

    from .plugin import SUITE

    if args.workers and not _has_xdist():
        print(f"tilecore: error: -n {args.workers} needs pytest-xdist, which is not installed: "
              "pip install pytest-xdist (or run without -n)", file=sys.stderr)
        return 2

    if args.pass_configs:
        import json
        import os

        configs = json.loads(os.environ.get("TILECORE_PASS_CONFIGS") or "{}")
        for item in args.pass_configs:
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                print(f"tilecore: error: --pass-config {item!r}: write KEY=VALUE, e.g. "
                      "--pass-config tilecore.fast_math=true", file=sys.stderr)
                return 2
            try:
                configs[key.strip()] = json.loads(value)
            except ValueError:
                configs[key.strip()] = value
        os.environ["TILECORE_PASS_CONFIGS"] = json.dumps(configs)  # the case runners inherit it

    argv = [str(SUITE), f"--tilecore-target={args.target}", f"--tilecore-timeout={args.timeout}",
            "-p", "no:cacheprovider", "-q", "-rfE",
            # this command imported the plugin before pytest could rewrite its asserts (it has none)
            "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if args.workers:
        argv += ["-n", str(args.workers)]
    if args.keyword:
        argv += ["-k", args.keyword]
    if args.expectations:
        argv += [f"--tilecore-expectations={args.expectations}"]
    if args.report:  # the report writer makes junit.xml from the results (not pytest's --junitxml)
        Path(args.report).mkdir(parents=True, exist_ok=True)
        argv += [f"--tilecore-report={args.report}"]
    rc = int(pytest.main(argv))
    if args.report and (Path(args.report) / "manifest.json").exists():
        print(f"report: {args.report} ({', '.join(FILES)})")
    return rc


def _has_xdist() -> bool:
    import importlib.util

    return importlib.util.find_spec("xdist") is not None  # not imported: pytest would warn it cannot rewrite it


def cmd_merge(args) -> int:
    from .report import merge

    merge([Path(d) for d in args.dirs], Path(args.out))
    print(f"merged {len(args.dirs)} report(s) into {args.out} ({', '.join(FILES)})")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tilecore-conformance")
    sub = p.add_subparsers(dest="command")
    add_commands(sub)
    args = p.parse_args(["conformance", *(argv or [])])
    return args.fn(args)
