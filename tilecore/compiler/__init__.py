"""``tilecore.compile`` and ``@tilecore.jit``."""
from __future__ import annotations

import functools
import inspect
import os
import threading
import time
import warnings
from pathlib import Path

from .._version import __version__
from ..errors import CompileError, PerformanceWarning, TargetError
from ..plugin import PLUGIN_API, get_registry
from ..plugin.capabilities import profile_with
from . import cache
from .kernel import JITKernel, load_kernel

__all__ = ["compile", "jit", "lower", "JITKernel", "load_kernel"]


def _normalize_configs(pass_configs: dict | None) -> dict:
    from ..passes import TILELANG_EQUIVALENTS, PassConfigKey

    known = set(PassConfigKey.all().values())
    out = {}
    given = dict(pass_configs or {})
    env = os.environ.get("TILECORE_PASS_CONFIGS", "")
    if env:  # defaults for every compile of the process (a CI run of the whole suite under one option)
        import json

        try:
            defaults = json.loads(env)
        except ValueError as exc:
            raise CompileError(f"TILECORE_PASS_CONFIGS is not a JSON object ({exc}); e.g. "
                               "TILECORE_PASS_CONFIGS='{\"tilecore.fast_math\": true}'") from None
        if not isinstance(defaults, dict):
            raise CompileError(f"TILECORE_PASS_CONFIGS must be a JSON object of pass configs, not {env!r}")
        given = {**defaults, **given}
    for k, v in given.items():
        k = str(k)
        if k in TILELANG_EQUIVALENTS:  # a TileLang key with a tilecore meaning
            k = TILELANG_EQUIVALENTS[k]
            v = [v] if k == PassConfigKey.EXTRA_FLAGS and isinstance(v, str) else v
        elif k.startswith(("tl.", "tir.", "tirx.")):  # other TileLang keys: accepted, change nothing
            continue
        if k not in known and k.count(".") < 2:  # tilecore.<backend>.<name> keys belong to backends
            raise CompileError(f"unknown pass config {k!r}; known: {', '.join(sorted(known))} (backend-specific keys "
                               "are spelled tilecore.<backend>.<name>)")
        out[k] = v
    if "tilecore.checked" not in out and os.environ.get("TILECORE_CHECKED", "") not in ("", "0"):
        out["tilecore.checked"] = True  # in the options, so in the cache key
    return out


def _signature(func, out_idx) -> dict:
    from ..codegen import abi_of
    from ..ir import const_value

    abi = abi_of(func)
    params = []
    for p in func.params:
        if p.buffer is not None:
            shape = []
            for s in p.buffer.shape:
                v = const_value(s)
                if v is None:
                    from ..ir import Var

                    if not isinstance(s, Var):
                        what = f"the T.alloc_global workspace {p.name}" if p.workspace else f"parameter {p.name}"
                        raise CompileError(f"{what}: dimension {s!r} must be a number or a plain "
                                           "symbol (T.dynamic)", func.span)
                    v = s.name
                shape.append(v)
            params.append({"name": p.name, "kind": "buffer", "dtype": str(p.buffer.dtype), "shape": shape,
                           **({"workspace": True} if p.workspace else {})})
        else:
            params.append({"name": p.name, "kind": "scalar", "dtype": str(p.var.dtype)})
    n = sum(1 for p in params if not p.get("workspace"))  # out_idx counts the declared parameters only
    idx = [] if out_idx is None else ([out_idx] if isinstance(out_idx, int) else list(out_idx))
    norm = []
    for i in idx:
        j = i + n if i < 0 else i
        if not 0 <= j < n or params[j]["kind"] != "buffer":
            raise CompileError(f"out_idx {i} does not name a tensor parameter of {func.name} "
                               f"({n} parameters: {', '.join(p['name'] for p in params[:n])})", func.span)
        norm.append(j)
    return {"params": params, "out_idx": sorted(set(norm)),
            "ints": [v.name for v in abi.ints], "floats": [v.name for v in abi.floats]}


def resolve_auto(target) -> str:
    if target not in (None, "auto"):
        return target
    env = os.environ.get("TILECORE_TARGET")
    if env:
        return env
    for name, b in sorted(get_registry().backends().items()):
        if name != "cpu" and b.probe().status == "ok":
            return b.targets()[0]
    return "cpu"


def lower(func, target="auto", pass_configs=None):
    """Run the pass pipeline and codegen (no device compiler); returns ``(backend, target, lowered_func,
    Source, options)``, ``options`` the normalized pass configs."""
    return _lower(func, target, pass_configs, {})


def _lower(func, target, pass_configs, times: dict):
    """:func:`lower`, adding the seconds of its passes and of codegen to ``times``."""
    from ..ir.simplify import forget
    from ..layout import units_for
    from ..passes import PassContext, core_pipeline, dump_dir_from_env

    t0 = time.perf_counter()
    backend, tgt = get_registry().resolve(resolve_auto(target))
    options = _normalize_configs(pass_configs)
    caps = profile_with(tgt, options.get("tilecore.capability_overlay"))
    pipe = core_pipeline()
    for spec in list(backend.passes(tgt)) + get_registry().extra_passes(tgt):
        pipe.add(spec.slot, spec.pass_, spec.position)
    units = units_for(backend, tgt, caps)
    families = options.get("tilecore.matrix_unit_families")
    if families is not None:  # only these families (e.g. compare one unit with another on the same target)
        known = sorted({u.family for u in units})
        if isinstance(families, str) or any(f not in known for f in families):
            raise CompileError(f"pass config tilecore.matrix_unit_families={families!r}: give a list of the target's "
                               f"matrix unit families ({', '.join(known) or 'none'})")
        units = [u for u in units if u.family in families]
    ctx = PassContext(tgt, backend, caps, options, list(backend.intrinsics(tgt)), matrix_units=units)
    dump = dump_dir_from_env()
    forget()  # the passes' remembered answers are per kernel (D65)
    try:
        lowered = pipe.run(func, ctx, dump)
        t1 = time.perf_counter()
        source = backend.emitter(tgt).emit(lowered, ctx)
    finally:
        forget()
    times["passes"], times["codegen"] = t1 - t0, time.perf_counter() - t1
    if dump:
        ext = {"c": "c"}.get(source.lang, source.lang)
        (Path(dump) / _safe(func.name) / f"final.{ext}").write_text(source.code)
    return backend, tgt, lowered, source, options


def _safe(name):
    from ..passes import _safe as s

    return s(name)


def compile(func, target="auto", out_idx=None, pass_configs=None, target_host=None,  # noqa: A001
            execution_backend=None, verbose=False) -> JITKernel:
    """Compile a ``@T.prim_func`` for ``target`` and return a callable :class:`JITKernel`.

    The result is cached on disk, keyed by the kernel's IR, the target and its capability profile, the
    options, the core, plugin and toolchain versions, and a sha256 of the core's and the backend's code
    (``cache.code_fingerprint``): compiling the same kernel again (in any process) loads it instead.
    """
    from ..ir import PrimFunc

    if not isinstance(func, PrimFunc):
        raise CompileError(f"tilecore.compile takes a @T.prim_func, got {type(func).__name__}; decorate the "
                           "kernel with @T.prim_func")
    # seconds per phase, kept as kernel.compile_times (benchmarks/cold_compile.py): "plugins" includes the
    # discovery of the installed backends on a process's first compile, "toolchain" the device compiler's
    # version (loading its library)
    times: dict = {}
    clock = time.perf_counter
    t = clock()
    backend, tgt = get_registry().resolve(resolve_auto(target))
    t, times["plugins"] = clock(), clock() - t
    options = _normalize_configs(pass_configs)
    caps = profile_with(tgt, options.get("tilecore.capability_overlay"))
    t, times["capabilities"] = clock(), clock() - t
    toolchain = backend.toolchain_version(tgt)
    t, times["toolchain"] = clock(), clock() - t
    sig = _signature(func, out_idx)
    ir_text = func.script()
    key = cache.make_key({
        "ir": ir_text, "target": str(tgt), "target_options": tgt.options, "capabilities": caps.hash(),
        "options": options, "out_idx": sig["out_idx"], "core": [__version__, cache.code_fingerprint(__name__)],
        "plugin_api": PLUGIN_API,
        "backend": [backend.name, backend.distribution, backend.version(),
                    cache.code_fingerprint(type(backend).__module__)],
        "toolchain": toolchain,
    })
    use_cache = (cache.enabled() and not options.get("tilecore.disable_cache")
                 and not os.environ.get("TILECORE_DUMP_IR"))
    if use_cache:
        hit = cache.load(key)
        if hit is not None:
            meta, binary = hit
            _warn_performance(func, meta["source"]["meta"])
            times["key"] = clock() - t
            return JITKernel({**meta, "from_cache": True, "compile_times": times}, binary, backend, tgt, func)
    t, times["key"] = clock(), clock() - t
    backend, tgt, lowered, source, options = _lower(func, tgt, pass_configs, times)
    t = clock()
    binary = backend.runtime(tgt).build(source, options)
    t, times["build"] = clock(), clock() - t
    meta = {"name": func.name, "signature": sig, "ir": ir_text, "key": key,
            "source": {"code": source.code, "lang": source.lang, "entry": source.entry, "meta": source.meta},
            "attrs": {k: v for k, v in lowered.attrs.items()}, "options": options}
    if use_cache:
        cache.store(key, meta, binary)
    _warn_performance(func, source.meta)
    times["store"] = clock() - t
    return JITKernel({**meta, "from_cache": False, "compile_times": times}, binary, backend, tgt, func)


def _warn_performance(func, source_meta: dict) -> None:
    """One :class:`PerformanceWarning` per kernel whose backend left ``performance_notes`` in the source's meta
    (plugin API 1.7: what its device compiler reported that costs speed, each note ending with the usual fix)."""
    notes = source_meta.get("performance_notes") or ()
    if notes:
        where = f"{func.span}: " if func.span else ""
        warnings.warn(PerformanceWarning(f"{where}kernel {func.name}: " + "; ".join(notes)), stacklevel=3)


class _JitFunction:
    """What ``@tilecore.jit`` returns: call it with the factory's arguments to get a compiled kernel."""

    def __init__(self, factory, out_idx=None, target="auto", pass_configs=None, **_ignored):
        self.factory = factory
        self.out_idx = out_idx
        self.target = target
        self.pass_configs = pass_configs
        self._kernels: dict = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, factory)

    def _key(self, args, kwargs):
        sig = inspect.signature(self.factory)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return tuple((k, repr(v)) for k, v in bound.arguments.items())

    def compile(self, *args, **kwargs) -> JITKernel:
        key = self._key(args, kwargs)
        with self._lock:
            k = self._kernels.get(key)
        if k is not None:
            return k
        func = self.factory(*args, **kwargs)
        from ..ir import PrimFunc

        if not isinstance(func, PrimFunc):
            raise CompileError(f"@tilecore.jit factory {self.factory.__name__} must return a @T.prim_func, got "
                               f"{type(func).__name__}")
        kernel = compile(func, target=self.target, out_idx=self.out_idx, pass_configs=self.pass_configs)
        with self._lock:
            self._kernels[key] = kernel
        return kernel

    __call__ = compile

    def get_tir(self, *args, **kwargs):
        return self.factory(*args, **kwargs)


def jit(func=None, *, out_idx=None, target="auto", pass_configs=None, **kwargs):
    """Decorate a kernel factory: ``kernel = factory(M, N, K, ...)`` compiles (once per arguments).

    A function whose own body is the kernel (``T.const``, ``T.empty``, ``with T.Kernel``) is an eager
    kernel: call it with tensors to run it (tilecore/compiler/eager.py)."""
    if func is None:
        return lambda f: jit(f, out_idx=out_idx, target=target, pass_configs=pass_configs, **kwargs)
    if isinstance(func, (str,)):
        raise TargetError("use @tilecore.jit(target=...) with keyword arguments")
    from .eager import EagerJit, is_eager

    if is_eager(func):
        if out_idx is not None:
            raise CompileError(f"@tilecore.jit(out_idx=...) is for kernel factories; the eager kernel {func.__name__} "
                               "returns the tensors it makes with T.empty instead: drop out_idx")
        return EagerJit(func, target=target, pass_configs=pass_configs)
    return _JitFunction(func, out_idx=out_idx, target=target, pass_configs=pass_configs, **kwargs)
