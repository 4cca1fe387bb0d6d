"""Fragments that block-level statements access element by element, in registers (decision D88, issue 11).

TileLang's examples keep scalars in fragments of shape (1,): the online softmax's running ``lse[0] = max_x[0] * scale
+ ...`` between its two reductions, stream-K's loop bounds ``start_iter[0]`` / ``end_iter[0]``, a single-element
``T.fill``. The layout pass gives such a fragment (at most ``UNIFORM_MAX`` elements, constant indices) the *uniform*
layout: every thread holds every element, and every thread runs the block-level statement on its own copy (block-level
values are uniform). A ``T.Parallel`` nest may write a fragment without a loop variable of extent 1
(LayerNorm backward's ``dgamma_acc[j] += ...`` in a nest over ``(1, D)``). ``tilecore.uniform_fragments=False`` keeps
both in shared memory as before.

Through the public interface: the TileLang corpus kernels that moved, compiled for CUDA and run on the host emulator
(tests/cuda_host_emulator.py) against float64 references and bit for bit against the option off; the layout pass's
reasons for what stays in shared memory; the same kernels on a GPU where one is (``test_device``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tilecore
import tilecore.language as T

sys.path.insert(0, str(Path(__file__).parent))
from test_tilelang_corpus import _load  # noqa: E402

tilecore_cuda = pytest.importorskip("tilecore_cuda")
from test_cuda_backend import HAS_DEVICE, needs_toolchain  # noqa: E402

OFF = {"tilecore.uniform_fragments": False}


def _compile(func, target, configs=None, out_idx=None):
    return tilecore.compile(func, target=target, out_idx=out_idx,
                            pass_configs={"tilecore.disable_cache": True, **(configs or {})})


def _layouts(k):
    return k.meta["attrs"]["fragment_layouts"]


# -- the corpus kernels that moved ---------------------------------------------------------------------------------

def _softmax(M=8, N=256):
    return _load("softmax_online").softmax_kernel.get_tir(M, N), [1]


def _softmax_eager(N=256):
    fn = _load("softmax_online_eager").softmax_kernel
    fn = getattr(fn, "jit_fn", fn)
    return fn.get_tir(BLOCK_N=N), None


def _layernorm_bwd(N=64, D=128):
    return _load("norm_layernorm_bwd")._layernorm_bwd.get_tir(N, D), [-3]


def _streamk():
    mod = _load("gemm_streamk")
    return mod.tl_matmul_streamk.get_tir(*mod.ARGS), None


#: example -> (its fragments that move to registers, the layouts they take)
MOVED = {
    "softmax_online": (_softmax, {"lse": "uniform", "max_x": "fragment", "sum_exp_x": "fragment"}),  # a reduction's
    "softmax_online_eager": (_softmax_eager, {"lse": "uniform"}),
    "norm_layernorm_bwd": (_layernorm_bwd, {"dgamma_acc": "nest", "dbeta_acc": "nest"}),  # the nest's, projected
    "gemm_streamk": (_streamk, {"start_iter": "uniform", "end_iter": "uniform"}),
}


@pytest.mark.parametrize("target", ["cuda:sm_80", "cuda:sm_90a"])
@pytest.mark.parametrize("name", sorted(MOVED))
def test_in_registers(name, target):
    make, frags = MOVED[name]
    func, out_idx = make()
    on = _layouts(_compile(func, target, out_idx=out_idx))
    off = _layouts(_compile(func, target, OFF, out_idx=out_idx))
    for f, kind in frags.items():
        assert on[f].startswith(kind), (f, on[f])
        assert off[f].startswith("shared: "), (f, off[f])
    assert not [v for v in on.values() if v.startswith("shared")], on


#: the prelude's float atomics on the host (the emulator drops the device atomics; LayerNorm backward and stream-K add
#: partials with them)
ATOMICS = r"""
inline void tc_atomic_add_float32(float* p, float v) {
  float old = *p, want;
  do { want = old + v; } while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}
inline void tc_atomic_add_float16(__half* p, float v) {  /* the host's tc_round_h gives a float */
  unsigned short* q = (unsigned short*)p;
  unsigned short old = __atomic_load_n(q, __ATOMIC_RELAXED), want;
  do { want = __float2half_rn(__half2float(__half{old}) + v).bits; }
  while (!__atomic_compare_exchange_n(q, &old, want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}
inline void tc_atomic_add_float16(__half* p, __half v) { tc_atomic_add_float16(p, __half2float(v)); }
"""


def _run(k, arrays, ints=None):
    import cuda_host_emulator as emu

    shim = emu.SHIM
    emu.SHIM = shim + ATOMICS
    try:
        return emu.run_on_host(k, [a.copy() for a in arrays], ints=ints)
    finally:
        emu.SHIM = shim


@needs_toolchain
@pytest.mark.parametrize("target", ["cuda:sm_80", "cuda:sm_90a"])
def test_softmax_online_on_host(target):
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((8, 256)) * 3).astype(np.float16)
    func, out_idx = _softmax()
    on = _run(_compile(func, target, out_idx=out_idx), [X, np.zeros_like(X)])[1]
    off = _run(_compile(func, target, OFF, out_idx=out_idx), [X, np.zeros_like(X)])[1]
    ref = torch.from_numpy(X).double().softmax(1).numpy()
    np.testing.assert_allclose(on.astype(np.float64), ref, rtol=1e-2, atol=1e-3)
    np.testing.assert_array_equal(on, off)  # the same operations in the same order: the same bits


@needs_toolchain
def test_softmax_online_eager_on_host():
    rng = np.random.default_rng(1)
    X = (rng.standard_normal((8, 512)) * 3).astype(np.float16)
    func, _ = _softmax_eager()
    on = _run(_compile(func, "cuda:sm_80"), [X, np.zeros_like(X)])[1]
    off = _run(_compile(func, "cuda:sm_80", OFF), [X, np.zeros_like(X)])[1]
    ref = torch.from_numpy(X).double().softmax(1).numpy()
    np.testing.assert_allclose(on.astype(np.float64), ref, rtol=1e-2, atol=1e-3)
    np.testing.assert_array_equal(on, off)


@needs_toolchain
def test_layernorm_bwd_on_host():
    N, D, eps = 64, 128, 1e-5
    g = torch.Generator().manual_seed(2)
    x, gam, dy = (torch.randn(s, generator=g).to(torch.bfloat16) for s in ((N, D), (D,), (N, D)))
    mean = x.double().mean(-1)
    rstd = torch.rsqrt(x.double().var(-1, unbiased=False) + eps)
    xr, gr = x.double().requires_grad_(), gam.double().requires_grad_()
    br = torch.zeros(D, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.layer_norm(xr, (D,), gr, br, eps=eps).backward(dy.double())
    bf = lambda t: t.view(torch.int16).numpy().view(np.uint16)  # noqa: E731 - bfloat16 as its bits
    args = [bf(dy), bf(x), bf(gam), mean.float().numpy(), rstd.float().numpy(), np.zeros((N, D), np.uint16),
            np.zeros(D, np.float32), np.zeros(D, np.float32)]
    func, _ = _layernorm_bwd(N, D)
    on = _run(_compile(func, "cuda:sm_80"), args)
    off = _run(_compile(func, "cuda:sm_80", OFF), args)
    dx = torch.from_numpy(on[5].view(np.int16)).view(torch.bfloat16).double().numpy()
    np.testing.assert_allclose(dx, xr.grad.numpy(), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(on[6], gr.grad.numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(on[7], br.grad.numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(on[5], off[5])  # DX: the same arithmetic per element
    # DGamma / DBeta: each block adds its partial with an atomic: the same partials, blocks in any order
    np.testing.assert_allclose(on[6], off[6], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(on[7], off[7], rtol=1e-6, atol=1e-6)


@needs_toolchain
def test_gemm_streamk_on_host():
    mod = _load("gemm_streamk")
    g = torch.Generator().manual_seed(3)
    A = (torch.rand(mod.m, mod.k, generator=g) * 2 - 1).half()
    B = (torch.rand(mod.n, mod.k, generator=g) * 2 - 1).half()
    func, _ = _streamk()
    args = [A.numpy(), B.numpy(), np.zeros((mod.m, mod.n), np.float16)]
    on = _run(_compile(func, "cuda:sm_80"), args)[2]
    off = _run(_compile(func, "cuda:sm_80", OFF), args)[2]
    ref = (A.double() @ B.double().T).numpy()
    np.testing.assert_allclose(on.astype(np.float64), ref, rtol=1e-2, atol=2e-2)
    np.testing.assert_allclose(on, off, rtol=1e-2, atol=2e-2)  # float16 atomics of partial tiles, in any order


# -- the rule on small kernels -------------------------------------------------------------------------------------

def _scalar_kernel(n=1, idx=0, threads=64):
    @T.prim_func
    def main(X: T.Tensor((4, 64), "float32"), Y: T.Tensor((4, 64), "float32")):
        with T.Kernel(4, threads=threads) as b:
            s = T.alloc_fragment((n,), "float32")
            x = T.alloc_fragment((64,), "float32")
            T.fill(s, 0)
            T.copy(X[b, 0:64], x)
            for j in T.serial(4):
                s[idx] = s[idx] + X[b, j]  # block level: every thread updates its copy
            for i in T.Parallel(64):
                x[i] = x[i] * s[idx]
            T.copy(x, Y[b, 0:64])
    return main


@pytest.mark.parametrize("target", ["cuda:sm_80", "webgpu"])
def test_uniform_layout_recorded(target):
    pytest.importorskip("tilecore_webgpu") if target == "webgpu" else None
    k = _compile(_scalar_kernel(), target)
    assert _layouts(k)["s"].startswith("uniform(1,)") and "replicate t64@1" in _layouts(k)["s"]
    k4 = _compile(_scalar_kernel(n=4, idx=2), target)
    assert _layouts(k4)["s"].startswith("uniform(4,)[r4@1")  # 4 registers each, read at register 2
    big = _layouts(_compile(_scalar_kernel(n=32, idx=2), target))["s"]
    assert big.startswith("shared: ") and "32 elements" in big and "at most 16" in big
    assert _layouts(_compile(_scalar_kernel(), target, OFF))["s"].startswith("shared: ")


@needs_toolchain
@pytest.mark.parametrize("n,idx", [(1, 0), (4, 2)])
def test_uniform_scalar_on_host(n, idx):
    X = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    k = _compile(_scalar_kernel(n, idx), "cuda:sm_80")
    assert "__shared__ float s" not in k.get_kernel_source()
    Y = _run(k, [X, np.zeros_like(X)])[1]
    want = X.astype(np.float64) * X[:, :4].astype(np.float64).sum(1, keepdims=True)
    np.testing.assert_allclose(Y, want, rtol=1e-5, atol=1e-5)


def test_runtime_index_reason():
    @T.prim_func
    def main(M: T.Tensor((4, 8), "int32"), X: T.Tensor((4, 64), "float32"), Y: T.Tensor((4, 64), "float32")):
        with T.Kernel(4, threads=64) as b:
            mask = T.alloc_fragment((8,), "int32")
            x = T.alloc_fragment((64,), "float32")
            T.copy(M[b, 0:8], mask)
            T.copy(X[b, 0:64], x)
            for k in T.serial(8):
                if mask[k] != 0:
                    for i in T.Parallel(64):
                        x[i] = x[i] * 2
            T.copy(x, Y[b, 0:64])

    why = _layouts(_compile(main, "cuda:sm_80"))["mask"]
    assert why.startswith("shared: indexed at block level (If) by the run-time value k") and "global memory" in why


def test_extent_one_loop_writes():
    def make(rows):
        @T.prim_func
        def main(X: T.Tensor((rows, 64), "float32"), Y: T.Tensor((64,), "float32")):
            with T.Kernel(1, threads=64) as b:
                x = T.alloc_fragment((rows, 64), "float32")
                acc = T.alloc_fragment((64,), "float32")
                T.copy(X[0:rows, 0:64], x)
                T.clear(acc)
                for i, j in T.Parallel(rows, 64):
                    acc[j] += x[i, j]
                T.copy(acc, Y[0:64])
        return main

    assert not _layouts(_compile(make(1), "cuda:sm_80"))["acc"].startswith("shared")
    why = _layouts(_compile(make(2), "cuda:sm_80"))["acc"]  # two writers per element: a reduction, not a nest
    assert why.startswith("shared: written in a T.Parallel nest over more loop variables") and "T.reduce_" in why


# -- on a GPU ------------------------------------------------------------------------------------------------------

@pytest.mark.skipif(not HAS_DEVICE, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(MOVED))
def test_device(name, monkeypatch):
    """The corpus example's own check() (its kernels at the driver's sizes, float64 references) on the GPU,
    with the fragments in registers (the default) and with the option off."""
    from test_tilelang_corpus import TOL, _dtype_name, _to_np

    gpu = f"cuda:sm_{torch.cuda.get_device_capability()[0]}{torch.cuda.get_device_capability()[1]}"
    monkeypatch.setenv("TILECORE_TARGET", gpu + ("a" if gpu == "cuda:sm_90" else ""))
    torch.set_default_device("cuda")
    try:
        torch.manual_seed(0)
        results = _load(name).check()
    finally:
        torch.set_default_device("cpu")
    assert results
    for label, out, ref, *staged in results:
        rtol, atol = TOL[staged[0] if staged else _dtype_name(out)]
        np.testing.assert_allclose(_to_np(out), _to_np(ref), rtol=rtol, atol=atol, err_msg=f"{name} {label}")


def _loop_bound_kernel():
    """A serial loop's bound read from a fragment set at block level (stream-K's ``end_iter[0]``), with a copy into
    shared memory and its barriers inside the loop: every thread takes the same trip count from its own copy."""
    @T.prim_func
    def main(X: T.Tensor((4, 8, 64), "float32"), Y: T.Tensor((4, 64), "float32")):
        with T.Kernel(4, threads=64) as b:
            n = T.alloc_fragment((1,), "int32")
            acc = T.alloc_fragment((64,), "float32")
            xs = T.alloc_shared((64,), "float32")
            T.clear(acc)
            n[0] = b + 2
            for k in T.serial(n[0]):
                T.copy(X[b, k, 0:64], xs)
                for i in T.Parallel(64):
                    acc[i] += xs[64 - 1 - i]  # another thread's element: the barriers matter
            T.copy(acc, Y[b, 0:64])
    return main


def _loop_bound_want(X):
    return np.stack([X[b, : b + 2, ::-1].astype(np.float64).sum(0) for b in range(4)])


@needs_toolchain
def test_loop_bound_on_host():
    X = np.random.default_rng(5).standard_normal((4, 8, 64)).astype(np.float32)
    k = _compile(_loop_bound_kernel(), "cuda:sm_80")
    assert _layouts(k)["n"].startswith("uniform(1,)")
    np.testing.assert_allclose(_run(k, [X, np.zeros((4, 64), np.float32)])[1], _loop_bound_want(X), rtol=1e-5, atol=1e-5)


def test_loop_bound_on_webgpu():
    try:
        from tilecore_webgpu.runtime import adapters
    except ImportError:
        pytest.skip("the WebGPU plugin is not installed")
    if not adapters():
        pytest.skip("no WebGPU adapter (apt-get install mesa-vulkan-drivers gives lavapipe)")
    X = np.random.default_rng(6).standard_normal((4, 8, 64)).astype(np.float32)
    for cfg in ({}, OFF):
        k = _compile(_loop_bound_kernel(), "webgpu", cfg)
        Y = torch.zeros(4, 64)
        k(torch.from_numpy(X), Y)
        np.testing.assert_allclose(Y.numpy(), _loop_bound_want(X), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target,emulator", [("hip:gfx942", "hip_host_emulator"), ("musa:mp_31", "musa_host_emulator")])
def test_softmax_online_other_vendors(target, emulator):
    """The core's rule, not CUDA's: the online softmax's scalars in registers on HIP and MUSA too (their generated
    source on the host emulators), the same bits as with the option off."""
    import importlib

    pytest.importorskip("tilecore_" + target.split(":")[0])
    emu = importlib.import_module(emulator)
    if emu.compiler() is None:  # as tests/test_musa_host.py: the host emulations build with clang++
        pytest.skip("no clang++ here for the host emulation (scripts/setup.sh installs clang-22)")
    rng = np.random.default_rng(7)
    X = (rng.standard_normal((8, 256)) * 3).astype(np.float16)
    func, out_idx = _softmax()
    k = _compile(func, target, out_idx=out_idx)
    assert _layouts(k)["lse"].startswith("uniform(1,)")
    on = emu.run_on_host(k, [X.copy(), np.zeros_like(X)])[1]
    off = emu.run_on_host(_compile(func, target, OFF, out_idx=out_idx), [X.copy(), np.zeros_like(X)])[1]
    np.testing.assert_allclose(on.astype(np.float64), torch.from_numpy(X).double().softmax(1).numpy(), rtol=1e-2,
                               atol=1e-3)
    np.testing.assert_array_equal(on, off)
