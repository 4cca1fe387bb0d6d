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


# -- docs/language.md "Known limitations" says what the code does ------------------------------------

def _limitations() -> str:
    text = (DOCS / "language.md").read_text()
    return text[text.index("## Known limitations"):]


def test_global_accesses_guarded_both_ways_onchip_limitation_stated():
    import numpy as np

    import tilecore
    import tilecore.language as T

    @T.prim_func
    def fill_at(B: T.Tensor((12,), "float32"), k: T.int32):
        with T.Kernel(1) as bx:
            T.fill(B[k], 1.0)

    @T.prim_func
    def fill_past_end(B: T.Tensor((12,), "float32")):
        with T.Kernel(1) as bx:
            T.fill(B[20], 1.0)

    big = np.zeros(32, np.float32)
    tilecore.compile(fill_past_end, target="cpu")(big[4:16])
    assert not big.any()                                   # the constant past-the-end write is dropped
    tilecore.compile(fill_at, target="cpu")(big[4:16], -1)
    assert not big.any()                                   # k = -1 is guarded too (a global access)
    tilecore.compile(fill_at, target="cpu")(big[4:16], 11)
    assert np.nonzero(big)[0].tolist() == [15]
    lim = _limitations()
    assert "a negative index is not guarded" not in lim and "on-chip buffers are not guarded" in lim


def test_limitation_list_does_not_contradict_copy_and_operators():
    import numpy as np

    import tilecore
    import tilecore.language as T

    @T.prim_func
    def g2g(A: T.Tensor((8,), "float32"), B: T.Tensor((12,), "float32")):
        with T.Kernel(1) as bx:
            T.copy(A[0:12], B[0:12])

    @T.prim_func
    def bits(A: T.Tensor((4,), "int32"), B: T.Tensor((4,), "int32")):
        with T.Kernel(1) as bx:
            for i in T.serial(4):
                B[i] = (A[i] & 6) | 1

    a = np.arange(1, 9, dtype=np.float32)
    b = np.full(12, -7.0, np.float32)
    tilecore.compile(g2g, target="cpu")(a, b)
    assert b.tolist() == a.tolist() + [-7.0] * 4           # the tail is left, not zeroed
    x = np.array([7, 8, 5, 2], np.int32)
    assert tilecore.compile(bits, target="cpu", out_idx=[-1])(x).tolist() == ((x & 6) | 1).tolist()
    lim = _limitations()
    assert "logical operators" not in lim and "reads out-of-bounds global elements as 0" not in lim
