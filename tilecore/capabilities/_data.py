"""Plain-data helpers: YAML reading, deep merge, freezing, dotted access, flattening."""

from __future__ import annotations

import atexit
import copy
import functools
import hashlib
import json
import marshal
import os
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ._errors import CapabilityError


@functools.lru_cache(maxsize=1)
def _strict_loader():
    """SafeLoader (libyaml's parser where PyYAML was built with it, as the PyPI wheels are: about 10x the
    pure-Python one) that refuses duplicate keys instead of silently keeping the last. Built on first use:
    a process whose capability files are all in the parsed-document memo below never imports yaml."""
    import yaml

    class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        path = ""  # the file being read (libyaml's marks do not carry the name given to the Python reader)

    def _construct_mapping(loader, node, deep: bool = False):
        loader.flatten_mapping(node)
        result: dict = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in result:
                mark = key_node.start_mark
                raise CapabilityError(
                    f"duplicate key {key!r} at line {mark.line + 1}",
                    file=loader.path or str(mark.name),
                    hint="keep one of the two entries",
                )
            result[key] = loader.construct_object(value_node, deep=deep)
        return result

    _StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    return _StrictLoader


# -- documents already parsed ---------------------------------------------------------------------------
# Every compile reads every installed backend's capability files (33 today): parsing them was 37 ms of a
# 0.47 s cold compile of the Hopper GEMM (docs/decisions.md D25). A parsed document is remembered by the
# sha256 of its text in one marshal file in the user's cache directory (the kernel cache's, with its
# ownership and permission checks; marshal's format is per Python version, hence the name); a file whose
# text changed is parsed again, with its errors, and only files that parsed are remembered. A missing,
# unreadable or damaged memo is the same as an empty one.
_PARSED_NAME = f"capabilities-parsed-py{sys.version_info[0]}{sys.version_info[1]}.marshal"
_PARSED_MAX = 256  # documents; past this the memo starts over
_PARSER_TAG = b"strict-yaml-1\0"  # change it when the parsing rules change


def _parsed_path(create: bool = False):
    from ..compiler import cache  # the cache directory's rules (ownership, permissions, TILECORE_CACHE_DIR)

    return cache.memo_file(_PARSED_NAME, create)


@functools.lru_cache(maxsize=1)
def _parsed() -> dict:
    """sha256 of a file's text -> marshal bytes of its document (each caller unmarshals its own copy)."""
    path = _parsed_path()
    try:
        memo = marshal.loads(path.read_bytes()) if path is not None else {}
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    if not isinstance(memo, dict) or not all(isinstance(k, str) and isinstance(v, bytes) for k, v in memo.items()):
        return {}
    return memo


_dirty: list = []  # documents parsed since the memo was last written


def _remember_parsed(key: str, doc: Any) -> None:
    try:
        blob = marshal.dumps(doc)
    except ValueError:
        return  # a value marshal cannot write (a YAML timestamp, ...): parsed every time
    memo = _parsed()
    if len(memo) >= _PARSED_MAX:
        memo.clear()
    memo[key] = blob
    if not _dirty:
        atexit.register(flush_parsed)  # for readers other than the plugin registry, which flushes itself
    _dirty.append(key)


def flush_parsed() -> None:
    """Write the memo if this process parsed anything new (once, not once per file)."""
    if not _dirty:
        return
    _dirty.clear()
    path = _parsed_path(create=True)
    if path is None:
        return
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(marshal.dumps(_parsed()))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)  # readers see the old memo or the new one, never half of one
    except OSError:
        tmp.unlink(missing_ok=True)  # a read-only cache: parsed again next time


def read_yaml(path: str) -> Any:
    """Parse one YAML file strictly; syntax errors become CapabilityError."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise CapabilityError(f"cannot read file: {exc.strerror}", file=str(path)) from exc
    key = hashlib.sha256(_PARSER_TAG + text.encode("utf-8", "surrogatepass")).hexdigest()
    blob = _parsed().get(key)
    if blob is not None:
        try:
            return marshal.loads(blob)
        except (ValueError, EOFError, TypeError):
            pass  # a damaged entry: parse the file
    doc = _parse_yaml(text, str(path))
    _remember_parsed(key, doc)
    return doc


def _parse_yaml(text: str, path: str) -> Any:
    import yaml

    loader = _strict_loader()(text)
    loader.name = loader.path = path
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise CapabilityError(
            f"not valid YAML: {exc}", file=path, hint="correct the YAML syntax"
        ) from exc
    finally:
        loader.dispose()


def deep_merge(base: Mapping, over: Mapping, *, union_lists: tuple[str, ...] = ()) -> dict:
    """Return base with over merged in: dicts merge recursively, everything else is replaced.

    Keys named in union_lists (dotted, relative to the top) hold lists that are unioned
    in order instead of replaced.
    """
    return _merge(base, over, "", union_lists)


def _merge(base: Mapping, over: Mapping, prefix: str, union_lists: tuple[str, ...]) -> dict:
    out = {k: copy.deepcopy(v) for k, v in base.items()}
    for key, value in over.items():
        path = f"{prefix}{key}"
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            out[key] = _merge(old, value, path + ".", union_lists)
        elif path in union_lists and isinstance(old, list) and isinstance(value, list):
            out[key] = old + [v for v in value if v not in old]
        else:
            out[key] = copy.deepcopy(value)
    return out


def freeze(value: Any) -> Any:
    """Deep read-only view: mappings become MappingProxyType, lists become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Inverse of freeze: plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


_MISSING = object()


def get_dotted(data: Any, dotted: str, default: Any = None) -> Any:
    """Walk a.b.c through mappings (and integer indices through sequences)."""
    node = data
    for part in dotted.split(".") if dotted else []:
        if isinstance(node, Mapping):
            node = node.get(part, _MISSING)
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return default
        if node is _MISSING:
            return default
    return node


def has_dotted(data: Any, dotted: str) -> bool:
    return get_dotted(data, dotted, _MISSING) is not _MISSING


def flatten(data: Mapping, prefix: str = "") -> dict[str, Any]:
    """Leaf values keyed by dotted path; lists are leaves."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def expand_dotted(data: Mapping) -> dict:
    """Turn {"a.b": 1, "a": {"c": 2}} into {"a": {"b": 1, "c": 2}}."""
    out: dict = {}
    for key, value in data.items():
        value = expand_dotted(value) if isinstance(value, Mapping) else copy.deepcopy(value)
        parts = str(key).split(".")
        nested: Any = value
        for part in reversed(parts[1:]):
            nested = {part: nested}
        out = deep_merge(out, {parts[0]: nested})
    return out


def canonical_json(data: Any) -> str:
    """Stable JSON text: sorted keys, no whitespace, integral floats written as ints."""
    return json.dumps(_canon(thaw(data)), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _canon(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canon(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def same_value(a: Any, b: Any) -> bool:
    """Equality that treats 2 and 2.0 alike and tuples like lists."""
    return canonical_json(a) == canonical_json(b)
