"""The pytest plugin: ``pytest --tilecore-target=<t>`` runs the catalog against an installed target.

Each case becomes one test item, run in a case-runner child process (``isolation.py``) so that a
kernel that crashes or hangs in native code is recorded as CRASH or TIMEOUT without taking the run
down. The item passes for PASS and EXPECTED_FAIL (shown as xfail), is skipped with the reason
``NOT_SUPPORTED: ...`` only after the suite verified that compiling it fails with the clear
unsupported-feature error, and fails for every other state. At the end the controller
writes the reports, checks the expectations file (stale entries and the floor on collected cases)
and prints a summary table.

The plugin is installed as a ``pytest11`` entry point, so it loads in every pytest run of the
environment: without ``--tilecore-target`` every hook here returns at once, and the pytest-xdist hook is
registered only where xdist is installed (pytest rejects a plugin implementing a hook nobody declared).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from . import model

SUITE = Path(__file__).with_name("suite.py")
EXPECTATIONS = Path(__file__).with_name("expectations")


def pytest_addoption(parser):
    g = parser.getgroup("tilecore", "tilecore conformance")
    g.addoption("--tilecore-target", default=None, help="run the conformance catalog against this target")
    g.addoption("--tilecore-report", default=None, help="write results.jsonl, manifest.json, matrix.md/html here")
    g.addoption("--tilecore-expectations", default=None,
                help="expectations YAML (default: the packaged expectations/<target>.yaml)")
    g.addoption("--tilecore-timeout", type=float, default=120.0, help="seconds per case before TIMEOUT")


def _expectations_path(config, target: str) -> Path | None:
    opt = config.getoption("tilecore_expectations")
    if opt:
        return Path(opt)
    p = EXPECTATIONS / (target.replace(":", "_") + ".yaml")
    return p if p.exists() else None


def load_expectations(path: Path | None) -> dict:
    import yaml

    if path is None:
        return {"min_cases": 0, "expected_failures": {}}
    data = yaml.safe_load(path.read_text()) or {}
    entries = {}
    for e in data.get("expected_failures", []) or []:
        missing = [k for k in ("case", "reason", "issue") if not e.get(k)]
        if missing:
            raise pytest.UsageError(f"{path}: expectation {e} lacks {missing} (each needs case, reason, issue)")
        entries[e["case"]] = f"{e['reason']} ({e['issue']})"
    return {"min_cases": int(data.get("min_cases", 0)), "expected_failures": entries, "path": str(path)}


class Session:
    def __init__(self, config):
        from tilecore.errors import TilecoreError

        from .catalog import catalog
        from .runner import Target

        self.config = config
        self.spec = spec = config.getoption("tilecore_target")
        self.error = None
        try:
            self.target = Target(spec)
        except TilecoreError as e:  # an unknown target or a broken plugin: its message says what to do
            self.target, self.error = None, str(e)
        except Exception as e:  # noqa: BLE001 - a failed device query stops the run as an error, never a skip
            self.target, self.error = None, f"querying target {spec!r} failed: {type(e).__name__}: {e}"
        self.cases = catalog()
        self.expect = load_expectations(_expectations_path(config, spec))
        self.results: list = []
        self.timeout = config.getoption("tilecore_timeout")
        self.runner = None

    def run(self, case):
        """Run one case in this process's case runner (started on first use, restarted after a crash)."""
        from .isolation import CaseRunner

        if self.runner is None:
            self.runner = CaseRunner(self.spec, self.target.name, self.target.mode, self.timeout)
        return self.runner.run(case, self.expect["expected_failures"])


def _assign_device(config) -> None:
    """One worker per device: xdist worker gwN uses device N modulo the device count. Backends read the
    index from ``TILECORE_DEVICE`` (see docs/plugin-guide.md)."""
    worker = getattr(config, "workerinput", None)
    if worker is None or "TILECORE_DEVICE" in os.environ:
        return
    count = int(worker.get("tilecore_devices", 1) or 1)
    index = int(str(worker.get("workerid", "gw0"))[2:] or 0)
    os.environ["TILECORE_DEVICE"] = str(index % max(1, count))


def pytest_configure(config):
    if not config.getoption("tilecore_target"):
        return
    _assign_device(config)
    explicit = [a for a in config.invocation_params.args if not str(a).startswith("-") and Path(str(a)).exists()]
    if not explicit and str(SUITE) not in config.args:
        config.args[:] = [str(SUITE)]
    config._tilecore = Session(config)
    if config._tilecore.target is None:
        _stop_for_target(config, config._tilecore)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(), "tilecore_conformance_xdist")


def _selection(config, sess: Session) -> dict:
    from . import report

    return report.selection(config, len(sess.cases), sess.expect.get("path"))


def _stop_for_target(config, sess: Session) -> None:
    """A target that cannot be resolved or probed stops the run before any case: one line that says what to
    do, exit status 4, and (with a report folder) a manifest with the error, no results and a junit error."""
    from tilecore.plugin import get_registry

    from . import report

    spec = config.getoption("tilecore_target")
    msg = sess.error
    if "tilecore targets list" not in msg:
        known = sorted(t for b in get_registry().backends().values() for t in b.targets())
        msg += f"; installed targets: {', '.join(known) or 'none'} (see `tilecore targets list`)"
    rep = config.getoption("tilecore_report")
    if rep:
        report.write(Path(rep), [], report.failed_manifest(spec, msg, _selection(config, sess)))
    raise pytest.UsageError(f"tilecore conformance: cannot run target {spec!r}: {msg}")


def pytest_unconfigure(config):
    sess = getattr(config, "_tilecore", None)
    if sess is not None and sess.runner is not None:
        sess.runner.close()


def record(sess: Session, result) -> None:
    sess.results.append(result.to_dict())


def pytest_collection_finish(session):
    sess = getattr(session.config, "_tilecore", None)
    if sess is None or hasattr(session.config, "workerinput"):
        return
    ids = {c.id for c in sess.cases}
    stale = sorted(set(sess.expect["expected_failures"]) - ids)
    if stale:
        raise pytest.UsageError(f"expectations file {sess.expect.get('path')} names cases that do not exist: "
                                f"{stale}; remove them")


def _parts_dir(config) -> Path:
    rep = config.getoption("tilecore_report")
    base = Path(rep) if rep else Path(tempfile.gettempdir()) / f"tilecore-conformance-{os.getpid()}"
    return base / ".parts"


def pytest_sessionfinish(session, exitstatus):
    sess = getattr(session.config, "_tilecore", None)
    if sess is None:
        return
    worker = getattr(session.config, "workerinput", None)
    if worker is not None:  # an xdist worker hands its results to the controller through a file
        parts = Path(worker["tilecore_parts"])
        parts.mkdir(parents=True, exist_ok=True)
        with open(parts / f"{worker['workerid']}.jsonl", "w") as f:
            for r in sess.results:
                f.write(json.dumps(r) + "\n")
        return
    results = list(sess.results)
    parts = _parts_dir(session.config)
    if parts.exists():
        for p in sorted(parts.glob("*.jsonl")):
            results += [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
            p.unlink()
        parts.rmdir()
    _finish(session, sess, results)


class XdistHooks:
    """pytest-xdist's hooks, registered by ``pytest_configure`` only where xdist is installed."""

    @staticmethod
    def pytest_configure_node(node):  # tell workers where to put results and how many devices exist
        node.workerinput["tilecore_parts"] = str(_parts_dir(node.config))
        sess = getattr(node.config, "_tilecore", None)
        devices = len(sess.target.probe.devices) if sess is not None and sess.target is not None else 1
        node.workerinput["tilecore_devices"] = max(1, devices)


def _finish(session, sess: Session, results: list) -> None:
    from collections import Counter

    from . import report

    counts = Counter(r["state"] for r in results)
    problems = []
    floor = sess.expect["min_cases"]
    if len(sess.cases) < floor:
        problems.append(f"only {len(sess.cases)} cases collected, the floor for this target is {floor}: the suite shrank")
    if sess.target is not None:
        problems += list(sess.target.mismatches)
    if counts[model.UNEXPECTED_PASS]:
        problems.append(f"{counts[model.UNEXPECTED_PASS]} UNEXPECTED_PASS: remove the stale expectations")
    rep = session.config.getoption("tilecore_report")
    if rep:
        man = report.manifest(sess.target, _selection(session.config, sess))
        report.write(Path(rep), results, {**man, "problems": problems})
    _summary(session.config, sess, counts, problems)
    if problems or any(counts[s] for s in model.FAILING):
        session.exitstatus = 1


def _summary(config, sess, counts, problems) -> None:
    from rich.console import Console
    from rich.table import Table

    tr = config.pluginmanager.get_plugin("terminalreporter")
    con = Console(file=tr._tw._file if tr else None, force_terminal=False, soft_wrap=True)
    t = sess.target
    table = Table(title=f"tilecore conformance: {t.name if t else config.getoption('tilecore_target')} "
                        f"({t.mode if t else 'no target'})")
    table.add_column("state")
    table.add_column("cases", justify="right")
    for s in model.STATES:
        if counts[s]:
            table.add_row(s, str(counts[s]))
    con.print()
    con.print(table)
    for p in problems:
        con.print(f"error: {p}")
