"""Regression tests for bugs found in review (each names what went wrong)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.errors import UnsupportedFeatureError


def test_ampersand_on_integers_is_bitwise_not_logical():
    @T.prim_func
    def bits(A: T.Tensor((4,), "int32"), B: T.Tensor((4,), "int32")):
        with T.Kernel(1) as bx:
            for i in T.serial(4):
                B[i] = (A[i] & 6) | (A[i] << 4) ^ ~A[i]

    k = tilecore.compile(bits, target="cpu")
    a = np.array([5, 3, -7, 12], np.int32)
    b = np.zeros(4, np.int32)
    k(a, b)
    np.testing.assert_array_equal(b, (a & 6) | (a << 4) ^ ~a)


def test_statically_out_of_bounds_fill_writes_nothing():
    @T.prim_func
    def oob(B: T.Tensor((12,), "float32")):
        with T.Kernel(1) as bx:
            T.fill(B[20], 1.0)
            T.fill(B[8:16], 2.0)

    k = tilecore.compile(oob, target="cpu")
    b = np.zeros(12, np.float32)
    k(b)
    np.testing.assert_array_equal(b, [0] * 8 + [2] * 4)


def test_global_to_global_copy_skips_elements_outside_the_source():
    @T.prim_func
    def g2g(A: T.Tensor((10,), "float32"), B: T.Tensor((16,), "float32")):
        with T.Kernel(1) as bx:
            T.copy(A[4], B[0:16])

    k = tilecore.compile(g2g, target="cpu")
    a = np.arange(10, dtype=np.float32)
    b = np.full(16, -1.0, np.float32)
    k(a, b)
    np.testing.assert_array_equal(b, list(range(4, 10)) + [-1] * 10)


def test_ieee_rounding_mode_is_checked_wherever_the_value_goes():
    @T.prim_func
    def rz(A: T.Tensor((4,), "float32"), B: T.Tensor((4,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.serial(4):
                s = T.ieee_add(A[i], 1.0, rounding="rz")   # bound to a name, not stored directly
                B[i] = s

    with pytest.raises(UnsupportedFeatureError, match="feature:rounding_rz"):
        tilecore.compile(rz, target="cpu")


def test_min_and_max_value_are_finite_for_floats():
    @T.prim_func
    def extremes(B: T.Tensor((4,), "float32")):
        with T.Kernel(1) as bx:
            B[0] = T.min_value("float32")
            B[1] = T.max_value("float32")
            B[2] = T.max_value("float16")
            B[3] = T.min_value("int8")

    b = np.zeros(4, np.float32)
    tilecore.compile(extremes, target="cpu")(b)
    assert b.tolist() == [float(np.finfo(np.float32).min), float(np.finfo(np.float32).max), 65504.0, -128.0]


def test_trace_plugins_prints_hook_calls():
    env = {**os.environ, "TILECORE_TRACE_PLUGINS": "1"}
    r = subprocess.run([sys.executable, "-m", "tilecore", "targets", "list", "--json"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0
    assert "[tilecore plugins] cpu.tilecore_backends() -> [" in r.stderr


def test_pipeline_hook_returning_none_is_tolerated():
    from tilecore.plugin import get_registry, hookimpl

    class Quiet:
        @hookimpl
        def tilecore_pipeline_passes(self, target):
            return None

    reg = get_registry()
    reg.register(Quiet(), name="quiet")
    try:
        from kernels_for_tests import scale_kernel

        tilecore.compile(scale_kernel(1.5), target="cpu", pass_configs={"tilecore.disable_cache": True})
    finally:
        reg.unregister("quiet")


def test_elementwise_max_and_min_propagate_nan():
    """T.max / T.min on floats return NaN for a NaN operand, as torch.maximum / minimum (issue 9)."""
    @T.prim_func
    def mm(A: T.Tensor((4,), "float32"), B: T.Tensor((4,), "float32"), C: T.Tensor((4,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.serial(4):
                B[i] = T.max(A[i], 0.0)
                C[i] = T.min(1.0, A[i])

    k = tilecore.compile(mm, target="cpu")
    a = np.array([np.nan, -2.0, 3.0, np.nan], np.float32)
    b, c = np.zeros(4, np.float32), np.zeros(4, np.float32)
    k(a, b, c)
    np.testing.assert_array_equal(b, [np.nan, 0.0, 3.0, np.nan])
    np.testing.assert_array_equal(c, [np.nan, -2.0, 1.0, np.nan])


def _chunked_linear_attention(S, H, D, chunk):
    """TileLang's fused-chunk linear attention forward, reduced: one (batch, head) per block, a pipelined
    chunk loop named ``i``, 4-D slice copies, the scale in a T.Parallel, K^T V with transpose_A, and O
    accumulated with atomic_add of a shared tile into a global region."""
    @T.prim_func
    def linear_attn(Q: T.Tensor((1, S, H, D), "float16"), K: T.Tensor((1, S, H, D), "float16"),
                    V: T.Tensor((1, S, H, D), "float16"), O: T.Tensor((1, S, H, D), "float32"),
                    state: T.Tensor((1, H, D, D), "float32")):
        with T.Kernel(1, 1, H) as (i_v, i_k, i_bh):
            i_h = i_bh % H
            q = T.alloc_shared([chunk, D], "float16")
            k = T.alloc_shared([chunk, D], "float16")
            v = T.alloc_shared([chunk, D], "float16")
            h = T.alloc_fragment([D, D], "float32")
            h_shared = T.alloc_shared([D, D], "float16")
            s = T.alloc_fragment([chunk, chunk], "float32")
            s_shared = T.alloc_shared([chunk, chunk], "float16")
            o = T.alloc_fragment([chunk, D], "float32")
            o_shared = T.alloc_shared([chunk, D], "float32")
            T.use_swizzle(10)
            T.clear(h)
            for i in T.Pipelined(0, S // chunk):
                for row, col in T.Parallel(chunk, D):
                    q[row, col] = Q[0, i * chunk + row, i_h, col] * 0.25
                T.copy(K[0, i * chunk:(i + 1) * chunk, i_h, 0:D], k)
                T.copy(V[0, i * chunk:(i + 1) * chunk, i_h, 0:D], v)
                T.gemm(q, k, s, clear_accum=True, transpose_B=True)
                for row, col in T.Parallel(chunk, chunk):
                    s_shared[row, col] = T.if_then_else(row >= col, s[row, col], 0)
                T.gemm(s_shared, v, o, clear_accum=True)
                T.copy(h, h_shared)
                T.gemm(k, v, h, transpose_A=True)
                T.gemm(q, h_shared, o)
                T.copy(o, o_shared)
                T.atomic_add(O[0, i * chunk:(i + 1) * chunk, i_h, 0:D], o_shared)
            T.copy(h, state[0, i_h, 0:D, 0:D])
    return linear_attn


@pytest.mark.parametrize("target", ["cpu", "webgpu"])
def test_chunked_linear_attention_reads_every_row_of_each_chunk(target):
    # Seen: TileLang's linear_attn_fwd gave a wrong final_state with one chunk and O off by a constant factor:
    # the copies read row `i` (the chunk loop's variable) for every row of the chunk (name capture), and
    # kernels compiled before the fix kept coming from the cache. Small integers keep every float16 staging
    # (q * 0.25, s, h) exact, so the results must equal the float64 reference.
    if target == "webgpu":
        pytest.importorskip("tilecore_webgpu")
    S, H, D, chunk = 64, 2, 32, 32
    rng = np.random.default_rng(7)
    q, k, v = (rng.integers(-2, 3, (1, S, H, D)).astype(np.float16) for _ in range(3))
    o, state = np.zeros((1, S, H, D), np.float32), np.zeros((1, H, D, D), np.float32)
    tilecore.compile(_chunked_linear_attention(S, H, D, chunk), target=target)(q, k, v, o, state)
    qd, kd, vd = (x.astype(np.float64)[0].transpose(1, 0, 2) for x in (q, k, v))   # (H, S, D)
    o_ref = (qd @ kd.transpose(0, 2, 1) * 0.25 * np.tril(np.ones((S, S)))) @ vd
    np.testing.assert_array_equal(state[0], kd.transpose(0, 2, 1) @ vd)
    np.testing.assert_array_equal(o[0].transpose(1, 0, 2), o_ref)


def test_chunked_linear_attention_compiles_for_sm90a():
    pytest.importorskip("tilecore_cuda")
    from test_cuda_backend import HAS_TOOLCHAIN

    if not HAS_TOOLCHAIN and os.environ.get("TILECORE_CUDA_REQUIRE_TOOLCHAIN") != "1":
        pytest.skip("no CUDA compiler here (see tests/test_cuda_backend.py)")
    k = tilecore.compile(_chunked_linear_attention(64, 2, 32, 32), target="cuda:sm_90a")
    assert "linear_attn" in k.meta["source"]["code"]


@pytest.mark.parametrize("threads", ["1", "3"])
def test_cpu_block_local_memory_starts_zeroed_in_every_block(threads, tmp_path):
    """TileLang's split-K decode reduces into a fragment it never set (reduce_max with clear=False). The cpu
    reference ran it on whatever the allocator or the previous block on that OpenMP thread left there: NaN
    rows at OMP_NUM_THREADS=1, right at others. Every block now starts from zeroed block-local memory."""
    code = f"""
import numpy as np, tilecore, tilecore.language as T
@T.prim_func
def unset(A: T.Tensor((8, 4, 16), "float32"), B: T.Tensor((8, 16), "float32")):
    with T.Kernel(8) as bx:
        a = T.alloc_fragment((4, 16), "float32")
        m = T.alloc_fragment((16,), "float32")
        T.copy(A[bx, :, :], a)
        T.reduce_max(a, m, dim=0, clear=False)
        for i in T.Parallel(16):
            m[i] = m[i] + 1.0
        T.copy(m, B[bx, :])
        for i in T.Parallel(16):
            m[i] = -1.0  # what the next block on this thread would have seen
k = tilecore.compile(unset, target="cpu")
a = -np.arange(8 * 4 * 16, dtype=np.float32).reshape(8, 4, 16) - 5
b = np.full((8, 16), 7, np.float32)
k(a, b)
np.testing.assert_array_equal(b, np.ones((8, 16), np.float32))
"""
    (tmp_path / "unset.py").write_text(code)
    env = dict(os.environ, OMP_NUM_THREADS=threads)
    r = subprocess.run([sys.executable, str(tmp_path / "unset.py")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def _two_names(x):  # a function whose source the parser can read
    return x


def test_parser_code_cache_never_serves_a_freed_nodes_code():
    """The parser compiled each expression once, keyed by ``id(node)``. An augmented assignment's load is a
    node made on the spot and freed after it; a later one at the same address got the earlier one's code
    (CI: ``lse_logsum_local += ...`` evaluated ``acc_o`` of another line, now and then). Here two fresh
    nodes are made to share an address and must still give their own values."""
    import ast

    from tilecore.language.parser import Interpreter

    from tilecore.language.builder import Builder

    interp = Interpreter(_two_names, Builder("_two_names"))
    interp.layers[-1].update({"first": 1, "second": 2})
    node = ast.Name("first", ast.Load(), lineno=1, col_offset=0)
    assert interp.eval(node) == 1
    addr = id(node)
    del node
    for _ in range(10000):  # CPython reuses a freed slot for the next node of the same size (unless the
        other = ast.Name("second", ast.Load(), lineno=1, col_offset=0)  # cache keeps the first node alive)
        if id(other) == addr:
            break
    assert interp.eval(other) == 2
