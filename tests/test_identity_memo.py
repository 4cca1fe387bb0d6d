"""The identity memos behind simplify and the prover (tilecore.ir.memo, D65): a hit needs the very objects the
answer was about, the memo stays bounded, and forget() drops every one of them."""

from tilecore.ir import bounds
from tilecore.ir.expr import Var, binary
from tilecore.ir.memo import MISS, IdentityMemo
from tilecore.ir.simplify import _KEYS, _LINEAR, _MEMO, forget, simplify


def test_hit_needs_the_same_objects():
    m = IdentityMemo(limit=8)
    a, b = Var("a", "int32"), Var("b", "int32")
    m.put(id(a), "answer", a)
    assert m.get(id(a), a) == "answer"
    # the same key asked about another object (an id reused after the first was freed) is a miss, not its answer
    assert m.get(id(a), b) is MISS
    m.put((id(a), 1), "two owners", a, b)
    assert m.get((id(a), 1), a, b) == "two owners"
    assert m.get((id(a), 1), a, a) is MISS
    assert m.get((id(a), 1), a) is MISS


def test_bounded():
    m = IdentityMemo(limit=4)
    owners = [Var(f"v{i}", "int32") for i in range(10)]
    for v in owners:
        m.put(id(v), v.name, v)
        assert len(m) <= 4
    assert m.get(id(owners[-1]), owners[-1]) == "v9"


def test_simplify_remembers_and_forget_drops_everything():
    x = Var("x", "int32")
    e = binary("add", binary("mul", x, 4), binary("mul", x, 4))
    first = simplify(e)
    assert simplify(e) is first  # the remembered answer, the same object
    assert len(_MEMO) > 0
    forget()
    for memo in (_MEMO, _KEYS, _LINEAR, bounds._BOUNDS, bounds._DIVISORS,
                 bounds._THREAD_ONLY):
        assert len(memo) == 0
    again = simplify(e)
    assert again is not first and str(again) == str(first)
