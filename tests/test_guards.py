"""Bounds guards on global accesses (elided where proven) and the checked mode, through the public API.

Guards: TileLang kernels rely on global loads and stores outside a tensor being skipped (loads give 0);
a ragged grid (``T.ceildiv(M, blk)`` with ``M % blk != 0``) must not touch memory past the tensor, which
the tests check with canaries: the tensor is a view of a bigger array whose tail must stay unchanged.
Elision: a kernel whose bounds are provable has no guard in its generated source (performance).
Checked mode: an out-of-range access raises KernelRuntimeError naming the buffer, the index and the line.
"""
from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.errors import KernelRuntimeError

NOCACHE = {"tilecore.disable_cache": True}
TARGETS = ["cpu", "webgpu"]


def _webgpu_ok() -> bool:
    try:
        from tilecore_webgpu.runtime import adapters

        return bool(adapters())
    except ImportError:
        return False


def _skip_without(target):
    if target == "webgpu" and not _webgpu_ok():
        pytest.skip("no WebGPU adapter here (scripts/setup.sh installs lavapipe)")


def rows_times_two(M, N, blk):
    """The top-k-like repro: a block of ``blk`` rows per block over ``ceildiv(M, blk)`` blocks."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, blk), threads=128) as bx:
            for i, j in T.Parallel(blk, N):
                B[bx * blk + i, j] = A[bx * blk + i, j] * 2.0

    return main


def copy_tiles(M, N, bm):
    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, bm), threads=128) as bx:
            s = T.alloc_shared((bm, N), "float32")
            T.copy(A[bx * bm, 0], s)
            T.copy(s, B[bx * bm, 0])

    return main


def kernel_body(k) -> str:
    """The generated kernel function without the backend's prelude (helpers have `if`s of their own)."""
    src = k.get_kernel_source()
    return src[src.index("tc_kernel("):]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("blk", [128, 256])
def test_ragged_rows_touch_nothing_outside_the_tensor(target, blk):
    _skip_without(target)
    M, N = 320, 16
    k = tilecore.compile(rows_times_two(M, N, blk), target=target, pass_configs=NOCACHE)
    rng = np.random.default_rng(blk)
    a_big = rng.standard_normal((M + blk, N)).astype(np.float32)  # rows past M: values the kernel must not read
    b_big = np.full((M + blk, N), -7.0, np.float32)                # rows past M: canaries
    k(a_big[:M], b_big[:M])
    np.testing.assert_array_equal(b_big[:M], 2 * a_big[:M])
    np.testing.assert_array_equal(b_big[M:], -7.0)


@pytest.mark.parametrize("target", TARGETS)
def test_loads_outside_a_tensor_give_zero_and_the_store_still_happens(target):
    _skip_without(target)

    @T.prim_func
    def shifted(A: T.Tensor((10,), "float32"), B: T.Tensor((16,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            for i in T.Parallel(16):
                B[i] = A[i - 3] + 1.0  # A[-3..-1] and A[10..12] are outside A

    k = tilecore.compile(shifted, target=target, pass_configs=NOCACHE)
    a_big = np.full(30, 100.0, np.float32)
    a = a_big[10:20]
    a[:] = np.arange(10, dtype=np.float32)
    b = np.zeros(16, np.float32)
    k(a, b)
    want = np.array([0, 0, 0, *range(10), 0, 0, 0], np.float32) + 1.0
    np.testing.assert_array_equal(b, want)


@pytest.mark.parametrize("target", TARGETS)
def test_ragged_tile_copies_touch_nothing_outside_the_tensor(target):
    _skip_without(target)
    M, N = 200, 32
    k = tilecore.compile(copy_tiles(M, N, 128), target=target, pass_configs=NOCACHE)
    a = np.arange(M * N, dtype=np.float32).reshape(M, N)
    b_big = np.full((M + 128, N), -7.0, np.float32)
    k(a, b_big[:M])
    np.testing.assert_array_equal(b_big[:M], a)
    np.testing.assert_array_equal(b_big[M:], -7.0)


@pytest.mark.parametrize("target", ["cpu", "webgpu", "cuda:sm_90a"])
def test_no_guard_where_the_bounds_are_proven(target):
    """Divisible static shapes: the rows kernel and the tile copies compile without any bounds test."""
    if target.startswith("cuda"):
        pytest.importorskip("tilecore_cuda")
    _skip_without(target)
    for func in (rows_times_two(512, 16, 128), copy_tiles(1024, 64, 128)):
        body = kernel_body(tilecore.compile(func, target=target, pass_configs=NOCACHE))
        assert not re.search(r"< *(512|1024)\b", body), body  # no `row < M` test anywhere


def test_no_guard_for_a_loop_over_a_symbolic_extent():
    N = T.dynamic("N")

    @T.prim_func
    def scale(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.serial(N):
                B[i] = A[i] * 3.0

    k = tilecore.compile(scale, target="cpu", pass_configs=NOCACHE)
    assert "?" not in kernel_body(k) and "if ((" not in kernel_body(k), kernel_body(k)
    a = np.arange(5, dtype=np.float32)
    b = np.zeros(5, np.float32)
    k(a, b)
    np.testing.assert_array_equal(b, 3 * a)


@pytest.mark.parametrize("target", ["cpu", "webgpu", "cuda:sm_90a"])
def test_guard_present_where_the_grid_overhangs(target):
    if target.startswith("cuda"):
        pytest.importorskip("tilecore_cuda")
    _skip_without(target)
    body = kernel_body(tilecore.compile(rows_times_two(320, 16, 128), target=target, pass_configs=NOCACHE))
    assert re.search(r"if \(.*< 320", body), body


# -- checked mode --------------------------------------------------------------------------------------

def _line_of(func, text: str) -> int:
    lines, first = inspect.getsourcelines(func)
    return first + next(k for k, ln in enumerate(lines) if text in ln)


def shared_overrun():
    @T.prim_func
    def overrun(A: T.Tensor((16,), "float32"), B: T.Tensor((16,), "float32"), n: T.int32):
        with T.Kernel(1, threads=32) as bx:
            s = T.alloc_shared((16,), "float32")
            for i in T.serial(16):
                s[i] = A[i]
            for i in T.serial(16):
                s[i + n] = 1.0  # overruns s when n > 0
            for i in T.serial(16):
                B[i] = s[i]

    return overrun


def global_overread():
    @T.prim_func
    def overread(A: T.Tensor((8, 16), "float32"), B: T.Tensor((8, 16), "float32")):
        with T.Kernel(2, threads=32) as bx:
            for i, j in T.Parallel(8, 16):
                B[i, j] = A[bx * 4 + i, j]  # rows 8..11 of A for bx == 1

    return overread


@pytest.mark.parametrize("target", TARGETS)
def test_checked_mode_names_buffer_index_and_line_of_a_shared_overrun(target):
    _skip_without(target)
    k = tilecore.compile(shared_overrun(), target=target, pass_configs={**NOCACHE, "tilecore.checked": True})
    line = _line_of(shared_overrun, "s[i + n] = 1.0")
    with pytest.raises(KernelRuntimeError) as e:
        k(np.ones(16, np.float32), np.zeros(16, np.float32), 3)
    msg = str(e.value)
    m = re.search(r"out-of-bounds store s\[(\d+)\]: shared buffer s has shape \(16,\) \(at (\S+):(\d+) in overrun\)", msg)
    assert m, msg
    assert 16 <= int(m.group(1)) <= 18 and m.group(2) == __file__ and int(m.group(3)) == line
    # in bounds, the checked kernel runs and computes
    b = np.zeros(16, np.float32)
    k(np.arange(16, dtype=np.float32), b, 0)
    np.testing.assert_array_equal(b, 1.0)


@pytest.mark.parametrize("target", TARGETS)
def test_checked_mode_names_a_global_overread(target, monkeypatch):
    _skip_without(target)
    func = global_overread()
    args = (np.ones((8, 16), np.float32), np.zeros((8, 16), np.float32))
    tilecore.compile(func, target=target)(*args)  # unchecked: the guard reads 0, no error
    monkeypatch.setenv("TILECORE_CHECKED", "1")  # the environment switch, and a different cache entry
    k = tilecore.compile(func, target=target)
    with pytest.raises(KernelRuntimeError) as e:
        k(*args)
    m = re.search(r"out-of-bounds load A\[(\d+), (\d+)\]: global buffer A has shape \(8, 16\) \(at \S+:(\d+) ", str(e.value))
    assert m, str(e.value)
    assert 8 <= int(m.group(1)) <= 11 and 0 <= int(m.group(2)) < 16
    assert int(m.group(3)) == _line_of(global_overread, "B[i, j] = A[bx * 4 + i, j]")


def test_checked_mode_cuda_source_records_the_fault(monkeypatch):
    pytest.importorskip("tilecore_cuda")
    k = tilecore.compile(shared_overrun(), target="cuda:sm_90a", pass_configs={**NOCACHE, "tilecore.checked": True})
    src = k.get_kernel_source()
    assert "atomicCAS(tc_status, 0, " in src and "tc_v[0]" in src
    entry = k.source.meta["asserts"][0]
    assert entry["values"] == 2 and "out-of-bounds" in entry["message"]


def test_the_bounds_prover_never_proves_a_false_comparison():
    """Soundness of tilecore.ir.bounds on random index expressions over small loop ranges (exhaustive check
    of every proven comparison); elision rests on it."""
    import itertools
    import random

    from tilecore.ir import IntImm, Var, as_expr, binary, compare
    from tilecore.ir.bounds import Facts

    ops = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b, "min": min, "max": max,
           "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}
    rnd = random.Random(7)
    proved = 0
    for _ in range(1500):
        vs = [Var(f"v{k}") for k in range(3)]
        ranges = [(rnd.randint(-3, 3), rnd.randint(0, 5)) for _ in vs]
        facts = Facts()
        for v, (lo, n) in zip(vs, ranges):
            facts = facts.with_range(v, as_expr(lo), as_expr(lo + n))

        def build(depth=0):
            if depth > 2 or rnd.random() < 0.3:
                return rnd.choice(vs + [IntImm(rnd.randint(-5, 9))])
            op = rnd.choice(["add", "sub", "mul", "floordiv", "floormod", "min", "max"])
            rhs = IntImm(rnd.randint(1, 4)) if op in ("mul", "floordiv", "floormod") else build(depth + 1)
            return binary(op, build(depth + 1), rhs)

        cond = compare(rnd.choice(["lt", "le", "gt", "ge"]), build(), IntImm(rnd.randint(-2, 12)))
        if isinstance(cond, IntImm) or not facts.proves(cond):
            continue
        proved += 1
        for vals in itertools.product(*[range(lo, lo + n + 1) for lo, n in ranges]):
            env = {id(v): x for v, x in zip(vs, vals)}

            def ev(x):
                if isinstance(x, Var):
                    return env[id(x)]
                if isinstance(x, IntImm):
                    return x.value
                return ops[x.op](ev(x.a), ev(x.b))

            assert ev(cond), f"proved {cond} but it fails at {vals} (ranges {ranges})"
    assert proved > 200  # the prover proves a good share of them
