"""Row reductions of register fragments on WebGPU: subgroup shuffles below the run-time subgroup size,
workgroup memory above it (decision D21), through ``tilecore.compile`` on the adapter here.

The profile ``webgpu/desktop-subgroups`` declares ``execution.simd_width: dynamic``: the core lowers a
fragment's row reduction to shuffles for the butterfly's masks below ``ShuffleWidth()`` and a
workgroup-memory combine of the groups above it; the WGSL entry votes on full subgroups and numbers its
threads by them. lavapipe runs subgroups of 8, so the kernels here (32 threads per row) take both parts;
``tilecore.webgpu.max_shuffle_width`` caps the width (1: the same code, every row through workgroup
memory), and ``webgpu:desktop`` (no subgroups) has no subgroup code at all.

That the shuffles ran is shown by mutation: a wrong xor mask, a wrong condition on which threads join the
workgroup-memory part, or threads numbered other than subgroup by subgroup in the generated WGSL give
wrong numbers, and the same mutations with the width capped at 1 do not (the shuffles are skipped at run
time). The mutations pick widths that show on any subgroup size of 8 or more (lavapipe 8, NVIDIA 32).
"""
from __future__ import annotations

import re
import zipfile

import numpy as np
import pytest
from tilecore_conformance import composite

import tilecore
import tilecore.language as T

try:
    from tilecore_webgpu.runtime import adapters, has_subgroups

    SUBGROUPS = bool(adapters()) and has_subgroups(adapters()[0])
except ImportError:  # pragma: no cover - the WebGPU plugin is not installed
    SUBGROUPS = False

pytestmark = pytest.mark.skipif(not SUBGROUPS, reason="no WebGPU adapter with the subgroups feature "
                                                      "(apt-get install mesa-vulkan-drivers gives lavapipe)")
CAP = "tilecore.webgpu.max_shuffle_width"


def gemm_rowsum(M=64, N=128, K=64, bm=32, bk=32, threads=128):
    """The README GEMM (float16 A, B; float32 accumulator in registers) with a row sum of the result:
    each block owns ``bm`` whole rows of C."""
    @T.prim_func
    def kernel(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32"),
               S: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, bm), threads=threads) as by:
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, N), "float16")
            acc = T.alloc_fragment((bm, N), "float32")
            s = T.alloc_fragment((bm,), "float32")
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, 0], B_s)
                T.gemm(A_s, B_s, acc)
            T.reduce_sum(acc, s, dim=1)
            T.copy(acc, C[by * bm, 0])
            T.copy(s, S[by * bm])
    return kernel


def _gemm_case():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((64, 64)).astype(np.float16)
    b = rng.standard_normal((64, 128)).astype(np.float16)
    c = a.astype(np.float64) @ b.astype(np.float64)
    return (gemm_rowsum, [a, b, np.full((64, 128), np.nan, np.float32), np.full(64, np.nan, np.float32)],
            [c, c.sum(1)], 1e-4)


def _rows_case(name):
    x = composite.row_inputs(np.random.default_rng(3), "float32")[0]
    ref = getattr(composite, name + "_ref")([x], "float32")
    return (lambda: getattr(composite, name)("float32"), [x, np.full_like(x, np.nan)], ref, 1e-5)


SEQ, DIM, HEADS, BM, BN = 72, 32, 2, 32, 16


def _flash_case(causal):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((HEADS, SEQ, DIM)).astype(np.float16) for _ in range(3))
    ref = composite.attention_ref([q, k, v], "float16", causal, seq=SEQ, dim=DIM)
    return (lambda: composite.flash_attention_forward(SEQ, DIM, HEADS, BM, BN, "float16", causal),
            [q, k, v, np.full(q.shape, np.nan, np.float16)], ref, 1e-2)


CASES = {"softmax": lambda: _rows_case("softmax"), "rmsnorm": lambda: _rows_case("rmsnorm"),
         "layernorm": lambda: _rows_case("layernorm"), "flash_attention": lambda: _flash_case(False),
         "flash_attention_causal": lambda: _flash_case(True), "gemm_rowsum": _gemm_case}
#: the fragments each case reduces along rows (in registers; FlashAttention keeps other fragments in
#: workgroup memory on WebGPU, for reasons its meta records)
REDUCED = {"softmax": ("x", "m", "s"), "rmsnorm": ("sq", "s"), "layernorm": ("x", "sq", "mean", "var"),
           "flash_attention": ("acc_s", "m_cur", "row_sum"), "flash_attention_causal": ("acc_s", "m_cur", "row_sum"),
           "gemm_rowsum": ("acc", "s")}


def _run(kernel, args) -> list:
    args = [a.copy() for a in args]
    kernel(*args)
    return args


def _check(outs, refs, tol):
    for got, ref in zip(outs, refs):
        got = np.asarray(got, np.float64)
        assert not np.isnan(got).any(), f"{int(np.isnan(got).sum())} element(s) not written"
        np.testing.assert_allclose(got, np.asarray(ref, np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("target,width", [("webgpu", None), ("webgpu", 1), ("webgpu:desktop", None)],
                         ids=["subgroups", "capped-at-1", "no-subgroups"])
def test_row_reductions_of_fragments(name, target, width):
    make, args, refs, tol = CASES[name]()
    kernel = tilecore.compile(make(), target=target, pass_configs={CAP: width} if width else None)
    got = kernel.meta["attrs"]["fragment_layouts"]
    assert all(not got[f].startswith("shared") for f in REDUCED[name]), got
    src = kernel.get_kernel_source()
    if target == "webgpu":
        # shuffles below the subgroup size the workgroup agreed on, workgroup memory above it
        assert "subgroupShuffleXor(" in src and "workgroupUniformLoad(&tc_sg_width)" in src, src
        assert "red_scratch" in src and "tc_sg_id * tc_sg_size + tc_sg_lane" in src
    else:
        assert "subgroup" not in src and "tc_sgw" not in src
    outs = _run(kernel, args)[-len(refs):]
    _check(outs, refs, tol)


# -- the shuffles run: mutations of the generated WGSL ------------------------------------------------

def _mutated(kernel, tmp_path, edit):
    """``kernel`` with its WGSL edited, through export / load_kernel (the public way to ship a kernel)."""
    path = kernel.export(tmp_path / "kernel.tck")
    with zipfile.ZipFile(path) as z:
        items = {n: z.read(n) for n in z.namelist()}
    code = items["binary.bin"].decode()
    new = edit(code)
    assert new != code, "the mutation found nothing to change"
    items["binary.bin"] = new.encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in items.items():
            z.writestr(n, data)
    return tilecore.load_kernel(path)


def _wrong_mask(code):  # the first butterfly step exchanges with lane ^ 2 instead of lane ^ 1
    return re.sub(r"subgroupShuffleXor\((\w+\[\d+i\]), 1u\)", r"subgroupShuffleXor(\1, 2u)", code)


def _wrong_group_condition(code):  # the row's threads 4 apart join the workgroup-memory combine at width 8
    return code.replace("(tc_sgw <= 4i)", "(tc_sgw <= 8i)")


def _wrong_numbering(code):  # a permutation of the invocations, but not subgroup by subgroup
    return code.replace("tc_sg_id * tc_sg_size + tc_sg_lane", "tc_sg_lane * tc_sg_n + tc_sg_id")


#: the mutation, and the width it needs to show (8: the workgroup-memory part runs on any subgroup size >= 8)
MUTATIONS = [(_wrong_mask, None), (_wrong_group_condition, 8), (_wrong_numbering, None)]


@pytest.mark.parametrize("name", ["rmsnorm", "softmax"])
@pytest.mark.parametrize("mutation,width", MUTATIONS, ids=[m.__name__.strip("_") for m, _ in MUTATIONS])
def test_a_mutated_shuffle_path_gives_wrong_numbers_and_is_skipped_at_width_1(name, mutation, width, tmp_path):
    make, args, refs, tol = CASES[name]()
    kernel = tilecore.compile(make(), target="webgpu", pass_configs={CAP: width} if width else None)
    _check(_run(kernel, args)[-1:], refs, tol)
    bad = _mutated(kernel, tmp_path, mutation)
    with pytest.raises(AssertionError):
        _check(_run(bad, args)[-1:], refs, tol)
    # the same mutation where the width is capped at 1: the run skips the shuffles, the numbers are right
    capped = tilecore.compile(make(), target="webgpu", pass_configs={CAP: 1})
    _check(_run(_mutated(capped, tmp_path, mutation), args)[-1:], refs, tol)


def test_max_shuffle_width_must_be_a_power_of_two():
    with pytest.raises(tilecore.errors.CompileError, match="max_shuffle_width=6.*power of two"):
        tilecore.compile(composite.rmsnorm("float32"), target="webgpu", pass_configs={CAP: 6})
