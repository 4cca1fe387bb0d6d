"""Vector stores of block-level copies into global memory (tilecore.vectorize_stores on parallel nests, D47).

``T.copy(C_shared, C[...])`` lowers to a nest of parallel loops that stores one element per thread and iteration.
Where the innermost extent is a multiple of ``n`` and the prover shows every run of ``n`` aligned and stored under
one condition, each thread stores ``n`` consecutive elements (at most 16 bytes) as one access; where the values are
``n`` consecutive, aligned elements of one block buffer it reads them as one access too (``tc_vld``). Checked
through ``tilecore.compile`` and the generated code run on the host (tests/cuda_host_emulator.py: ``tc_vst`` and
``tc_vld`` fail on a misaligned address, as a GPU would) against float64 / exact references, for whole tiles, a
ragged tail, an odd row length (elements), a source at an odd column (vector stores, element reads); mutations:
the alignment proof skipped, a strided source taken as consecutive.
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

pytest.importorskip("tilecore_cuda")
sys.path.insert(0, str(Path(__file__).parent))
from cuda_host_emulator import run_on_host  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")
GENERAL = {**NOCACHE, "tilecore.cuda.register_programs": False}
NPDT = {"float16": np.float16, "float32": np.float32, "int8": np.int8}


def gemm_via_shared(M, N, K, bm=64, bn=64, bk=32, threads=128, out="float16"):
    """The GEMM whose epilogue goes through shared memory (TileLang's examples' form): C_l -> C_s -> C."""

    @T.prim_func
    def k(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), out)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            C_l = T.alloc_fragment((bm, bn), "float32")
            C_s = T.alloc_shared((bm, bn), out)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C_s)
            T.copy(C_s, C[by * bm, bx * bn])

    return k


def staged_copy(M, N, dtype="float16", col=0, pattern="copy"):
    """B = A[:, col:col + N] through one shared tile of (M, N + col); ``pattern`` "transpose": B = the tile's
    transpose (read down a column of the tile); "stride2": B[i, j] = tile[i, 2 j] (a tile of (M, 2 N))."""
    W = 2 * N if pattern == "stride2" else N + col

    @T.prim_func
    def k(A: T.Tensor((M, W), dtype), B: T.Tensor((N, M) if pattern == "transpose" else (M, N), dtype)):
        with T.Kernel(1, threads=128) as bx:
            s = T.alloc_shared((M, W), dtype)
            T.copy(A, s)
            if pattern == "transpose":
                for i, j in T.Parallel(N, M):
                    B[i, j] = s[j, i + col]
            elif pattern == "stride2":
                for i, j in T.Parallel(M, N):
                    B[i, j] = s[i, 2 * j]
            else:
                T.copy(s[0:M, col:W], B)

    return k


def _reference(a, col, pattern):
    return {"transpose": lambda: a[:, col:].T, "stride2": lambda: a[:, ::2]}.get(pattern, lambda: a[:, col:])()


def _body(k) -> str:
    return k.get_kernel_source().split('extern "C"')[1]


def _vectors(k) -> list:
    """(vector type, reads with one load) of every vector store of the kernel's body."""
    return [(m.group(1), m.group(2) is not None)
            for m in re.finditer(r"tc_vst<(tc_vecn<[^>]*>|[^<>(]*)>\(&[^;]*?(tc_vld)?[<;]", _body(k))]


# -- what is emitted ---------------------------------------------------------------------------------------

def test_shared_epilogue_stores_and_reads_16_bytes():
    """128x128 fp16 tile through shared: one 16-byte load from C_s and one 16-byte store to C per thread and
    iteration (16 iterations of 128 threads), no element store of C; the launch checks C's alignment;
    ``tilecore.vectorize=False`` gives the element copy back (128 iterations)."""
    fn = gemm_via_shared(1024, 1024, 256, bm=128, bn=128)
    k = tilecore.compile(fn, target="cuda:sm_80", pass_configs=GENERAL)
    body = _body(k)
    assert re.search(r"tc_vst<tc_vecn<__half, 8>>\(&C\[[^;]*tc_vld<tc_vecn<__half, 8>>\(&C_s\[", body)
    assert "it_6 < 16;" in body or re.search(r"< 16; \+\+it", body)
    assert not re.search(r"\bC\[[^\]]*\] = ", body)
    assert 2 in k.source.meta["aligned_args"]
    off = tilecore.compile(fn, target="cuda:sm_80", pass_configs={**GENERAL, "tilecore.vectorize": False})
    assert "tc_vst" not in _body(off) and re.search(r"\bC\[[^\]]*\] = C_s\[", _body(off))


def test_ir_dump_shows_the_vector_read(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECORE_DUMP_IR", str(tmp_path))
    tilecore.compile(staged_copy(64, 64), target="cuda:sm_80", pass_configs=NOCACHE)
    text = next(tmp_path.rglob("*vectorize_stores.ir")).read_text()
    assert re.search(r"B\[i, \(j_v \* 8\):\+8\] = T.vector\(s\[i, \(j_v \* 8\)\]:\+8\)", text), text


def test_odd_row_length_and_offsets():
    # 77 columns: no run is aligned, element stores as before, no alignment demand on B
    k = tilecore.compile(staged_copy(16, 77), target="cuda:sm_80", pass_configs=NOCACHE)
    assert not _vectors(k) and 1 not in k.source.meta["aligned_args"]
    # the source at column 1 of a wider tile: B's runs are aligned, the tile's are not: stores, element reads
    k = tilecore.compile(staged_copy(16, 64, col=1), target="cuda:sm_80", pass_configs=NOCACHE)
    assert _vectors(k) == [("tc_vecn<__half, 8>", False)]
    # float32: 4 lanes (16 bytes); int8: 8 lanes (the widest run the pass takes)
    assert _vectors(tilecore.compile(staged_copy(16, 64, "float32"), target="cuda:sm_80",
                                     pass_configs=NOCACHE)) == [("tc_vecn<float, 4>", True)]
    assert _vectors(tilecore.compile(staged_copy(16, 64, "int8"), target="cuda:sm_80",
                                     pass_configs=NOCACHE)) == [("tc_vecn<signed char, 8>", True)]
    # a transposed read: stores are consecutive, reads are not
    for pattern in ("transpose", "stride2"):
        k = tilecore.compile(staged_copy(64, 64, pattern=pattern), target="cuda:sm_80", pass_configs=NOCACHE)
        assert _vectors(k) == [("tc_vecn<__half, 8>", False)], pattern


def test_targets_without_a_vector_spelling_keep_element_stores(tmp_path, monkeypatch):
    """The C and WGSL emitters do not spell vectors: the pass leaves their copies as they were."""
    from tilecore.compiler import lower

    for target in ("cpu", "webgpu:desktop"):
        monkeypatch.setenv("TILECORE_DUMP_IR", str(tmp_path / target.replace(":", "_")))
        lower(staged_copy(64, 64), target, NOCACHE)
        text = next((tmp_path / target.replace(":", "_")).rglob("*vectorize_stores.ir")).read_text()
        assert "T.vector(" not in text and re.search(r"B\[i\w*, j\w*\] = s\[i\w*, j\w*\]", text), (target, text)


# -- run on the host --------------------------------------------------------------------------------------

def _copy_data(M, W, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "int8":
        return rng.integers(-128, 127, (M, W)).astype(np.int8)
    return rng.standard_normal((M, W)).astype(NPDT[dtype])


@needs_toolchain
@needs_gxx
@pytest.mark.parametrize("M,N,dtype,col,pattern", [
    (64, 64, "float16", 0, "copy"),   # 8-lane runs read and stored as one access each
    (16, 77, "float16", 0, "copy"),   # elements
    (16, 64, "float16", 1, "copy"),   # vector stores, element reads
    (16, 64, "float32", 0, "copy"),
    (32, 64, "float16", 0, "transpose"),
    (16, 64, "float16", 0, "stride2"),
])
def test_emulated_staged_copy(M, N, dtype, col, pattern):
    k = tilecore.compile(staged_copy(M, N, dtype, col, pattern), target="cuda:sm_80", pass_configs=NOCACHE)
    a = _copy_data(M, 2 * N if pattern == "stride2" else N + col, dtype, M + N)
    ref = _reference(a, col, pattern)
    got = run_on_host(k, [a, np.zeros(ref.shape, a.dtype)])[1]
    np.testing.assert_array_equal(got, ref)


@needs_toolchain
@needs_gxx
@pytest.mark.parametrize("M,N,K", [(128, 128, 64), (100, 72, 40), (64, 77, 32)])
def test_emulated_gemm_through_shared(M, N, K):
    """Whole tiles, a ragged tail (72 columns of 64-column tiles: the tail guard holds for whole runs) and an odd
    row length (elements), against float64."""
    k = tilecore.compile(gemm_via_shared(M, N, K), target="cuda:sm_80", pass_configs=GENERAL)
    assert bool(_vectors(k)) == (N % 8 == 0)
    rng = np.random.default_rng(M + N + K)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    got = run_on_host(k, [a, b, np.full((M, N), np.nan, np.float16)])[2]
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2e-2, atol=8e-2)


# -- mutations: the checks catch a wrong vector ------------------------------------------------------------

@needs_toolchain
@needs_gxx
def test_mutation_misaligned_read_is_caught(monkeypatch):
    """Every offset proven a multiple (the proof skipped): the copy from column 1 of the tile reads 16 bytes at an
    odd element, which the emulator's ``tc_vld`` refuses (a GPU faults). Unmutated it passes above."""
    from tilecore.passes import vectorize

    monkeypatch.setattr(vectorize, "_multiple", lambda facts, e, n: True)
    k = tilecore.compile(staged_copy(16, 64, col=1), target="cuda:sm_80", pass_configs=NOCACHE)
    assert _vectors(k) == [("tc_vecn<__half, 8>", True)]
    a = _copy_data(16, 65, "float16")
    with pytest.raises(RuntimeError, match="vector load address not aligned"):
        run_on_host(k, [a, np.zeros((16, 64), np.float16)])


@needs_toolchain
@needs_gxx
def test_mutation_strided_read_taken_as_consecutive_is_caught(monkeypatch):
    """The consecutive-elements check skipped (any aligned load of a block buffer taken as a run): the copy of
    every other column reads 8 neighbours instead; the exact comparison fails. Unmutated it passes above."""
    from tilecore.passes import vectorize

    monkeypatch.setattr(vectorize, "_contiguous_load", lambda values, n, facts, dtype, block:
                        id(values[0].buffer) in block and vectorize._multiple(
                            facts, vectorize._flat(values[0].indices, values[0].buffer.shape), n))
    k = tilecore.compile(staged_copy(16, 64, pattern="stride2"), target="cuda:sm_80", pass_configs=NOCACHE)
    assert _vectors(k) == [("tc_vecn<__half, 8>", True)]
    a = _copy_data(16, 128, "float16", 80)
    got = run_on_host(k, [a, np.zeros((16, 64), np.float16)])[1]
    assert not np.array_equal(got, a[:, ::2])
