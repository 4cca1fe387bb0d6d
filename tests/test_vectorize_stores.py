"""Vector stores of register fragments (tilecore.vectorize_stores, D32): the general path's epilogue.

Where a fragment's layout keeps consecutive elements of a row in consecutive registers and the prover shows the
address aligned to the vector and the store's condition the same over the run, the per-thread program stores
the run as one access; everywhere else it stores elements as before. Checked through ``tilecore.compile`` and
the generated code run on the host (tests/cuda_host_emulator.py, whose ``tc_vst`` fails on a misaligned vector,
as a GPU would), for ragged shapes (the predicate splits a run), odd row lengths (alignment fails) and every
output dtype the emulator has; a mutation (the proof of alignment skipped) must be caught by the emulator.
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T

tilecore_cuda = pytest.importorskip("tilecore_cuda")
sys.path.insert(0, str(Path(__file__).parent))
from cuda_host_emulator import run_on_host  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")
# the general path's stores to global memory: without D51's default bulk store (its tile's stores: test_general_gemm)
GENERAL = {**NOCACHE, "tilecore.cuda.register_programs": False, "tilecore.bulk_store": False}


def gemm(M, N, K, out="float16", bm=64, bn=64, bk=32, threads=128):
    """The general path's GEMM (mma.sync accumulators: pairs of consecutive columns per register run)."""

    @T.prim_func
    def k(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), out)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])

    return k


def gemm_at(M, N, K, col=1, bm=64, bn=64, bk=32):
    """The GEMM with C stored at column ``col`` of a (M, N + 2) tensor (one block column: no tail guard
    in N), so an odd ``col`` puts every pair at an odd element."""

    @T.prim_func
    def k(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N + 2), "float16")):
        with T.Kernel(1, T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, 0], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, col])

    return k


def _body(k) -> str:
    return k.get_kernel_source().split('extern "C"')[1]


def _vector_widths(k) -> list:
    """The lanes of every vector store in the kernel's body (a packed pair counts 2 per pair type)."""
    out = []
    for vt in re.findall(r"tc_vst<(.*?)>\(", _body(k)):
        m = re.match(r"tc_vecn<(.*), (\d+)>$", vt)
        if m is None:
            out.append(2)  # __half2 / __nv_bfloat162
        else:
            out.append(int(m.group(2)) * (2 if m.group(1).endswith("2") else 1))
    return out


def _ref_gemm(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


# -- what is emitted ---------------------------------------------------------------------------------------

def test_gemm_epilogue_stores_pairs():
    """4096^3 at 128x256x64 (the benchmark's general-path kernel): 64 pair stores per thread, no element stores
    of C, with the one-instruction pair conversion; and the launch checks C's alignment."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from cuda_offpath import gemm_777

    k = tilecore.compile(gemm_777(4096, 4096, 4096, 128, 256, 64, 256, 3), target="cuda:sm_90a",
                         pass_configs=GENERAL)
    body = _body(k)
    assert body.count("tc_vst<__half2>(&C[") == 64
    assert body.count("__floats2half2_rn(C_local[") == 64
    assert not re.search(r"\bC\[[^\]]*\] = ", body)  # no element store of C left
    assert 2 in k.source.meta["aligned_args"]
    off = tilecore.compile(gemm_777(4096, 4096, 4096, 128, 256, 64, 256, 3), target="cuda:sm_90a",
                           pass_configs={**GENERAL, "tilecore.vectorize": False})
    # each element stored with one conversion (D55's tilecore.store_cast_once, on where the target has bulk tile
    # copies: the same bits as the rounding round trip it replaced)
    assert "tc_vst" not in off.get_kernel_source() and _body(off).count("__float2half_rn(C_local[") == 128


def test_odd_row_length_keeps_element_stores():
    """777 columns: a row's start is not a multiple of 2 elements, so no pair is proven aligned."""
    k = tilecore.compile(gemm(128, 777, 64), target="cuda:sm_80", pass_configs=GENERAL)
    assert "tc_vst" not in k.get_kernel_source()
    assert 2 not in k.source.meta["aligned_args"]


def test_ir_dump_shows_the_vector(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECORE_DUMP_IR", str(tmp_path))
    tilecore.compile(gemm(128, 128, 64), target="cuda:sm_80", pass_configs=GENERAL)
    text = next(tmp_path.rglob("*vectorize_stores.ir")).read_text()
    assert ":+2] = T.vector(" in text


# -- run on the host --------------------------------------------------------------------------------------

@needs_toolchain
@needs_gxx
@pytest.mark.parametrize("M,N,K,out", [
    (128, 128, 64, "float16"),   # whole tiles: every pair a vector
    (100, 126, 40, "float16"),   # ragged: N even, tail guard uniform over pairs
    (64, 77, 32, "float16"),     # odd row length: elements
    (64, 128, 32, "bfloat16"),
    (64, 96, 32, "float32"),
])
def test_emulated_gemm_epilogue(M, N, K, out):
    k = tilecore.compile(gemm(M, N, K, out), target="cuda:sm_80", pass_configs=GENERAL)
    widths = _vector_widths(k)
    assert bool(widths) == (N % 2 == 0), (N, widths)
    rng = np.random.default_rng(M * N + K)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    npout = {"float16": np.float16, "float32": np.float32, "bfloat16": np.uint16}[out]
    c = np.full((M, N), 0x7E00 if out == "bfloat16" else np.nan, npout) if out == "bfloat16" else \
        np.full((M, N), np.nan, npout)
    got = run_on_host(k, [a, b, c])[2]
    if out == "bfloat16":
        got = (got.astype(np.uint32) << 16).view(np.float32)
    ref = _ref_gemm(a, b)
    tol = {"float16": 2e-2, "bfloat16": 1e-1, "float32": 1e-3}[out]
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol * 4)


# -- mutations: the checks catch a wrong vector ------------------------------------------------------------

@needs_toolchain
@needs_gxx
def test_mutation_misaligned_vector_is_caught(monkeypatch):
    """Break the vectorizer's proofs (every offset a multiple): the GEMM stored at column 1 of a wider tensor
    then takes pairs that start at odd elements; the emulator's vector store refuses them (a GPU faults).
    Unmutated, the same kernel stores elements and computes the right result."""
    from tilecore.passes import vectorize

    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 32)).astype(np.float16)
    b = rng.standard_normal((32, 64)).astype(np.float16)
    good = tilecore.compile(gemm_at(64, 64, 32), target="cuda:sm_80", pass_configs=GENERAL)
    assert not _vector_widths(good)
    got = run_on_host(good, [a, b, np.zeros((64, 66), np.float16)])[2]
    np.testing.assert_allclose(got[:, 1:65].astype(np.float64), _ref_gemm(a, b), rtol=2e-2, atol=8e-2)
    monkeypatch.setattr(vectorize, "_multiple", lambda facts, e, n: True)
    bad = tilecore.compile(gemm_at(64, 64, 32), target="cuda:sm_80", pass_configs=GENERAL)
    assert _vector_widths(bad)
    with pytest.raises(RuntimeError, match="vector store address not aligned"):
        run_on_host(bad, [a, b, np.zeros((64, 66), np.float16)])


@needs_toolchain
@needs_gxx
def test_mutation_vector_values_swapped_is_caught(monkeypatch):
    """Swap the two values of every pair: the result check sees it (the unmutated code passes above)."""
    from tilecore.passes import vectorize

    orig = vectorize.VectorStore

    def swapped(buffer, indices, values, fallback, **kw):
        return orig(buffer, indices, tuple(reversed(values)), fallback, **kw)

    monkeypatch.setattr(vectorize, "VectorStore", swapped)
    k = tilecore.compile(gemm(64, 64, 32), target="cuda:sm_80", pass_configs=GENERAL)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 32)).astype(np.float16)
    b = rng.standard_normal((32, 64)).astype(np.float16)
    got = run_on_host(k, [a, b, np.zeros((64, 64), np.float16)])[2].astype(np.float64)
    assert not np.allclose(got, _ref_gemm(a, b), rtol=2e-2, atol=8e-2)


def accumulate(M, N, K, read_next=False, bm=64, bn=64, bk=32):
    """C += A @ B, the epilogue reading C at the element it writes (``read_next``: at the next column)."""

    @T.prim_func
    def k(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            for i, j in T.Parallel(bm, bn):
                if read_next:
                    C[by * bm + i, bx * bn + j] = C_l[i, j] + C[by * bm + i, T.min(bx * bn + j + 1, N - 1)]
                else:
                    C[by * bm + i, bx * bn + j] = C_l[i, j] + C[by * bm + i, bx * bn + j]

    return k


def test_value_reading_the_next_element_keeps_element_stores():
    """A value that reads an element another store of the run writes (here the next column) keeps element
    stores: a vector computes both values before writing either."""
    k = tilecore.compile(accumulate(64, 64, 32, read_next=True), target="cuda:sm_80", pass_configs=GENERAL)
    assert not _vector_widths(k)


@needs_toolchain
@needs_gxx
def test_emulated_accumulate_into_c():
    """C = C + acc reads only the element each store writes: pairs, and the right result."""
    k = tilecore.compile(accumulate(64, 64, 32), target="cuda:sm_80", pass_configs=GENERAL)
    assert _vector_widths(k)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 32)).astype(np.float16)
    b = rng.standard_normal((32, 64)).astype(np.float16)
    c0 = rng.standard_normal((64, 64)).astype(np.float32)
    got = run_on_host(k, [a, b, c0.copy()])[2].astype(np.float64)
    np.testing.assert_allclose(got, _ref_gemm(a, b) + c0, rtol=1e-3, atol=1e-3)
