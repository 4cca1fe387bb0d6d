"""The launch fast path (tilecore.compiler.binding.compile_binder) binds exactly what the general binder binds,
and hands everything else to it, so that its errors are unchanged.

Run through the public interface (a compiled CPU kernel called with torch tensors) and against ``bind`` itself.
"""
from __future__ import annotations

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.compiler.binding import bind, compile_binder
from tilecore.errors import ArgumentError

torch = pytest.importorskip("torch")


def _scale_add(n_sym: bool, out: bool):
    n = T.symbolic("n") if n_sym else 256

    @T.prim_func
    def scale_add(A: T.Tensor((n, 4), "float32"), B: T.Tensor((n, 4), "float32"), C: T.Tensor((n, 4), "float32"),
                  alpha: T.float32, shift: T.int32):
        with T.Kernel(T.ceildiv(n, 64), threads=64) as bx:
            for i, j in T.Parallel(64, 4):
                r = bx * 64 + i
                if r < n:
                    C[r, j] = A[r, j] * alpha + B[r, j] + shift

    return tilecore.compile(scale_add, target="cpu", out_idx=[2] if out else None)


@pytest.mark.parametrize("n_sym", [False, True])
@pytest.mark.parametrize("out", [False, True])
def test_fast_path_binds_what_bind_binds_and_the_kernel_is_right(n_sym, out):
    k = _scale_add(n_sym, out)
    sig = k.meta["signature"]
    fast = compile_binder(sig, "cpu")
    assert fast is not None
    a, b = torch.randn(256, 4), torch.randn(256, 4)
    args = (a, b, 1.5, 3) if out else (a, b, torch.empty(256, 4), 1.5, 3)
    got, want = fast(args), bind(sig, args, k.name, "cpu")
    assert got.ints == want.ints and got.floats == want.floats
    assert got.buffers[:2] == want.buffers[:2]  # inputs: the same addresses
    assert [(o.shape, o.dtype) for o in got.outputs] == [(o.shape, o.dtype) for o in want.outputs]
    res = k(*args)
    c = res if out else args[2]
    torch.testing.assert_close(c, a * 1.5 + b + 3)


def _bad_args(a, b, c):
    i64 = torch.zeros(256, 4, dtype=torch.int64)
    return {
        "count": (a, b),
        "dtype": (a, i64, c, 1.0, 1),
        "shape": (a, torch.randn(128, 4), c, 1.0, 1),
        "rank": (a, torch.randn(1024), c, 1.0, 1),
        "non-contiguous": (a, torch.randn(4, 256).t(), c, 1.0, 1),
        "numpy": (a, b.numpy(), c, 1.0, 1),
        "float for int": (a, b, c, 1.0, 1.5),
        "bool for int": (a, b, c, 1.0, True),
        "string for float": (a, b, c, "x", 1),
    }


@pytest.mark.parametrize("case", list(_bad_args(*(torch.randn(256, 4),) * 3)))
def test_anything_else_goes_to_bind_and_its_errors(case):
    k = _scale_add(n_sym=False, out=False)
    sig = k.meta["signature"]
    fast = compile_binder(sig, "cpu")
    a, b, c = torch.randn(256, 4), torch.randn(256, 4), torch.empty(256, 4)
    args = _bad_args(a, b, c)[case]
    assert fast(args) is None
    if case == "numpy":  # the general binder takes numpy arrays on CPU targets: a right result, no error
        k(*args)
        torch.testing.assert_close(c, a + b + 1)
        return
    with pytest.raises(ArgumentError) as e:
        k(*args)
    assert k.name in str(e.value)


def test_symbolic_dims_must_agree_across_arguments():
    k = _scale_add(n_sym=True, out=False)
    fast = compile_binder(k.meta["signature"], "cpu")
    a, b, c = torch.randn(256, 4), torch.randn(128, 4), torch.empty(256, 4)
    assert fast((a, b, c, 1.0, 0)) is None
    with pytest.raises(ArgumentError, match="already 256"):
        k(a, b, c, 1.0, 0)


def test_the_device_is_checked():
    k = _scale_add(n_sym=False, out=False)
    fast = compile_binder(k.meta["signature"], "cuda")  # a target whose kernels take CUDA tensors
    a = torch.randn(256, 4)
    assert fast((a, a, a, 1.0, 0)) is None
    with pytest.raises(ArgumentError, match="move it with"):
        bind(k.meta["signature"], (a, a, a, 1.0, 0), k.name, "cuda")


def test_numbers_bind_like_bind():
    k = _scale_add(n_sym=False, out=False)
    sig = k.meta["signature"]
    fast = compile_binder(sig, "cpu")
    a = torch.randn(256, 4)
    got = fast((a, a, a, 2, 7))  # an int for a float scalar is a number too
    assert got.floats == [2.0] and isinstance(got.floats[0], float) and got.ints == [7]
    assert np.array_equal(got.floats, bind(sig, (a, a, a, 2, 7), k.name, "cpu").floats)
