"""Switch-like pass configs read one way by every pass (``PassContext.switch`` / ``tilecore.passes.parse_switch``):
the spellings of on and off, "auto" and counts where the option takes them, and the error that names the option."""
from __future__ import annotations

import pytest

from tilecore.errors import CompileError
from tilecore.passes import PassContext, parse_switch
from tilecore.passes.splitk import split_k_option


def ctx(**config):
    return PassContext(target=None, backend=None, capabilities=None, config=config)


@pytest.mark.parametrize("v,want", [(True, True), ("true", True), ("True", True), ("on", True), (1, True),
                                    (False, False), ("false", False), ("False", False), ("off", False), (0, False),
                                    (None, False)])
def test_the_spellings_of_on_and_off(v, want):
    assert ctx(k=v).switch("k") is want


def test_the_default_is_read_the_same_way():
    assert ctx().switch("k", "on") is True and ctx().switch("k", "auto", auto=True) == "auto"


@pytest.mark.parametrize("v", ["auto", 2, "yes", 1.0, [True]])
def test_a_value_the_option_does_not_take_names_option_value_and_what_it_takes(v):
    with pytest.raises(CompileError) as e:
        ctx(**{"tilecore.x": v}).switch("tilecore.x", expected="True or False (the x)")
    assert str(e.value) == f"pass config tilecore.x={v!r}: expected True or False (the x)"


def test_counts_are_ints_not_switches():
    assert parse_switch("k", 1, counts=True) == 1 and parse_switch("k", 1, counts=True) is not True
    assert parse_switch("k", 7, counts=True) == 7
    with pytest.raises(CompileError):
        parse_switch("k", -1, counts=True)


@pytest.mark.parametrize("v,want", [(None, None), (False, None), (0, None), (1, None), ("off", None), (True, "auto"),
                                    ("auto", "auto"), ("on", "auto"), (2, 2), (8, 8)])
def test_split_k_reads_through_it(v, want):
    assert split_k_option(ctx() if v is None else ctx(**{"tilecore.split_k": v})) == want


def test_split_k_refuses_by_name():
    with pytest.raises(CompileError, match=r"tilecore.split_k='many': expected False \(off\), an int >= 2"):
        split_k_option(ctx(**{"tilecore.split_k": "many"}))
