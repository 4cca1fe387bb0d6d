"""The capability schema and document validation with readable messages."""

from __future__ import annotations

import copy
import functools
from importlib import resources
from typing import Any

import jsonschema
import yaml

SCHEMA_ID = "tilecore.capabilities/v1"


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    text = resources.files(__package__).joinpath("schema.yaml").read_text(encoding="utf-8")
    # the schema's own validity against the 2020-12 meta-schema is a test (tests/test_capabilities.py), not a
    # cost of every process that reads a capability file
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_schema() -> dict:
    """The capability schema (a fresh copy the caller may modify)."""
    return copy.deepcopy(_schema())


@functools.lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_schema())


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
    out: list[str] = []
    errors = sorted(_validator().iter_errors(doc), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    for error in errors:
        for field, message in _messages(error):
            line = f"{source}: {field}: {message}"
            if line not in out:
                out.append(line)
    return out
