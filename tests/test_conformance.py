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

    monkeypatch.delenv("TILECORE_DEVICE", raising=False)
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
