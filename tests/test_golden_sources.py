"""Golden sources (scripts/golden_sources.py): the generated source of every conformance catalog kernel for
every in-tree target must match the hashes in tests/golden/sources.json, byte for byte. A change to an
emitter, a prelude or a pass that alters any kernel's source fails here until it is explained in the commit
and accepted with ``python scripts/golden_sources.py --update``.

No device compiler is needed: the sources come from ``tilecore.compiler.lower`` (passes and emitter only),
so nothing here is skipped, the CUDA targets included."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))  # importable by name: the check's worker processes import it
import golden_sources as golden  # noqa: E402


def test_manifest_covers_every_target_and_case():
    from tilecore_conformance.catalog import catalog

    manifest = golden.load_manifest()
    want = {f"{t}/{c.id}" for t in golden.TARGETS for c in catalog()}
    assert set(manifest) == want, ("tests/golden/sources.json is out of step with the catalog: missing "
                                   f"{sorted(want - set(manifest))[:5]}, extra {sorted(set(manifest) - want)[:5]}; "
                                   "run python scripts/golden_sources.py --update")


@pytest.mark.xdist_group("golden_sources")
def test_generated_sources_are_byte_identical_to_the_manifest():
    changes, report = golden.check(jobs=2)
    if changes:
        names = "\n".join(f"  {k}" for k, _, _ in changes[:40]) + ("\n  ..." if len(changes) > 40 else "")
        pytest.fail(f"{len(changes)} generated source(s) differ from tests/golden/sources.json:\n{names}\n"
                    "see the diffs: python scripts/golden_sources.py --check\n"
                    "accept them (explain the difference in the commit): python scripts/golden_sources.py --update\n"
                    + report[:4000], pytrace=False)


def test_check_reports_a_changed_source_with_its_diff(tmp_path, monkeypatch):
    # a guard that can fail: a source that differs from the manifest is reported, with the diff
    monkeypatch.setattr(golden, "CACHE", tmp_path)
    old, new = "int a;\nint b;\n", "int a;\nint c;\n"
    for text in (old, new):
        golden._store(text, golden._sha(text))
    changes = golden.compare({"cpu/x": golden._sha(old), "cpu/gone": "0" * 64},
                             {"cpu/x": golden._sha(new), "cpu/added": "1" * 64})
    assert [k for k, _, _ in changes] == ["cpu/added", "cpu/gone", "cpu/x"]
    text = golden.describe(changes)
    assert "-int b;\n+int c;\n" in text and "cpu/gone: gone" in text and "cpu/added: new" in text
    # the old text not cached: said so, with both hashes
    text = golden.describe([("cpu/y", "a" * 64, golden._sha(new))])
    assert "not in" in text and "aaaaaaaaaaaa -> " in text


def test_manifest_is_plain_sorted_json():
    data = json.loads(golden.MANIFEST.read_text())
    assert list(data) == sorted(data) and all(len(v) == 64 for v in data.values())
