"""Tests of the capability-matrix loader, through its public API only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tilecore.capabilities import (
    SCHEMA_ID,
    Capabilities,
    CapabilityError,
    CapabilityRegistry,
    compare_probe,
    load_schema,
    validate_document,
)

ROOT = Path(__file__).resolve().parents[1]
CAP_DIR = ROOT / "capabilities"


# -- helpers ----------------------------------------------------------------------------

def _complete(**over) -> dict:
    """A minimal complete, non-abstract document."""
    doc = {
        "schema": SCHEMA_ID,
        "id": "acme/x1",
        "target": "acme",
        "match": {"arch": "x1"},
        "execution": {"simd_width": 32, "max_threads_per_block": 1024},
        "memory": {"shared": {"max_bytes_per_block": 65536}, "scopes": ["global", "shared"]},
        "dtypes": {"float16": {"storage": True, "arith": True, "mma": True},
                   "float64": {"storage": False}},
        "features": {"async_copy": True, "clusters": False},
        "limits": {"max_shared_bytes_per_block": {"value": 65536, "kind": "max", "unit": "bytes"}},
        "provenance": {"memory": "Acme X1 Programming Guide", "sources": ["Acme X1 Programming Guide"]},
    }
    doc.update(over)
    return doc


def _write(tmp_path: Path, rel: str, doc: dict) -> Path:
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def tree() -> CapabilityRegistry:
    reg = CapabilityRegistry()
    reg.add_directory(CAP_DIR, origin="in-tree")
    return reg


# -- the in-tree files ------------------------------------------------------------------

def test_schema_is_one_file_behind_a_symlink():
    link = CAP_DIR / "schema.yaml"
    assert link.is_symlink()
    assert not os.path.isabs(os.readlink(link))
    assert yaml.safe_load(link.read_text()) == load_schema()
    assert load_schema()["properties"]["schema"]["const"] == SCHEMA_ID


def test_schema_is_a_valid_2020_12_schema():
    """Checked here rather than in every process that reads a capability file (it cost a cold compile 34 ms)."""
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(load_schema())
    broken = load_schema()
    broken["type"] = "no-such-type"
    with pytest.raises(jsonschema.SchemaError):
        jsonschema.Draft202012Validator.check_schema(broken)


def test_every_in_tree_file_validates_and_resolves(tree):
    files = sorted(p for p in CAP_DIR.rglob("*.yaml") if p.name != "schema.yaml")
    assert len(files) == len(tree.ids()) >= 20
    for path in files:
        assert validate_document(yaml.safe_load(path.read_text()), str(path)) == []
    assert tree.validate_all() == []
    for ident in tree.ids():
        caps = tree.resolve(ident)
        assert caps.id == ident and caps.target
        assert len(caps.hash()) == 16


def test_every_non_abstract_profile_is_complete_and_cites_documents(tree):
    concrete = [i for i in tree.ids() if not tree.resolve(i).get("abstract")]
    assert {"cpu/host", "cuda/sm_90a", "hip/gfx950", "ascend/910b", "webgpu/baseline"} <= set(concrete)
    for ident in concrete:
        caps = tree.resolve(ident)
        for section in ("execution", "memory", "dtypes", "features", "limits", "provenance"):
            assert caps.get(section), f"{ident} lacks {section}"
        assert caps.get("provenance.sources"), ident


def test_find_by_target_and_match(tree):
    caps = tree.find(target="cuda", arch="sm_90a")
    assert caps is not None and caps.id == "cuda/sm_90a"
    assert tree.find(target="hip", arch="gfx950").id == "hip/gfx950"
    assert tree.find(target="cuda", arch="sm_999") is None
    assert tree.find(target="hip", arch="sm_90a") is None  # right match, wrong target
    with pytest.raises(CapabilityError, match="ambiguous"):
        tree.find(target="cuda")


def test_in_tree_figures(tree):
    sm80, sm90 = tree.resolve("cuda/sm_80"), tree.resolve("cuda/sm_90a")
    # inherited from sm_80 (declared there, not in sm_90a)
    assert sm90.get("execution.max_threads_per_sm") == 2048
    assert sm90.feature("async_copy") is True
    # overridden by sm_90a
    assert sm80.get("memory.shared.max_bytes_per_block") == 166912
    assert sm90.get("memory.shared.max_bytes_per_block") == 232448
    assert sm90.feature("wgmma") is True and sm80.feature("wgmma") is False
    assert tree.resolve("hip/gfx950").get("memory.shared.max_bytes_per_block") == 163840
    assert tree.resolve("hip/gfx1100").get("execution.simd_width") == 32
    assert tree.resolve("hip/gfx942").get("execution.simd_width") == 64
    assert tree.resolve("webgpu/baseline").limit("max_shared_bytes_per_block") == (16384.0, "max")
    assert tree.resolve("metal/apple9").dtype("float64") is False
    assert tree.resolve("cpu/host").dtype("float8_e4m3") is True and tree.resolve("cpu/host").dtype("int8", "mma") is False
    a3 = tree.resolve("ascend/a3")
    assert a3.feature("separate_vector_cube_units") is True and a3.feature("shared_memory") is False
    assert a3.limit("max_ub_bytes") == (196608.0, "max")


# -- inheritance ------------------------------------------------------------------------

def test_inheritance_deep_merge_lists_replaced(tmp_path):
    base = _complete(id="acme/base", abstract=True)
    base.pop("match")
    base["memory"]["registers"] = {"per_thread_max": 255}
    child = {
        "schema": SCHEMA_ID, "id": "acme/x2", "extends": ["acme/base"], "match": {"arch": "x2"},
        "memory": {"shared": {"max_bytes_per_block": 232448}, "scopes": ["global"]},
        "provenance": {"memory.shared": "Acme X2 Tuning Guide", "sources": ["Acme X2 Tuning Guide"]},
    }
    reg = CapabilityRegistry()
    reg.add_file(_write(tmp_path, "acme/base.yaml", base))
    reg.add_file(_write(tmp_path, "acme/x2.yaml", child))
    caps = reg.resolve("acme/x2")
    assert caps.get("memory.registers.per_thread_max") == 255          # inherited
    assert caps.get("memory.shared.max_bytes_per_block") == 232448     # overridden
    assert caps.get("memory.scopes") == ("global",)                     # list replaced
    assert caps.target == "acme"                                        # target inherited
    assert caps.get("abstract") is False                                # abstract is not
    assert caps.get("match") == {"arch": "x2"}
    assert list(caps.get("provenance.sources")) == ["Acme X1 Programming Guide", "Acme X2 Tuning Guide"]
    assert caps.sources == (str(tmp_path / "acme/base.yaml"), str(tmp_path / "acme/x2.yaml"))
    assert reg.validate_all() == []


def test_later_parent_wins(tmp_path):
    a = _complete(id="acme/a", abstract=True, features={"async_copy": False})
    b = {"schema": SCHEMA_ID, "id": "acme/b", "abstract": True, "features": {"async_copy": True}}
    c = {"schema": SCHEMA_ID, "id": "acme/c", "extends": ["acme/a", "acme/b"]}
    reg = CapabilityRegistry()
    for doc in (a, b, c):
        reg.add_file(_write(tmp_path, doc["id"] + ".yaml", doc))
    assert reg.resolve("acme/c").feature("async_copy") is True


def test_cycle_is_an_error_naming_the_file(tmp_path):
    reg = CapabilityRegistry()
    a = {"schema": SCHEMA_ID, "id": "acme/a", "extends": ["acme/b"]}
    b = {"schema": SCHEMA_ID, "id": "acme/b", "extends": ["acme/a"]}
    pa = _write(tmp_path, "acme/a.yaml", a)
    _write(tmp_path, "acme/b.yaml", b)
    reg.add_directory(tmp_path)
    with pytest.raises(CapabilityError) as err:
        reg.resolve("acme/a")
    text = str(err.value)
    assert "cycle" in text and "acme/a -> acme/b -> acme/a" in text
    assert str(pa) in text and "extends" in text
    assert any("cycle" in e for e in reg.validate_all())


def test_unknown_parent_is_an_error_naming_the_file(tmp_path):
    reg = CapabilityRegistry()
    doc = _complete(extends=["acme/missing"])
    path = _write(tmp_path, "acme/x1.yaml", doc)
    reg.add_file(path)
    with pytest.raises(CapabilityError) as err:
        reg.resolve("acme/x1")
    assert str(path) in str(err.value)
    assert "acme/missing" in str(err.value) and "extends" in str(err.value)
    assert [e for e in reg.validate_all() if "acme/missing" in e]


def test_incomplete_profile_is_an_error(tmp_path):
    doc = _complete()
    del doc["limits"]
    reg = CapabilityRegistry()
    path = _write(tmp_path, "acme/x1.yaml", doc)
    reg.add_file(path)
    with pytest.raises(CapabilityError, match="limits") as err:
        reg.resolve("acme/x1")
    assert str(path) in str(err.value) and "abstract" in str(err.value)
    # the same file marked abstract is fine
    reg2 = CapabilityRegistry()
    reg2.add_file(_write(tmp_path, "b/acme.yaml", dict(doc, abstract=True)))
    assert reg2.resolve("acme/x1").get("abstract") is True


def test_duplicate_id_and_duplicate_key(tmp_path):
    reg = CapabilityRegistry()
    reg.add_file(_write(tmp_path, "one/x1.yaml", _complete()))
    with pytest.raises(CapabilityError, match="already defined"):
        reg.add_file(_write(tmp_path, "two/x1.yaml", _complete()))
    bad = tmp_path / "dup.yaml"
    bad.write_text(f"schema: {SCHEMA_ID}\nid: acme/d\nid: acme/e\n")
    with pytest.raises(CapabilityError, match="duplicate key 'id'") as err:
        CapabilityRegistry().add_file(bad)
    assert str(bad) in str(err.value)


def test_id_must_match_place_in_directory(tmp_path):
    _write(tmp_path, "acme/wrong_name.yaml", _complete())
    reg = CapabilityRegistry()
    reg.add_directory(tmp_path)
    assert any("does not match the file's place" in e for e in reg.validate_all())


# -- schema errors ----------------------------------------------------------------------

def test_schema_error_names_file_and_field(tmp_path):
    doc = _complete()
    doc["memory"]["shared"]["max_bytes_per_block"] = "lots"
    doc["execution"]["warp_width"] = 32
    doc["dtypes"]["fp16"] = {"storage": True}
    doc["limits"]["x"] = {"value": 1, "kind": "biggest"}
    errors = validate_document(doc, "acme/x1.yaml")
    joined = "\n".join(errors)
    assert "acme/x1.yaml: memory.shared.max_bytes_per_block: expected integer" in joined
    assert "acme/x1.yaml: execution.warp_width: unknown field" in joined
    assert "acme/x1.yaml: dtypes.fp16: unknown name 'fp16'" in joined
    assert "acme/x1.yaml: limits.x.kind: must be one of 'max', 'min'" in joined
    assert validate_document(_complete()) == []
    assert validate_document(dict(_complete(), schema="v0"))[0].startswith("<memory>: schema: must be")

    path = _write(tmp_path, "acme/x1.yaml", doc)
    reg = CapabilityRegistry()
    reg.add_file(path)
    assert any(e.startswith(f"{path}: memory.shared.max_bytes_per_block") for e in reg.validate_all())
    with pytest.raises(CapabilityError, match=r"memory\.shared\.max_bytes_per_block"):
        reg.resolve("acme/x1")


def test_provenance_must_name_declared_fields(tmp_path):
    doc = _complete()
    doc["provenance"]["memory.shared.nonexistent"] = "probe"
    reg = CapabilityRegistry()
    reg.add_file(_write(tmp_path, "acme/x1.yaml", doc))
    assert any("provenance.memory.shared.nonexistent" in e for e in reg.validate_all())


# -- queries ----------------------------------------------------------------------------

@pytest.fixture
def x1(tmp_path) -> Capabilities:
    reg = CapabilityRegistry()
    reg.add_file(_write(tmp_path, "acme/x1.yaml", _complete()))
    return reg.resolve("acme/x1")


def test_satisfies_three_kinds_three_outcomes(x1):
    assert x1.satisfies("feature:async_copy") == (True, "")
    ok, why = x1.satisfies("feature:clusters")
    assert ok is False and "explicitly absent" in why
    ok, why = x1.satisfies("feature:wgmma")
    assert ok is None and "not declared" in why

    assert x1.satisfies("dtype:float16:mma") == (True, "")
    assert x1.satisfies("dtype:float16") == (True, "")          # storage by default
    assert x1.satisfies("dtype:float64:arith")[0] is False       # storage false implies no use
    assert x1.satisfies("dtype:bfloat16:mma")[0] is None
    assert x1.satisfies("dtype:float16:atomic_add")[0] is None

    assert x1.satisfies("limit:max_shared_bytes_per_block>=65536") == (True, "")
    assert x1.satisfies("limit:max_shared_bytes_per_block>=64KiB") == (True, "")
    ok, why = x1.satisfies("limit:max_shared_bytes_per_block>=232448")
    assert ok is False and "too small" in why and "65536" in why
    assert x1.satisfies("limit:max_registers_per_thread>=128")[0] is None
    assert x1.satisfies("limit:max_shared_bytes_per_block") == (True, "")

    for bad in ("features:async_copy", "limit:max_shared_bytes_per_block=>1", "dtype:float16:fast"):
        with pytest.raises(CapabilityError):
            x1.satisfies(bad)


def test_accessors(x1):
    assert x1.get("memory.shared.max_bytes_per_block") == 65536
    assert x1.get("memory.nothing.here", "dflt") == "dflt"
    assert x1.get("memory.scopes.1") == "shared"
    assert x1.limit("max_shared_bytes_per_block") == (65536.0, "max")
    assert x1.limit("nope") is None
    assert x1.feature("async_copy") is True and x1.feature("nope") is None
    with pytest.raises(TypeError):
        x1.data["memory"]["shared"]["max_bytes_per_block"] = 1  # read-only view
    d = x1.to_dict()
    d["memory"]["shared"]["max_bytes_per_block"] = 1
    assert x1.get("memory.shared.max_bytes_per_block") == 65536


def test_hash_is_stable_and_follows_the_data(tmp_path):
    def load(doc):
        reg = CapabilityRegistry()
        reg.add_file(_write(tmp_path, "acme/x1.yaml", doc))
        return reg.resolve("acme/x1")

    first, again = load(_complete()), load(_complete())
    assert first.hash() == again.hash() and len(first.hash()) == 16
    int(first.hash(), 16)
    assert first == again
    reordered = dict(reversed(list(_complete().items())))
    assert load(reordered).hash() == first.hash()
    changed = _complete()
    changed["memory"]["shared"]["max_bytes_per_block"] = 65535
    assert load(changed).hash() != first.hash()


# -- probes -----------------------------------------------------------------------------

def test_compare_probe_finds_planted_mismatch(tree):
    sm90 = tree.resolve("cuda/sm_90a")
    probed = {
        "memory": {"shared": {"max_bytes_per_block": 101376}},   # planted mismatch
        "execution": {"simd_width": 32, "cores": 132},            # agrees / not declared
        "features.wgmma": True,                                   # dotted form, agrees
    }
    assert compare_probe(sm90, probed) == [
        "CAPABILITY_MISMATCH: memory.shared.max_bytes_per_block declared 232448, probed 101376"
    ]
    assert compare_probe(sm90, {"memory.shared.max_bytes_per_block": 232448.0}) == []


def test_compare_probe_skips_probe_sourced_defaults(tree):
    web = tree.resolve("webgpu/baseline")
    assert web.get("provenance")["dtypes.float16"] == "probe"
    assert compare_probe(web, {"dtypes": {"float16": {"storage": True}}}) == []
    assert compare_probe(web, {"limits.max_shared_bytes_per_block.value": 32768}) == [
        "CAPABILITY_MISMATCH: limits.max_shared_bytes_per_block.value declared 16384, probed 32768"
    ]


def test_overlay_records_probe_provenance(tree):
    web = tree.overlay("webgpu/baseline", {
        "dtypes": {"float16": {"storage": True, "arith": True}},
        "memory.shared.max_bytes_per_block": 32768,
    })
    assert web.dtype("float16", "arith") is True
    assert web.get("memory.shared.max_bytes_per_block") == 32768
    assert web.get("provenance")["memory.shared.max_bytes_per_block"] == "probe"
    assert web.get("provenance")["dtypes.float16.arith"] == "probe"
    assert web.sources[-1] == "probe"
    assert web.hash() != tree.resolve("webgpu/baseline").hash()
    assert tree.resolve("webgpu/baseline").dtype("float16") is False   # registry untouched
    with pytest.raises(CapabilityError, match="schema"):
        tree.overlay("webgpu/baseline", {"memory.shared.max_bytes_per_block": "big"})


def test_valid_documents_are_remembered_so_later_processes_skip_jsonschema(tmp_path):
    """A process that reads only documents validated before (same schema, same content) does not import
    jsonschema; an invalid document is validated, and reported, every time."""
    import subprocess
    import sys

    code = ("import sys; from tilecore.plugin import get_registry, profile_for; "
            "profile_for(get_registry().resolve('cpu')[1]); print('jsonschema' in sys.modules)")
    env = {**os.environ, "TILECORE_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True) for _ in range(2)]
    assert [r.stdout.strip() for r in runs] == ["True", "False"], [r.stderr[-400:] for r in runs]
    assert (tmp_path / "cache" / "capabilities-valid.txt").stat().st_mode & 0o077 == 0

    from tilecore.capabilities import validate_document

    bad = {"schema": SCHEMA_ID, "id": "x/y", "execution": {"simd_width": "wide"}}
    for _ in range(2):
        assert any("simd_width" in e for e in validate_document(bad, "bad.yaml"))


def test_parsed_documents_are_remembered_so_later_processes_skip_yaml(tmp_path):
    """The second process reads every capability file from the parsed-document memo (no yaml import) and
    resolves the same profile; a damaged memo is ignored (the files are parsed again and it is rewritten)."""
    import subprocess
    import sys

    code = ("import sys; from tilecore.plugin import get_registry, profile_for; "
            "p = profile_for(get_registry().resolve('cpu')[1]); print('yaml' in sys.modules, p.hash())")
    env = {**os.environ, "TILECORE_CACHE_DIR": str(tmp_path / "cache")}

    def run():
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-400:]
        return r.stdout.split()

    first, second = run(), run()
    assert first[0] == "True" and second == ["False", first[1]]
    memo = tmp_path / "cache" / f"capabilities-parsed-py{sys.version_info[0]}{sys.version_info[1]}.marshal"
    assert memo.stat().st_mode & 0o077 == 0
    memo.write_bytes(b"\xff not marshal data")
    assert run() == ["True", first[1]] and run() == ["False", first[1]]


def test_a_remembered_file_that_changes_is_parsed_again(tmp_path, monkeypatch):
    from tilecore.capabilities import _data

    monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path / "cache"))
    _data._parsed.cache_clear()
    try:
        path = _write(tmp_path, "acme/x1.yaml", _complete())
        assert CapabilityRegistry().add_file(path)
        _data.flush_parsed()  # as at the end of a process
        _data._parsed.cache_clear()  # as a later process: the memo file has the document
        assert len(_data._parsed()) == 1
        path.write_text(path.read_text() + "\nid: acme/x2\n")  # a duplicate key: an error, memo or not
        with pytest.raises(CapabilityError, match="duplicate key 'id'"):
            CapabilityRegistry().add_file(path)
    finally:
        _data._dirty.clear()
        _data._parsed.cache_clear()
