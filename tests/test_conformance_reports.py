"""The conformance reports as a CI operator reads them: junit.xml, manifest.json, results.jsonl, matrix.html,
through `tilecore conformance run` and `tilecore conformance merge`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

import fake_plugins
import tilecore
import tilecore_conformance
from tilecore_conformance.catalog import catalog

CATALOG = len(catalog())

DEAD_PROBE = """\
from tilecore.plugin import Target, hookimpl
from tilecore_cpu import CPUBackend

class DeadProbe(CPUBackend):
    name = "deadprobe"
    distribution = "tilecore-deadprobe"

    def parse_target(self, spec):
        return Target("deadprobe", "deadprobe", "", (), "cpu/host") if spec == "deadprobe" else None

    def targets(self):
        return ["deadprobe"]

    def capability_files(self):
        return []

    def probe(self):
        raise RuntimeError("driver exploded")

@hookimpl
def tilecore_backends():
    return [DeadProbe()]
"""


def tilecore_cli(args, cwd, plugins=None):
    env = {**os.environ, "TILECORE_CACHE_DIR": str(Path(cwd) / "cache")}
    if plugins is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(plugins), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "tilecore", *args], capture_output=True, text=True, env=env,
                          timeout=900, cwd=cwd)


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    return fake_plugins.install(tmp_path_factory.mktemp("report_plugins"),
                                {"wrongcpu": ("tc_rep_wrong", fake_plugins.WRONG_MODULE),
                                 "deadprobe": ("tc_rep_deadprobe", DEAD_PROBE)})


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """A filtered CPU run: one PASS and one NOT_SUPPORTED case."""
    tmp = tmp_path_factory.mktemp("cpu_run")
    r = tilecore_cli(["conformance", "run", "--target", "cpu", "-k", "fill/fill/float32 or gemm/int8/nn/64x64x64",
                      "--report", str(tmp / "report")], tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return tmp / "report"


def junit(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    for k in ("tests", "failures", "errors", "skipped"):
        assert int(root.get(k)) == sum(int(s.get(k)) for s in root.findall("testsuite")), k
    return root


def suite_cases(suite: ET.Element) -> dict:
    """{case id: (classname, outcome element or None)}; checks the suite's counts against its cases."""
    cases = {tc.get("name"): (tc.get("classname"), next(iter(tc), None)) for tc in suite.findall("testcase")}
    kinds = [o.tag for _, o in cases.values() if o is not None]
    assert int(suite.get("tests")) == len(cases)
    for attr, kind in (("failures", "failure"), ("errors", "error"), ("skipped", "skipped")):
        assert int(suite.get(attr)) == kinds.count(kind), attr
    return cases


def props(suite: ET.Element) -> dict:
    return {p.get("name"): p.get("value") for p in suite.find("properties")}


def test_unknown_target_stops_at_once_with_one_line_and_a_report_that_says_so(tmp_path):
    rep = tmp_path / "rep"
    r = tilecore_cli(["conformance", "run", "--target", "nosuch", "-n", "2", "--report", str(rep)], tmp_path)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if "nosuch" in line]
    assert len(errors) == 1, r.stderr
    assert "cannot run target 'nosuch'" in errors[0] and "cpu" in errors[0] and "tilecore targets list" in errors[0]
    assert "HARNESS_ERROR" not in r.stdout + r.stderr and "Traceback" not in r.stderr
    man = json.loads((rep / "manifest.json").read_text())
    assert man["target"] == "nosuch" and "no installed backend accepts target 'nosuch'" in man["error"]
    assert man["cases"] == 0 and man["selection"]["catalog_cases"] == CATALOG and man["selection"]["full"] is False
    assert (rep / "results.jsonl").read_text() == ""
    suite = junit(rep / "junit.xml").find("testsuite")  # an error, never an empty (green) suite
    assert suite.get("name") == "tilecore-conformance[nosuch]" and suite.get("errors") == "1"
    assert "the run stopped before any case" in (rep / "matrix.md").read_text()


def test_a_target_whose_probe_fails_stops_with_the_cause_and_the_installed_targets(tmp_path, plugins):
    rep = tmp_path / "rep"
    r = tilecore_cli(["conformance", "run", "--target", "deadprobe", "--report", str(rep)], tmp_path, plugins)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    line = [x for x in r.stderr.splitlines() if "deadprobe" in x]
    assert len(line) == 1 and "RuntimeError: driver exploded" in line[0], r.stderr
    assert "installed targets: " in line[0] and " cpu," in line[0] and "tilecore targets list" in line[0]
    assert "driver exploded" in json.loads((rep / "manifest.json").read_text())["error"]


def test_junit_names_suite_and_classes_after_the_target_and_carries_the_run_properties(cpu_run):
    root = junit(cpu_run / "junit.xml")
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "tilecore-conformance[cpu]" and suite.get("timestamp")
    p = props(suite)
    assert p["target"] == "cpu" and p["mode"] == "device" and p["device"] and p["device_status"] == "ok"
    assert p["tilecore_version"] == tilecore.__version__
    assert p["conformance_version"] == tilecore_conformance.__version__
    assert p["backend"].startswith("tilecore-cpu ") and p["capability_profile"] == "cpu/host"
    assert p["selection"] == f"filtered run: 2 of {CATALOG} cases (-k 'fill/fill/float32 or gemm/int8/nn/64x64x64')"
    cases = suite_cases(suite)
    assert set(cases) == {"fill/fill/float32", "gemm/int8/nn/64x64x64"}
    assert {c for c, _ in cases.values()} == {"cpu.fill", "cpu.gemm"}  # never the venv path pytest's writer puts there
    assert cases["fill/fill/float32"][1] is None
    skipped = cases["gemm/int8/nn/64x64x64"][1]
    assert skipped.tag == "skipped" and skipped.get("message").startswith("NOT_SUPPORTED: ")
    assert "kernel gemm uses T.gemm on int8 operands" in skipped.get("message")
    assert "site-packages" not in (cpu_run / "junit.xml").read_text()


def test_manifest_records_the_suite_version_and_the_selection(cpu_run):
    man = json.loads((cpu_run / "manifest.json").read_text())
    assert man["conformance_version"] == tilecore_conformance.__version__
    sel = man["selection"]
    assert sel["keyword"] == "fill/fill/float32 or gemm/int8/nn/64x64x64"
    assert sel["selected_cases"] == 2 and sel["catalog_cases"] == CATALOG and sel["full"] is False
    assert sel["expectations"].endswith("cpu.yaml") and len(sel["expectations_sha256"]) == 64
    assert f"filtered run: 2 of {CATALOG} cases" in (cpu_run / "matrix.md").read_text()


def test_junit_maps_failing_states_of_a_real_run(tmp_path, plugins):
    exp = tmp_path / "exp.yaml"
    exp.write_text("expected_failures:\n"
                   "  - {case: reduce/min/dim0/clear/float32, reason: planted min/max swap, issue: x/1}\n"
                   "  - {case: fill/fill/float32, reason: stale, issue: x/2}\n")
    rep = tmp_path / "rep"
    r = tilecore_cli(["conformance", "run", "--target", "wrongcpu", "--expectations", str(exp), "--report", str(rep),
                      "-k", "reduce/max/dim0/clear/float32 or reduce/min/dim0/clear/float32 or fill/fill/float32"],
                     tmp_path, plugins)
    assert r.returncode == 1, r.stdout[-3000:]
    suite = junit(rep / "junit.xml").find("testsuite")
    assert props(suite)["expectations"] == str(exp)
    cases = suite_cases(suite)
    fail, xfail, upass = (cases[i][1] for i in ("reduce/max/dim0/clear/float32", "reduce/min/dim0/clear/float32",
                                                 "fill/fill/float32"))
    assert fail.tag == "failure" and fail.get("type") == "FAIL" and "outside rtol" in fail.text
    assert "worst error abs" in fail.text
    assert xfail.tag == "skipped" and xfail.get("message").startswith("EXPECTED_FAIL")
    assert upass.tag == "failure" and upass.get("type") == "UNEXPECTED_PASS"
    man = json.loads((rep / "manifest.json").read_text())
    assert man["problems"] == ["1 UNEXPECTED_PASS: remove the stale expectations"]
    assert "wrongcpu (device): 1 UNEXPECTED_PASS: remove the stale expectations" in (rep / "matrix.md").read_text()


def test_a_shrunk_suite_fails_the_run_and_says_so_in_the_report(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("min_cases: 100000\nexpected_failures: []\n")
    rep = tmp_path / "rep"
    r = tilecore_cli(["conformance", "run", "--target", "cpu", "-k", "fill/clear/int32", "--expectations", str(exp),
                      "--report", str(rep)], tmp_path)
    assert r.returncode == 1
    man = json.loads((rep / "manifest.json").read_text())
    assert man["counts"] == {"PASS": 1} and "the suite shrank" in man["problems"][0]
    runs = (rep / "matrix.md").read_text().split("## Runs")[1].split("## Totals")[0]
    assert "| cpu (device) | **FAIL** |" in runs  # a verdict that agrees with the exit status


def synthetic_run(base: Path, out: Path) -> dict:
    """A report folder as another machine would send it, with a case in every state (copied from a real
    manifest, so the format is the writer's own)."""
    man = json.loads((base / "manifest.json").read_text())
    man.update(target="fake:x1", mode="emulated", device={"status": "ok", "devices": ["Fake X1"], "detail": ""},
               selection={"catalog_cases": 8, "selected_cases": 8, "full": True})
    states = ["PASS", "FAIL", "NOT_SUPPORTED", "EXPECTED_FAIL", "UNEXPECTED_PASS", "CRASH", "TIMEOUT", "HARNESS_ERROR"]
    recs = {}
    for i, s in enumerate(states):
        recs[f"syn/{s.lower()}"] = {
            "id": f"syn/{s.lower()}", "family": "syn", "params": {}, "state": s, "mode": "emulated",
            "target": "fake:x1", "seed": i, "duration": 0.5, "max_abs_err": 0.25 if s == "FAIL" else None,
            "max_rel_err": 0.5 if s == "FAIL" else None,
            "error": "" if s == "PASS" else f"{s} happened <here> & there\nsecond line of {s}"}
    recs["syn/crash"]["error"] = "Segmentation fault \x1b[31min native code\x00\nsecond line"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps(man))
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs.values()))
    return recs


class Tree(HTMLParser):
    """Just enough of an HTML tree to check the matrix's structure (the stdlib has no HTML DOM)."""
    VOID = {"meta", "input", "br", "link", "img", "hr"}

    def __init__(self, text):
        super().__init__()
        self.root = self.node("root", {})
        self.stack = [self.root]
        self.feed(text)

    @staticmethod
    def node(tag, attrs):
        return {"tag": tag, "attrs": dict(attrs), "kids": [], "text": []}

    def handle_starttag(self, tag, attrs):
        n = self.node(tag, attrs)
        self.stack[-1]["kids"].append(n)
        if tag not in self.VOID:
            self.stack.append(n)

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i]["tag"] == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1]["text"].append(data)
        self.stack[-1]["kids"].append(data)


def find(n, tag=None, **attrs):
    for k in n["kids"]:
        if isinstance(k, dict):
            if (tag is None or k["tag"] == tag) and all(k["attrs"].get(a.rstrip("_")) == v for a, v in attrs.items()):
                yield k
            yield from find(k, tag, **attrs)


def text(n) -> str:
    return "".join(k if isinstance(k, str) else text(k) for k in n["kids"])


def test_merge_writes_one_report_of_every_run(tmp_path, cpu_run):
    fake = tmp_path / "fake"
    recs = synthetic_run(cpu_run, fake)
    out = tmp_path / "merged"
    r = tilecore_cli(["conformance", "merge", str(cpu_run), str(fake), "--out", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr
    merged = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert {(x["target"], x["id"]) for x in merged} == (
        {("cpu", "fill/fill/float32"), ("cpu", "gemm/int8/nn/64x64x64")} | {("fake:x1", i) for i in recs})
    man = json.loads((out / "manifest.json").read_text())
    assert [m["target"] for m in man["runs"]] == ["cpu", "fake:x1"] and man["cases"] == len(merged)
    assert man["counts"]["fake:x1 (emulated)"]["CRASH"] == 1
    # junit: one suite per target, every state mapped, text a JUnit consumer can parse
    root = junit(out / "junit.xml")
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"tilecore-conformance[cpu]", "tilecore-conformance[fake:x1]"}
    assert props(suites["tilecore-conformance[fake:x1]"])["device"] == "Fake X1"
    cases = suite_cases(suites["tilecore-conformance[fake:x1]"])
    kind = {i.split("/")[1].upper(): (o.tag if o is not None else None) for i, (_, o) in cases.items()}
    assert kind == {"PASS": None, "FAIL": "failure", "UNEXPECTED_PASS": "failure", "CRASH": "error",
                    "TIMEOUT": "error", "HARNESS_ERROR": "error", "NOT_SUPPORTED": "skipped",
                    "EXPECTED_FAIL": "skipped"}
    assert cases["syn/crash"][1].get("message") == "Segmentation fault ?[31min native code?"
    assert {c for c, _ in cases.values()} == {"fake:x1.syn"}
    # a merged folder merges again; the same target twice is refused in one line
    again = tmp_path / "again"
    assert tilecore_cli(["conformance", "merge", str(out), "--out", str(again)], tmp_path).returncode == 0
    assert (again / "results.jsonl").read_text() == (out / "results.jsonl").read_text()
    r = tilecore_cli(["conformance", "merge", str(out), str(fake), "--out", str(tmp_path / "dup")], tmp_path)
    assert r.returncode == 1 and "fake:x1 (emulated)" in r.stderr and "Traceback" not in r.stderr
    # and the matrix shows it all
    check_html((out / "matrix.html").read_text(), recs)


def test_merge_of_a_folder_that_is_no_report_is_one_line(tmp_path, cpu_run):
    r = tilecore_cli(["conformance", "merge", str(cpu_run), "/nonexistent", "--out", str(tmp_path / "x")], tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "/nonexistent is not a conformance report folder" in r.stderr and r.stderr.startswith("tilecore: error:")
    assert "tilecore conformance run --report" in r.stderr


def check_html(page: str, recs: dict) -> None:
    doc = Tree(page).root
    assert not [n for n in find(doc) if n["attrs"].get("src") or n["attrs"].get("href")]  # no external assets
    (script,) = find(doc, "script")
    assert "addEventListener" in text(script)
    # the runs: verdict, totals per state, device, versions, date and selection per target
    (runs,) = find(doc, "table", class_="runs")
    head = [text(th) for th in find(runs, "th")]
    assert head == ["run", "verdict", "totals", "device", "backend", "versions", "created", "selection"]
    rows, totals = {}, {}
    for tr in find(next(find(runs, "tbody")), "tr"):
        tds = list(find(tr, "td"))
        rows[text(tds[0])] = [text(td) for td in tds]
        totals[text(tds[0])] = [text(t) for t in find(tds[2], "span", class_="tot")]
    cpu, fake = rows["cpu (device)"], rows["fake:x1 (emulated)"]
    assert cpu[1] == "pass" and fake[1] == "FAIL"
    assert totals["cpu (device)"] == ["NOT_SUPPORTED 1", "PASS 1"] and "2 cases" in cpu[2]
    worst_first = ["HARNESS_ERROR", "CRASH", "TIMEOUT", "FAIL", "UNEXPECTED_PASS", "EXPECTED_FAIL", "NOT_SUPPORTED",
                   "PASS"]
    assert totals["fake:x1 (emulated)"] == [f"{s} 1" for s in worst_first]
    assert fake[3] == "Fake X1" and f"tilecore {tilecore.__version__}" in cpu[5]
    assert f"conformance {tilecore_conformance.__version__}" in cpu[5] and cpu[6][:4].isdigit()
    assert cpu[7].startswith("filtered run: 2 of") and fake[7] == "all 8 cases"
    banners = [text(d) for d in find(doc, "div") if "banner" in d["attrs"].get("class", "")]
    assert banners == [f"cpu (device): filtered run: 2 of {CATALOG} cases "
                       "(-k 'fill/fill/float32 or gemm/int8/nn/64x64x64')"]
    # the filter: a text box, a toggle per state present, failures first
    assert list(find(doc, "input", id="q")) and list(find(doc, "input", id="ff"))
    toggles = [n["attrs"]["value"] for n in find(next(find(doc, "span", id="states")), "input")]
    assert toggles == worst_first
    # the cases, worst first; each non-PASS cell's error and worst error one click away
    (cases,) = find(doc, "table", id="cases")
    assert [text(th) for th in find(cases, "th")] == ["case", "cpu (device)", "fake:x1 (emulated)"]
    body = list(find(next(find(cases, "tbody")), "tr"))
    assert len(body) == 10 and text(next(find(body[0], "td"))) == "syn/harness_error"
    assert [int(tr["attrs"]["data-r"]) for tr in body] == sorted(int(tr["attrs"]["data-r"]) for tr in body)
    for tr in body:
        cid = text(next(find(tr, "td")))
        if cid not in recs:
            continue
        cell = list(find(tr, "td"))[2]
        r = recs[cid]
        if r["state"] == "PASS":
            assert not list(find(cell, "details")) and text(cell).startswith("PASS")
            continue
        (details,) = find(cell, "details")
        summary = text(next(find(details, "summary")))
        assert summary.startswith(r["state"]) and r["error"].splitlines()[0][:15] in summary
        assert text(next(find(details, "pre"))) == r["error"].strip().replace("\x1b", "?").replace("\x00", "?")
        if r["max_abs_err"] is not None:
            assert "abs 0.25, rel 0.5" in summary


def test_a_run_under_pass_configs_says_so_in_its_report(tmp_path):
    """`--pass-config` reaches every case's compile (through TILECORE_PASS_CONFIGS) and the manifest, the
    matrix and junit's selection property name it: such a run never reads as the default one."""
    rep = tmp_path / "report"
    r = tilecore_cli(["conformance", "run", "--target", "cpu", "-k", "fill/fill/float32", "--report", str(rep),
                      "--pass-config", "tilecore.fast_math=true", "--pass-config", "tilecore.extra_flags=[\"-O2\"]"],
                     tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    man = json.loads((rep / "manifest.json").read_text())
    assert man["pass_configs"] == {"tilecore.fast_math": True, "tilecore.extra_flags": ["-O2"]}
    assert 'under pass configs tilecore.extra_flags=["-O2"], tilecore.fast_math=true' in (rep / "matrix.md").read_text()
    bad = tilecore_cli(["conformance", "run", "--target", "cpu", "--pass-config", "tilecore.fast_math"], tmp_path)
    assert bad.returncode == 2 and "write KEY=VALUE" in bad.stderr
