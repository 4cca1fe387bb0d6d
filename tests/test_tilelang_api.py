"""TileLang's API around T, through the public interface: eager @tilecore.jit (T.const, T.empty),
tilecore.profiler / autotuner / testing / math / layout / utils.tensor, PassConfigKey's TileLang names,
the errors for what tilecore does not provide, and two semantic fixes (lazy `x if c else y`, autotune
keeping the caller's arguments). All on the cpu target."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.errors import ArgumentError, CompileError, NotProvidedError, ParseError


@tilecore.jit(target="cpu")
def add_scaled(A, B, alpha=2.0, block=64, dtype=T.float32):
    N = T.const("N")
    A: T.Tensor((N,), dtype)
    B: T.Tensor((N,), dtype)
    C = T.empty((N,), dtype)
    with T.Kernel(T.ceildiv(N, block)) as bx:
        for i in T.Parallel(block):
            if bx * block + i < N:
                C[bx * block + i] = A[bx * block + i] * alpha + B[bx * block + i]
    return C


@tilecore.jit(target="cpu")
def matmul(A, B, block_M, block_N, block_K, dtype=T.float32, accum_dtype=T.float32):
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((K, N), dtype)
    C = T.empty((M, N), dtype)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
        A_shared = T.alloc_shared((block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        T.clear(C_local)
        for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
            T.copy(A[by * block_M, k * block_K], A_shared)
            T.copy(B[k * block_K, bx * block_N], B_shared)
            T.gemm(A_shared, B_shared, C_local)
        T.copy(C_local, C[by * block_M, bx * block_N])
    return C


@tilecore.jit(target="cpu")
def row_stats(X, dtype=T.float32):
    M, N = T.const("M N")
    X: T.Tensor((M, N), dtype)
    S = T.empty((M,), dtype)
    Mx = T.empty((M,), dtype)
    with T.Kernel(M) as bx:
        for j in T.serial(1):
            S[bx] = 0.0
            Mx[bx] = X[bx, 0]
        for j in T.serial(N):
            S[bx] = S[bx] + X[bx, j]
            Mx[bx] = T.max(Mx[bx], X[bx, j])
    return Mx, S


def test_eager_call_binds_sizes_from_tensors_and_returns_the_output():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    np.testing.assert_allclose(add_scaled(a, b), 2.0 * a.astype(np.float64) + b, rtol=1e-6)
    np.testing.assert_allclose(add_scaled(a, b, alpha=0.5, block=128), 0.5 * a.astype(np.float64) + b, rtol=1e-6)
    a2, b2 = a[:77].copy(), b[:77].copy()                      # a new size: a new kernel, right answer
    np.testing.assert_allclose(add_scaled(a2, b2), 2.0 * a2.astype(np.float64) + b2, rtol=1e-6)


def test_eager_kernels_are_cached_per_sizes_and_compile_time_arguments():
    a, b = np.ones(300, np.float32), np.ones(300, np.float32)
    k1 = add_scaled.compile(a, b)
    assert add_scaled.compile(np.zeros(300, np.float32), b) is k1            # same sizes: same kernel
    assert add_scaled.compile(N=300) is k1                                   # sizes by keyword: the same too
    assert add_scaled.compile(a[:10].copy(), b[:10].copy()) is not k1
    assert add_scaled.compile(a, b, block=32) is not k1
    assert k1.signature["params"][0]["shape"] == [300]                      # static shapes


def test_eager_gemm_compile_with_sizes_like_tilelang_example():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((32, 48)).astype(np.float32)
    kernel = matmul.compile(M=64, N=48, K=32, block_M=32, block_N=16, block_K=16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(kernel(a, b), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(matmul(a, b, 32, 16, 16), ref, rtol=1e-5, atol=1e-5)
    assert "T.Tensor((64, 32,)" in matmul.get_tir(a, b, 32, 16, 16).script()


def test_eager_several_outputs_come_back_in_return_order():
    x = np.random.default_rng(2).standard_normal((5, 7)).astype(np.float32)
    mx, s = row_stats(x)
    np.testing.assert_allclose(mx, x.max(axis=1))
    np.testing.assert_allclose(s, x.astype(np.float64).sum(axis=1), rtol=1e-5)


def test_eager_errors_name_the_problem():
    a = np.ones(8, np.float32)
    with pytest.raises(ArgumentError, match=r"argument 'B' dim 0 is 9, but 'N' is 8 from argument 'A' dim 0"):
        add_scaled(a, np.ones(9, np.float32))
    with pytest.raises(ArgumentError, match=r"missing tensor argument 'B'"):
        add_scaled(a)
    with pytest.raises(ArgumentError, match=r"dtype float64, expected float32"):
        add_scaled(a.astype(np.float64), a.astype(np.float64))
    with pytest.raises(ParseError, match=r"the size 'M' is not determined .*compile\(M=\.\.\.\)"):
        matmul.compile(N=4, K=4, block_M=4, block_N=4, block_K=4)
    with pytest.raises(ParseError, match=r"T.const belongs to eager kernels"):
        @T.prim_func
        def bad(A: T.Tensor((4,), "float32")):
            n = T.const("n")  # noqa: F841
    with pytest.raises(CompileError, match=r"drop out_idx"):
        tilecore.jit(out_idx=[-1])(add_scaled.__wrapped__)
    with pytest.raises(ParseError, match=r"got the size blok_M=4, but it is no parameter and the body asks for no "
                                         r"T.const 'blok_M' \(its T.const sizes: K, M, N\); check the spelling"):
        matmul.compile(M=4, N=4, K=4, blok_M=4, block_M=4, block_N=4, block_K=4)


@tilecore.jit(target="cpu")
def forgets_to_return(A):
    A: T.Tensor((4,), T.float32)
    C = T.empty((4,), T.float32)
    with T.Kernel(1) as bx:
        for i in T.Parallel(4):
            C[i] = A[i]


def test_eager_output_not_returned_is_an_error():
    with pytest.raises(ParseError, match=r"the output 'C' made by T.empty is not returned"):
        forgets_to_return(np.ones(4, np.float32))


# -- x if c else y ----------------------------------------------------------------------------------

def test_conditional_expression_evaluates_only_the_taken_arm():
    def never(*_):
        raise AssertionError("the arm not taken was evaluated")

    def build(flag):
        @T.prim_func
        def k(A: T.Tensor((8,), "float32"), B: T.Tensor((8,), "float32")):
            with T.Kernel(1) as bx:
                for i in T.Parallel(8):
                    B[i] = (A[i] * 2.0 if flag else never(A)) if flag is not None else never(A)
        return k

    kern = tilecore.compile(build(True), target="cpu", out_idx=[-1])
    a = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(kern(a), 2 * a)


def test_conditional_expression_on_a_symbolic_condition_still_selects():
    @T.prim_func
    def k(A: T.Tensor((8,), "float32"), B: T.Tensor((8,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.Parallel(8):
                B[i] = A[i] if i < 4 else -A[i]

    a = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(tilecore.compile(k, target="cpu", out_idx=[-1])(a), np.where(a < 4, a, -a))


# -- autotune -----------------------------------------------------------------------------------------

def make_tuned(calls):
    @tilecore.autotune(configs=[{"block": 32, "unroll": 1}, {"block": 64, "unroll": 1}], warmup=1, rep=2)
    @tilecore.jit(out_idx=[-1], target="cpu")
    def scale(n, block=16, unroll=0):
        calls.append((block, unroll))

        @T.prim_func
        def scale_k(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
            with T.Kernel(T.ceildiv(n, block)) as bx:
                for i in T.Parallel(block):
                    if bx * block + i < n:
                        B[bx * block + i] = A[bx * block + i] * 3.0
        return scale_k
    return scale


def test_autotune_keeps_arguments_the_caller_passed(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path))
    calls = []
    tuned = make_tuned(calls)
    k = tuned(100, block=8, unroll=5)                  # every tunable argument given: no tuning
    assert calls == [(8, 5)] and k.config is None
    calls.clear()
    k = tuned(100, 8)                                  # block given positionally: only unroll is tuned
    assert calls == [(8, 1)] and k.config == {"unroll": 1}
    a = np.arange(100, dtype=np.float32)
    np.testing.assert_array_equal(k(a), 3 * a)


def test_autotune_an_eager_kernel_with_set_autotune_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path))
    from tilecore.autotuner import AutoTuner, autotune, set_autotune_inputs

    tuned = autotune(configs=[{"block": 32}, {"block": 128}], warmup=1, rep=2)(
        tilecore.jit(target="cpu")(add_scaled.__wrapped__))
    a, b = np.ones(500, np.float32), np.arange(500, dtype=np.float32)
    np.testing.assert_allclose(tuned(a, b), 2 + b)
    assert tuned.compile(a, b).config in ({"block": 32}, {"block": 128})
    with set_autotune_inputs(a, b):
        res = AutoTuner.from_kernel(make_tuned([]).jit_fn, [{"block": 32}]).set_profile_args(warmup=1, rep=1)
        assert isinstance(res, AutoTuner)


def test_autotuner_from_kernel_run():
    from tilecore.autotuner import AutoTuner

    def factory(block=16):
        @T.prim_func
        def k(A: T.Tensor((64,), "float32"), B: T.Tensor((64,), "float32")):
            with T.Kernel(T.ceildiv(64, block)) as bx:
                for i in T.Parallel(block):
                    B[bx * block + i] = A[bx * block + i] + 1.0
        return k

    result = (AutoTuner.from_kernel(factory, [{"block": 16}, {"block": 32}])
              .set_compile_args(out_idx=[-1], target="cpu").set_profile_args(warmup=1, rep=2).run())
    assert result.config in ({"block": 16}, {"block": 32}) and result.latency > 0
    np.testing.assert_array_equal(result.kernel(np.zeros(64, np.float32)), np.ones(64, np.float32))


# -- the modules around T ------------------------------------------------------------------------------

def test_profiler_do_bench_times_a_callable():
    from tilecore.profiler import do_bench

    a, b = np.ones(256, np.float32), np.ones(256, np.float32)
    ms = do_bench(lambda: add_scaled(a, b), warmup=1, rep=5)
    assert ms > 0
    qs = do_bench(lambda: add_scaled(a, b), _n_warmup=1, _n_repeat=4, quantiles=[0.5, 1.0])
    assert len(qs) == 2 and 0 < qs[0] <= qs[1]
    assert tilecore.profiler.Profiler is tilecore.Profiler


def test_tensor_supply_type_feeds_the_profiler():
    from tilecore.utils.tensor import TensorSupplyType

    k = add_scaled.compile(N=64)
    assert tilecore.TensorSupplyType is TensorSupplyType
    zeros = k.get_profiler(TensorSupplyType.Zero)._inputs(None)
    assert all(float(abs(t).sum()) == 0 for t in zeros)
    ints = k.get_profiler(TensorSupplyType.Integer)._inputs(None)
    assert all(bool((t == t.round()).all()) for t in ints)


def test_testing_helpers():
    import torch

    from tilecore.testing import set_random_seed, torch_assert_close

    set_random_seed(7)
    x = torch.randn(100)
    set_random_seed(7)
    assert torch.equal(x, torch.randn(100))
    y = x.clone()
    y[0] += 1
    torch_assert_close(x, y, max_mismatched_ratio=0.02)
    with pytest.raises(AssertionError, match=r"1 of 100 elements"):
        torch_assert_close(x, y, max_mismatched_ratio=0.0)


def test_math_helpers():
    from tilecore.math import next_power_of_2

    assert [next_power_of_2(x) for x in (1, 2, 3, 17, 64)] == [1, 2, 4, 32, 64]
    assert tilecore.cdiv(10, 3) == 4 and tilecore.math.cdiv(9, 3) == 3


def test_make_swizzled_layout_is_a_hint_that_compiles():
    from tilecore.layout import make_swizzled_layout

    @T.prim_func
    def k(A: T.Tensor((32, 32), "float32"), B: T.Tensor((32, 32), "float32")):
        with T.Kernel(1) as bx:
            S = T.alloc_shared((32, 32), "float32")
            T.annotate_layout({S: make_swizzled_layout(S)})
            T.copy(A, S)
            T.copy(S, B)

    a = np.arange(1024, dtype=np.float32).reshape(32, 32)
    np.testing.assert_array_equal(tilecore.compile(k, target="cpu", out_idx=[-1])(a), a)


def test_pass_config_key_tilelang_names():
    from tilecore.compiler import _normalize_configs

    K = tilecore.PassConfigKey
    cfg = _normalize_configs({K.TL_ENABLE_FAST_MATH: True, K.TL_DISABLE_WARP_SPECIALIZED: True,
                              K.TL_DISABLE_TMA_LOWER: True, K.TL_DEVICE_COMPILE_FLAGS: "-O2"})
    assert cfg == {"tilecore.fast_math": True, "tilecore.extra_flags": ["-O2"]}
    k = add_scaled.compile(N=16, block=16)
    assert k is not None
    fast = tilecore.jit(target="cpu", pass_configs={K.TL_ENABLE_FAST_MATH: True})(add_scaled.__wrapped__)
    assert fast.compile(N=16).meta["options"] == {"tilecore.fast_math": True}


def test_disable_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path))
    fresh = tilecore.jit(target="cpu")(add_scaled.__wrapped__)
    tilecore.disable_cache()
    try:
        assert not tilecore.is_cache_enabled()
        fresh.compile(N=40)
        assert not list(tmp_path.rglob("*.bin")) and not any(p.is_file() for p in tmp_path.rglob("*"))
    finally:
        tilecore.enable_cache()
    assert tilecore.is_cache_enabled()


# -- tilecore.carver: the compute-unit count for persistent kernels ----------------------------------------

@tilecore.jit(out_idx=[-1], target="cpu")
def persistent_copy(N, block, dtype=T.float32):
    from tilecore.carver.arch import driver

    sm_num = driver.get_num_sms()

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(sm_num) as block_id:
            for w in T.serial(T.ceildiv(T.ceildiv(N, block), sm_num)):
                tile = w * sm_num + block_id
                if tile * block < N:
                    for i in T.Parallel(block):
                        B[tile * block + i] = A[tile * block + i] + tile
    return main


def _torch_sms():
    torch = pytest.importorskip("torch")
    return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else None


def test_get_num_sms_on_the_cpu_target_sizes_a_persistent_kernel(monkeypatch):
    from tilecore.carver.arch.driver import get_num_sms

    monkeypatch.setenv("TILECORE_TARGET", "cpu")
    want = _torch_sms() or os.cpu_count()  # a CUDA device first, else the cpu profile's probed cores
    assert get_num_sms() == want
    import tilecore.carver.arch.driver as drv
    assert tilecore.carver.arch.driver is drv

    kernel = persistent_copy(1000, 64)
    a = np.arange(1000, dtype=np.float32)
    np.testing.assert_array_equal(kernel(a), a + np.arange(1000) // 64)


def test_get_num_sms_reads_a_declared_figure_from_the_targets_profile(tmp_path, monkeypatch):
    from tilecore.carver.arch.driver import get_num_sms
    from tilecore.plugin import Probe, Target, get_registry, hookimpl, reset_registry
    from tilecore.plugin.capabilities import clear_cache
    from tilecore_cpu import CPUBackend

    if _torch_sms():
        pytest.skip("a CUDA device is present: get_num_sms answers from it before the profile")
    caps = tmp_path / "x20.yaml"
    caps.write_text("schema: tilecore.capabilities/v1\nid: twenty/x20\nextends: [cpu/host]\ntarget: twenty\n"
                    "match: {arch: x20}\nexecution: {cores: 20}\n"
                    "provenance: {execution.cores: \"tilecore test fixture (a declared figure, not probed)\"}\n")

    class Twenty(CPUBackend):
        name = "twenty"

        def parse_target(self, spec):
            return Target("twenty", "twenty", "x20", (), "twenty/x20") if spec == "twenty" else None

        def targets(self):
            return ["twenty"]

        def capability_files(self):
            return [caps]

        def probe(self):
            return Probe("no-device")

    class Plugin:
        @hookimpl
        def tilecore_backends(self):
            return [Twenty()]

    monkeypatch.setenv("TILECORE_TARGET", "twenty")
    get_registry().register(Plugin(), name="twenty")
    clear_cache()  # the capability profiles are collected once; collect them again with twenty's
    try:
        assert get_num_sms() == 20
    finally:
        reset_registry()


# -- what tilecore does not provide ---------------------------------------------------------------------

def test_missing_tilelang_names_raise_a_tilecore_error_saying_what_to_use():
    with pytest.raises(NotProvidedError, match=r"T.alloc_tmem \(TileLang's\) is not provided by tilecore; instead: "
                                               r"T.alloc_fragment"):
        T.alloc_tmem
    with pytest.raises(NotProvidedError, match=r"tilecore.carver.arch.CUDA \(TileLang's\) .* instead: tilecore.autotune"):
        tilecore.carver.arch.CUDA
    with pytest.raises(NotProvidedError, match=r"tilecore.carver.MatmulTemplate \(TileLang's\) .* instead: "):
        tilecore.carver.MatmulTemplate
    with pytest.raises(NotProvidedError, match=r"T.no_such_op is not part of tilecore; docs/tilelang-compat.md"):
        T.no_such_op
    assert not hasattr(T, "no_such_op") and not hasattr(tilecore, "no_such_thing")  # still an AttributeError


def test_missing_name_in_a_kernel_names_the_line():
    with pytest.raises(ParseError, match=r"test_tilelang_api.py:\d+ in uses_missing: .*T.alloc_tmem \(TileLang's\) is "
                                         r"not provided by tilecore; instead: T.alloc_fragment"):
        @T.prim_func
        def uses_missing(A: T.Tensor((4,), "float32")):
            with T.Kernel(1) as bx:
                T.alloc_tmem((4, 4), "float32")


def test_import_stays_cheap():
    code = ("import sys, tilecore, tilecore.language, tilecore.profiler, tilecore.math, tilecore.testing, "
            "tilecore.autotuner, tilecore.layout, tilecore.utils.tensor, tilecore.carver.arch.driver; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
