"""The on-disk kernel cache.

An entry is a directory ``<root>/kernels/<key[:2]>/<key>/`` holding ``kernel.json`` (signature,
source, metadata) and ``binary.bin``; ``kernel.json`` records the binary's sha256. Writers build an
entry in a private temporary directory and publish it with one atomic ``rename``, so concurrent
writers (pytest -n) never produce a torn entry: the first rename wins and the others discard their
copy. A reader that finds an entry whose checksum or JSON does not verify deletes it and rebuilds.

The root is ``$TILECORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tilecore``, else ``~/.cache/tilecore``.
Entries are native code that runs in the process that loads them, so the root is created private
(0700) and a root that is not a directory, belongs to another user or that others can write is not
used: :func:`usable_root` warns once on stderr and the process compiles without a cache.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from ..errors import CacheError

FORMAT = 1
_warned: set = set()


def cache_root() -> Path:
    env = os.environ.get("TILECORE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tilecore"


def _described(root: Path) -> str:
    return f"TILECORE_CACHE_DIR={root}" if os.environ.get("TILECORE_CACHE_DIR") else f"the cache directory {root}"


def check_root(create: bool = True) -> tuple[Path, str]:
    """``(root, problem)``: problem is "" when the root is safe to use (creating it 0700 if missing and
    ``create``), else one sentence naming the problem and the fix."""
    root = cache_root()
    try:
        if create and not root.exists() and not root.is_symlink():
            root.parent.mkdir(parents=True, exist_ok=True)
            try:
                root.mkdir(mode=0o700)
                os.chmod(root, 0o700)  # mkdir's mode is masked by the umask
            except FileExistsError:
                pass  # another process made it first: checked below like any existing root
        st = os.stat(root)
    except FileNotFoundError:
        return root, ""  # not created (create=False): nothing cached yet
    except OSError as e:
        return root, (f"{_described(root)} cannot be created ({e.strerror}); fix: point TILECORE_CACHE_DIR "
                      "at a directory you own")
    if not stat.S_ISDIR(st.st_mode):
        return root, f"{_described(root)} is not a directory; fix: point TILECORE_CACHE_DIR at a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return root, (f"{_described(root)} belongs to another user (uid {st.st_uid}), and cached kernels are "
                      "native code that runs in this process; fix: use a directory you own")
    if st.st_mode & 0o022:
        return root, (f"{_described(root)} can be written by other users (mode {stat.S_IMODE(st.st_mode):o}), "
                      f"and cached kernels are native code that runs in this process; fix: chmod 700 {root}")
    return root, ""


def memo_file(name: str, create: bool = False) -> Path | None:
    """``name`` in the cache root, for a small memo of this process's work that later processes may skip
    (capability documents parsed or validated), or None where the cache is off or its root must not be used
    (no warning: a memo only saves time)."""
    if not enabled():
        return None
    root, problem = check_root(create=create)
    return None if problem or not root.is_dir() else root / name


def usable_root() -> Path | None:
    """The cache root, or None (after one warning on stderr per problem) when it must not be used."""
    root, problem = check_root()
    if not problem:
        return root
    if problem not in _warned:
        _warned.add(problem)
        print(f"tilecore: warning: compiling without a kernel cache: {problem}", file=sys.stderr)
    return None


_fingerprints: dict = {}


def code_fingerprint(module: str) -> str:
    """sha256 of the files of ``module``'s top-level package (its sources, preludes, capability files), so
    that a cache entry built by other compiler code (an edit, a fix, a checkout) is never loaded for this
    code, even with the version unchanged. A module without files on disk gives ""."""
    top = module.split(".")[0]
    if top not in _fingerprints:
        mod = sys.modules.get(top)
        paths = list(getattr(mod, "__path__", []) or [])
        files = [Path(f) for d in paths for f in sorted(Path(d).rglob("*"))
                 if f.is_file() and "__pycache__" not in f.parts]
        if not paths and getattr(mod, "__file__", None):
            files = [Path(mod.__file__)]
        h = hashlib.sha256()
        for f in files:
            try:
                data = f.read_bytes()
            except OSError:
                continue
            h.update(f"{len(data)}:{f.name}:".encode() + data)
        _fingerprints[top] = h.hexdigest() if files else ""
    return _fingerprints[top]


def make_key(parts: dict) -> str:
    blob = json.dumps({"format": FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _entry(key: str) -> Path | None:
    root = usable_root()
    return None if root is None else root / "kernels" / key[:2] / key


def load(key: str):
    """``(meta, binary)`` for a verified entry, or None (a corrupt entry is removed)."""
    d = _entry(key)
    if d is None:
        return None
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
    if d is None or d.exists():
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


def clear() -> dict:
    """Delete every cached kernel, autotune result and compiled launcher build; returns how many of each
    were removed (a process that loaded a launcher keeps its mapped copy; the next one rebuilds it)."""
    root, problem = check_root(create=False)
    if problem:
        raise CacheError(problem)
    kernels, tuned, launchers = root / "kernels", root / "autotune", root / "launchers"
    counts = {"kernels": sum(1 for _ in kernels.glob("*/*")) if kernels.is_dir() else 0,
              "autotune": sum(1 for _ in tuned.glob("*.json")) if tuned.is_dir() else 0,
              "launchers": sum(1 for _ in launchers.iterdir()) if launchers.is_dir() else 0}
    for d in (kernels, tuned, launchers):
        shutil.rmtree(d, ignore_errors=True)
    return counts


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
