"""`tilecore` as a user types it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def tc(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tilecore", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_version():
    import tilecore

    r = tc("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tilecore {tilecore.__version__} (plugin API 1.0)"


def test_help_lists_commands():
    r = tc("--help")
    for word in ("targets", "compile", "capabilities", "cache"):
        assert word in r.stdout


def test_targets_list_json_has_cpu_ok():
    r = tc("targets", "list", "--json")
    rows = json.loads(r.stdout)
    cpu = next(row for row in rows if row["target"] == "cpu")
    assert cpu["status"] == "ok" and cpu["distribution"] == "tilecore-cpu"
    assert cpu["plugin_api"] == "1.0" and cpu["profile"] == "cpu/host" and cpu["devices"]


def test_targets_show_prints_the_resolved_matrix_and_probe():
    r = tc("targets", "show", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["capability_profile"] == "cpu/host"
    assert info["capabilities"]["features"]["atomics"] is True
    assert info["probed"]["execution"]["cores"] == os.cpu_count()
    assert info["mismatches"] == []


def test_targets_show_unknown_target_is_a_clear_error():
    r = tc("targets", "show", "nosuch")
    assert r.returncode == 1 and "no installed backend accepts target 'nosuch'" in r.stderr


def test_compile_emits_ir_lowered_and_source():
    spec = f"{HERE / 'kernels_for_tests.py'}:vadd"
    ir = tc("compile", spec, "--args", "1000", "--emit", "ir")
    assert ir.returncode == 0, ir.stderr
    assert "@T.prim_func" in ir.stdout and "T.Kernel(8" in ir.stdout
    lowered = tc("compile", spec, "--args", "1000,256", "--emit", "lowered")
    assert "T.Kernel(4" in lowered.stdout
    src = tc("compile", spec, "--args", "1000", "--emit", "source", "--target", "cpu")
    assert "int tc_kernel(" in src.stdout and "#pragma omp" in src.stdout


def test_compile_prim_func_by_name(tmp_path):
    f = tmp_path / "k.py"
    f.write_text("import tilecore.language as T\n\n@T.prim_func\ndef fill_ones(A: T.Tensor((16,), 'float32')):\n"
                 "    with T.Kernel(1) as bx:\n        T.fill(A, 1.0)\n")
    r = tc("compile", f"{f}:fill_ones", "--emit", "source", "-o", str(tmp_path / "out.c"))
    assert r.returncode == 0, r.stderr
    assert "1.0f" in (tmp_path / "out.c").read_text()


def test_compile_reports_kernel_errors_without_a_traceback(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text("import tilecore.language as T\n\ndef make():\n    @T.prim_func\n    def bad(A: T.Tensor((16,), 'float32')):\n"
                 "        with T.Kernel(1) as bx:\n            A[0] = nope\n    return bad\n")
    r = tc("compile", f"{f}:make", "--emit", "ir")
    assert r.returncode == 1
    assert "bad.py:7 in bad: NameError: name 'nope' is not defined" in r.stderr
    assert "Traceback" not in r.stderr


def test_capabilities_validate_checks_every_in_tree_file():
    r = tc("capabilities", "validate", str(HERE.parent / "capabilities"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all valid" in r.stdout


def test_capabilities_validate_a_second_checkout_shadows_installed_copies(tmp_path):
    # CI validates a fresh clone while an editable install of another checkout may still be on the
    # machine: the named files are the ones checked, the installed copies with the same ids are shadowed.
    import shutil

    copy = tmp_path / "capabilities"
    shutil.copytree(HERE.parent / "capabilities", copy)
    r = tc("capabilities", "validate", str(copy))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "shadowed by the named paths" in r.stdout and "all valid" in r.stdout
    (copy / "cpu" / "host.yaml").write_text((copy / "cpu" / "host.yaml").read_text()
                                           .replace("simd_width:", "simd_width: -1 #"))
    r = tc("capabilities", "validate", str(copy))
    assert r.returncode == 1 and "simd_width" in r.stdout, r.stdout


def test_capabilities_validate_fails_on_a_bad_file(tmp_path):
    (tmp_path / "bad.yaml").write_text("schema: tilecore.capabilities/v1\nid: acme/bad\ntarget: acme\n"
                                       "execution: {simd_width: -3}\n")
    r = tc("capabilities", "validate", str(tmp_path))
    assert r.returncode == 1 and "simd_width" in r.stdout


def test_cache_dir_and_clear(tmp_path):
    env = {"TILECORE_CACHE_DIR": str(tmp_path)}
    assert tc("cache", "dir", env=env).stdout.strip() == str(tmp_path)
    (tmp_path / "kernels" / "ab" / "abc").mkdir(parents=True)
    assert "removed 1 cached kernel" in tc("cache", "clear", env=env).stdout


def test_capabilities_validate_accepts_the_wheel_and_guide_layouts(tmp_path):
    # a wheel's folder (tilecore_cpu/capabilities/host.yaml, id cpu/host) validates as it ships
    r = tc("capabilities", "validate", str(HERE.parent / "backends" / "cpu" / "tilecore_cpu" / "capabilities"))
    assert r.returncode == 0 and "all valid" in r.stdout, r.stdout + r.stderr
    # the plugin guide's layout: tilecore_acme/capabilities/x1.yaml with id acme/x1, named by its folder
    # or by the package folder above it
    caps = tmp_path / "tilecore_acme" / "capabilities"
    caps.mkdir(parents=True)
    (caps / "x1.yaml").write_text("schema: tilecore.capabilities/v1\nid: acme/x1\nextends: [cpu/host]\ntarget: acme\n"
                                  "match: {arch: x1}\n")
    for where in (caps, tmp_path / "tilecore_acme"):
        r = tc("capabilities", "validate", str(where))
        assert r.returncode == 0 and "all valid" in r.stdout, r.stdout + r.stderr
    # a copy-pasted file whose id names another device still fails, with the fix
    (caps / "x2.yaml").write_text((caps / "x1.yaml").read_text().replace("acme/x1", "acme/x3"))
    r = tc("capabilities", "validate", str(caps))
    assert r.returncode == 1 and "id 'acme/x3' does not match the file's place 'x2'" in r.stdout
    assert "fix: name the file x3.yaml" in r.stdout
