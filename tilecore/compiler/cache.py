"""The on-disk kernel cache.

An entry is a directory ``<root>/kernels/<key[:2]>/<key>/`` holding ``kernel.json`` (signature,
source, metadata) and ``binary.bin``; ``kernel.json`` records the binary's sha256. Writers build an
entry in a private temporary directory and publish it with one atomic ``rename``, so concurrent
writers (pytest -n) never produce a torn entry: the first rename wins and the others discard their
copy. A reader that finds an entry whose checksum or JSON does not verify deletes it and rebuilds.

The root is ``$TILECORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tilecore``, else ``~/.cache/tilecore``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

FORMAT = 1


def cache_root() -> Path:
    env = os.environ.get("TILECORE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tilecore"


def make_key(parts: dict) -> str:
    blob = json.dumps({"format": FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _entry(key: str) -> Path:
    return cache_root() / "kernels" / key[:2] / key


def load(key: str):
    """``(meta, binary)`` for a verified entry, or None (a corrupt entry is removed)."""
    d = _entry(key)
    meta_path = d / "kernel.json"
    if not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        binary = (d / "binary.bin").read_bytes()
        if meta.get("format") != FORMAT or hashlib.sha256(binary).hexdigest() != meta.get("binary_sha256"):
            raise ValueError("checksum mismatch")
        return meta, binary
    except (OSError, ValueError, json.JSONDecodeError):
        _discard(d)
        return None


def store(key: str, meta: dict, binary: bytes) -> None:
    d = _entry(key)
    if d.exists():
        return
    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=d.parent))
    try:
        (tmp / "binary.bin").write_bytes(binary)
        meta = {**meta, "format": FORMAT, "binary_sha256": hashlib.sha256(binary).hexdigest()}
        (tmp / "kernel.json").write_text(json.dumps(meta, sort_keys=True, default=str))
        os.rename(tmp, d)
    except OSError:
        pass  # another writer published this entry first, or the cache is read-only: both are fine
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _discard(d: Path) -> None:
    """Move a corrupt entry aside atomically, then delete it (never half-delete under a reader)."""
    grave = d.parent / f".dead-{d.name}-{os.getpid()}"
    try:
        os.rename(d, grave)
    except OSError:
        return
    shutil.rmtree(grave, ignore_errors=True)


def clear() -> int:
    """Delete every cached kernel; returns how many entries were removed."""
    root = cache_root() / "kernels"
    n = sum(1 for _ in root.glob("*/*")) if root.exists() else 0
    shutil.rmtree(root, ignore_errors=True)
    return n


_disabled = False


def disable_cache() -> None:
    """Neither read nor write the kernel cache in this process (``tilecore.disable_cache()``)."""
    global _disabled
    _disabled = True


def enable_cache() -> None:
    global _disabled
    _disabled = False


def enabled() -> bool:
    return not _disabled
