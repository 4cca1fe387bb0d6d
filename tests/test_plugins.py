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
