"""Layout conversion (tilecore.layout.plan_conversion, the layout pass's conversions; docs/layout.md, "Layout
conversion"): the algebra (every plan moves every element to where the destination layout wants it; identity,
round trip and composition laws), and kernels through tilecore.compile run on the host emulators where two
statements need one fragment in different layouts: FlashAttention forward (TileLang's example and the
catalog's, causal and not) on the made-up 64-thread unit and on mma.sync, reductions into a fragment laid
out otherwise, a GEMM whose C is copied into a fragment with another layout (by xor shuffles on CUDA and
HIP, by shared memory, and the two agree), and a mutation: a wrong exchange is caught."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.layout import Digit, FragmentLayout, apply_conversion, blocked, plan_conversion

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
NOCACHE = {"tilecore.disable_cache": True}
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")


def values(lay: FragmentLayout):
    """``[thread, reg]`` -> the row-major index of the element the slot holds."""
    tab = lay.element_table()
    return np.ravel_multi_index(tuple(tab[..., k] for k in range(tab.shape[-1])), lay.shape)


# -- the algebra -----------------------------------------------------------------------------------------

def _mma_c(shape=(32, 32)):
    """mma.sync's 16x8 accumulator tiled over 4 warps (2x2) and registers, as the CUDA plugin registers it."""
    c = FragmentLayout((16, 8), [[Digit("thread", 8, 4), Digit("reg", 2, 2)], [Digit("reg", 2, 1), Digit("thread", 4, 1)]])
    c = c.tile(0, 2, "thread").tile(1, 2, "thread").tile(1, shape[1] // 16, "reg")
    return c.tile(0, shape[0] // 32, "reg") if shape[0] > 32 else c


def _swapped():
    """The 32x32 accumulator above with two thread bits exchanged (thread bit 0 with bit 2)."""
    return FragmentLayout((32, 32), [[Digit("thread", 2, 1), Digit("thread", 4, 8), Digit("reg", 2, 2),
                                      Digit("thread", 2, 32)],
                                     [Digit("reg", 2, 1), Digit("thread", 2, 4), Digit("thread", 2, 2),
                                      Digit("thread", 2, 64), Digit("reg", 2, 4)]], name="swapped")


LAYOUTS = {
    "mma": _mma_c(),
    "swapped": _swapped(),
    "blocked": blocked((32, 32), 128),
    "blocked_vec4": blocked((32, 32), 128, vector=4),
    "transposed": blocked((32, 32), 128).transpose().transpose([1, 0]).transpose(),
    "replicated": blocked((32, 32), 32).replicate_over(4),
    "rows_in_regs": FragmentLayout((32, 32), [[Digit("reg", 8, 1), Digit("thread", 4, 32)],
                                               [Digit("thread", 32, 1)]], name="rows_in_regs"),
}
for _n, _l in LAYOUTS.items():
    assert _l.shape == (32, 32) and _l.threads == 128, _n


@pytest.mark.parametrize("width", [0, 32, 64])
@pytest.mark.parametrize("src", sorted(LAYOUTS))
def test_every_plan_moves_every_element_where_the_destination_wants_it(src, width):
    for dst in sorted(LAYOUTS):
        a, b = LAYOUTS[src], LAYOUTS[dst]
        conv = plan_conversion(a, b, width)
        got = apply_conversion(conv, values(a))
        np.testing.assert_array_equal(got, values(b), err_msg=f"{src} -> {dst} by {conv.kind}")
        if conv.kind == "shuffle":
            assert width and max(conv.all_masks()) < width, conv.describe()


def test_identity_is_register_moves_and_the_kinds_follow_the_hardware():
    for name, lay in LAYOUTS.items():
        conv = plan_conversion(lay, lay, 32)
        assert conv.kind == "registers", name
    # two thread bits exchanged within a warp: one move and one xor shuffle (distance 1 ^ 4) per register
    conv = plan_conversion(LAYOUTS["mma"], LAYOUTS["swapped"], 32)
    assert conv.kind == "shuffle" and conv.all_masks() == (5,) and all(ms == (0, 5) for ms in conv.masks)
    # without shuffles (or across warps) the same exchange goes through shared memory
    assert plan_conversion(LAYOUTS["mma"], LAYOUTS["swapped"], 0).kind == "shared"
    assert plan_conversion(LAYOUTS["mma"], LAYOUTS["blocked"], 32).kind == "shared"
    # a replicated source: each thread reads the replica in its own warp
    rep = LAYOUTS["replicated"]
    assert plan_conversion(rep, blocked((32, 32), 32).replicate_over(4), 0).kind == "registers"


def test_round_trip_and_composition_laws():
    names = sorted(LAYOUTS)
    for a in names:
        for b in names:
            x = values(LAYOUTS[a])
            there = apply_conversion(plan_conversion(LAYOUTS[a], LAYOUTS[b], 32), x)
            back = apply_conversion(plan_conversion(LAYOUTS[b], LAYOUTS[a], 32), there)
            np.testing.assert_array_equal(back, x, err_msg=f"{a} -> {b} -> {a}")
            for c in names[:2]:
                two = apply_conversion(plan_conversion(LAYOUTS[b], LAYOUTS[c], 32), there)
                one = apply_conversion(plan_conversion(LAYOUTS[a], LAYOUTS[c], 32), x)
                np.testing.assert_array_equal(two, one, err_msg=f"{a} -> {b} -> {c}")


def test_conversions_keep_shape_and_threads():
    with pytest.raises(ValueError, match="shape"):
        plan_conversion(blocked((32, 32), 128), blocked((32, 16), 128))
    with pytest.raises(ValueError, match="threads"):
        plan_conversion(blocked((32, 32), 128), blocked((32, 32), 64))


# -- kernels ---------------------------------------------------------------------------------------------

def gemm_copy(M, N, K, threads, annotate=None, transpose=False):
    """C = A @ B on the matrix unit, then ``D = C`` (``D = C^T`` with ``transpose``) into a fragment laid out
    otherwise (``annotate``: its layout; else the layout a first statement gives it), plus the old D."""
    dshape = (N, M) if transpose else (M, N)

    @T.prim_func
    def kern(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), D: T.Tensor(dshape, "float32")):
        with T.Kernel(1, threads=threads) as bx:
            A_s = T.alloc_shared((M, K), "float16")
            B_s = T.alloc_shared((K, N), "float16")
            C_l = T.alloc_fragment((M, N), "float32")
            D_l = T.alloc_fragment(dshape, "float32")
            if annotate is not None:
                T.annotate_layout({D_l: annotate})
            T.copy(A, A_s)
            T.copy(B, B_s)
            T.copy(D, D_l)
            T.clear(C_l)
            T.gemm(A_s, B_s, C_l)
            if transpose:
                for i, j in T.Parallel(N, M):
                    D_l[i, j] += C_l[j, i]
            else:
                for i, j in T.Parallel(M, N):
                    D_l[i, j] += C_l[i, j]
            T.copy(D_l, D)
    return kern


def _gemm_data(M, N, K, transpose, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    d = rng.standard_normal((N, M) if transpose else (M, N)).astype(np.float32)
    c = a.astype(np.float64) @ b.astype(np.float64)
    return a, b, d, d.astype(np.float64) + (c.T if transpose else c)


def _conversion(kernel, frag):
    text = kernel.meta["attrs"]["fragment_layouts"][frag]
    assert not text.startswith("shared"), text
    assert "[converted for" in text, text
    return text


@needs_gxx
@pytest.mark.parametrize("mode,how", [(True, "by shuffle"), ("shared", "by shared")])
def test_gemm_result_copied_into_another_layout_by_shuffles_or_shared_memory(mode, how, monkeypatch):
    """C on mma.sync copied into an annotated layout with two thread bits exchanged: one xor shuffle by 5 per
    register (or a shared round trip); right against float64. Mutation (shuffles): the distance off by one
    lane (the plan says 5, the code exchanges with 4) gives wrong numbers."""
    from cuda_host_emulator import run_on_host

    import tilecore.layout.convert as cv

    kern = gemm_copy(32, 32, 32, 128, annotate=_swapped())
    k = tilecore.compile(kern, target="cuda:sm_80", pass_configs={**NOCACHE, "tilecore.layout_conversion": mode})
    assert k.meta["attrs"]["fragment_layouts"]["D_l"].startswith("swapped")
    assert how in _conversion(k, "C_l")
    assert ("__shfl_xor_sync" in k.source.code.partition('extern "C"')[2]) == (mode is True)
    a, b, d, ref = _gemm_data(32, 32, 32, False)
    out = run_on_host(k, [a, b, d.copy()])[2]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    if mode is not True:
        return
    real = cv.plan_conversion

    def wrong(src, dst, width=0, indexed=False):
        conv = real(src, dst, width, indexed)
        if conv.kind != "shuffle":
            return conv
        masks = tuple(tuple(m - 1 if m == 5 else m for m in ms) for ms in conv.masks)
        return cv.Conversion(conv.src, conv.dst, conv.kind, masks, conv.width)

    monkeypatch.setattr("tilecore.layout.plan_conversion", wrong)
    bad = tilecore.compile(kern, target="cuda:sm_80", pass_configs=NOCACHE)
    assert bad.source.code != k.source.code
    out = run_on_host(bad, [a, b, d.copy()])[2]
    assert not np.allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_without_conversion_one_fragment_stays_in_shared_memory():
    k = tilecore.compile(gemm_copy(32, 32, 32, 128, annotate=_swapped()), target="cuda:sm_80",
                         pass_configs={**NOCACHE, "tilecore.layout_conversion": False})
    got = k.meta["attrs"]["fragment_layouts"]
    assert any(v.startswith("shared: its layout does not hold") for v in got.values()), got
    assert not any("converted" in v for v in got.values())


@needs_gxx
def test_gemm_result_read_transposed_goes_through_shared_memory():
    from cuda_host_emulator import run_on_host

    k = tilecore.compile(gemm_copy(32, 64, 32, 128, transpose=True), target="cuda:sm_80", pass_configs=NOCACHE)
    assert "by shared" in _conversion(k, "C_l")
    a, b, d, ref = _gemm_data(32, 64, 32, True, seed=1)
    out = run_on_host(k, [a, b, d])[2]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_gemm_result_copied_by_shuffles_on_hip_waves():
    pytest.importorskip("tilecore_hip")
    from hip_host_emulator import compiler, run_on_host

    if compiler() is None:
        pytest.skip("the HIP host emulator needs clang++")

    # MFMA 16x16's accumulator over 2x1 waves of 64 (rows [r4@1 t4@16 t2@64], columns [t16@1 r2@4]) with
    # thread bits 0 and 4 exchanged: one xor shuffle by 17 within each wave
    swapped = FragmentLayout((32, 32), [[Digit("reg", 4, 1), Digit("thread", 2, 1), Digit("thread", 2, 32),
                                         Digit("thread", 2, 64)],
                                        [Digit("thread", 2, 16), Digit("thread", 8, 2), Digit("reg", 2, 4)]],
                             name="swapped")
    k = tilecore.compile(gemm_copy(32, 32, 32, 128, annotate=swapped), target="hip:gfx942", pass_configs=NOCACHE)
    assert k.meta["attrs"]["fragment_layouts"]["C_l"].startswith("mfma")
    assert "by shuffle (8 xor shuffles over lanes 17" in _conversion(k, "C_l")
    a, b, d, ref = _gemm_data(32, 32, 32, False, seed=2)
    out = run_on_host(k, [a, b, d])[2]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


# -- reductions into a fragment laid out otherwise --------------------------------------------------------

@needs_gxx
@pytest.mark.parametrize("target,clear", [("cuda:sm_80", False)])
def test_reduction_into_a_fragment_laid_out_otherwise(fakemu, target, clear):
    """The catalog's reduce kernel: ``r`` is laid out by ``T.copy(D, r)`` before the reduction of ``f``
    (whose layout projects elsewhere); the reduction is computed in the projection and converted."""
    from cuda_host_emulator import run_on_host
    from tilecore_conformance.catalog import _reduce_kernel

    k = tilecore.compile(_reduce_kernel("max", 1, clear, "float32"), target=target, pass_configs=NOCACHE)
    assert "T.reduce_max of f" in _conversion(k, "r")
    assert not k.meta["attrs"]["fragment_layouts"]["f"].startswith("shared")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((64, 48)).astype(np.float32)
    d = rng.standard_normal(64).astype(np.float32) + 1.0
    out = run_on_host(k, [a, d, np.full(64, np.nan, np.float32)])[2]
    ref = a.max(1) if clear else np.maximum(a.max(1), d)
    np.testing.assert_allclose(out, ref)


# -- FlashAttention ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fakemu(tmp_path_factory):
    pytest.importorskip("tilecore_cuda")
    from fake_matrix_backend import register
    from tilecore.plugin import reset_registry

    reset_registry()
    register(tmp_path_factory.mktemp("fakemu"))
    yield "fakemu"
    reset_registry()


def _corpus_flashattn():
    sys.path.insert(0, str(HERE))
    from tilelang_corpus.attention_mha_fwd_bhsd import flashattn

    return getattr(flashattn, "jit_fn", flashattn)


@needs_gxx
@pytest.mark.parametrize("causal", [True])
def test_tilelang_flash_attention_on_the_made_up_unit(fakemu, causal):
    """TileLang's example_mha_fwd_bhsd (tests/tilelang_corpus): S = Q K^T's accumulator (columns in lanes,
    groups of 64) feeds P V's A operand (rows in lanes), which only shared memory can give each thread. By
    default the operand stays there (the unit's operand load is the load half of the round trip), with the
    reason; ``tilecore.layout_conversion='shared'`` converts it into registers instead. Both right, every
    other fragment in registers."""
    import torch

    from cuda_host_emulator import run_on_host
    from tilelang_corpus._driver import attention_ref

    fn = _corpus_flashattn()
    args = (1, 2, 64, 96, 32, causal)
    kw = dict(block_M=32, block_N=32, num_stages=1, threads=128)
    func = fn.get_tir(*args, **kw) if hasattr(fn, "get_tir") else fn(*args, **kw)
    default = tilecore.compile(func, target=fakemu, out_idx=[3], pass_configs=NOCACHE)
    got = default.meta["attrs"]["fragment_layouts"]
    assert not any(v.startswith("shared") for n, v in got.items() if n != "acc_s_cast"), got
    assert got["acc_s_cast"].startswith("shared: the A operand of a matrix-unit T.gemm that the T.Parallel "
                                        "nest or T.copy over (32, 32) producing it can feed only through shared")
    # (the default kernel runs in tests/test_fake_matrix_backend.py; this one converts)
    k = tilecore.compile(func, target=fakemu, out_idx=[3],
                         pass_configs={**NOCACHE, "tilecore.layout_conversion": "shared"})
    got = k.meta["attrs"]["fragment_layouts"]
    assert not any(v.startswith("shared") for v in got.values()), got
    assert "by shared" in _conversion(k, "acc_s_cast")
    rng = np.random.default_rng(8 + causal)
    q = rng.standard_normal((1, 2, 64, 32)).astype(np.float16)
    kk = rng.standard_normal((1, 2, 96, 32)).astype(np.float16)
    v = rng.standard_normal((1, 2, 96, 32)).astype(np.float16)
    out = run_on_host(k, [q, kk, v, np.zeros_like(q)])[3].astype(np.float64)
    ref = attention_ref(*(torch.from_numpy(x) for x in (q, kk, v)), causal=causal).numpy()
    assert np.abs(out - ref).max() <= 2e-3


@needs_gxx
@pytest.mark.parametrize("causal", [True])
def test_catalog_flash_attention_with_warps_over_columns_on_mma_sync(causal):
    """The catalog's attention (2x2 warps over S's atoms, not FullRow): each warp of P V's A operand needs the
    other column warp's half of S; converted through shared memory into registers under
    ``tilecore.layout_conversion='shared'`` (by default the operand stays in shared memory, for ldmatrix)."""
    from cuda_host_emulator import run_on_host
    from tilecore_conformance import composite

    k = tilecore.compile(composite.attention("float16", causal), target="cuda:sm_80",
                         pass_configs={**NOCACHE, "tilecore.layout_conversion": "shared"})
    got = k.meta["attrs"]["fragment_layouts"]
    assert not any(v.startswith("shared") for v in got.values()), got
    assert "by shared" in _conversion(k, "acc_s_cast")
    rng = np.random.default_rng(10 + causal)
    shape = (composite.HEADS, composite.SEQ, composite.DIM)
    q, kk, v = (rng.standard_normal(shape).astype(np.float16) for _ in range(3))
    out = run_on_host(k, [q, kk, v, np.zeros(shape, np.float16)])[3].astype(np.float64)
    ref = composite.attention_ref([q, kk, v], "float16", causal)[0]
    assert np.abs(out - ref).max() <= 2e-3


def test_a_wrong_pass_config_value_says_which_values_exist():
    with pytest.raises(tilecore.errors.CompileError, match="use True .* 'shared' .* or False"):
        tilecore.compile(gemm_copy(32, 32, 32, 128), target="cuda:sm_80",
                         pass_configs={**NOCACHE, "tilecore.layout_conversion": "yes"})
