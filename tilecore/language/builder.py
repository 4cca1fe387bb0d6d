"""The statement builder the language functions append to while a kernel is being parsed."""
from __future__ import annotations

import threading
from collections import Counter

from ..errors import ParseError, Span
from ..ir import Stmt, seq

_state = threading.local()


class Builder:
    eager = None  #: the EagerState while an eager @tilecore.jit body is parsed (tilecore/language/eager.py)

    def __init__(self, func_name: str):
        self.func_name = func_name
        self.frames: list = [[]]
        self.span: Span | None = None
        self._names: Counter = Counter()
        self.in_kernel = False
        self.workspaces: list = []  #: the T.alloc_global buffers, in call order (hidden parameters)

    def fresh(self, name: str) -> str:
        """A name unique in this kernel: ``i``, ``i_1``, ``i_2``..."""
        n = self._names[name]
        self._names[name] += 1
        return name if n == 0 else f"{name}_{n}"

    def emit(self, stmt: Stmt) -> Stmt:
        if stmt.span is None:
            stmt.span = self.span
        self.frames[-1].append(stmt)
        return stmt

    def push(self) -> None:
        self.frames.append([])

    def pop(self) -> Stmt:
        return seq(self.frames.pop())

    def workspace_params(self, taken) -> list:
        """The T.alloc_global buffers as workspace parameters, named apart from the ``taken`` names."""
        from ..ir import Param

        out, names = [], set(taken)
        for buf in self.workspaces:
            while buf.name in names:
                buf.name = self.fresh(buf.name)
            names.add(buf.name)
            out.append(Param(buf.name, buffer=buf, workspace=True))
        return out

    def error(self, message: str, cls=ParseError):
        return cls(message, self.span)


def current(what: str = "this function") -> Builder:
    b = getattr(_state, "builder", None)
    if b is None:
        raise ParseError(f"{what} can only be used inside a @T.prim_func or @T.macro body")
    return b


def active() -> Builder | None:
    return getattr(_state, "builder", None)


class building:
    """Context manager installing a builder for the current thread (nesting restores the outer one)."""

    def __init__(self, builder: Builder):
        self.builder = builder

    def __enter__(self) -> Builder:
        self.prev = getattr(_state, "builder", None)
        _state.builder = self.builder
        return self.builder

    def __exit__(self, *exc) -> None:
        _state.builder = self.prev
