"""The plugin system through what users see: entry-point discovery, `tilecore targets list`, isolation
of broken plugins, API version refusal, the allowlist and strict mode."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import fake_plugins


def run_cli(args, env_extra=None, path=None):
    env = {**os.environ, **(env_extra or {})}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "tilecore", *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    return fake_plugins.install(tmp_path_factory.mktemp("plugins"), fake_plugins.ALL)


def rows_by_plugin(stdout):
    return {r["plugin"]: r for r in json.loads(stdout)}


def test_fake_plugin_appears_and_broken_ones_are_isolated(plugin_path):
    r = run_cli(["targets", "list", "--json"], path=plugin_path)
    assert r.returncode == 0, r.stderr
    rows = rows_by_plugin(r.stdout)
    assert rows["cpu"]["status"] == "ok" and rows["cpu"]["target"] == "cpu"
    assert rows["acme"]["target"] == "acme:x1"
    assert rows["acme"]["status"] == "no-device"
    assert rows["acme"]["profile"] == "acme/x1"
    assert rows["broken"]["status"].startswith("broken: ")
    assert "libacme.so not found" in rows["broken"]["status"]
    assert rows["future"]["status"].startswith("incompatible: ")
    assert "2.0" in rows["future"]["status"] and "1.0" in rows["future"]["status"]
    assert rows["misspelled"]["status"].startswith("broken: ")
    assert "tilecore_backend" in rows["misspelled"]["status"]


def test_table_output_names_every_plugin(plugin_path):
    r = run_cli(["targets", "list"], path=plugin_path, env_extra={"COLUMNS": "250"})
    assert r.returncode == 0, r.stderr
    for word in ("cpu", "acme:x1", "broken", "incompatible", "no-device"):
        assert word in r.stdout


def test_allowlist_loads_only_named_plugins(plugin_path):
    r = run_cli(["targets", "list", "--json"], path=plugin_path, env_extra={"TILECORE_PLUGINS": "cpu,acme"})
    assert set(rows_by_plugin(r.stdout)) == {"cpu", "acme"}


def test_strict_mode_reraises(plugin_path):
    r = run_cli(["targets", "list", "--json"], path=plugin_path, env_extra={"TILECORE_STRICT_PLUGINS": "1"})
    assert r.returncode != 0
    assert "broken" in r.stderr and "libacme.so" in r.stderr


def test_using_a_broken_plugins_target_raises_its_error(plugin_path):
    code = ("import tilecore.plugin as p\n"
            "try:\n    p.resolve_target('broken')\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "PluginError" in r.stdout and "libacme.so" in r.stdout


def test_discovery_is_lazy():
    code = ("import sys, tilecore\n"
            "print(any(m.startswith('tilecore_cpu') for m in sys.modules), 'tilecore.language' in sys.modules,"
            " 'tvm' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["False", "False", "False"], r.stdout + r.stderr


def test_unknown_target_lists_choices():
    from tilecore.errors import TargetError
    from tilecore.plugin import resolve_target

    with pytest.raises(TargetError, match=r"no installed backend accepts target 'nosuch:x9'.*available: .*cpu"):
        resolve_target("nosuch:x9")


def test_plugin_registered_in_code_gets_the_same_checks(tmp_path):
    from tilecore.plugin import Backend, get_registry, hookimpl

    class Bad(Backend):
        name = "bad"
        plugin_api = "not-a-version"

        def parse_target(self, spec):
            return None

        def emitter(self, target):
            raise NotImplementedError

        def runtime(self, target):
            raise NotImplementedError

    class Plugin:
        @hookimpl
        def tilecore_backends(self):
            return [Bad()]

    reg = get_registry()
    try:
        rec = reg.register(Plugin(), name="bad-plugin")
        assert rec.status == "incompatible" and "major.minor" in rec.error
        assert "bad" not in reg.backends()
    finally:
        reg.unregister("bad-plugin")


def _backend_package(root, name, with_caps):
    """A backend's package as a wheel lays it out: ``<name>/__init__.py`` (a Backend that writes neither
    capability_files nor a parser of its own) and, when asked, ``<name>/capabilities/*.yaml``."""
    pkg = root / name
    (pkg / "capabilities").mkdir(parents=True) if with_caps else pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from tilecore.plugin import Backend\n"
        "class B(Backend):\n"
        f"    name = {name!r}\n"
        "    def parse_target(self, spec):\n"
        "        return None\n"
        "    def emitter(self, target): ...\n"
        "    def runtime(self, target): ...\n")
    if with_caps:
        for f in ("zeta.yaml", "alpha.yaml", "README.txt"):
            (pkg / "capabilities" / f).write_text("# test\n")
    return pkg


def test_capability_files_default_reads_the_packages_capabilities_folder(tmp_path, monkeypatch):
    """Plugin API 1.13: a backend that writes no capability_files() gets its package's capabilities/*.yaml, sorted
    (nothing else in the folder); a package without the folder gets none, not an error."""
    import importlib

    with_caps = _backend_package(tmp_path, "tc_acme_caps", True)
    _backend_package(tmp_path, "tc_acme_nocaps", False)
    monkeypatch.syspath_prepend(str(tmp_path))
    b = importlib.import_module("tc_acme_caps").B()
    assert [p.name for p in b.capability_files()] == ["alpha.yaml", "zeta.yaml"]
    assert all(p.parent == with_caps / "capabilities" for p in b.capability_files())
    assert importlib.import_module("tc_acme_nocaps").B().capability_files() == []


def test_every_in_tree_backend_ships_its_capability_files_through_the_default():
    """The installed backends (which no longer write capability_files themselves) still find their profiles."""
    from tilecore.plugin import get_registry

    backends = get_registry().backends()
    assert "cpu" in backends
    for name, backend in backends.items():
        if not type(backend).__module__.startswith("tilecore_"):
            continue  # a test's plugin
        files = backend.capability_files()
        assert files and all(p.suffix == ".yaml" and p.parent.name == "capabilities" for p in files), name


def test_arch_of_parses_bare_and_named_architectures():
    from tilecore.plugin import Backend

    class Acme(Backend):
        name = "acme"

        def parse_target(self, spec):
            return None

        def emitter(self, target): ...

        def runtime(self, target): ...

    b, archs, aliases = Acme(), ("x1", "x2"), {"big": "x2"}
    assert b.arch_of("acme:x1", archs, aliases) == "x1"
    assert b.arch_of("  ACME:Big ", archs, aliases) == "x2"
    assert b.arch_of("acme", archs, aliases, local=lambda: "x1") == "x1"
    assert b.arch_of("acme", archs, aliases) is None  # no local(): the bare name is refused
    for other in ("acme:x3", "acme:", "acmex:x1", "cuda:x1", "x1", ""):
        assert b.arch_of(other, archs, aliases, local=lambda: "x1") is None, other
