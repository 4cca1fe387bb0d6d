"""The capability schema and document validation with readable messages."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema

SCHEMA_ID = "tilecore.capabilities/v1"


@functools.lru_cache(maxsize=1)
def _schema_text() -> str:
    return resources.files(__package__).joinpath("schema.yaml").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    # the schema's own validity against the 2020-12 meta-schema is a test (tests/test_capabilities.py), not a
    # cost of every process that reads a capability file
    import yaml  # here, not at the top: a compile whose documents are all remembered valid never needs it

    return yaml.load(_schema_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_schema() -> dict:
    """The capability schema (a fresh copy the caller may modify)."""
    return copy.deepcopy(_schema())


@functools.lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    import jsonschema

    return jsonschema.Draft202012Validator(_schema())


# -- documents already found valid ------------------------------------------------------------------------
# Every process that reads capability files (`tilecore targets list`, every compile) validated each one
# against the schema: importing jsonschema and validating 20 documents cost 0.1-0.2 s per process. A document
# that validated once is remembered by the sha256 of (schema, document) in the user's cache directory (the
# kernel cache's, with its ownership and permission checks), so later processes skip both. Only valid
# documents are remembered: an edited or invalid file is validated, and its errors reported, every time.
_MEMO_NAME = "capabilities-valid.txt"
_MEMO_MAX = 4096  # lines; past this the file starts over


def _memo_key(doc: dict) -> str | None:
    try:
        body = json.dumps(doc, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256((_schema_text() + "\0" + body).encode()).hexdigest()


def _memo_path(create: bool = False):
    from ..compiler import cache  # the cache directory's rules (ownership, permissions, TILECORE_CACHE_DIR)

    return cache.memo_file(_MEMO_NAME, create)


@functools.lru_cache(maxsize=1)
def _memo() -> set:
    path = _memo_path()
    try:
        return set(path.read_text().split()) if path is not None else set()
    except OSError:
        return set()


def _remember(key: str) -> None:
    memo = _memo()
    memo.add(key)
    path = _memo_path(create=True)
    if path is None:
        return
    try:
        if len(memo) > _MEMO_MAX:
            memo.clear()
            memo.add(key)
            path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as fh:  # one short appended line: concurrent writers do not interleave
            fh.write(key + "\n")
    except OSError:
        pass  # a read-only cache: validated again next time


def _path(parts) -> str:
    return ".".join(str(p) for p in parts) if parts else "(top level)"


def _join(path: str, key: Any) -> str:
    return str(key) if path == "(top level)" else f"{path}.{key}"


def _allowed(schema: dict) -> str:
    names = sorted(schema.get("properties", {}))
    return ", ".join(names) if names else "none"


def _messages(error: jsonschema.ValidationError) -> list[tuple[str, str]]:
    """(field, message) pairs for one jsonschema error, phrased for a file author."""
    path = _path(list(error.absolute_path))
    kind = error.validator
    schema = error.schema if isinstance(error.schema, dict) else {}
    if "propertyNames" in error.schema_path:
        where = _join(path, error.instance)
        if path.startswith("dtypes") or kind == "enum":
            names = ", ".join(_schema()["$defs"]["dtype_name"]["enum"])
            return [(where, f"unknown name {error.instance!r}; use one of: {names}")]
        return [(where, f"invalid name {error.instance!r}: use lower_snake_case ({error.message})")]
    if kind == "additionalProperties" and isinstance(error.instance, dict):
        props = set(schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in props)
        return [
            (_join(path, k), f"unknown field; allowed here: {_allowed(schema)}") for k in extra
        ] or [(path, error.message)]
    if kind == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        return [(_join(path, k), "required field is missing") for k in missing]
    if kind == "const":
        return [(path, f"must be {error.validator_value!r}, got {error.instance!r}")]
    if kind == "enum":
        allowed = ", ".join(repr(v) for v in error.validator_value)
        return [(path, f"must be one of {allowed}, got {error.instance!r}")]
    if kind == "type":
        want = error.validator_value
        want = " or ".join(want) if isinstance(want, list) else want
        return [(path, f"expected {want}, got {type(error.instance).__name__} {error.instance!r}")]
    if kind == "pattern":
        return [(path, f"{error.instance!r} does not match the pattern {error.validator_value!r}")]
    return [(path, error.message)]


def validate_document(doc: dict, source: str = "<memory>") -> list[str]:
    """Schema errors of one capability document as "source: field.path: message"."""
    if not isinstance(doc, dict):
        return [f"{source}: (top level): a capability file must be a mapping, got "
                f"{type(doc).__name__}"]
    key = _memo_key(doc)
    if key is not None and key in _memo():
        return []
    out: list[str] = []
    errors = sorted(_validator().iter_errors(doc), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    for error in errors:
        for field, message in _messages(error):
            line = f"{source}: {field}: {message}"
            if line not in out:
                out.append(line)
    if not out and key is not None:
        _remember(key)
    return out
