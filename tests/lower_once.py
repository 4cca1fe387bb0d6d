"""One lowering per distinct input in a test process (D89: CI time).

Several compile-only test files lower the same kernel with the same configs in many tests (a kept shape checked in
every parametrization, the default route read again by the next test): ``lower_once`` returns the first result for
the same inputs instead of running the passes again. The key is everything ``tilecore.compiler.lower`` reads: the
kernel's IR text, the target, the pass configs (``tilecore.disable_cache`` aside: ``lower`` never reads the cache)
and the process's ``TILECORE_*`` environment but the cache's directory (``TILECORE_PASS_CONFIGS``, through which
conftest pins the register programs, ``TILECORE_TARGET`` for "auto", ``TILECORE_CHECKED``). A file that
monkeypatches the compiler's modules must not use it: a patched pass would be served the unpatched result. Results
are shared: a caller reads them and never changes them (``fresh=True`` lowers anew).
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict

from tilecore.compiler import lower

#: the most results kept (a lowered FlashAttention form holds about 0.5 MB: 130 MB at most), least recently used out first
LIMIT = 256
_MEMO: OrderedDict = OrderedDict()
#: lowerings run and served from the memo in this process (tests/test_lower_once.py reads them)
STATS = {"lowered": 0, "served": 0}


def key_of(func, target, pass_configs) -> tuple:
    configs = {k: v for k, v in dict(pass_configs or {}).items() if k != "tilecore.disable_cache"}
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("TILECORE_") and k != "TILECORE_CACHE_DIR")
    return func.script(), str(target), json.dumps(configs, sort_keys=True, default=repr), tuple(env)


def lower_once(func, target="auto", pass_configs=None, fresh: bool = False):
    """``tilecore.compiler.lower(func, target, pass_configs)``, run once per distinct input in this process."""
    key = key_of(func, target, pass_configs)
    if not fresh and key in _MEMO:
        _MEMO.move_to_end(key)
        STATS["served"] += 1
        return _MEMO[key]
    out = lower(func, target, pass_configs)  # an error is raised each time: nothing is kept
    STATS["lowered"] += 1
    _MEMO[key] = out
    while len(_MEMO) > LIMIT:
        _MEMO.popitem(last=False)
    return out
