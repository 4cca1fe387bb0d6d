"""The conformance catalog on both MUSA targets as CI can run it: mode ``codegen-only`` (no MUSA compiler or
device here), every case's MUSA source generated, passed through the backend's structural checks and
through clang in CUDA mode against the stub header of the backend's tests (``TILECORE_MUSA_STUB``). Zero
FAIL; what the profiles do not declare is NOT_SUPPORTED; the vendor paths are taken where they should be."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

tilecore_musa = pytest.importorskip("tilecore_musa")
from tilecore_musa.compiler import find_clang  # noqa: E402

STUB = str(Path(tilecore_musa.__file__).resolve().parents[1] / "tests" / "stub")
pytestmark = pytest.mark.skipif(find_clang() is None and os.environ.get("TILECORE_MUSA_REQUIRE_TOOLCHAIN") != "1",
                                reason="no clang++ for the MUSA stub check (apt-get install clang-22)")


@pytest.mark.parametrize("target", ["musa:mp_22", "musa:mp_31"])
def test_conformance_catalog(tmp_path, target):
    env = {**os.environ, "TILECORE_MUSA_STUB": STUB, "TILECORE_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "tilecore", "conformance", "run", "--target", target, "-n", "1",
                           "--report", str(tmp_path / "report")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    res = [json.loads(line) for line in (tmp_path / "report" / "results.jsonl").read_text().splitlines()]
    states = {x["id"]: x["state"] for x in res}
    assert len(res) >= 340 and list(states.values()).count("PASS") >= 270, len(res)
    assert set(states.values()) <= {"PASS", "NOT_SUPPORTED"}, {k: v for k, v in states.items() if v != "PASS"}
    assert {x["mode"] for x in res} == {"codegen-only"}
    man = json.loads((tmp_path / "report" / "manifest.json").read_text())
    assert man["mode"] == "codegen-only"
    assert man["capability_profile"] == {"musa:mp_22": "musa/quyuan", "musa:mp_31": "musa/pinghu"}[target]
    for case in ("softmax/float32", "gemm/float16/nn/64x64x64", "feature/matrix_unit/gemm_float16",
                 "feature/subgroup_ops/gemm_float16", "attention/full/float16"):
        assert states[case] == "PASS", case
    ph1 = target == "musa:mp_31"
    for case in ("feature/bulk_tensor_copy/gemm_float16", "feature/async_barrier/gemm_float16",
                 "feature/async_copy/gemm_float16"):
        assert states[case] == ("PASS" if ph1 else "NOT_SUPPORTED"), case
    assert states["feature/warp_specialization/gemm_float16"] == "NOT_SUPPORTED"
