"""Finding a backend's external programs (compilers, disassemblers): the lookup every plugin that shells
out to a toolchain needs, in one place."""
from __future__ import annotations

import os
import shutil


def find_program(candidates, env: str | None = None) -> str | None:
    """The program a backend should run: ``$env`` when that variable is set (a name looked up on PATH, or a
    path taken as given), else the first of ``candidates`` (names on PATH, or absolute paths) that exists;
    None when none does."""
    chosen = os.environ.get(env) if env else None
    if chosen:
        return shutil.which(chosen) or chosen
    for c in candidates:
        path = shutil.which(c) or (c if os.path.isabs(c) and os.path.exists(c) else None)
        if path:
            return path
    return None


__all__ = ["find_program"]
