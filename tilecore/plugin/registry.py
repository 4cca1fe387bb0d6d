"""Plugin discovery, isolation and target resolution.

Environment switches:

- ``TILECORE_PLUGINS=a,b``              load only these entry points (by entry-point name);
- ``TILECORE_DISABLE_PLUGIN_AUTOLOAD=1`` load no entry points (register plugins in code);
- ``TILECORE_STRICT_PLUGINS=1``         re-raise the first plugin error instead of isolating it;
- ``TILECORE_TRACE_PLUGINS=1``          print every hook call to stderr.
"""
from __future__ import annotations

import importlib.metadata
import os
import sys
import threading
import traceback
from dataclasses import dataclass, field

import pluggy

from ..errors import PluginError, TargetError
from . import hookspecs
from .api import PLUGIN_API, Backend, Target

GROUP = "tilecore.backends"


@dataclass
class PluginRecord:
    """One discovered plugin and what became of it."""

    name: str
    distribution: str = ""
    version: str = ""
    status: str = "ok"  # ok | broken | incompatible
    error: str = ""
    backends: list = field(default_factory=list)
    plugin: object = None
    #: the entry point's distribution (importlib.metadata), whose name and version are read on first use of
    #: ``distribution`` or ``version``: reading them parses its METADATA file, 0.5 ms a plugin in every process
    #: (decision D48), and a compile needs neither
    dist: object = field(default=None, repr=False, compare=False)

    @property
    def status_text(self) -> str:
        return self.status if self.status == "ok" else f"{self.status}: {self.error}"

    def _filled(self, attr: str) -> str:
        d = self.__dict__
        if not d.get(attr):
            dist = d.get("dist")
            if dist is not None:
                d["dist"] = None
                d["distribution"] = d.get("distribution") or dist.name
                d["version"] = d.get("version") or dist.version
            if not d.get("version") and self.backends:  # a plugin registered in code: its first backend's
                d["version"] = self.backends[0].version()
                d["distribution"] = d.get("distribution") or self.backends[0].distribution
        return d.get(attr, "")


# ``distribution`` and ``version`` as properties over the dataclass's fields (its __init__ sets them through these)
PluginRecord.distribution = property(lambda self: self._filled("distribution"),
                                     lambda self, v: self.__dict__.__setitem__("distribution", v))
PluginRecord.version = property(lambda self: self._filled("version"),
                                lambda self, v: self.__dict__.__setitem__("version", v))

#: False: read every plugin's distribution name and version when it loads, as before D48 (benchmarks/cold_compile.py)
LAZY_RECORDS = True


def _api_fits(declared: str) -> tuple[bool, str]:
    try:
        major, minor = (int(x) for x in str(declared).split(".")[:2])
    except ValueError:
        return False, f"declares plugin API {declared!r}, which is not 'major.minor'"
    ours = f"{PLUGIN_API[0]}.{PLUGIN_API[1]}"
    if major != PLUGIN_API[0] or minor > PLUGIN_API[1]:
        fits = f"{PLUGIN_API[0]}.0 to {ours}"
        return False, (f"written for plugin API {declared}, this tilecore provides {ours} (plugins for "
                       f"{fits} fit); install a tilecore that provides {major}.{minor} or a plugin "
                       f"release built for {ours}")
    return True, ""


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


class Registry:
    def __init__(self, autoload: bool | None = None):
        self.pm = pluggy.PluginManager("tilecore")
        self.pm.add_hookspecs(hookspecs)
        self.records: dict = {}
        self._backends: dict = {}
        self._loaded = False
        self._lock = threading.RLock()
        self.autoload = (not _env_flag("TILECORE_DISABLE_PLUGIN_AUTOLOAD")) if autoload is None else autoload
        self.strict = _env_flag("TILECORE_STRICT_PLUGINS")
        self.trace = _env_flag("TILECORE_TRACE_PLUGINS")

    def _call(self, impl, **kwargs):
        """Call one plugin's hook implementation (one at a time, so a failure is that plugin's alone)."""
        args = {k: v for k, v in kwargs.items() if k in impl.argnames}
        result = impl.function(**args)
        if self.trace:
            sys.stderr.write(f"[tilecore plugins] {impl.plugin_name}.{impl.function.__name__}"
                             f"({', '.join(f'{k}={v}' for k, v in args.items())}) -> {result!r}\n")
        return result

    # -- loading ------------------------------------------------------------------------------------
    def load(self) -> None:
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            if self.autoload:
                self._load_entry_points()

    def _load_entry_points(self) -> None:
        allow = os.environ.get("TILECORE_PLUGINS")
        allowed = {a.strip() for a in allow.split(",") if a.strip()} if allow else None
        for ep in sorted(importlib.metadata.entry_points(group=GROUP), key=lambda e: e.name):
            if allowed is not None and ep.name not in allowed:
                continue
            dist = getattr(ep, "dist", None)
            rec = PluginRecord(ep.name, dist=dist)
            if not LAZY_RECORDS and dist is not None:
                rec.distribution, rec.version = dist.name, dist.version
            try:
                obj = ep.load()
            except Exception as e:  # noqa: BLE001 - a broken plugin must not take the others down
                self._fail(rec, "broken", f"import of {ep.value} failed: {type(e).__name__}: {e}", e)
                continue
            self._register(obj, rec)

    def register(self, plugin: object, name: str | None = None, distribution: str = "", version: str = "") -> PluginRecord:
        """Register a plugin object in code (tests, notebooks, embedding applications)."""
        with self._lock:
            self.load()
            rec = PluginRecord(name or getattr(plugin, "__name__", type(plugin).__name__), distribution, version)
            self._register(plugin, rec)
            return rec

    def unregister(self, name: str) -> None:
        with self._lock:
            rec = self.records.pop(name, None)
            if rec is None:
                return
            for b in rec.backends:
                self._backends.pop(b.name, None)
            if rec.plugin is not None and self.pm.is_registered(rec.plugin):
                self.pm.unregister(rec.plugin)

    def _fail(self, rec: PluginRecord, status: str, message: str, exc: BaseException | None = None) -> None:
        rec.status, rec.error = status, message
        self.records[rec.name] = rec
        if self.strict:
            raise PluginError(f"plugin {rec.name!r} is {status}: {message}") from exc

    def _register(self, obj: object, rec: PluginRecord) -> None:
        try:
            self.pm.register(obj, name=rec.name)
        except Exception as e:  # noqa: BLE001 - pluggy validation errors name the hook
            self._fail(rec, "broken", f"{type(e).__name__}: {e}", e)
            return
        rec.plugin = obj
        unknown = [name for name in dir(obj) if name.startswith("tilecore_") and callable(getattr(obj, name))
                   and getattr(getattr(self.pm.hook, name, None), "spec", None) is None]
        if unknown:
            self.pm.unregister(obj)
            self._fail(rec, "broken", f"implements unknown hook(s) {', '.join(unknown)}; known hooks: "
                       + ", ".join(n for n in dir(hookspecs) if n.startswith("tilecore_")))
            return
        backends: list = []
        for impl in self.pm.hook.tilecore_backends.get_hookimpls():
            if impl.plugin is not obj:
                continue
            try:
                backends.extend(self._call(impl) or [])
            except Exception as e:  # noqa: BLE001
                self.pm.unregister(obj)
                tb = traceback.format_exception_only(type(e), e)[-1].strip()
                self._fail(rec, "broken", f"tilecore_backends() raised {tb}", e)
                return
        for b in backends:
            if not isinstance(b, Backend):
                self.pm.unregister(obj)
                self._fail(rec, "broken", f"tilecore_backends() returned {b!r}, not a tilecore.plugin.Backend")
                return
            ok, why = _api_fits(getattr(b, "plugin_api", "?"))
            if not ok:
                self.pm.unregister(obj)
                self._fail(rec, "incompatible", f"backend {b.name!r} {why}")
                return
            if b.name in self._backends:
                self.pm.unregister(obj)
                self._fail(rec, "broken", f"backend name {b.name!r} is already provided by another plugin")
                return
        rec.backends = backends  # (a record without a version takes its first backend's, on first use)
        if not LAZY_RECORDS:
            _ = rec.version
        for b in backends:
            self._backends[b.name] = b
        self.records[rec.name] = rec

    # -- queries ------------------------------------------------------------------------------------
    def backends(self) -> dict:
        self.load()
        return dict(self._backends)

    def plugins(self) -> list:
        self.load()
        return list(self.records.values())

    def resolve(self, spec) -> tuple:
        """Return ``(backend, Target)`` for a target string, or raise TargetError naming the choices."""
        self.load()
        if isinstance(spec, Target):
            b = self._backends.get(spec.backend)
            if b is None:
                raise TargetError(f"target {spec} belongs to backend {spec.backend!r}, which is not installed")
            return b, spec
        text = str(spec).strip()
        for b in self._backends.values():
            t = b.parse_target(text)
            if t is not None:
                return b, t
        kind = text.split(":")[0]
        for rec in self.records.values():
            if rec.status != "ok" and (rec.name == kind or rec.name.endswith(kind)):
                raise PluginError(f"target {text!r} belongs to plugin {rec.name!r}, which is {rec.status_text}")
        known = sorted(t for b in self._backends.values() for t in b.targets())
        raise TargetError(f"no installed backend accepts target {text!r}; available: {', '.join(known) or 'none'} "
                          "(install a backend such as tilecore-<vendor>, or see `tilecore targets list`)")

    def extra_passes(self, target: Target) -> list:
        out: list = []
        for impl in self.pm.hook.tilecore_pipeline_passes.get_hookimpls():
            out.extend(self._call(impl, target=target) or [])
        return out

    def extra_capability_paths(self) -> list:
        out: list = []
        for impl in self.pm.hook.tilecore_capability_paths.get_hookimpls():
            out.extend(self._call(impl) or [])
        return out


_registry: Registry | None = None
_registry_lock = threading.Lock()


def get_registry() -> Registry:
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = Registry()
        return _registry


def reset_registry(**kwargs) -> Registry:
    """Forget loaded plugins and start over (tests; after changing TILECORE_* variables)."""
    global _registry
    with _registry_lock:
        _registry = Registry(**kwargs)
        from . import capabilities as _caps

        _caps.clear_cache()
        return _registry
