"""The pass pipeline: one ordered list of named slots that backends fill.

Slots, in order (a kernel moves from tile ops over regions to scalar loops ready for codegen):

``legalize``        check the kernel against the target's capabilities and the tile ops' contracts
``layout``          decide layouts (fragments, swizzles); collect layout and scheduling hints
``tile-lowering``   replace each tile op with the implementation the target's intrinsic table picks
``pipelining``      software-pipeline ``T.Pipelined`` loops (a backend's job; the core serializes)
``memory``          plan on-chip memory and check it against the target's limits; guard memory accesses
                    not proven in bounds (all of them in checked mode)
``before-codegen``  final clean-up and verification

A backend adds passes to a slot, before or after the core's own; it never copies the list.
``TILECORE_DUMP_IR=<dir>`` writes the IR after every pass.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

SLOTS = ("legalize", "layout", "tile-lowering", "pipelining", "memory", "before-codegen")


class PassConfigKey:
    """Keys accepted in ``pass_configs``. ``tl.*`` keys from TileLang are accepted and ignored."""

    FAST_MATH = "tilecore.fast_math"           #: bool: allow contraction and approximate math (default off)
    DISABLE_CACHE = "tilecore.disable_cache"   #: bool: neither read nor write the kernel cache
    DEBUG = "tilecore.debug"                   #: bool: compile device code with debug info
    EXTRA_FLAGS = "tilecore.extra_flags"       #: list[str]: extra flags for the backend's compiler
    REQUIRE = "tilecore.require"               #: list[str]: capability needs the target must satisfy
    CHECKED = "tilecore.checked"               #: bool: check every memory access at run time (also TILECORE_CHECKED=1)

    @classmethod
    def all(cls) -> dict:
        return {k: v for k, v in vars(cls).items() if k.isupper()}


@dataclass(frozen=True)
class Pass:
    """A named IR transformation ``fn(func, ctx) -> func``; ``name`` appears in IR dumps."""

    name: str
    fn: Callable
    doc: str = ""

    def __call__(self, func, ctx):
        return self.fn(func, ctx)


def tile_pass(name: str) -> Callable:
    """Decorator: ``@tile_pass("vendor.do_thing")`` turns ``fn(func, ctx)`` into a :class:`Pass`."""

    def wrap(fn):
        return Pass(name, fn, (fn.__doc__ or "").strip())

    return wrap


@dataclass
class PassContext:
    """What a pass may consult: the target, its capabilities, options, and the intrinsic table."""

    target: Any
    backend: Any
    capabilities: Any
    config: dict = field(default_factory=dict)
    intrinsics: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def option(self, key: str, default=None):
        return self.config.get(key, default)


class Pipeline:
    def __init__(self, core: dict | None = None):
        self.slots: dict = {s: {"before": [], "core": list((core or {}).get(s, [])), "after": []} for s in SLOTS}

    def add(self, slot: str, p: Pass, position: str = "before") -> None:
        if slot not in self.slots:
            raise ValueError(f"unknown pipeline slot {slot!r}; slots: {', '.join(SLOTS)}")
        if position not in ("before", "after"):
            raise ValueError(f"pass position must be 'before' or 'after' the core passes, got {position!r}")
        if not isinstance(p, Pass):
            p = Pass(getattr(p, "name", getattr(p, "__name__", "plugin_pass")), p)
        self.slots[slot][position].append(p)

    def passes(self) -> list:
        """``(slot, Pass)`` in execution order."""
        out = []
        for s in SLOTS:
            parts = self.slots[s]
            out += [(s, p) for p in parts["before"] + parts["core"] + parts["after"]]
        return out

    def describe(self) -> str:
        return "\n".join(f"{slot:15s} {p.name}" for slot, p in self.passes())

    def run(self, func, ctx: PassContext, dump_dir: str | None = None):
        dump = Path(dump_dir) / _safe(func.name) if dump_dir else None
        if dump:
            dump.mkdir(parents=True, exist_ok=True)
            (dump / "00_input.ir").write_text(func.script())
        for n, (slot, p) in enumerate(self.passes(), start=1):
            func = p(func, ctx)
            if dump:
                (dump / f"{n:02d}_{slot}.{_safe(p.name)}.ir").write_text(func.script())
        return func


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def dump_dir_from_env() -> str | None:
    return os.environ.get("TILECORE_DUMP_IR") or None


def core_pipeline() -> Pipeline:
    from . import core, guard, lower_tile

    return Pipeline({
        "legalize": [core.check_structure, core.check_capabilities],
        "layout": [core.collect_hints],
        "tile-lowering": [lower_tile.lower_tile_ops],
        "pipelining": [core.serialize_pipelined],
        "memory": [core.plan_memory, guard.guard_accesses],
        "before-codegen": [core.verify_lowered],
    })
