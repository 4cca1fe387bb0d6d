"""Plugin API 1.2: a backend declares extra keyword arguments of ``T.copy`` / ``T.Kernel``
(``Backend.op_extensions``); its passes read them from the op, and every other target refuses them at the
user's line, naming the backend and targets that accept them. A made-up backend registered in code
(``extdemo``, running on the CPU backend's emitter and runtime) declares two."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.errors import CompileError, UnsupportedFeatureError
from tilecore.ir import KernelLaunch, TileOp, walk
from tilecore.plugin import PLUGIN_API, Backend, OpExtension, PassSpec, Target, get_registry, hookimpl

SEEN: list = []


def _record(func, ctx):
    """extdemo's pass: what its extensions say, as its lowering would read them."""
    def look(s):
        if isinstance(s, (TileOp, KernelLaunch)):
            SEEN.extend(dict(s.attrs).get("extensions", ()))
    walk(func.body, look)
    return func


class ExtDemo(Backend):
    name = "extdemo"
    plugin_api = "1.2"
    distribution = "tilecore-extdemo"

    def parse_target(self, spec):
        return Target("extdemo", "extdemo", "", (), "cpu/host") if spec == "extdemo" else None

    def targets(self):
        return ["extdemo"]

    def op_extensions(self, target):
        return [OpExtension("copy", "stream_hint", "which stream buffer the copy goes through", (int,)),
                OpExtension("Kernel", "warp_groups", "how many warp groups the block has", (int,))]

    def passes(self, target):
        return [PassSpec("legalize", _record, position="after")]

    def emitter(self, target):
        return get_registry().backends()["cpu"].emitter(target)

    def runtime(self, target):
        return get_registry().backends()["cpu"].runtime(target)


class Plugin:
    @hookimpl
    def tilecore_backends(self):
        return [ExtDemo()]


@pytest.fixture
def extdemo():
    reg = get_registry()
    rec = reg.register(Plugin(), name="extdemo-plugin")
    assert rec.status == "ok", rec.error
    SEEN.clear()
    try:
        yield
    finally:
        reg.unregister("extdemo-plugin")


def kernel(copy_kwargs: dict, kernel_kwargs: dict):
    @T.prim_func
    def k(A: T.Tensor((64,), T.float32), B: T.Tensor((64,), T.float32)):
        with T.Kernel(1, threads=32, **kernel_kwargs) as bx:
            s = T.alloc_shared((64,), T.float32)
            T.copy(A, s, **copy_kwargs)
            T.copy(s, B)
    return k


def _line(text: str) -> int:
    src, first = inspect.getsourcelines(kernel)
    return first + next(i for i, line in enumerate(src) if text in line)


def test_the_declaring_backend_gets_the_values(extdemo):
    k = tilecore.compile(kernel({"stream_hint": 3}, {"warp_groups": 2}), target="extdemo",
                         pass_configs={"tilecore.disable_cache": True})
    assert sorted(SEEN) == [("stream_hint", 3), ("warp_groups", 2)]
    a = np.arange(64, dtype=np.float32)
    b = np.zeros(64, dtype=np.float32)
    k(a, b)
    assert (a == b).all()


@pytest.mark.parametrize("where", ["copy", "Kernel"])
def test_other_targets_refuse_naming_the_backend_and_line(extdemo, where):
    args = ({"stream_hint": 3}, {}) if where == "copy" else ({}, {"warp_groups": 2})
    name = "stream_hint" if where == "copy" else "warp_groups"
    with pytest.raises(UnsupportedFeatureError) as e:
        tilecore.compile(kernel(*args), target="cpu")
    msg = str(e.value)
    line = _line("T.copy(A, s" if where == "copy" else "with T.Kernel")
    assert f"T.{where}(..., {name}=" in msg and f"`{name}`" in msg, msg
    assert "backend extdemo (tilecore-extdemo: extdemo)" in msg and f":{line} " in msg, msg
    assert e.value.feature == f"extension:{where}.{name}" and e.value.target == "cpu"


def test_an_undeclared_keyword_is_refused_everywhere():
    with pytest.raises(UnsupportedFeatureError, match=r"`stream_hnit`.*no installed backend declares it"):
        tilecore.compile(kernel({"stream_hnit": 3}, {}), target="cpu")


def test_a_value_of_the_wrong_type_is_refused(extdemo):
    with pytest.raises(CompileError, match=r"`stream_hint` takes int on extdemo"):
        tilecore.compile(kernel({"stream_hint": "fast"}, {}), target="extdemo")


def test_api_version_and_older_plugins_load():
    assert PLUGIN_API == (1, 13)

    class Old(ExtDemo):
        name = "olddemo"
        plugin_api = "1.1"

        def parse_target(self, spec):
            return None

    class OldPlugin:
        @hookimpl
        def tilecore_backends(self):
            return [Old()]

    reg = get_registry()
    try:
        rec = reg.register(OldPlugin(), name="old-plugin")
        assert rec.status == "ok" and "olddemo" in reg.backends()
        assert Backend.op_extensions(reg.backends()["olddemo"], None) == []
    finally:
        reg.unregister("old-plugin")


def test_extension_values_are_part_of_the_cache_key(extdemo, tmp_path, monkeypatch):
    monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path))
    for groups in (2, 3):
        tilecore.compile(kernel({}, {"warp_groups": groups}), target="extdemo")
    assert SEEN == [("warp_groups", 2), ("warp_groups", 3)]  # the second compile ran the passes again
