"""A resolved capability profile and the questions asked of it."""

from __future__ import annotations

import hashlib
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._data import canonical_json, flatten, expand_dotted, freeze, get_dotted, same_value, thaw
from ._errors import CapabilityError

DTYPE_USES = ("storage", "arith", "mma", "atomic_add")

_OPS = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_SUFFIX = {"": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2, "g": 1024**3, "gib": 1024**3}
_LIMIT_NEED = re.compile(
    r"^(?P<name>[a-z][a-z0-9_]*)\s*(?:(?P<op>>=|<=|==|!=|>|<)\s*"
    r"(?P<num>-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*(?P<suffix>[A-Za-z]*))?$"
)
NEED_SYNTAX = (
    "feature:NAME | dtype:NAME[:storage|arith|mma|atomic_add] | "
    "limit:NAME[OP VALUE] with OP one of >= <= == != > < and VALUE a number "
    "optionally followed by K/KiB/M/MiB/G/GiB"
)


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


@dataclass(frozen=True, eq=False)
class Capabilities:
    """A fully resolved profile: `extends` merged, read-only.

    sources are the files merged to make it, parents first (an overlay appends its source).
    """

    id: str
    target: str
    data: Mapping
    sources: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "data", freeze(self.data))
        object.__setattr__(self, "sources", tuple(self.sources))

    # -- plain access -------------------------------------------------------------
    def get(self, dotted: str, default: Any = None) -> Any:
        """Value at a dotted path, e.g. "memory.shared.max_bytes_per_block"."""
        return get_dotted(self.data, dotted, default)

    def feature(self, name: str) -> bool | None:
        """True/False when declared, None when the profile says nothing."""
        value = get_dotted(self.data, f"features.{name}")
        return value if isinstance(value, bool) else None

    def dtype(self, name: str, use: str = "storage") -> bool | None:
        """Whether dtype `name` supports `use`; None when not declared.

        A use that is not declared is False when storage is explicitly False (what
        cannot be stored cannot be computed on), otherwise None.
        """
        if use not in DTYPE_USES:
            raise CapabilityError(
                f"unknown dtype use {use!r}", field=f"dtypes.{name}",
                hint=f"use one of {', '.join(DTYPE_USES)}",
            )
        entry = get_dotted(self.data, f"dtypes.{name}")
        if not isinstance(entry, Mapping):
            return None
        value = entry.get(use)
        if isinstance(value, bool):
            return value
        if entry.get("storage") is False:
            return False
        return None

    def limit(self, name: str) -> tuple[float, str] | None:
        """(value, kind) of a named limit, or None when not declared."""
        entry = get_dotted(self.data, f"limits.{name}")
        if not isinstance(entry, Mapping) or "value" not in entry:
            return None
        return float(entry["value"]), str(entry.get("kind", "max"))

    # -- needs ----------------------------------------------------------------------
    def satisfies(self, need: str) -> tuple[bool | None, str]:
        """Answer a need string: (True, ""), (False, why) or (None, "not declared ...")."""
        kind, _, rest = str(need).strip().partition(":")
        if kind == "feature" and re.fullmatch(r"[a-z][a-z0-9_]*", rest):
            value = self.feature(rest)
            if value is None:
                return None, f"not declared: feature {rest} is not declared by {self.id}"
            if value:
                return True, ""
            return False, f"feature {rest} is explicitly absent on {self.id}"
        if kind == "dtype" and re.fullmatch(r"[a-z][a-z0-9_]*(:[a-z_]+)?", rest):
            name, _, use = rest.partition(":")
            use = use or "storage"
            value = self.dtype(name, use)
            if value is None:
                return None, f"not declared: dtype {name} ({use}) is not declared by {self.id}"
            if value:
                return True, ""
            return False, f"dtype {name} does not support {use} on {self.id} (explicitly absent)"
        if kind == "limit":
            m = _LIMIT_NEED.match(rest.strip())
            if m and (m.group("op") is None or m.group("suffix").lower() in _SUFFIX):
                return self._limit_need(m)
        raise CapabilityError(
            f"cannot parse need {need!r}", field="need", hint=f"write {NEED_SYNTAX}"
        )

    def _limit_need(self, m: re.Match) -> tuple[bool | None, str]:
        name = m.group("name")
        found = self.limit(name)
        if found is None:
            return None, f"not declared: limit {name} is not declared by {self.id}"
        if m.group("op") is None:
            return True, ""
        value, kind = found
        wanted = float(m.group("num")) * _SUFFIX[m.group("suffix").lower()]
        op = m.group("op")
        if _OPS[op](value, wanted):
            return True, ""
        unit = get_dotted(self.data, f"limits.{name}.unit", "")
        unit = f" {unit}" if unit else ""
        if op in (">=", ">"):
            why = "too small"
        elif op in ("<=", "<"):
            why = "too large"
        else:
            why = "different value"
        return False, (
            f"limit {name} ({kind}) is {_fmt(value)}{unit} on {self.id}; "
            f"need {op} {_fmt(wanted)}: {why}"
        )

    # -- identity -------------------------------------------------------------------
    def to_dict(self) -> dict:
        """A deep, mutable copy of the merged data."""
        return thaw(self.data)

    def hash(self) -> str:
        """First 16 hex digits of sha256 over the canonical JSON of the data."""
        return hashlib.sha256(canonical_json(self.data).encode("ascii")).hexdigest()[:16]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Capabilities):
            return NotImplemented
        return self.id == other.id and self.target == other.target and self.hash() == other.hash()

    def __hash__(self) -> int:
        return hash((self.id, self.hash()))

    def __repr__(self) -> str:
        return f"Capabilities(id={self.id!r}, target={self.target!r}, hash={self.hash()!r})"


def _probe_sourced(declared: Capabilities, path: str) -> bool:
    """True when the most specific provenance entry for the field is "probe"."""
    prov = declared.data.get("provenance", {})
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in prov:  # the most specific entry decides
            return prov[key] == "probe"
    return False


def compare_probe(declared: Capabilities, probed: Mapping) -> list[str]:
    """CAPABILITY_MISMATCH messages for fields that both declare and disagree on.

    probed may be nested or use dotted keys.  Fields whose provenance is "probe" hold a
    conservative default awaiting the probe, not a declared value, and are not compared.
    Provenance itself is never compared.
    """
    if not isinstance(probed, Mapping):
        raise CapabilityError("probed values must be a mapping", field="probed")
    mine = flatten(thaw(declared.data))
    theirs = flatten(expand_dotted(probed))
    out = []
    for path in sorted(theirs):
        if path.startswith("provenance.") or path not in mine:
            continue
        if _probe_sourced(declared, path):
            continue
        if not same_value(mine[path], theirs[path]):
            out.append(
                f"CAPABILITY_MISMATCH: {path} declared {canonical_json(mine[path])}, "
                f"probed {canonical_json(theirs[path])}"
            )
    return out
