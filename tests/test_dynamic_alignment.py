"""Divisibility in the core prover and the alignment of asynchronous copies with dynamic shapes (D20).

- ``tilecore.ir.bounds.Facts.divisor`` is sound: on random index expressions, every divisor it claims divides
  the value at every point of the variables' ranges (exhaustively);
- ``T.Pipelined`` copies from tensors whose row length is a shape symbol are *versioned* by the planner: ``if
  n % k == 0`` the wide asynchronous copies, else the copies proven without it; the generated CUDA and HIP
  kernels run on the host emulators (cp.async / global_load_lds checked for alignment) with shapes that take
  each branch, and match float64;
- mutation: the same kernel with its version test flipped is caught by the emulator;
- ``if K % 8 == 0:`` around the loop and ``T.assume(K % 8 == 0)`` are facts: no version test is needed then.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.compiler import lower

sys.path.insert(0, str(Path(__file__).parent))

NOCACHE = {"tilecore.disable_cache": True}


# -- the prover ----------------------------------------------------------------------------------------------

def _divisor_counterexamples(divisor, trials: int = 500):
    """Random index expressions over loop variables (small ranges), free symbols constrained by ``x % k == 0``
    conditions and a scalar bound to ``n0 * c``: ``(wrong claims, non-trivial claims)`` of ``divisor(facts, e)``,
    each claim checked at every point."""
    from tilecore.ir import IntImm, Var, as_expr, binary, compare
    from tilecore.ir.bounds import Facts

    ops = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b, "min": min, "max": max,
           "shl": lambda a, b: a << b}
    rnd = random.Random(11)
    nontrivial, wrong = 0, []
    for _ in range(trials):
        loops = [Var(f"i{k}") for k in range(2)]
        syms = [Var(f"n{k}") for k in range(2)]
        bound = Var("b")
        facts = Facts()
        ranges = {}
        for v in loops:
            lo, n = rnd.randint(-3, 3), rnd.randint(0, 5)
            facts = facts.with_range(v, as_expr(lo), as_expr(lo + n))
            ranges[id(v)] = range(lo, lo + n + 1)
        mods = {}
        for v in syms:
            k = rnd.choice([1, 2, 4, 8])
            if k > 1:
                facts = facts.with_cond(compare("eq", binary("floormod", v, k), 0))
            mods[id(v)] = k
            ranges[id(v)] = [x for x in range(-8, 9) if x % k == 0]
        scale = rnd.choice([1, 2, 3, 4, 8])
        facts = facts.with_range(bound, binary("mul", syms[0], scale), binary("mul", syms[0], scale))
        atoms = loops + syms + [bound]

        def build(depth=0):
            if depth > 2 or rnd.random() < 0.3:
                return rnd.choice(atoms + [IntImm(rnd.choice([0, 1, 2, 4, 6, 8, 12, 16]))])
            op = rnd.choice(list(ops))
            if op in ("floordiv", "floormod"):
                rhs = IntImm(rnd.choice([2, 3, 4, 8]))
            elif op == "shl":
                rhs = IntImm(rnd.randint(0, 3))
            else:
                rhs = build(depth + 1)
            return binary(op, build(depth + 1), rhs)

        e = build()
        if isinstance(e, IntImm):
            continue
        d = divisor(facts, e)
        nontrivial += d not in (0, 1)
        free = [v for v in loops + syms]
        for vals in itertools.product(*[ranges[id(v)] for v in free]):
            env = dict(zip((id(v) for v in free), vals))
            env[id(bound)] = env[id(syms[0])] * scale

            def ev(x):
                if isinstance(x, Var):
                    return env[id(x)]
                if isinstance(x, IntImm):
                    return x.value
                return ops[x.op](ev(x.a), ev(x.b))

            v = ev(e)
            if not ((v == 0) if d == 0 else v % d == 0):
                wrong.append(f"divisor({e}) = {d} but the value is {v} at {vals}")
                break
    return wrong, nontrivial


def test_divisor_is_sound_on_random_expressions():
    """Every ``k`` the prover says divides ``e`` divides it at every point, and it finds a good share of
    non-trivial divisors."""
    wrong, nontrivial = _divisor_counterexamples(lambda facts, e: facts.divisor(e))
    assert not wrong, wrong[:5]
    assert nontrivial > 100, nontrivial


def test_the_divisor_check_catches_a_wrong_prover():
    """Mutations: a prover that claims twice its divisors, and one that takes a loop variable's start as its
    divisor, are both caught by the check above."""
    from tilecore.ir import Var
    from tilecore.ir.bounds import Facts

    wrong, _ = _divisor_counterexamples(lambda facts, e: 2 * facts.divisor(e), trials=100)
    assert wrong

    class LoopStartsDivide(Facts):
        def _atom_divisor(self, a, depth):
            r = self.ranges.get(id(a)) if isinstance(a, Var) else None
            if r is not None:
                return self.divisor(r[1], depth + 1)  # wrong: a loop variable takes every value in its range
            return super()._atom_divisor(a, depth)

    wrong, _ = _divisor_counterexamples(
        lambda facts, e: LoopStartsDivide(facts.ranges, facts.known, facts.divs).divisor(e), trials=200)
    assert wrong




def test_proves_multiple_conditions_and_their_negation():
    from tilecore.ir import Var, binary, compare, logic_and, logic_not
    from tilecore.ir.bounds import Facts

    n, m = Var("n"), Var("m")
    even = compare("eq", binary("floormod", n, 8), 0)
    f = Facts().with_cond(logic_and(even, compare("eq", binary("floormod", m, 4), 0)))
    assert f.proves(compare("eq", binary("floormod", binary("add", binary("mul", n, 3), binary("mul", m, 2)), 8), 0))
    assert not f.proves(compare("eq", binary("floormod", binary("add", n, m), 8), 0))
    assert not Facts().with_cond(even, False).proves(even)  # the else branch knows nothing of the kind
    assert Facts().with_cond(logic_not(compare("ne", binary("floormod", n, 8), 0))).proves_multiple(n, 8)


# -- versioned copies ----------------------------------------------------------------------------------------

def dyn_gemm(bm=64, bn=64, bk=32, stages=3, dtype="float16", guard_k=False, assume_k=False):
    """C = A @ B with M, N and K shape symbols (a generic-path GEMM: 64x64 tiles, a T.Pipelined K loop)."""
    M, N, K = T.dynamic("M"), T.dynamic("N"), T.dynamic("K")

    @T.prim_func
    def kernel(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            if assume_k:
                T.assume(K % 8 == 0)
            if guard_k:
                if K % 8 == 0:
                    for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                        T.copy(A[by * bm, ko * bk], A_s)
                        T.copy(B[ko * bk, bx * bn], B_s)
                        T.gemm(A_s, B_s, C_l)
            else:
                for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                    T.copy(A[by * bm, ko * bk], A_s)
                    T.copy(B[ko * bk, bx * bn], B_s)
                    T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])

    return kernel


def _note(k) -> str:
    (note,) = k.meta["attrs"]["pipelines"]
    return note


def _toolchain(target):
    if target.startswith("cuda"):
        pytest.importorskip("tilecore_cuda")
        from test_cuda_backend import needs_toolchain  # noqa: F401 - the marker's condition

        if shutil.which("g++") is None:
            pytest.skip("the CUDA host emulator needs g++ (C++20)")
        from cuda_host_emulator import run_on_host
    else:
        pytest.importorskip("tilecore_hip")
        import hip_host_emulator

        if hip_host_emulator.compiler() is None:
            pytest.skip("the HIP host emulator needs clang++")
        run_on_host = hip_host_emulator.run_on_host
    return run_on_host


def _run(k, run, M, N, K, dtype, seed=5):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    out = run(k, [a, b, np.full((M, N), np.nan, np.float32)], ints={"M": M, "N": N, "K": K})
    ref = a.astype(np.float64) @ b.astype(np.float64)
    bound = 1e-5 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))) + 1e-5
    err = np.abs(out[2].astype(np.float64) - ref)
    assert (err <= bound).all(), f"max error {err.max()} at {np.unravel_index(err.argmax(), err.shape)}"


@pytest.mark.parametrize("target,dtype", [("cuda:sm_80", "float16"), ("cuda:sm_80", "float32"),
                                          ("hip:gfx950", "float16")])
def test_dynamic_row_lengths_are_versioned_and_both_branches_run(target, dtype):
    run = _toolchain(target)
    k = tilecore.compile(dyn_gemm(dtype=dtype), target=target, pass_configs=NOCACHE)
    run_elems = 16 // np.dtype(dtype).itemsize
    note = _note(k)
    assert f"A_s async 16-byte copies where K % {run_elems} == 0, else " in note, note
    assert f"B_s async 16-byte copies where N % {run_elems} == 0, else " in note, note
    src = k.get_kernel_source()
    assert f"K, {run_elems}) == 0)" in src and f"N, {run_elems}) == 0)" in src  # the version tests
    if target.startswith("cuda"):  # the launch refuses A or B unless 16-byte aligned, as for static shapes
        assert k.source.meta["aligned_args"] == [0, 1]
    # K and N multiples of the run (the wide copies), then neither (the copies proven without it); ragged M
    for M, N, K in ((70, 72, 96), (33, 77, 90)):
        _run(k, run, M, N, K, dtype)


def test_flipped_version_test_is_caught():
    """Mutation: the wide copies taken when the row length is *not* a multiple of the run read misaligned
    16-byte chunks; the emulator's cp.async check stops the kernel (the unmutated kernel passes above)."""
    run = _toolchain("cuda:sm_80")
    k = tilecore.compile(dyn_gemm(dtype="float16"), target="cuda:sm_80", pass_configs=NOCACHE)
    code = k.source.code.replace("K, 8) == 0)", "K, 8) != 0)").replace("N, 8) == 0)", "N, 8) != 0)")
    assert code.count(", 8) != 0)") >= 2
    mutant = types.SimpleNamespace(source=dataclasses.replace(k.source, code=code))
    with pytest.raises(RuntimeError, match="cp.async address not aligned to its size"):
        _run(mutant, run, 70, 77, 90, "float16")


@pytest.mark.parametrize("how", ["guard_k", "assume_k"])
def test_a_known_divisibility_needs_no_version(how):
    """Inside ``if K % 8 == 0:`` (or after ``T.assume(K % 8 == 0)``) A's copies are wide without a test; B's
    rows (N) still get one."""
    pytest.importorskip("tilecore_cuda")
    _, _, lowered, source, _ = lower(dyn_gemm(dtype="float16", **{how: True}), "cuda:sm_80", NOCACHE)
    (note,) = lowered.attrs["pipelines"]
    assert "A_s async 16-byte copies, B_s async 16-byte copies where N % 8 == 0" in note, note
    tests = source.code.split('extern "C"')[1].count("K, 8) == 0)")
    assert tests == (1 if how == "guard_k" else 0)  # the user's own if, and no version test of the planner
    assert "T.assume" not in lowered.script()  # consumed by tilecore.guard_accesses


def test_assume_is_checked_in_checked_mode_and_elides_guards():
    """``T.assume`` (in the kernel and before it) removes the guards it makes redundant (cpu); checked mode
    asserts it and names it."""
    from tilecore.errors import TilecoreError

    n = T.dynamic("n")

    @T.prim_func
    def gather(A: T.Tensor((n,), "float32"), B: T.Tensor((64,), "float32"), off: T.int32):
        T.assume(off >= 0)  # before the kernel: a promise about the parameters
        with T.Kernel(1) as bx:
            for i in T.Parallel(64):
                T.assume(off + i < n)
                B[i] = A[off + i]

    _, _, lowered, _, _ = lower(gather, "cpu", NOCACHE)
    assert "T.if_then_else" not in lowered.script()
    k = tilecore.compile(gather, target="cpu", pass_configs={**NOCACHE, "tilecore.checked": True})
    a, b = np.arange(80, dtype=np.float32), np.zeros(64, np.float32)
    k(a, b, 10)
    assert (b == a[10:74]).all()
    with pytest.raises(TilecoreError, match=r"T\.assume"):
        k(a, b, 30)
