"""The conformance suite, run as a vendor's CI runs it: `tilecore conformance run`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fake_plugins


def run(args, tmp_path, plugins=None, cache=None):
    env = {**os.environ, "TILECORE_CACHE_DIR": str(cache or (tmp_path / "cache"))}
    if plugins is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(plugins), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "tilecore", "conformance", "run", *args], capture_output=True,
                          text=True, env=env, timeout=900, cwd=tmp_path)


def results(report: Path) -> list:
    return [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    return fake_plugins.install(tmp_path_factory.mktemp("conf_plugins"),
                                {"acme": ("tc_conf_acme", fake_plugins.ACME_MODULE),
                                 "wrongcpu": ("tc_conf_wrong", fake_plugins.WRONG_MODULE)})


def test_full_catalog_on_cpu_device_mode_has_no_failures(tmp_path):
    report = tmp_path / "report"
    r = run(["--target", "cpu", "-n", "2", "--report", str(report)], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = results(report)
    man = json.loads((report / "manifest.json").read_text())
    assert man["mode"] == "device" and man["capability_profile"] == "cpu/host" and man["cases"] == len(res)
    assert len(res) >= 340
    states = {x["state"] for x in res}
    assert states <= {"PASS", "NOT_SUPPORTED"}, states
    assert all(x["mode"] == "device" for x in res)
    # every NOT_SUPPORTED case was checked to fail with the clear unsupported-feature error
    for x in res:
        if x["state"] == "NOT_SUPPORTED":
            assert "does not support" in x["error"] and "cpu/host" in x["error"], x
    # and each family ran real work
    families = {x["family"] for x in res if x["state"] == "PASS"}
    assert {"copy", "gemm", "reduce", "cumsum", "elementwise", "atomic", "softmax", "attention"} <= families
    for name in ("junit.xml", "matrix.md", "matrix.html"):
        assert (report / name).stat().st_size > 0
    assert "| gemm/float16/nt/100x72x40 | PASS |" in (report / "matrix.md").read_text()


def test_missing_capability_is_not_supported_with_the_right_error(tmp_path, plugins):
    report = tmp_path / "report"
    r = run(["--target", "acme:x1", "-k", "atomic or fill/fill/float32", "--report", str(report)], tmp_path, plugins)
    res = {x["id"]: x for x in results(report)}
    assert r.returncode == 0, r.stdout[-2000:]
    atomic = [x for i, x in res.items() if i.startswith("atomic/")]
    assert atomic and all(x["state"] == "NOT_SUPPORTED" for x in atomic)
    for x in atomic:  # refused at compile time, naming what is absent (atomics, or the dtype itself for float64)
        assert "does not support" in x["error"] and "acme:x1" in x["error"], x
        assert ("feature:atomics" in x["error"]) != (x["params"]["dtype"] == "float64"), x
    # no device for acme here: the highest honest mode is compile-only, and it is recorded
    assert res["fill/fill/float32"] == {**res["fill/fill/float32"], "state": "PASS", "mode": "compile-only"}


def test_planted_wrong_results_are_caught_as_fail(tmp_path, plugins):
    report = tmp_path / "report"
    r = run(["--target", "wrongcpu", "-k", "reduce/max or elementwise/relu", "--report", str(report)], tmp_path,
            plugins)
    assert r.returncode == 1
    res = results(report)
    failed = [x for x in res if x["state"] == "FAIL"]
    assert failed and all("outside rtol" in x["error"] for x in failed)
    assert "FAIL" in r.stdout


def test_stale_expectation_is_an_unexpected_pass(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("min_cases: 10\nexpected_failures:\n  - case: fill/fill/float32\n    reason: planted\n"
                   "    issue: https://example.invalid/1\n")
    report = tmp_path / "report"
    r = run(["--target", "cpu", "-k", "fill/fill", "--expectations", str(exp), "--report", str(report)], tmp_path)
    assert r.returncode == 1
    states = {x["id"]: x["state"] for x in results(report)}
    assert states["fill/fill/float32"] == "UNEXPECTED_PASS"
    assert "UNEXPECTED_PASS" in r.stdout


def test_expectation_for_a_missing_case_fails_the_run(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("expected_failures:\n  - case: no/such/case\n    reason: x\n    issue: https://example.invalid/2\n")
    r = run(["--target", "cpu", "-k", "fill/fill/float32", "--expectations", str(exp)], tmp_path)
    assert r.returncode != 0 and "no/such/case" in (r.stdout + r.stderr)


def test_case_floor_catches_a_shrinking_suite(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("min_cases: 100000\nexpected_failures: []\n")
    r = run(["--target", "cpu", "-k", "fill/clear/int32", "--expectations", str(exp)], tmp_path)
    assert r.returncode == 1 and "the suite shrank" in r.stdout


def test_merge_puts_each_target_and_mode_in_its_own_column(tmp_path, plugins):
    a, b = tmp_path / "a", tmp_path / "b"
    pick = "copy/whole/float32 or copy/whole/float64"  # dtypes the acme profile declares (float64: absent)
    assert run(["--target", "cpu", "-k", pick, "--report", str(a)], tmp_path).returncode == 0
    assert run(["--target", "acme:x1", "-k", pick, "--report", str(b)], tmp_path, plugins).returncode == 0
    out = tmp_path / "merged"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    m = subprocess.run([sys.executable, "-m", "tilecore", "conformance", "merge", str(a), str(b), "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert m.returncode == 0, m.stderr
    text = (out / "matrix.md").read_text()
    assert "| case | cpu (device) | acme:x1 (compile-only) |" in text
    assert "| copy/whole/float32/64x64 | PASS | PASS |" in text
    assert "| copy/whole/float64/64x64 | PASS | NOT_SUPPORTED |" in text


def junit_cases(report: Path) -> dict:
    """junit.xml's test cases by name (the case id)."""
    import xml.etree.ElementTree as ET

    return {tc.get("name"): tc for tc in ET.parse(report / "junit.xml").iter("testcase")}


def processes_with(marker: str) -> list:
    """Live processes whose environment holds ``marker`` (a case runner left behind would be one)."""
    found = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        if env.parent.name == str(os.getpid()):
            continue
        try:
            if marker.encode() in env.read_bytes():
                found.append(env.parent.name)
        except OSError:
            pass
    return found


# the planted backend's kernels that take a maximum segfault, those that take a minimum spin forever
SEGFAULTS, HANGS = "reduce/max/dim0/clear/float32", "reduce/min/dim0/clear/float32"
HEALTHY = ["reduce/sum/dim0/clear/float32", "reduce/sum/dim1/clear/float32", "reduce/abssum/dim0/clear/float32",
           "fill/fill/float32", "fill/clear/int32", "copy/whole/float32/64x64", "cumsum/dim0/forward/float32",
           "cumsum/dim1/reverse/int32"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return fake_plugins.install(tmp_path_factory.mktemp("planted"),
                                {"plantedcpu": ("tc_conf_planted", fake_plugins.PLANTED_MODULE)})


@pytest.mark.parametrize("workers", [["-n", "2"], []], ids=["xdist", "one-process"])
def test_native_crash_and_hang_are_recorded_and_later_cases_still_run(tmp_path, planted, workers, monkeypatch):
    monkeypatch.setenv("TC_TEST_MARKER", str(tmp_path))  # inherited by every process of the run
    report = tmp_path / "report"
    pick = " or ".join([SEGFAULTS, HANGS, *HEALTHY])
    # 10 s per case: the crashing case compiles its kernel (g++) inside its clock before it crashes, which took
    # more than 5 s on a loaded 2-core CI machine (recorded as TIMEOUT instead of CRASH)
    r = run(["--target", "plantedcpu", *workers, "--timeout", "10", "--report", str(report), "-k", pick],
            tmp_path, planted)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    res = {x["id"]: x for x in results(report)}
    assert sorted(res) == sorted([SEGFAULTS, HANGS, *HEALTHY])
    crash, hang = res.pop(SEGFAULTS), res.pop(HANGS)
    assert crash["state"] == "CRASH" and "signal SIGSEGV" in crash["error"], crash
    assert "in launch" in crash["error"], crash  # faulthandler names the Python frame that was in native code
    assert hang["state"] == "TIMEOUT" and "no result within 10 s" in hang["error"], hang
    assert 10 <= hang["duration"] < 20, hang
    assert {x["state"] for x in res.values()} == {"PASS"}, res  # in catalog order, some ran after both
    cases = junit_cases(report)
    assert set(cases) >= {SEGFAULTS, HANGS, *HEALTHY}, cases
    assert cases[SEGFAULTS].find("error") is not None and cases[HANGS].find("error") is not None
    matrix = (report / "matrix.md").read_text()
    assert f"| {SEGFAULTS} | CRASH |" in matrix and f"| {HANGS} | TIMEOUT |" in matrix
    assert "CRASH" in r.stdout and "TIMEOUT" in r.stdout
    assert processes_with(str(tmp_path)) == [], "a case runner outlived the run"


def test_an_unrelated_pytest_run_without_xdist_is_untouched(tmp_path):
    (tmp_path / "test_other.py").write_text("def test_other():\n    assert 1 + 1 == 2\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
                        "test_other.py"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    assert "tilecore" not in r.stdout + r.stderr


def test_workers_without_xdist_is_one_clear_error(tmp_path):
    code = ("import runpy, sys; sys.modules['xdist'] = None; "  # pytest-xdist not installed
            "sys.argv = ['tilecore', 'conformance', 'run', '--target', 'cpu', '-n', '2']; "
            "runpy.run_module('tilecore', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "tilecore: error: -n 2 needs pytest-xdist, which is not installed: pip install pytest-xdist "
        "(or run without -n)"]


def test_bfloat16_cases_without_torch_are_a_harness_error_naming_the_fix(tmp_path):
    hide = tmp_path / "notorch"
    (hide / "torch").mkdir(parents=True)  # shadows the real torch in every process of the run
    (hide / "torch" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    report = tmp_path / "report"
    r = run(["--target", "cpu", "-k", "fill/fill/bfloat16 or copy/whole/bfloat16 or fill/fill/float32",
             "--report", str(report)], tmp_path, hide)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    res = {x["id"]: x for x in results(report)}
    assert res.pop("fill/fill/float32")["state"] == "PASS"
    assert sorted(res) == ["copy/whole/bfloat16/64x64", "fill/fill/bfloat16"]
    for x in res.values():
        assert x["state"] == "HARNESS_ERROR" and x["error"] == "needs torch for bfloat16 inputs: pip install torch", x


MISMATCH_MODULE = fake_plugins.ACME_MODULE.replace(
    'return Probe("no-device", detail="acme boards are not attached here")',
    'return Probe("ok", (DeviceInfo("acme x1 board"),), {"memory": {"shared": {"max_bytes_per_block": 8192}}})',
).replace("from tilecore.plugin import Backend, Probe, Target, hookimpl",
          "from tilecore.plugin import Backend, DeviceInfo, Probe, Target, hookimpl")


def test_probe_disagreeing_with_the_profile_fails_the_run(tmp_path):
    plugins = fake_plugins.install(tmp_path / "p", {"acme": ("tc_conf_acme_mismatch", MISMATCH_MODULE)})
    report = tmp_path / "report"
    r = run(["--target", "acme:x1", "-k", "fill/fill/float32", "--report", str(report)], tmp_path, plugins)
    assert r.returncode == 1
    assert "CAPABILITY_MISMATCH: memory.shared.max_bytes_per_block declared 16384, probed 8192" in r.stdout
    man = json.loads((report / "manifest.json").read_text())
    assert man["capability_mismatches"] and man["mode"] == "device"


def test_each_worker_gets_its_own_device(monkeypatch):
    from tilecore_conformance.plugin import _assign_device

    class Config:
        workerinput = {"workerid": "gw5", "tilecore_devices": 4}

    monkeypatch.setenv("TILECORE_DEVICE", "")  # (recorded, so the value _assign_device sets is undone after the
    monkeypatch.delenv("TILECORE_DEVICE")        # test: it leaked into later tests of the worker before)
    _assign_device(Config())
    assert os.environ["TILECORE_DEVICE"] == "1"


def test_results_read_back_from_torch_stay_exact():
    # outputs of a device runtime come back as torch tensors; float64 must not pass through float32
    import torch

    from tilecore_conformance.catalog import f64

    x = torch.tensor([1 / 3, 2.0 ** -40 + 1.0], dtype=torch.float64)
    assert (f64(x) == x.numpy()).all()
    assert f64(torch.tensor([2 ** 53 - 1], dtype=torch.int64))[0] == 2 ** 53 - 1
    assert f64(torch.tensor([0.1], dtype=torch.bfloat16))[0] == float(torch.tensor(0.1, dtype=torch.bfloat16))
