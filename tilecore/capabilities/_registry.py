"""Registry of capability files: loading, `extends` resolution, checks, probe overlays."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ._data import deep_merge, expand_dotted, flatten, has_dotted, read_yaml
from ._errors import CapabilityError
from ._profile import Capabilities
from ._schema import SCHEMA_ID, validate_document

REQUIRED_SECTIONS = ("execution", "memory", "dtypes", "features", "limits", "provenance")
# Header keys describe one file and are not inherited; `target` and every section are.
_NOT_INHERITED = ("schema", "id", "extends", "abstract", "match", "description")
_UNION_LISTS = ("provenance.sources",)


def _fits_place(ident: str, rel: str) -> bool:
    """A file found in a folder is ``<name>.yaml`` for id ``vendor/name``, directly in the folder given
    (a wheel's ``tilecore_<vendor>/capabilities/``), in a ``capabilities`` folder, or in a folder named
    after the vendor (the repository's ``capabilities/<vendor>/``)."""
    vendor, _, name = ident.partition("/")
    parts = os.path.splitext(rel)[0].split(os.sep)
    return parts[-1] == name and (len(parts) == 1 or parts[-2] in (vendor, "capabilities"))


@dataclass
class _Entry:
    doc: dict
    path: str
    origin: str
    rel: str | None  # path relative to the directory it was found in, when added that way


class CapabilityRegistry:
    """Holds capability files by id and resolves them into Capabilities."""

    def __init__(self):
        self._entries: dict[str, _Entry] = {}
        self._cache: dict[str, Capabilities] = {}

    # -- loading ----------------------------------------------------------------------
    def add_file(self, path, origin: str = "", *, if_absent: bool = False) -> bool:
        """Add one file. With if_absent, a file whose id is already defined is skipped (returns False):
        files named by the user shadow an installed backend's copy of the same profile."""
        return self._add(os.fspath(path), origin, None, if_absent=if_absent)

    def add_directory(self, path, origin: str = "") -> None:
        """Add every *.yaml / *.yml below path (recursively) except schema.yaml."""
        root = os.fspath(path)
        if not os.path.isdir(root):
            raise CapabilityError("not a directory", file=root,
                                  hint="pass the folder that holds the capability files")
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith((".yaml", ".yml")) or name in ("schema.yaml", "schema.yml"):
                    continue
                full = os.path.join(dirpath, name)
                self._add(full, origin, os.path.relpath(full, root))

    def _add(self, path: str, origin: str, rel: str | None, *, if_absent: bool = False) -> bool:
        doc = read_yaml(path)
        if not isinstance(doc, dict):
            raise CapabilityError(
                f"a capability file must be a mapping, got {type(doc).__name__}",
                file=path, field="(top level)",
                hint=f"start the file with 'schema: {SCHEMA_ID}' and 'id: vendor/name'",
            )
        ident = doc.get("id")
        if not isinstance(ident, str) or not ident:
            raise CapabilityError("missing or non-string id", file=path, field="id",
                                  hint="add 'id: vendor/name', e.g. 'id: acme/x1'")
        old = self._entries.get(ident)
        if old is not None and if_absent:
            return False
        if old is not None and os.path.realpath(old.path) != os.path.realpath(path):
            where = f" (from {old.origin})" if old.origin else ""
            raise CapabilityError(
                f"id {ident!r} is already defined by {old.path}{where}",
                file=path, field="id", hint="give each capability file its own id",
            )
        self._entries[ident] = _Entry(doc, path, origin, rel)
        self._cache.clear()
        return True

    def ids(self) -> list[str]:
        return sorted(self._entries)

    def path_of(self, ident: str) -> str:
        """File that defines an id."""
        return self._entry(ident, None).path

    # -- resolution -------------------------------------------------------------------
    def _entry(self, ident: str, child: str | None) -> _Entry:
        entry = self._entries.get(ident)
        if entry is not None:
            return entry
        known = ", ".join(self.ids()) or "none loaded"
        if child is None:
            raise CapabilityError(f"unknown capability id {ident!r} (known: {known})",
                                  hint="add the file that defines it to the registry")
        parent_of = self._entries[child]
        raise CapabilityError(
            f"unknown parent {ident!r} (known: {known})",
            file=parent_of.path, field="extends",
            hint="fix the id in extends or add the file that defines it",
        )

    def _merged(self, ident: str, stack: tuple[str, ...], child: str | None) -> tuple[dict, tuple[str, ...]]:
        entry = self._entry(ident, child)
        if ident in stack:
            chain = " -> ".join(stack[stack.index(ident):] + (ident,))
            raise CapabilityError(
                f"extends cycle: {chain}", file=entry.path, field="extends",
                hint="remove one of the links so the chain ends at a base",
            )
        errors = validate_document(entry.doc, entry.path)
        if errors:
            listed = "\n  ".join(errors)
            raise CapabilityError(f"schema error{'s' if len(errors) > 1 else ''} in "
                                  f"{entry.path}:\n  {listed}\n",
                                  hint="correct each field as its message says")
        merged: dict = {}
        files: list[str] = []
        for parent in entry.doc.get("extends", []):
            pdata, pfiles = self._merged(parent, stack + (ident,), ident)
            merged = deep_merge(merged, pdata, union_lists=_UNION_LISTS)
            files.extend(f for f in pfiles if f not in files)
        own = {k: v for k, v in entry.doc.items() if k not in _NOT_INHERITED}
        merged = deep_merge(merged, own, union_lists=_UNION_LISTS)
        files.append(entry.path)
        return merged, tuple(files)

    def _build(self, ident: str) -> tuple[dict, tuple[str, ...], list[tuple[str, str, str]]]:
        entry = self._entry(ident, None)
        merged, files = self._merged(ident, (), None)
        data = {"schema": SCHEMA_ID, "id": ident}
        data.update(merged)
        data["abstract"] = bool(entry.doc.get("abstract", False))
        data["match"] = dict(entry.doc.get("match", {}))
        data["extends"] = list(entry.doc.get("extends", []))
        if "description" in entry.doc:
            data["description"] = entry.doc["description"]
        return data, files, self._check_resolved(entry, data)

    def resolve(self, id: str) -> Capabilities:  # noqa: A002 - public API name
        """The profile with `extends` merged (dicts deep-merged, lists replaced)."""
        if id in self._cache:
            return self._cache[id]
        data, files, problems = self._build(id)
        if problems:
            field, message, hint = problems[0]
            more = "".join(f"; also {f}: {m}" for f, m, _ in problems[1:])
            raise CapabilityError(message + more, file=self._entries[id].path, field=field, hint=hint)
        caps = Capabilities(id=id, target=str(data.get("target", "")), data=data, sources=files)
        self._cache[id] = caps
        return caps

    def _check_resolved(self, entry: _Entry, data: dict) -> list[tuple[str, str, str]]:
        """(field, message, hint) for a merged profile; completeness only if not abstract."""
        out = []
        chain = ", ".join(entry.doc.get("extends", [])) or "no parents"
        if not data["abstract"]:
            if not data.get("target"):
                out.append(("target", "missing after resolving extends (" + chain + ")",
                            "declare target here or in a parent"))
            for section in REQUIRED_SECTIONS:
                if not data.get(section):
                    out.append((section, f"a non-abstract profile needs {section}; it is "
                                f"missing after resolving extends ({chain})",
                                f"declare {section} here or in a parent, or mark the file "
                                f"'abstract: true'"))
            if data.get("provenance") and not data["provenance"].get("sources"):
                out.append(("provenance.sources", "no documents named",
                            "list the documents the values come from in provenance.sources"))
        for key in sorted(data.get("provenance", {})):
            if key != "sources" and not has_dotted(data, key):
                out.append((f"provenance.{key}", f"names {key}, which the profile does not "
                            "declare", "fix the dotted path or remove the entry"))
        dtypes = data.get("dtypes", {})
        for i, unit in enumerate(data.get("matrix_units", [])):
            for name in unit.get("a_dtypes", []):
                if dtypes.get(name, {}).get("mma") is not True:
                    out.append((f"matrix_units.{i}.a_dtypes", f"lists {name}, but "
                                f"dtypes.{name}.mma is not true",
                                f"set dtypes.{name}.mma: true or drop {name} from the unit"))
        return out

    # -- queries ----------------------------------------------------------------------
    def find(self, target: str, **match) -> Capabilities | None:
        """The non-abstract profile for target whose match items all equal those given."""
        found = []
        for ident in self.ids():
            doc = self._entries[ident].doc
            if doc.get("abstract"):
                continue
            own = doc.get("match", {})
            if not all(k in own and (own[k] == v or str(own[k]) == str(v)) for k, v in match.items()):
                continue
            caps = self.resolve(ident)
            if caps.target == target:
                found.append(caps)
        if len(found) > 1:
            names = ", ".join(c.id for c in found)
            raise CapabilityError(
                f"find(target={target!r}, {match}) is ambiguous: {names}",
                hint="pass more match items (e.g. arch=...) or give the profiles distinct match values",
            )
        return found[0] if found else None

    def validate_all(self) -> list[str]:
        """Every problem in every file: schema, resolution, completeness. [] means fine."""
        out: list[str] = []
        for ident in self.ids():
            entry = self._entries[ident]
            errors = validate_document(entry.doc, entry.path)
            out.extend(errors)
            if entry.rel is not None and not _fits_place(ident, entry.rel):
                place = os.path.splitext(entry.rel)[0].replace(os.sep, "/")
                out.append(f"{entry.path}: id: {ident!r} does not match the file's place {place!r} "
                           f"(fix: name the file {ident.split('/')[-1]}.yaml, in a folder named "
                           f"{ident.split('/')[0]} or capabilities or directly in the folder given, "
                           "or change the id)")
            if errors:
                continue
            try:
                _, _, problems = self._build(ident)
            except CapabilityError as exc:
                text = str(exc)
                if text.startswith("schema error"):
                    continue  # reported once, for the file that has it
                out.append(text if text.startswith(entry.path) else f"{entry.path}: {text}")
                continue
            for field, message, hint in problems:
                out.append(f"{entry.path}: {field}: {message} (fix: {hint})")
        return out

    def overlay(self, id: str, values: dict, source: str = "probe") -> Capabilities:  # noqa: A002
        """The resolved profile with values (nested or dotted keys) merged over it.

        Each overlaid leaf is recorded in provenance as coming from `source`.
        """
        if not isinstance(values, Mapping):
            raise CapabilityError("overlay values must be a mapping", field="values")
        base = self.resolve(id)
        extra = expand_dotted(values)
        for bad in ("schema", "id", "extends", "abstract", "provenance"):
            if bad in extra:
                raise CapabilityError(f"an overlay cannot change {bad}", field=bad,
                                      hint="overlay sections such as memory, features, limits")
        merged = deep_merge(base.to_dict(), extra)
        prov = merged.setdefault("provenance", {})
        for path in flatten(extra):
            prov[path] = source
        sources = prov.setdefault("sources", [])
        if source not in sources:
            sources.append(source)
        errors = validate_document(merged, f"{id} + {source}")
        if errors:
            raise CapabilityError(f"overlaid values do not fit the schema: {'; '.join(errors)}",
                                  hint="probe results must use the schema's names and types")
        return Capabilities(id=id, target=str(merged.get("target", base.target)),
                            data=merged, sources=base.sources + (source,))
