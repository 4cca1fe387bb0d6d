"""The distributions as users get them: every wheel built with ``python -m build``, installed into a fresh
venv (no editable installs, nothing of this checkout on ``sys.path``), then used as a kernel author and a
vendor's CI would use them.

Wheels are built once per session (from a copy of the checkout, so no ``build/`` or ``*.egg-info`` lands in
it) and the venvs are shared; every test here runs in one xdist worker (``xdist_group`` with
``--dist loadgroup``, set in pyproject.toml). The venvs have no pip of their own: this interpreter's pip
installs into them (``pip --python``), with the machine's pip configuration (index, torch wheel cache).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from email import message_from_string
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REPO_URL = "https://github.com/tilecore/tilecore"
#: distribution -> its folder in this repository
DISTS = {"tilecore": ".", "tilecore-cpu": "backends/cpu", "tilecore-cuda": "backends/cuda",
         "tilecore-hip": "backends/hip", "tilecore-webgpu": "backends/webgpu", "tilecore-ascend": "backends/ascend",
         "tilecore-musa": "backends/musa", "tilecore-metal": "backends/metal", "tilecore-tvm": "backends/tvm",
         "tilecore-conformance": "conformance"}
#: wheels installed without their dependencies: tilecore-tvm's apache-tvm is 320 MB (its pins are checked in
#: the metadata instead; tests/test_tvm_backend.py runs it where setup.sh installed it)
NO_DEPS = ("tilecore-tvm",)

pytestmark = pytest.mark.xdist_group("wheels")


def _env(**extra) -> dict:
    """The caller's environment without anything that would put this checkout on sys.path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "__PYVENV_LAUNCHER__")}
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra)
    return env


def _run(cmd, cwd, timeout=600, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def _copy_checkout(dst: Path) -> None:
    """The files git knows (tracked and untracked-but-not-ignored), symlinks kept as symlinks."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src, out = ROOT / rel, dst / rel
        if not src.exists() and not src.is_symlink():  # deleted in the work tree, not yet committed
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), out)
        else:
            shutil.copy2(src, out)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> dict:
    """Distribution name -> its wheel, built by ``python -m build --wheel`` (the builds run at once)."""
    base = tmp_path_factory.mktemp("wheels")
    src, out = base / "src", base / "dist"
    _copy_checkout(src)
    procs = {name: subprocess.Popen([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(src / d)],
                                    env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, d in DISTS.items()}
    for name, p in procs.items():
        log = p.communicate(timeout=900)[0]
        assert p.returncode == 0, f"python -m build --wheel {DISTS[name]} failed:\n{log[-3000:]}"
        # setuptools' warning for a folder of files it would leave out of the wheel (a packaging slip, not noise)
        assert "would be ignored" not in log, f"python -m build --wheel {DISTS[name]} warns:\n{log[-3000:]}"
    found = {name: list(out.glob(name.replace("-", "_") + "-*.whl")) for name in DISTS}
    assert all(len(w) == 1 for w in found.values()), found
    return {name: w[0] for name, w in found.items()}


def _venv(path: Path, *requirements) -> Path:
    """A fresh venv (no pip, no system site-packages) with ``requirements`` installed; returns its bin/."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, env=_env())
    bin_ = path / "bin"
    r = _run([sys.executable, "-m", "pip", "--python", bin_ / "python", "install", "-q",
              "--disable-pip-version-check", *requirements], cwd=path, timeout=900)
    assert r.returncode == 0, f"pip install into the fresh venv failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return bin_


def _host_torch() -> str:
    import torch

    return f"torch=={torch.__version__}"  # the build setup.sh installed (a CPU build from the local wheel cache)


@pytest.fixture(scope="session")
def full_venv(wheels, tmp_path_factory) -> Path:
    """Every wheel, the conformance suite with its torch extra, as a vendor's CI installs them."""
    path = tmp_path_factory.mktemp("venv-full")
    bin_ = _venv(path, *(str(wheels[n]) for n in DISTS if n != "tilecore-conformance" and n not in NO_DEPS),
                 f"tilecore-conformance[torch] @ {wheels['tilecore-conformance'].as_uri()}", _host_torch())
    r = _run([sys.executable, "-m", "pip", "--python", bin_ / "python", "install", "-q", "--no-deps",
              "--disable-pip-version-check", *(str(wheels[n]) for n in NO_DEPS)], cwd=path, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    # nothing may come from this checkout: every package resolves inside the venv
    mods = ("tilecore", "tilecore_cpu", "tilecore_cuda", "tilecore_hip", "tilecore_webgpu", "tilecore_ascend",
            "tilecore_musa", "tilecore_metal", "tilecore_tvm", "tilecore_conformance")
    r = _run([bin_ / "python", "-c", f"import json, xdist, torch, {', '.join(mods)}; "
              f"print(json.dumps([m.__file__ for m in ({', '.join(mods)})]))"], cwd=path)
    assert r.returncode == 0, r.stderr
    for f in json.loads(r.stdout):
        assert Path(f).resolve().is_relative_to(path.resolve()) and "site-packages" in f, f
    return bin_


@pytest.fixture(scope="session")
def bare_venv(wheels, tmp_path_factory) -> Path:
    """A kernel author's venv: the core and the CPU backend (and pytest), no conformance suite, no xdist."""
    path = tmp_path_factory.mktemp("venv-bare")
    return _venv(path, wheels["tilecore"], wheels["tilecore-cpu"], "pytest")


# -- metadata -------------------------------------------------------------------------------------------

def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        lic = [n for n in names if ".dist-info/licenses/" in n]
        return message_from_string(z.read(meta).decode()), {n: z.read(n).decode() for n in lic}


@pytest.mark.parametrize("name", DISTS)
def test_wheel_metadata_license_urls_and_a_pypi_safe_readme(wheels, name):
    meta, licenses = _metadata(wheels[name])
    assert meta["License-Expression"] == "Apache-2.0"
    assert any(n.endswith("/licenses/LICENSE") for n in licenses), list(licenses)
    assert all("Copyright 2026 The tilecore authors" in t and "Apache License" in t for t in licenses.values())
    assert meta["Author"] == "The tilecore authors" and meta.get_all("Classifier")
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert urls["Homepage"] == REPO_URL and urls["Source"].startswith(REPO_URL)
    assert meta["Description-Content-Type"] == "text/markdown"
    readme = meta.get_payload()
    assert name in readme.splitlines()[0], "the description is not this distribution's README"
    # on PyPI a relative link points nowhere: every link is absolute, and those into the repository name a
    # file or folder that exists here
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        assert re.match(r"https?://", target), f"{name}: relative link {target!r} in its README"
        m = re.match(re.escape(REPO_URL) + r"/(?:blob|tree)/main/(.+?)(?:#.*)?$", target)
        if m:
            assert (ROOT / m.group(1)).exists(), f"{name}: README links to {m.group(1)}, which does not exist"


def test_dependencies_are_declared_and_bounded(wheels):
    conf = _metadata(wheels["tilecore-conformance"])[0].get_all("Requires-Dist")
    assert any(r.startswith("pytest-xdist") for r in conf), conf  # its CLI advertises -n
    torch = [r for r in conf if r.startswith("torch")]
    assert torch and all('extra == "torch"' in r and "==" not in r.split(";")[0] for r in torch), torch
    wgpu = [r for r in _metadata(wheels["tilecore-webgpu"])[0].get_all("Requires-Dist") if r.startswith("wgpu")]
    assert wgpu and "<" in wgpu[0], f"wgpu needs an upper bound: {wgpu}"
    tvm = _metadata(wheels["tilecore-tvm"])[0].get_all("Requires-Dist")
    assert "apache-tvm==0.27.0.post1" in tvm and any(r.startswith("apache-tvm-ffi") and "<" in r for r in tvm), tvm
    for name in DISTS:  # every backend needs the core of this minor series, nothing else of this checkout
        if name.startswith("tilecore-") and name != "tilecore-conformance":
            core = [r for r in _metadata(wheels[name])[0].get_all("Requires-Dist") if r.startswith("tilecore")]
            assert core and all("<0.2" in r for r in core), (name, core)


# -- a kernel author ------------------------------------------------------------------------------------

def test_targets_list_from_wheels(full_venv, tmp_path):
    r = _run([full_venv / "tilecore", "targets", "list", "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    cpu = next(row for row in rows if row["target"] == "cpu")
    assert cpu["status"] == "ok" and cpu["distribution"] == "tilecore-cpu" and cpu["profile"] == "cpu/host"
    assert {row["distribution"] for row in rows} == {"tilecore-cpu", "tilecore-cuda", "tilecore-hip", "tilecore-webgpu",
                                                     "tilecore-ascend", "tilecore-musa", "tilecore-metal",
                                                     "tilecore-tvm"}
    # tilecore-tvm without apache-tvm (installed --no-deps): listed, no toolchain (its probe imports no tvm)
    tvm = [row for row in rows if row["distribution"] == "tilecore-tvm"]
    assert tvm and all(row["status"] == "no-toolchain" for row in tvm), tvm
    assert all(not row["profile"].startswith("invalid") for row in rows), rows
    table = _run([full_venv / "tilecore", "targets", "list"], cwd=tmp_path)
    assert table.returncode == 0 and "targets (plugin API" in table.stdout, table.stderr


def test_readme_kernel_from_wheels(full_venv, tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    script = tmp_path / "readme_example.py"
    script.write_text(blocks[0] + "\nimport numpy as _np\n"
                      "_ref = _np.maximum(a.double().numpy() @ b.double().numpy(), 0)\n"
                      "_np.testing.assert_allclose(c.double().numpy(), _ref, rtol=1e-2, atol=2e-2)\n"
                      "print('README kernel: right answer')\n")
    r = _run([full_venv / "python", script], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "generated by tilecore-cpu" in r.stdout and "README kernel: right answer" in r.stdout


def test_cuda_source_from_wheels_inlines_the_core_simt_prelude(wheels, full_venv, tmp_path):
    # the SIMT C++ prelude is package data of the core wheel; the CUDA codegen inlines it into every source
    with zipfile.ZipFile(wheels["tilecore"]) as z:
        assert "tilecore/codegen/prelude/tc_simt.h" in z.namelist()
    script = tmp_path / "emit.py"
    script.write_text("import tilecore.language as T\nfrom tilecore.compiler import lower\n"
                      "@T.prim_func\ndef k(A: T.Tensor((64,), 'int32')):\n    with T.Kernel(1, threads=64) as bx:\n"
                      "        for i in T.Parallel(64):\n            A[i] = A[i] // 3\n"
                      "code = lower(k, 'cuda:sm_90a')[3].code\n"
                      "assert '\\n#include \"tc_simt.h\"' not in code and 'tc_floordiv(long long a' in code\n"
                      "print('inlined')\n")
    r = _run([full_venv / "python", script], cwd=tmp_path)
    assert r.returncode == 0 and "inlined" in r.stdout, r.stderr[-3000:]


# -- a vendor's CI --------------------------------------------------------------------------------------

def test_conformance_wheel_ships_its_expectations(wheels):
    """The known-failure files `tilecore conformance run` reads by target (tilecore_conformance/expectations)."""
    with zipfile.ZipFile(wheels["tilecore-conformance"]) as z:
        names = set(z.namelist())
    here = {p.name for p in (ROOT / "conformance" / "tilecore_conformance" / "expectations").glob("*.yaml")}
    assert here and {f"tilecore_conformance/expectations/{n}" for n in here} <= names


def test_conformance_run_from_wheels(full_venv, tmp_path):
    report = tmp_path / "report"
    r = _run([full_venv / "tilecore", "conformance", "run", "--target", "cpu", "-n", "2", "--report", report],
             cwd=tmp_path, timeout=1800)
    assert r.returncode == 0, (r.stdout[-4000:], r.stderr[-2000:])
    for f in ("manifest.json", "results.jsonl", "junit.xml", "matrix.md", "matrix.html"):
        assert (report / f).is_file(), f"{f} missing from the report"
    results = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    states = {rec["state"] for rec in results}
    assert len(results) > 300 and "PASS" in states and states <= {"PASS", "NOT_SUPPORTED", "EXPECTED_FAIL"}, states
    # torch came with the [torch] extra, so the bfloat16 cases ran
    assert any(rec["state"] == "PASS" for rec in results if "bfloat16" in rec["id"])
    manifest = json.loads((report / "manifest.json").read_text())
    assert manifest["target"] == "cpu" and manifest["mode"] == "device" and manifest["cases"] == len(results)


def test_conformance_run_without_the_suite_says_what_to_install(bare_venv, tmp_path):
    for argv in (["conformance"], ["conformance", "run", "--target", "cpu", "-n", "2", "--report", "out"]):
        r = _run([bare_venv / "tilecore", *argv], cwd=tmp_path)
        assert r.returncode == 2 and "unrecognized arguments" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "pip install tilecore-conformance" in r.stderr


def test_unrelated_pytest_with_the_suite_installed_but_no_xdist(bare_venv, wheels, tmp_path):
    """The suite's pytest11 plugin loads in every pytest run of the environment; without xdist (and torch) an
    unrelated test file must still pass. The suite goes in with --no-deps beside the bare venv."""
    site = tmp_path / "site"
    r = _run([sys.executable, "-m", "pip", "--python", bare_venv / "python", "install", "-q", "--no-deps",
              "--disable-pip-version-check", "--target", site, wheels["tilecore-conformance"]], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    probe = _run([bare_venv / "python", "-c", "import importlib.util as u, importlib.metadata as m; "
                  "print(u.find_spec('xdist'), u.find_spec('torch'), "
                  "sorted(e.name for e in m.entry_points(group='pytest11')))"], cwd=tmp_path, PYTHONPATH=site)
    assert probe.stdout.strip() == "None None ['tilecore_conformance']", probe.stdout + probe.stderr
    (tmp_path / "test_unrelated.py").write_text("def test_arithmetic():\n    assert 1 + 1 == 2\n")
    r = _run([bare_venv / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_unrelated.py"],
             cwd=tmp_path, PYTHONPATH=site)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
