"""``@tilecore.autotune``: pick the fastest config of a ``@tilecore.jit`` factory, per shapes and target.

The module is named after TileLang's ``tilelang.autotuner``; it is not ``tilecore.autotune`` so that
importing it never shadows the ``tilecore.autotune`` decorator.

    @tilecore.autotune(configs=[{"bm": 64, "bn": 64}, {"bm": 128, "bn": 64}], warmup=5, rep=20)
    @tilecore.jit(out_idx=[-1])
    def matmul(M, N, K, bm=64, bn=64): ...

    kernel = matmul(1024, 1024, 1024)   # compiles every config in parallel, times each, returns the best

The winner is remembered in memory and on disk (``<cache>/autotune/<key>.json``), keyed by the factory,
its arguments, the config list and the target, so a later process compiles only the winner;
``tilecore cache clear`` forgets the winners with the kernels.
"""
from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import inspect
import json
import os
import sys

import threading

from ..errors import CompileError, TilecoreError

_inputs = threading.local()


class set_autotune_inputs:  # noqa: N801 - TileLang's name
    """``with set_autotune_inputs(a, b): kernel = tuned(...)``: time every config on these tensors
    instead of random ones (TileLang's ``tilelang.autotuner.set_autotune_inputs``)."""

    def __init__(self, *tensors):
        self.tensors = list(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else list(tensors)

    def __enter__(self):
        self.prev = getattr(_inputs, "tensors", None)
        _inputs.tensors = self.tensors
        return self

    def __exit__(self, *exc):
        _inputs.tensors = self.prev


def get_autotune_inputs():
    return getattr(_inputs, "tensors", None)


def _describe(v):
    """What of an argument keys a tuning result: a tensor's shape and dtype, not its values."""
    from ..compiler.eager import _is_tensor, _shape

    return ("tensor", _shape(v), str(v.dtype)) if _is_tensor(v) else v


class AutoTuner:
    def __init__(self, jit_fn, configs, warmup: int = 25, rep: int = 100, timeout: float | None = None,
                 max_workers: int | None = None, verbose: bool = True):
        from ..compiler import _JitFunction
        from ..compiler.eager import EagerJit

        if not isinstance(jit_fn, (_JitFunction, EagerJit)):
            if callable(jit_fn):  # AutoTuner.from_kernel(factory, configs): compiled with set_compile_args
                jit_fn = _JitFunction(jit_fn)
            else:
                raise CompileError("@tilecore.autotune must be applied on top of @tilecore.jit")
        self.eager = isinstance(jit_fn, EagerJit)
        self.jit_fn = jit_fn
        self.configs = configs
        self.warmup, self.rep = warmup, rep
        self.max_workers = max_workers or max(1, min(8, os.cpu_count() or 1))
        self.verbose = verbose
        self._best: dict = {}
        functools.update_wrapper(self, self.factory)

    @property
    def factory(self):
        return self.jit_fn.fn if self.eager else self.jit_fn.factory

    # -- TileLang's builder-style API: AutoTuner.from_kernel(f, configs).set_compile_args(...).run() --
    @classmethod
    def from_kernel(cls, kernel, configs):
        return cls(kernel, configs)

    def set_compile_args(self, out_idx=None, target="auto", execution_backend=None, target_host=None, verbose=False,
                         pass_configs=None):
        if not self.eager:
            self.jit_fn.out_idx, self.jit_fn.target, self.jit_fn.pass_configs = out_idx, target, pass_configs
        return self

    def set_profile_args(self, warmup: int = 25, rep: int = 100, timeout=None, supply_type=None, ref_prog=None,
                         supply_prog=None, rtol=1e-2, atol=1e-2, max_mismatched_ratio=0.01, skip_check=False,
                         manual_check_prog=None, cache_input_tensors=False, **_ignored):
        self.warmup, self.rep = warmup, rep
        return self

    def run(self, warmup=None, rep=None, timeout=None):
        """Tune the factory's configs with no other arguments; the best kernel is ``result.kernel``."""
        if warmup is not None:
            self.warmup = warmup
        if rep is not None:
            self.rep = rep
        kernel = self()
        return AutotuneResult(kernel.latency, kernel.config, kernel)

    def _configs(self, args, kwargs) -> list:
        cfgs = self.configs(*args, **kwargs) if callable(self.configs) else self.configs
        cfgs = [dict(c) for c in cfgs]
        if not cfgs:
            raise CompileError("@tilecore.autotune got an empty config list")
        params = inspect.signature(self.factory).parameters
        for c in cfgs:
            unknown = [k for k in c if k not in params]
            if unknown:
                raise CompileError(f"autotune config {c} names {unknown}, which {self.factory.__name__} does "
                                   f"not take (its parameters: {', '.join(params)})")
        return cfgs

    def _without_given(self, args, kwargs, cfgs):
        """The configs less the arguments the caller passed (a config never overrides those); an empty
        list when the caller passed every tunable argument (then there is nothing to tune)."""
        try:
            given = set(inspect.signature(self.factory).bind_partial(*args, **kwargs).arguments)
        except TypeError as e:
            raise CompileError(f"{self.factory.__name__}: {e}") from None
        out = []
        for c in cfgs:
            c = {k: v for k, v in c.items() if k not in given}
            if c and c not in out:
                out.append(c)
        return out

    def _key(self, args, kwargs, cfgs) -> str:
        from ..compiler import resolve_auto

        f = self.factory
        blob = json.dumps({"fn": f"{f.__module__}.{f.__qualname__}", "args": repr([_describe(a) for a in args]),
                           "kwargs": repr(sorted((k, _describe(v)) for k, v in kwargs.items())),
                           "configs": repr(cfgs), "target": resolve_auto(self.jit_fn.target),
                           "out_idx": repr(getattr(self.jit_fn, "out_idx", None))}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def _disk(self, key: str):
        """The record's path, or None when the cache directory must not be used (see compiler.cache)."""
        from ..compiler.cache import usable_root

        root = usable_root()
        return None if root is None else root / "autotune" / f"{key}.json"

    def __call__(self, *args, **kwargs):
        kernel = self._kernel(args, kwargs)
        if not self.eager:
            return kernel
        from ..compiler.eager import _is_tensor

        tensors = [v for v in inspect.signature(self.factory).bind_partial(*args, **kwargs).arguments.values()
                   if _is_tensor(v)]
        return kernel(*tensors)

    def compile(self, *args, **kwargs):
        """The tuned kernel without running it (an eager kernel's ``.compile``)."""
        return self._kernel(args, kwargs)

    def _kernel(self, args, kwargs):
        cfgs = self._without_given(args, kwargs, self._configs(args, kwargs))
        if not cfgs:  # every tunable argument given: nothing to tune
            return self.jit_fn.compile(*args, **kwargs)
        key = self._key(args, kwargs, cfgs)
        if key in self._best:
            return self._best[key]
        path = self._disk(key)
        if path is not None and path.exists():
            try:
                rec = json.loads(path.read_text())
                kernel = self.jit_fn.compile(*args, **{**kwargs, **rec["config"]})
                kernel.config, kernel.latency = rec["config"], rec["latency"]
                self._best[key] = kernel
                return kernel
            except (OSError, ValueError, KeyError, TilecoreError):
                pass  # a stale or corrupt record: tune again
        kernel = self._tune(args, kwargs, cfgs)
        self._best[key] = kernel
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"config": kernel.config, "latency": kernel.latency}))
                os.replace(tmp, path)
            except OSError:
                pass  # a read-only cache: the winner is kept in memory only
        return kernel

    def _tune(self, args, kwargs, cfgs):
        def build(cfg):
            return self.jit_fn.compile(*args, **{**kwargs, **cfg})

        results = []
        errors = []
        kernels = self._compile_in_processes(args, kwargs, cfgs, errors)
        if kernels is None:  # threads: the front end holds the GIL, the vendor compilers may not
            with concurrent.futures.ThreadPoolExecutor(self.max_workers) as pool:
                futures = {pool.submit(build, c): i for i, c in enumerate(cfgs)}
                kernels = [None] * len(cfgs)
                for fut in concurrent.futures.as_completed(futures):
                    i = futures[fut]
                    try:
                        kernels[i] = fut.result()
                    except TilecoreError as e:
                        errors.append((cfgs[i], e))
        for cfg, k in zip(cfgs, kernels):
            if k is None:
                continue
            try:
                ms = k.get_profiler().do_bench(warmup=self.warmup, rep=self.rep,
                                               input_tensors=self._bench_inputs(k, args, kwargs))
            except TilecoreError as e:
                errors.append((cfg, e))
                continue
            results.append((ms, cfg, k))
            if self.verbose:
                print(f"[tilecore autotune] {self.factory.__name__} {cfg}: {ms:.4f} ms", file=sys.stderr)
        if not results:
            detail = "; ".join(f"{c}: {e}" for c, e in errors[:3])
            raise CompileError(f"autotune: no config of {self.factory.__name__} compiled and ran ({detail})")
        ms, cfg, kernel = min(results, key=lambda r: r[0])
        kernel.config, kernel.latency = cfg, ms
        return kernel

    def _compile_in_processes(self, args, kwargs, cfgs, errors):
        """Compile every config in forked worker processes (the whole pipeline, front end included, runs in
        parallel; threads share one GIL); None where that does not apply (one config, one worker, an eager
        kernel, no ``fork`` on this platform, or ``TILECORE_AUTOTUNE_PROCESSES=0``), so threads compile.

        The target is resolved here, before forking, so that no worker asks a device anything; workers
        only lower and build, and send back the kernel's metadata and binary (and write the disk cache)."""
        import multiprocessing

        workers = min(self.max_workers, len(cfgs))
        if (self.eager or workers < 2 or os.environ.get("TILECORE_AUTOTUNE_PROCESSES", "1") == "0"
                or "fork" not in multiprocessing.get_all_start_methods()):
            return None
        from ..compiler import JITKernel, resolve_auto
        from ..plugin import get_registry

        jit = self.jit_fn
        backend, target = get_registry().resolve(resolve_auto(jit.target))
        global _FORK_JOB
        _FORK_JOB = (jit.factory, args, kwargs, cfgs, target, jit.out_idx, jit.pass_configs)
        kernels = [None] * len(cfgs)
        try:
            import warnings

            with warnings.catch_warnings():  # fork() in a process with threads (torch's): workers only compile
                warnings.simplefilter("ignore", DeprecationWarning)
                ctx = multiprocessing.get_context("fork")
                with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
                    outcomes = list(pool.map(_fork_compile, range(len(cfgs))))
        except (OSError, concurrent.futures.process.BrokenProcessPool):
            return None  # no processes here (a sandbox, a crashed worker): compile with threads instead
        finally:
            _FORK_JOB = None
        for i, (ok, a, b) in enumerate(outcomes):
            if ok:
                kernels[i] = JITKernel(a, b, backend, target)
                jit._kernels[jit._key(args, {**kwargs, **cfgs[i]})] = kernels[i]
            else:
                errors.append((cfgs[i], _error(a, b)))
        return kernels

    def _bench_inputs(self, kernel, args, kwargs):
        """set_autotune_inputs' tensors, else an eager kernel's own tensor arguments, else None (random)."""
        given = get_autotune_inputs()
        if given is not None:
            return given
        if self.eager:
            from ..compiler.eager import _is_tensor

            return [v for v in inspect.signature(self.factory).bind_partial(*args, **kwargs).arguments.values()
                    if _is_tensor(v)]
        return None


class AutotuneResult:
    """What ``AutoTuner.run()`` returns: ``latency`` (ms), ``config`` and the best ``kernel``."""

    def __init__(self, latency, config, kernel):
        self.latency, self.config, self.kernel = latency, config, kernel


#: what the forked compile workers run: (factory, args, kwargs, configs, target, out_idx, pass_configs)
_FORK_JOB = None


def _fork_compile(i: int):
    """One config's compile in a forked worker: ``(True, meta, binary)`` or ``(False, error class, message)``."""
    from ..compiler import compile as compile_func
    from ..ir import PrimFunc

    factory, args, kwargs, cfgs, target, out_idx, pass_configs = _FORK_JOB
    try:
        func = factory(*args, **{**kwargs, **cfgs[i]})
        if not isinstance(func, PrimFunc):
            raise CompileError(f"@tilecore.jit factory {factory.__name__} must return a @T.prim_func, got "
                               f"{type(func).__name__}")
        k = compile_func(func, target=target, out_idx=out_idx, pass_configs=pass_configs)
        return True, {key: v for key, v in k.meta.items()}, k.binary
    except TilecoreError as e:
        return False, type(e).__name__, str(e)


def _error(cls_name: str, message: str) -> TilecoreError:
    """A worker's error, as the class it raised where that class takes a message alone."""
    from .. import errors as errs

    cls = getattr(errs, cls_name, None)
    try:
        return cls(message) if isinstance(cls, type) and issubclass(cls, TilecoreError) else CompileError(message)
    except TypeError:
        return CompileError(message)


def autotune(configs=None, warmup: int = 25, rep: int = 100, timeout=None, **kwargs):
    """Decorate a ``@tilecore.jit`` factory; ``configs`` is a list of keyword dicts or a function
    of the factory's arguments returning one."""
    if configs is None:
        raise CompileError("@tilecore.autotune needs configs=[{...}, ...]")

    def wrap(jit_fn):
        return AutoTuner(jit_fn, configs, warmup=warmup, rep=rep, timeout=timeout,
                         **{k: v for k, v in kwargs.items() if k in ("max_workers", "verbose")})

    return wrap


def __getattr__(name):
    from ..errors import not_provided

    raise not_provided("tilecore.autotuner", name)
