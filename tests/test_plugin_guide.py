"""docs/plugin-guide.md's complete example (`tilecore-acme`) built from the guide's own text and used as
a vendor would: validate its capability folder, list it, run its snippet, run conformance on it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugin-guide.md"


def _block_after(text: str, marker: str) -> str:
    """The body of the first fenced block after ``marker``."""
    start = text.index(marker)
    m = re.compile(r"```[a-z]*\n(.*?)\n```", re.S).search(text, start)
    return m.group(1)


@pytest.fixture(scope="module")
def acme(tmp_path_factory):
    """The example package (from the guide) plus a dist-info made from its pyproject's entry points."""
    text = GUIDE.read_text()
    root = tmp_path_factory.mktemp("acme")
    pkg_dir, meta_dir = root / "pkg", root / "meta"
    caps = pkg_dir / "tilecore_acme" / "capabilities"
    caps.mkdir(parents=True)
    (pkg_dir / "tilecore_acme" / "__init__.py").write_text(_block_after(text, "`backends/acme/tilecore_acme/__init__.py`:"))
    (caps / "x1.yaml").write_text(_block_after(text, "`backends/acme/tilecore_acme/capabilities/x1.yaml`:"))
    toml = _block_after(text, "`backends/acme/pyproject.toml`:")   # read with re: tomllib is 3.11+
    project = dict(re.findall(r'^(name|version) = "([^"]+)"$', toml, re.M))
    section = toml.split('[project.entry-points."tilecore.backends"]\n')[1].split("\n\n")[0]
    eps = dict(re.findall(r'^(\w+) = "([\w.:]+)"$', section, re.M))
    assert project and eps == {"acme": "tilecore_acme"}
    dist = meta_dir / f"tilecore_acme-{project['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (dist / "entry_points.txt").write_text("[tilecore.backends]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    snippet = root / "try_it.py"
    snippet.write_text(_block_after(text, "Try it without installing"))
    return {"root": root, "pkg": pkg_dir, "meta": meta_dir, "caps": caps, "snippet": snippet}


def _run(args, acme, installed=True, **kw):
    paths = [str(acme["pkg"])] + ([str(acme["meta"])] if installed else []) + [os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "TILECORE_CACHE_DIR": str(acme["root"] / "cache")}
    return subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, **kw)


def test_guide_example_validates_lists_ok_and_runs_its_snippet(acme):
    r = _run([sys.executable, "-m", "tilecore", "capabilities", "validate", str(acme["caps"])], acme)
    assert r.returncode == 0 and "all valid" in r.stdout, r.stdout + r.stderr
    r = _run([sys.executable, "-m", "tilecore", "targets", "list", "--json"], acme)
    row = next(x for x in json.loads(r.stdout) if x["plugin"] == "acme")
    assert row["target"] == "acme:x1" and row["status"] == "ok", row
    assert row["devices"] == ["Acme X1 (emulated on the host CPU)"] and row["distribution"] == "tilecore-acme"
    r = _run([sys.executable, str(acme["snippet"])], acme, installed=False)   # registers in code itself
    assert r.returncode == 0, r.stderr
    assert "emulated ('copy:acme.dma_copy',)" in r.stdout and "[2. 2. 2." in r.stdout, r.stdout


def test_guide_example_conformance_runs_kernels_emulated(acme):
    pytest.importorskip("tilecore_conformance")
    report = acme["root"] / "report"
    r = _run([sys.executable, "-m", "tilecore", "conformance", "run", "--target", "acme:x1", "-k",
              "fill and float32", "--report", str(report)], acme)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = [json.loads(x) for x in (report / "results.jsonl").read_text().splitlines() if x.strip()]
    assert results and {x["state"] for x in results} == {"PASS"}
    assert {x["mode"] for x in results} == {"emulated"}      # kernels ran; not downgraded to compile-only


def test_guide_lists_every_need_the_conformance_suite_checks():
    catalog = pytest.importorskip("tilecore_conformance.catalog")
    text = GUIDE.read_text()
    table = text[text.index("The needs it checks:"):text.index("checks this table against the catalog")]
    rows = {}
    for line in table.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = set(re.findall(r"`([a-z0-9_]+)`", cells[1]))
    declared = {"feature": rows[next(k for k in rows if k.startswith("features with"))] | rows["other features"]}
    for use in ("storage", "arith", "mma", "atomic_add"):
        declared[use] = rows[f"`dtype:<d>:{use}`"]
    used: dict = {}
    for case in catalog.catalog():
        for need in case.needs:
            kind, name, *rest = need.split(":")
            if kind == "feature":
                used.setdefault("feature", set()).add(name)
            elif kind == "dtype":
                used.setdefault(rest[0], set()).add(name)
    assert used == declared
    assert rows[next(k for k in rows if k.startswith("features with"))] == set(catalog.FEATURES)
