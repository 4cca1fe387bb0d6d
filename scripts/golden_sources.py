#!/usr/bin/env python
"""Golden sources: the generated device source of every conformance catalog kernel for every in-tree
target, kept in the tree as a manifest of sha256 hashes (tests/golden/sources.json).

    python scripts/golden_sources.py --check     # exit 1 and print a diff for every kernel that changed
    python scripts/golden_sources.py --update    # accept the current sources

The source is what the backend's emitter returns (``tilecore.compiler.lower``: no device compiler runs),
followed by its entry and launch metadata. A kernel the target refuses is recorded as the refusal
(``refused: <feature>``), so a kernel that starts or stops compiling is a change too. The texts themselves
go to an ignored cache (.golden-cache/, one gzip file per hash), so ``--check`` can diff against the
last ``--update`` made on this machine; where the old text is not there it says so and gives the hashes.
"""
from __future__ import annotations

import argparse
import difflib
import gzip
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "tests" / "golden" / "sources.json"
CACHE = ROOT / ".golden-cache"
#: every in-tree target whose source can differ (``tilecore targets list``); "webgpu" is desktop-subgroups
TARGETS = ("cpu", "cuda:sm_80", "cuda:sm_86", "cuda:sm_89", "cuda:sm_90a",
           "hip:gfx90a", "hip:gfx942", "hip:gfx950", "hip:gfx1100", "ascend:910b", "ascend:a3",
           "musa:mp_22", "musa:mp_31", "metal:apple7", "metal:apple8", "metal:apple9",
           "webgpu:baseline", "webgpu:desktop", "webgpu:desktop-subgroups")


def render(source) -> str:
    """The text that is hashed: the device code, then its entry and launch metadata."""
    meta = json.dumps(source.meta, indent=1, sort_keys=True, default=str)
    return f"{source.code}\n/* ---- golden: entry {source.entry}, lang {source.lang}, meta ---- */\n{meta}\n"


def _one(case, target) -> str:
    from tilecore.compiler import lower
    from tilecore.errors import TilecoreError, UnsupportedFeatureError

    try:
        func = case.build(**case.params)
        return render(lower(func, target, case.pass_configs)[3])
    except UnsupportedFeatureError as e:
        return f"refused: {e.feature}\n"
    except TilecoreError as e:  # recorded (paths made relative), so that a new or gone error is a change
        return f"error: {type(e).__name__}: {str(e).replace(str(ROOT) + os.sep, '')}\n"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _store(text: str, sha: str) -> None:
    path = CACHE / f"{sha}.gz"
    if not path.exists():
        CACHE.mkdir(exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(gzip.compress(text.encode(), mtime=0))
        tmp.replace(path)


def cached(sha: str) -> str | None:
    path = CACHE / f"{sha}.gz"
    return gzip.decompress(path.read_bytes()).decode() if path.exists() else None


def _target_hashes(target: str, pattern: str) -> dict:
    """{"<target>/<case id>": sha256} for one target; the texts go to the cache."""
    os.environ.pop("TILECORE_DUMP_IR", None)
    from tilecore_conformance.catalog import catalog

    out = {}
    for case in catalog():
        key = f"{target}/{case.id}"
        if pattern and pattern not in key:
            continue
        text = _one(case, target)
        out[key] = sha = _sha(text)
        _store(text, sha)
    return out


def generate(targets=TARGETS, pattern: str = "", jobs: int | None = None) -> dict:
    """The current hashes of every (target, case) matching ``pattern``, one process per target."""
    jobs = jobs or min(len(targets), os.cpu_count() or 1)
    if jobs <= 1:
        parts = [_target_hashes(t, pattern) for t in targets]
    else:
        with ProcessPoolExecutor(jobs) as pool:
            parts = list(pool.map(_target_hashes, targets, [pattern] * len(targets)))
    return {k: v for part in parts for k, v in part.items()}


def load_manifest() -> dict:
    return json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}


def compare(old: dict, new: dict, pattern: str = "") -> list:
    """[(key, old sha or None, new sha or None)] for every key that changed, appeared or went."""
    keys = sorted(k for k in set(old) | set(new) if not pattern or pattern in k)
    return [(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]


def describe(changes: list, max_diffs: int = 10) -> str:
    """A unified diff per changed kernel; kernels whose diff is the same as an earlier one's are named
    under it instead of repeating it (a prelude change touches every kernel of a target the same way)."""
    groups: dict = {}  # diff body -> [keys]
    notes = []
    for key, a, b in changes:
        if b is None:
            notes.append(f"{key}: gone (was {a[:12]})")
            continue
        if a is None:
            notes.append(f"{key}: new ({b[:12]})")
            continue
        old_text, new_text = cached(a), cached(b)
        if old_text is None:
            notes.append(f"{key}: changed, {a[:12]} -> {b[:12]} (the old source is not in {CACHE.name}/: run "
                         "--update on the commit before the change to diff against it)")
            continue
        body = "".join(difflib.unified_diff(old_text.splitlines(True), new_text.splitlines(True), n=2))
        body = body.split("\n", 2)[2] if body.startswith("---") else body  # drop the ---/+++ header
        groups.setdefault(body, []).append(key)
    lines = []
    for i, (body, keys) in enumerate(groups.items()):
        head = f"--- {keys[0]} (manifest)\n+++ {keys[0]} (now)\n"
        if len(keys) > 1:
            head += f"# the same diff for {len(keys) - 1} more: " + ", ".join(keys[1:8]) + (
                " ..." if len(keys) > 8 else "") + "\n"
        lines.append(head + (body if i < max_diffs else "# (diff not shown: --max-diffs)\n"))
    return "".join(lines) + "".join(n + "\n" for n in notes)


def check(pattern: str = "", targets=TARGETS, jobs: int | None = None) -> tuple:
    """(changes, report text); no changes means every kernel's source is byte-identical to the manifest."""
    new = generate(targets, pattern, jobs)
    old = {k: v for k, v in load_manifest().items() if k.split("/", 1)[0] in targets}
    changes = compare(old, new, pattern)
    return changes, describe(changes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="compare with the manifest; exit 1 on any change")
    mode.add_argument("--update", action="store_true", help="write the current hashes into the manifest")
    ap.add_argument("-k", dest="pattern", default="", help="only keys containing this text, e.g. cuda:sm_90a/gemm")
    ap.add_argument("--target", action="append", help="only this target (repeatable); default: all in-tree")
    ap.add_argument("-j", "--jobs", type=int, help="processes (default: one per target, up to the CPU count)")
    ap.add_argument("--max-diffs", type=int, default=10, help="diffs printed in full (default 10)")
    a = ap.parse_args(argv)
    targets = tuple(a.target or TARGETS)
    start = time.perf_counter()
    new = generate(targets, a.pattern, a.jobs)
    took = time.perf_counter() - start
    old = load_manifest()
    if a.update:
        kept = {k: v for k, v in old.items()
                if not (k.split("/", 1)[0] in targets and (not a.pattern or a.pattern in k))}
        MANIFEST.parent.mkdir(parents=True, exist_ok=True)
        MANIFEST.write_text(json.dumps({**kept, **new}, indent=0, sort_keys=True) + "\n")
        print(f"{len(new)} sources hashed in {took:.1f} s; {len(compare(old, {**kept, **new}))} changed; "
              f"manifest {MANIFEST.relative_to(ROOT)} written")
        return 0
    old = {k: v for k, v in old.items() if k.split("/", 1)[0] in targets}
    changes = compare(old, new, a.pattern)
    if not changes:
        print(f"{len(new)} sources byte-identical to the manifest ({took:.1f} s)")
        return 0
    text = describe(changes, a.max_diffs)
    print(text, end="")
    print(f"{len(changes)} of {len(new)} sources changed ({took:.1f} s). Explain the difference in the commit and "
          f"accept it with: python scripts/golden_sources.py --update", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
