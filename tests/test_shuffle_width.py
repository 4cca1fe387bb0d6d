"""Row reductions of register fragments where the lockstep width is known only at run time (plugin API 1.3,
``execution.simd_width: dynamic``, :class:`tilecore.ir.ShuffleWidth`; decision D21), through the core alone.

A made-up target (tests only) extends the CUDA profile with ``simd_width: dynamic``; its emitter spells
``ShuffleXor`` as the host emulator's 64-lane exchange and ``ShuffleWidth`` as the width named in the target
(``dynsw:<w>``), so one lowering runs at every width on the host (tests/cuda_host_emulator.py): 1 (every
row through shared memory), 4 (shuffles, then the groups of 4 meet in shared memory), 32 and 64 (shuffles
only). A WebGPU adapter decides the width when the kernel starts (tests/test_webgpu_shuffles.py).
"""
from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import tilecore
from tilecore.errors import CompileError

pytest.importorskip("tilecore_cuda")
sys.path.insert(0, str(Path(__file__).parent))
from cuda_host_emulator import run_on_host  # noqa: E402
from fake_matrix_backend import backend_class  # noqa: E402

composite = pytest.importorskip("tilecore_conformance.composite")
NOCACHE = {"tilecore.disable_cache": True}

CAPS = """\
schema: tilecore.capabilities/v1
id: dynsw/x1
extends: [cuda/sm_80]
match: {arch: x1}
description: a made-up target whose lockstep width is decided at run time (tests only)
execution: {simd_width: dynamic}
provenance:
  execution.simd_width: "tests/test_shuffle_width.py (invented)"
  sources: ["tilecore test fixture"]
"""


@pytest.fixture(scope="module")
def dynsw(tmp_path_factory):
    from tilecore.plugin import Target, get_registry, hookimpl, reset_registry

    caps = tmp_path_factory.mktemp("dynsw") / "dynsw_x1.yaml"
    caps.write_text(CAPS)
    base = backend_class()

    class DynamicWidthBackend(base):
        name = "dynsw"
        plugin_api = "1.3"
        distribution = "tilecore-dynsw"

        def parse_target(self, spec):
            if spec.startswith("dynsw:"):
                return Target("dynsw", "dynsw", spec[6:], (("width", spec[6:]),), "dynsw/x1")
            return None

        def targets(self):
            return ["dynsw:1"]

        def capability_files(self):
            return [caps]

        def matrix_units(self, target):
            return []

        def emitter(self, target):
            width = dict(target.options)["width"]

            class Emitter(type(super().emitter(target))):
                shuffle_xor = "tc_xor_exchange({0}, {1}, {2})"
                shuffle_width_expr = "" if width == "unspelled" else width

            return Emitter()

    mod = types.ModuleType("tc_dynsw")

    @hookimpl
    def tilecore_backends():
        return [DynamicWidthBackend()]

    mod.tilecore_backends = tilecore_backends
    reset_registry()
    get_registry().register(mod, name="dynsw")
    yield "dynsw"
    reset_registry()


def _lowered(func, target) -> str:
    """The IR after every pass (what ``TILECORE_DUMP_IR`` shows last)."""
    from tilecore.compiler import lower
    from tilecore.ir import func_str

    return func_str(lower(func, target, NOCACHE)[2])


@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")
@pytest.mark.parametrize("width", [1, 4, 32, 64])
def test_one_lowering_is_right_at_every_run_time_width(dynsw, width):
    k = tilecore.compile(composite.softmax("float32"), target=f"dynsw:{width}", pass_configs=NOCACHE)
    assert not k.meta["attrs"]["fragment_layouts"]["x"].startswith("shared")
    ir = _lowered(composite.softmax("float32"), f"dynsw:{width}")
    assert "T.shuffle_width()" in ir and "T.shuffle_xor(" in ir, ir
    code = k.source.code
    # masks 1 .. 16 (32 threads a row) shuffle below the width; the shared-memory part runs below 32
    assert "tc_xor_exchange(" in code and f"(1 < {width})" in code and f"({width} <= 16)" in code, code
    rng = np.random.default_rng(width)
    x = rng.standard_normal((composite.ROWS, composite.COLS)).astype(np.float32)
    out = run_on_host(k, [x, np.full_like(x, np.nan)])[1]
    np.testing.assert_allclose(out, composite.softmax_ref([x], "float32")[0], rtol=1e-5, atol=1e-6)


def test_an_emitter_without_the_spelling_is_told_what_to_set(dynsw):
    with pytest.raises(CompileError, match=r"shuffle_width_expr.*simd_width: dynamic"):
        tilecore.compile(composite.rmsnorm("float32"), target="dynsw:unspelled", pass_configs=NOCACHE)


def test_static_widths_keep_unconditional_shuffles():
    ir = _lowered(composite.rmsnorm("float32"), "cuda:sm_80")
    assert "T.shuffle_xor(" in ir and "T.shuffle_width()" not in ir
