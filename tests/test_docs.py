"""The guides document every hook and every pipeline slot (datasette's test_plugin_hooks_are_documented)."""
from pathlib import Path

from tilecore.passes import SLOTS
from tilecore.plugin import hookspecs

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_hook_is_documented_in_the_plugin_guide():
    guide = (DOCS / "plugin-guide.md").read_text()
    hooks = [n for n in dir(hookspecs) if n.startswith("tilecore_")]
    assert hooks
    missing = [h for h in hooks if h not in guide]
    assert not missing, f"undocumented hooks: {missing}"


def test_every_slot_is_documented():
    guide = (DOCS / "plugin-guide.md").read_text()
    assert [s for s in SLOTS if f"`{s}`" not in guide] == []


def test_every_pass_config_key_is_documented():
    from tilecore.passes import PassConfigKey

    text = (DOCS / "language.md").read_text() + (DOCS / "plugin-guide.md").read_text()
    assert [k for k in PassConfigKey.all().values() if k not in text] == []
