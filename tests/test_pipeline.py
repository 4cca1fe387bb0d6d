"""The pass pipeline and the intrinsic table, as a backend plugin uses them."""
from __future__ import annotations

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.ir import For, Store, TileOp, collect, walk
from tilecore.passes import SLOTS, Pipeline, core_pipeline, tile_pass
from tilecore.plugin import Intrinsic, PassSpec, get_registry


def test_core_pipeline_has_the_named_slots_in_order():
    assert SLOTS == ("legalize", "layout", "tile-lowering", "pipelining", "memory", "before-codegen")
    names = [p.name for _, p in core_pipeline().passes()]
    assert names.index("tilecore.check_capabilities") < names.index("tilecore.lower_tile_ops") \
        < names.index("tilecore.serialize_pipelined") < names.index("tilecore.plan_memory")


def test_unknown_slot_is_refused():
    with pytest.raises(ValueError, match="unknown pipeline slot 'layouts'"):
        Pipeline().add("layouts", tile_pass("x")(lambda f, c: f))


def kernel():
    @T.prim_func
    def copy_scale(A: T.Tensor((64, 64), "float32"), B: T.Tensor((64, 64), "float32")):
        with T.Kernel(2, threads=128) as bx:
            s = T.alloc_shared((32, 64), "float32")
            T.copy(A[bx * 32, 0], s)
            for i, j in T.Parallel(32, 64):
                s[i, j] = s[i, j] * 2.0
            T.copy(s, B[bx * 32, 0])
    return copy_scale


@pytest.fixture
def plugin_with_passes():
    """A cross-cutting plugin adding a pass per slot and a copy intrinsic that needs a capability."""
    seen = []

    def make(slot):
        @tile_pass(f"test.observe_{slot}")
        def observe(func, ctx):
            tileops = collect(func.body, TileOp)
            seen.append((slot, len(tileops)))
            return func
        return observe

    @tile_pass("test.double_stores")
    def rewrite_nothing(func, ctx):
        return func

    class Plugin:
        from tilecore.plugin import hookimpl

        @hookimpl
        def tilecore_pipeline_passes(self, target):
            return [PassSpec(s, make(s)) for s in SLOTS] + [PassSpec("memory", rewrite_nothing, "after")]

    reg = get_registry()
    rec = reg.register(Plugin(), name="observer")
    assert rec.status == "ok", rec.error
    yield seen
    reg.unregister("observer")


def test_plugin_passes_run_in_their_slots(plugin_with_passes, tmp_path, monkeypatch):
    monkeypatch.setenv("TILECORE_DUMP_IR", str(tmp_path))
    tilecore.compile(kernel(), target="cpu")
    # tile ops exist before tile-lowering and are gone after it
    assert plugin_with_passes == [("legalize", 2), ("layout", 2), ("tile-lowering", 2), ("pipelining", 0),
                                  ("memory", 0), ("before-codegen", 0)]
    dumped = sorted(p.name for p in (tmp_path / "copy_scale").iterdir())
    assert any(name.endswith("memory.test.double_stores.ir") for name in dumped)


def test_intrinsics_are_chosen_by_capability_not_by_name():
    from tilecore.passes import PassContext
    from tilecore.passes.lower_tile import choose, lower_copy
    from tilecore.plugin import profile_for, resolve_target

    backend, target = resolve_target("cpu")
    caps = profile_for(target)
    used = []

    def fast_copy(op, ctx):
        used.append(op)
        return lower_copy(op, ctx)

    wants_absent = Intrinsic("copy", "test.bulk_copy", fast_copy, requires=("feature:bulk_tensor_copy",), priority=10)
    wants_present = Intrinsic("copy", "test.atomic_copy", fast_copy, requires=("feature:atomics",), priority=5)
    ctx = PassContext(target, backend, caps, {}, [wants_absent, wants_present])
    op = collect(kernel().body, TileOp)[0]
    assert choose(op, ctx).name == "test.atomic_copy"   # bulk_tensor_copy is false on the host
    ctx.intrinsics = [wants_absent]
    assert choose(op, ctx).name == "generic.copy"


def test_lowered_ir_has_loops_not_tile_ops():
    from tilecore.compiler import lower

    _, _, lowered, source, _ = lower(kernel(), "cpu")
    kinds = []
    walk(lowered.body, lambda s: kinds.append(type(s).__name__))
    assert "TileOp" not in kinds and "For" in kinds and "Store" in kinds
    assert lowered.attrs["intrinsics"] == ("copy:generic.copy",)
    assert lowered.attrs["shared_bytes"] == 32 * 64 * 4
    k = tilecore.compile(kernel(), target="cpu")
    a = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    b = np.full((64, 64), np.nan, np.float32)
    k(a, b)
    np.testing.assert_array_equal(b, 2 * a)


def _onchip(shared_rows: int, frag_rows: int):
    @T.prim_func
    def onchip(X: T.Tensor((512, 256), "float32"), Y: T.Tensor((512, 256), "float32")):
        with T.Kernel(1, threads=256) as bx:
            S = T.alloc_shared((shared_rows, 256), "float32")
            F = T.alloc_fragment((frag_rows, 256), "float32")
            T.copy(X[0:shared_rows, :], S)
            T.copy(S[0:frag_rows, :], F)
            for i, j in T.Parallel(frag_rows, 256):
                tmp = T.alloc_local((1,), "float32")  # inside a parallel loop: a thread's own, not counted
                tmp[0] = F[i, j] * 2.0 + F[0, j] * 0.0  # F[0, j]: not this thread's element, so F stays in block memory
                F[i, j] = tmp[0]
            T.copy(F, Y[0:frag_rows, :])

    return onchip


def test_memory_planning_counts_every_block_buffer_and_names_them():
    from tilecore.compiler import lower
    from tilecore.errors import UnsupportedFeatureError

    # 64 KiB shared + 16 KiB fragment (in block memory: see _onchip): fits the 160 KiB of cuda:sm_80, counted together
    lowered = lower(_onchip(64, 16), "cuda:sm_80")[2]
    assert lowered.attrs["fragment_layouts"]["F"].startswith("shared")
    assert lowered.attrs["shared_bytes"] == 64 * 1024 + 16 * 1024
    # 128 KiB shared + 64 KiB fragment = 192 KiB > 163 KiB: refused, the buffers and the limit named
    with pytest.raises(UnsupportedFeatureError) as e:
        lower(_onchip(128, 64), "cuda:sm_80")
    msg = str(e.value)
    assert e.value.feature == "limit:max_shared_bytes_per_block"
    assert "196608 bytes" in msg and "S 131072 B shared" in msg and "F 65536 B fragment" in msg and "166912" in msg
    assert "tmp" not in msg.split(" needs ", 1)[1]  # the local inside the parallel loop is a thread's own
