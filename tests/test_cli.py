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
    assert r.returncode == 0 and r.stdout.strip() == f"tilecore {tilecore.__version__} (plugin API 1.13)"


def test_help_lists_commands():
    r = tc("--help")
    for word in ("targets", "compile", "capabilities", "cache"):
        assert word in r.stdout


def test_targets_list_json_has_cpu_ok():
    r = tc("targets", "list", "--json")
    rows = json.loads(r.stdout)
    cpu = next(row for row in rows if row["target"] == "cpu")
    assert cpu["status"] == "ok" and cpu["distribution"] == "tilecore-cpu"
    assert cpu["plugin_api"] == "1.13" and cpu["profile"] == "cpu/host" and cpu["devices"]


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
    (tmp_path / "launchers" / "0123abcd").mkdir(parents=True)
    out = tc("cache", "clear", env=env).stdout
    assert "removed 1 cached kernel(s), 0 autotune result(s) and 1 compiled launcher build(s)" in out, out
    assert not (tmp_path / "kernels").exists() and not (tmp_path / "launchers").exists()


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
    assert r.returncode == 1 and "id: 'acme/x3' does not match the file's place 'x2'" in r.stdout
    assert "fix: name the file x3.yaml" in r.stdout


# -- errors a user can act on: one line, the fix, no traceback ------------------------------------------

def _one_line_error(r, *words):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def test_missing_paths_are_one_line_errors(tmp_path):
    _one_line_error(tc("capabilities", "validate", str(tmp_path / "nosuch")),
                    "tilecore: error:", "nosuch: no such file or folder", "fix:")
    _one_line_error(tc("conformance", "merge", str(tmp_path / "rep"), str(tmp_path / "nosuch"), "--out",
                       str(tmp_path / "x")), "tilecore: error:", "rep is not a conformance report folder", "fix:")


def test_compile_wrong_arity_names_the_signature(tmp_path):
    spec = f"{HERE / 'kernels_for_tests.py'}:vadd"
    _one_line_error(tc("compile", spec, "--args", "1024,1024,'float32',5"),
                    "takes vadd(n, block=128, dtype='float32')", "--args 1024,1024,'float32',5 does not fit", "fix:")
    _one_line_error(tc("compile", spec), "missing a required argument: 'n'")
    _one_line_error(tc("compile", spec, "--args", "1024,("), "is not a list of Python literals", "fix:")


def test_compile_unknown_name_is_found_without_running_the_module(tmp_path):
    marker = tmp_path / "ran"
    f = tmp_path / "k.py"
    f.write_text(f"open({str(marker)!r}, 'w').close()\n\ndef make(n):\n    return 1 // n\n\nscale = 2\n"
                 "if __name__ == '__main__':\n    main_only = 3\n")
    r = tc("compile", f"{f}:nosuch")
    _one_line_error(r, "defines no top-level 'nosuch' (it defines: main_only, make, scale)")
    assert not marker.exists()
    _one_line_error(tc("compile", f"{f}:make", "--args", "0"), "make(0) failed at", "k.py:4: ZeroDivisionError")


def test_compile_module_that_fails_names_the_users_line(tmp_path):
    f = tmp_path / "k.py"
    f.write_text("import os\n\nx = 1\nraise RuntimeError('no GPU config here')\n\ndef f(n):\n    pass\n")
    _one_line_error(tc("compile", f"{f}:f"), f"k.py:4: RuntimeError: no GPU config here")


def test_output_into_a_closed_pipe_ends_quietly():
    # the reader is gone before tilecore writes anything, as with `tilecore targets show cpu | head -0`
    for args in (["targets", "show", "cpu", "--json"], ["targets", "show", "cpu"]):
        r_fd, w_fd = os.pipe()
        os.close(r_fd)
        p = subprocess.run([sys.executable, "-m", "tilecore", *args], stdout=w_fd,
                           stderr=subprocess.PIPE, text=True, timeout=300)
        os.close(w_fd)
        assert p.returncode != 0 and p.stderr == "", (args, p.stderr)


def test_tables_are_not_wrapped_when_stdout_is_not_a_terminal():
    rows = json.loads(tc("targets", "list", "--json").stdout)
    cpu = next(row for row in rows if row["target"] == "cpu")
    table = tc("targets", "list", env={"COLUMNS": "80"}).stdout
    line = next(ln for ln in table.splitlines() if "tilecore-cpu" in ln)
    for cell in (" cpu ", ", ".join(cpu["devices"]), "cpu/host", cpu["version"]):
        assert cell in line, (cell, line)


def test_help_texts():
    top = tc("--help").stdout
    assert "@tilecore.autotune" in top and "docs/language.md" in top
    cache = tc("cache", "--help").stdout
    assert "dir: print the cache directory" in cache and "autotune result" in cache
    show = tc("targets", "show", "--help").stdout
    assert "--json" in show and "print JSON" in show


# -- the cache: autotune results, an unusable TILECORE_CACHE_DIR --------------------------------------

def _docs_block(heading: str) -> str:
    text = (HERE.parent / "docs" / "language.md").read_text()
    part = text[text.index(heading):]
    return part[part.index("```python") + len("```python\n"):part.index("\n```", part.index("```python"))]


def test_autotune_example_runs_and_cache_clear_forgets_the_winner(tmp_path):
    script = tmp_path / "tune.py"
    script.write_text(_docs_block("### @tilecore.autotune"))
    env = {"TILECORE_CACHE_DIR": str(tmp_path / "cache")}

    def run():
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, **env})
        assert r.returncode == 0, r.stderr
        return r.stderr.count("[tilecore autotune]")

    assert run() == 3               # the documented example tunes its three configs
    assert run() == 0               # a later process reuses the winner
    r = tc("cache", "clear", env=env)
    assert r.returncode == 0 and ", 1 autotune result(s) and " in r.stdout, r.stdout
    assert run() == 3               # after clearing, it tunes again instead of reusing the old winner


SMALL_KERNEL = """import numpy as np, tilecore, tilecore.language as T

@T.prim_func
def twice(A: T.Tensor((8,), "float32"), B: T.Tensor((8,), "float32")):
    with T.Kernel(1) as bx:
        for i in T.Parallel(8):
            B[i] = A[i] * 2.0

print(tilecore.compile(twice, target="cpu", out_idx=[-1])(np.ones(8, np.float32)).tolist())
"""


def _run_small_kernel(tmp_path, cache):
    script = tmp_path / "small.py"
    script.write_text(SMALL_KERNEL)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TILECORE_CACHE_DIR": str(cache)})


def test_cache_dir_that_is_a_file_warns_once_and_compiles_without_a_cache(tmp_path):
    cache = tmp_path / "a-file"
    cache.write_text("")
    r = _run_small_kernel(tmp_path, cache)
    assert r.returncode == 0 and r.stdout.strip() == str([2.0] * 8), r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("tilecore: warning:") == 1
    assert f"TILECORE_CACHE_DIR={cache} is not a directory" in r.stderr and "fix:" in r.stderr
    _one_line_error(tc("cache", "clear", env={"TILECORE_CACHE_DIR": str(cache)}), "is not a directory", "fix:")


def test_cache_dir_is_created_private_and_one_others_can_write_is_not_used(tmp_path):
    import stat

    fresh = tmp_path / "new" / "cache"
    assert _run_small_kernel(tmp_path, fresh).returncode == 0
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700 and list((fresh / "kernels").glob("*/*"))
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    r = _run_small_kernel(tmp_path, shared)
    assert r.returncode == 0 and r.stdout.strip() == str([2.0] * 8), r.stderr
    assert "can be written by other users (mode 777)" in r.stderr and f"fix: chmod 700 {shared}" in r.stderr
    assert list(shared.iterdir()) == []     # nothing was written to, or would be loaded from, it
