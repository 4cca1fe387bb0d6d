"""``@tilecore.autotune``: pick the fastest config of a ``@tilecore.jit`` factory, per shapes and target.

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

from ..errors import CompileError, TilecoreError


class AutoTuner:
    def __init__(self, jit_fn, configs, warmup: int = 25, rep: int = 100, timeout: float | None = None,
                 max_workers: int | None = None, verbose: bool = True):
        from ..compiler import _JitFunction

        if not isinstance(jit_fn, _JitFunction):
            raise CompileError("@tilecore.autotune must be applied on top of @tilecore.jit")
        self.jit_fn = jit_fn
        self.configs = configs
        self.warmup, self.rep = warmup, rep
        self.max_workers = max_workers or max(1, min(8, os.cpu_count() or 1))
        self.verbose = verbose
        self._best: dict = {}
        functools.update_wrapper(self, jit_fn.factory)

    def _configs(self, args, kwargs) -> list:
        cfgs = self.configs(*args, **kwargs) if callable(self.configs) else self.configs
        cfgs = [dict(c) for c in cfgs]
        if not cfgs:
            raise CompileError("@tilecore.autotune got an empty config list")
        params = inspect.signature(self.jit_fn.factory).parameters
        for c in cfgs:
            unknown = [k for k in c if k not in params]
            if unknown:
                raise CompileError(f"autotune config {c} names {unknown}, which {self.jit_fn.factory.__name__} does "
                                   f"not take (its parameters: {', '.join(params)})")
        return cfgs

    def _key(self, args, kwargs, cfgs) -> str:
        from ..compiler import resolve_auto

        f = self.jit_fn.factory
        blob = json.dumps({"fn": f"{f.__module__}.{f.__qualname__}", "args": repr(args), "kwargs": repr(sorted(kwargs.items())),
                           "configs": repr(cfgs), "target": resolve_auto(self.jit_fn.target),
                           "out_idx": repr(self.jit_fn.out_idx)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def _disk(self, key: str):
        """The record's path, or None when the cache directory must not be used (see compiler.cache)."""
        from ..compiler.cache import usable_root

        root = usable_root()
        return None if root is None else root / "autotune" / f"{key}.json"

    def __call__(self, *args, **kwargs):
        cfgs = self._configs(args, kwargs)
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
                ms = k.get_profiler().do_bench(warmup=self.warmup, rep=self.rep)
            except TilecoreError as e:
                errors.append((cfg, e))
                continue
            results.append((ms, cfg, k))
            if self.verbose:
                print(f"[tilecore autotune] {self.jit_fn.factory.__name__} {cfg}: {ms:.4f} ms", file=sys.stderr)
        if not results:
            detail = "; ".join(f"{c}: {e}" for c, e in errors[:3])
            raise CompileError(f"autotune: no config of {self.jit_fn.factory.__name__} compiled and ran ({detail})")
        ms, cfg, kernel = min(results, key=lambda r: r[0])
        kernel.config, kernel.latency = cfg, ms
        return kernel


def autotune(configs=None, warmup: int = 25, rep: int = 100, timeout=None, **kwargs):
    """Decorate a ``@tilecore.jit`` factory; ``configs`` is a list of keyword dicts or a function
    of the factory's arguments returning one."""
    if configs is None:
        raise CompileError("@tilecore.autotune needs configs=[{...}, ...]")

    def wrap(jit_fn):
        return AutoTuner(jit_fn, configs, warmup=warmup, rep=rep, timeout=timeout,
                         **{k: v for k, v in kwargs.items() if k in ("max_workers", "verbose")})

    return wrap
