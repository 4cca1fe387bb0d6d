"""Answers remembered by the identity of the expressions they are about (D65).

An expression is never changed after it is built, so a pass that asks the same question of the same object again
(a bound scalar's value inlined into many indices, the prover's bounds of a fragment's thread part) can take the
first answer. Each entry keeps the objects it is about alive, so their ids are not reused while it is remembered,
and a hit is checked against them (``is``), never only by id. :func:`forget_all` drops every memo: the compiler calls
it around each kernel's lowering (``tilecore.ir.simplify.forget``)."""

from __future__ import annotations

import weakref

MISS = object()
_ALL: "weakref.WeakSet[IdentityMemo]" = weakref.WeakSet()


class IdentityMemo:
    """A bounded dict from a key (``id(obj)`` or a tuple starting with it) to an answer, valid while the objects it
    was asked about are the same ones (``get(key, *owners)`` returns :data:`MISS` otherwise)."""

    __slots__ = ("_entries", "limit", "__weakref__")

    def __init__(self, limit: int = 1 << 15):
        self._entries: dict = {}
        self.limit = limit
        _ALL.add(self)

    def get(self, key, *owners):
        hit = self._entries.get(key)
        if hit is None or len(hit[0]) != len(owners) or any(a is not b for a, b in zip(hit[0], owners)):
            return MISS
        return hit[1]

    def put(self, key, answer, *owners):
        if len(self._entries) >= self.limit:
            self._entries.clear()  # bounded: a long-lived process never holds more than ``limit`` expressions
        self._entries[key] = (owners, answer)
        return answer

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def forget_all() -> None:
    """Drop every identity memo's answers."""
    for memo in list(_ALL):
        memo.clear()
