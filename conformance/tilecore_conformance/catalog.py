"""The case catalog, generated from the capability vocabulary (dtype and feature names of the schema),
never hand-listed per vendor. Each case declares the capabilities it needs."""
from __future__ import annotations

import math

import numpy as np

import tilecore.language as T

from .model import Case

FLOATS = ("float16", "bfloat16", "float32", "float64")
TORCH_ONLY = ("bfloat16", "float8_e4m3", "float8_e5m2")


def schema_dtypes() -> list:
    from tilecore.capabilities import load_schema

    return list(load_schema()["$defs"]["dtype_name"]["enum"])


# -- host data ------------------------------------------------------------------------------------

def make(rng, shape, dtype, low=None, positive=False):
    """Random host data exactly representable in ``dtype`` (numpy, or torch where numpy lacks it)."""
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype.startswith(("int", "uint")):
        lo = 0 if dtype.startswith("uint") else -8
        return rng.integers(lo if low is None else low, 16, shape).astype(dtype)
    x = rng.standard_normal(shape)
    if positive:
        x = np.abs(x) + 0.25
    if dtype in TORCH_ONLY:
        import torch

        name = {"float8_e4m3": "float8_e4m3fn"}.get(dtype, dtype)
        return torch.from_numpy(x.astype(np.float32)).to(getattr(torch, name))
    return x.astype(dtype)


def f64(x) -> np.ndarray:
    if hasattr(x, "detach"):
        import torch

        x = x.detach().cpu()
        if x.dtype == torch.bool:
            return x.numpy().astype(np.float64)
        if x.dtype.is_floating_point and x.element_size() < 4:
            x = x.float()  # 8- and 16-bit floats: exactly representable in float32 (some lack a direct cast)
        return x.to(torch.float64).numpy()  # never through float32: float64 and 64-bit ints stay exact
    return np.asarray(x).astype(np.float64)


# -- families ------------------------------------------------------------------------------------

def copy_cases() -> list:
    out = []
    for dtype in schema_dtypes():
        for pattern in ("tile", "slice", "whole", "to_float32"):
            for shape in ((64, 64), (100, 72)):
                if pattern in ("slice", "whole") and shape != (64, 64):
                    continue
                out.append(Case(f"copy/{pattern}/{dtype}/{shape[0]}x{shape[1]}", "copy",
                                {"dtype": dtype, "pattern": pattern, "shape": shape},
                                (f"dtype:{dtype}:storage",) + (("dtype:float32:storage",) if pattern == "to_float32" else ()),
                                _copy_kernel, _copy_inputs, _copy_ref, op_class="data",
                                out_dtype="float32" if pattern == "to_float32" else dtype))
    return out


def _copy_kernel(dtype, pattern, shape):
    M, N = shape
    odt = "float32" if pattern == "to_float32" else dtype
    if pattern == "slice":
        @T.prim_func
        def copy_slice(A: T.Tensor((M, N), dtype), B: T.Tensor((16, N), odt)):
            with T.Kernel(1) as bx:
                f = T.alloc_fragment((16, N), dtype)
                T.copy(A[8:24, :], f)
                T.copy(f, B)
        return copy_slice
    if pattern == "whole":
        @T.prim_func
        def copy_whole(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), odt)):
            with T.Kernel(1) as bx:
                s = T.alloc_shared((M, N), dtype)
                T.copy(A, s)
                T.copy(s, B)
        return copy_whole

    @T.prim_func
    def copy_tiles(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), odt)):
        with T.Kernel(T.ceildiv(N, 32), T.ceildiv(M, 32)) as (bx, by):
            s = T.alloc_shared((32, 32), dtype)
            f = T.alloc_fragment((32, 32), odt)
            T.copy(A[by * 32, bx * 32], s)
            T.copy(s, f)
            T.copy(f, B[by * 32, bx * 32])
    return copy_tiles


def _copy_inputs(rng, dtype, pattern, shape):
    return [make(rng, shape, dtype)]


def _copy_ref(inputs, dtype, pattern, shape):
    a = f64(inputs[0])
    if pattern == "to_float32":  # the copy converts: the expected value is the input rounded to float32
        a = a.astype(np.float32).astype(np.float64)
    return [a[8:24, :] if pattern == "slice" else a]


def fill_cases() -> list:
    return [Case(f"fill/{kind}/{dtype}", "fill", {"dtype": dtype, "kind": kind}, (f"dtype:{dtype}:storage",),
                 _fill_kernel, lambda rng, **p: [], _fill_ref, op_class="data", out_dtype=dtype)
            for dtype in schema_dtypes() for kind in ("fill", "clear")]


def _fill_kernel(dtype, kind):
    value = 0 if kind == "clear" else (1 if dtype == "bool" else 3)

    @T.prim_func
    def fill(B: T.Tensor((40, 24), dtype)):
        with T.Kernel(2) as bx:
            f = T.alloc_fragment((32, 24), dtype)
            if kind == "clear":
                T.clear(f)
            else:
                T.fill(f, value)
            T.copy(f, B[bx * 32, 0])
    return fill


def _fill_ref(inputs, dtype, kind):
    return [np.full((40, 24), 0.0 if kind == "clear" else (1.0 if dtype == "bool" else 3.0))]


MMA_DTYPES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3", "float8_e5m2", "int8")


def gemm_cases() -> list:
    out = []
    for dtype in MMA_DTYPES:
        acc = "float64" if dtype == "float64" else ("int32" if dtype == "int8" else "float32")
        for ta in (False, True):
            for tb in (False, True):
                for (m, n, k) in ((64, 64, 64), (100, 72, 40), (32, 96, 128)):
                    tag = ("t" if ta else "n") + ("t" if tb else "n")
                    out.append(Case(f"gemm/{dtype}/{tag}/{m}x{n}x{k}", "gemm",
                                    {"dtype": dtype, "acc": acc, "ta": ta, "tb": tb, "m": m, "n": n, "k": k},
                                    (f"dtype:{dtype}:storage", f"dtype:{dtype}:mma", f"dtype:{acc}:storage"),
                                    _gemm_kernel, _gemm_inputs, _gemm_ref, op_class="matmul", reduce_len=k,
                                    out_dtype=acc, acc_dtype=acc))
    # one warpgroup's tile (64 rows, 128-byte rows of K): the shape the Hopper pipeline takes on sm_90a
    # (TMA + WGMMA, cuda.hopper_gemm_pipeline); elsewhere an ordinary tiled gemm. Edges on M and N.
    for dtype in ("float16", "bfloat16"):
        out.append(Case(f"gemm/{dtype}/nt/warpgroup_tile", "gemm",
                        {"dtype": dtype, "acc": "float32", "ta": False, "tb": True, "m": 200, "n": 96, "k": 320,
                         "stages": 3, "tile": (64, 32, 64, 128)},
                        (f"dtype:{dtype}:storage", f"dtype:{dtype}:mma"), _gemm_kernel, _gemm_inputs, _gemm_ref,
                        op_class="matmul", reduce_len=320, out_dtype="float32"))
    for stages in (0, 1, 2, 3):
        out.append(Case(f"pipelined/float16/stages{stages}", "pipelined",
                        {"dtype": "float16", "acc": "float32", "ta": False, "tb": False, "m": 96, "n": 64, "k": 160,
                         "stages": stages},
                        ("dtype:float16:storage", "dtype:float16:mma"), _gemm_kernel, _gemm_inputs, _gemm_ref,
                        op_class="matmul", reduce_len=160, out_dtype="float32"))
    return out


def _gemm_kernel(dtype, acc, ta, tb, m, n, k, stages=2, tile=(32, 32, 16, 128)):
    bm, bn, bk, threads = tile
    a_shape, b_shape = ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))
    as_shape, bs_shape = ((bk, bm) if ta else (bm, bk)), ((bn, bk) if tb else (bk, bn))

    @T.prim_func
    def gemm(A: T.Tensor(a_shape, dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor((m, n), acc)):
        with T.Kernel(T.ceildiv(n, bn), T.ceildiv(m, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared(as_shape, dtype)
            B_s = T.alloc_shared(bs_shape, dtype)
            C_l = T.alloc_fragment((bm, bn), acc)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(k, bk), num_stages=stages):
                if ta:
                    T.copy(A[ko * bk, by * bm], A_s)
                else:
                    T.copy(A[by * bm, ko * bk], A_s)
                if tb:
                    T.copy(B[bx * bn, ko * bk], B_s)
                else:
                    T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l, transpose_A=ta, transpose_B=tb)
            T.copy(C_l, C[by * bm, bx * bn])
    return gemm


def _gemm_inputs(rng, dtype, acc, ta, tb, m, n, k, stages=2, tile=None):
    return [make(rng, (k, m) if ta else (m, k), dtype), make(rng, (n, k) if tb else (k, n), dtype)]


def _gemm_ref(inputs, dtype, acc, ta, tb, m, n, k, stages=2, tile=None):
    a, b = f64(inputs[0]), f64(inputs[1])
    return [(a.T if ta else a) @ (b.T if tb else b)]


REDUCERS = {"sum": lambda x, d: x.sum(d), "max": lambda x, d: x.max(d), "min": lambda x, d: x.min(d),
            "abssum": lambda x, d: np.abs(x).sum(d), "absmax": lambda x, d: np.abs(x).max(d)}
COMBINE = {"sum": np.add, "max": np.maximum, "min": np.minimum, "abssum": np.add, "absmax": np.maximum}


def reduce_cases() -> list:
    return [Case(f"reduce/{kind}/dim{dim}/{'clear' if clear else 'accumulate'}/{dtype}", "reduce",
                 {"kind": kind, "dim": dim, "clear": clear, "dtype": dtype},
                 (f"dtype:{dtype}:storage", f"dtype:{dtype}:arith"), _reduce_kernel, _reduce_inputs, _reduce_ref,
                 op_class="reduction", reduce_len=48 if dim == 1 else 64, out_dtype="float32")
            for kind in REDUCERS for dim in (0, 1) for clear in (True, False) for dtype in ("float32", "float16")]


def _reduce_kernel(kind, dim, clear, dtype):
    n_out = 64 if dim == 1 else 48

    @T.prim_func
    def reduce(A: T.Tensor((64, 48), dtype), D: T.Tensor((n_out,), "float32"), B: T.Tensor((n_out,), "float32")):
        with T.Kernel(1) as bx:
            f = T.alloc_fragment((64, 48), dtype)
            r = T.alloc_fragment((n_out,), "float32")
            T.copy(A, f)
            T.copy(D, r)
            if kind == "sum":
                T.reduce_sum(f, r, dim=dim, clear=clear)
            elif kind == "max":
                T.reduce_max(f, r, dim=dim, clear=clear)
            elif kind == "min":
                T.reduce_min(f, r, dim=dim, clear=clear)
            elif kind == "abssum":
                T.reduce_abssum(f, r, dim=dim, clear=clear)
            else:
                T.reduce_absmax(f, r, dim=dim, clear=clear)
            T.copy(r, B)
    return reduce


def _reduce_inputs(rng, kind, dim, clear, dtype):
    return [make(rng, (64, 48), dtype), make(rng, (64 if dim == 1 else 48,), "float32")]


def _reduce_ref(inputs, kind, dim, clear, dtype):
    a, d = f64(inputs[0]), f64(inputs[1])
    r = REDUCERS[kind](a, dim)
    return [r if clear else COMBINE[kind](d, r)]


def reduce_nan_cases() -> list:
    """T.reduce_max / min / absmax propagate NaN (docs/language.md), as torch and numpy do."""
    return [Case(f"reduce_nan/{kind}/dim{dim}/{dtype}", "reduce_nan",
                 {"kind": kind, "dim": dim, "clear": True, "dtype": dtype},
                 (f"dtype:{dtype}:storage", f"dtype:{dtype}:arith"), _reduce_kernel, _reduce_nan_inputs, _reduce_ref,
                 op_class="reduction", reduce_len=48 if dim == 1 else 64, out_dtype="float32")
            for kind in ("max", "min", "absmax") for dim in (0, 1) for dtype in ("float32", "float16")]


def _reduce_nan_inputs(rng, kind, dim, clear, dtype):
    a, d = _reduce_inputs(rng, kind, dim, clear, dtype)
    if dim == 0:
        a = a.T.copy()
    a[0, 0] = a[5, 47] = a[9, 20] = np.nan  # first, last and a middle element of a row; most rows have none
    a[12, :] = np.nan
    if dim == 0:
        a = a.T.copy()
    return [a, d]


def cumsum_cases() -> list:
    return [Case(f"cumsum/dim{dim}/{'reverse' if rev else 'forward'}/{dtype}", "cumsum",
                 {"dim": dim, "reverse": rev, "dtype": dtype}, (f"dtype:{dtype}:storage", f"dtype:{dtype}:arith"),
                 _cumsum_kernel, lambda rng, dim, reverse, dtype: [make(rng, (32, 40), dtype)], _cumsum_ref,
                 op_class="reduction", reduce_len=40, out_dtype=dtype)
            for dim in (0, 1) for rev in (False, True) for dtype in ("float32", "int32")]


def _cumsum_kernel(dim, reverse, dtype):
    @T.prim_func
    def cumsum(A: T.Tensor((32, 40), dtype), B: T.Tensor((32, 40), dtype)):
        with T.Kernel(1) as bx:
            f = T.alloc_fragment((32, 40), dtype)
            T.copy(A, f)
            T.cumsum(f, dim=dim, reverse=reverse)
            T.copy(f, B)
    return cumsum


def _cumsum_ref(inputs, dim, reverse, dtype):
    a = f64(inputs[0])
    if reverse:
        return [np.flip(np.cumsum(np.flip(a, dim), dim), dim)]
    return [np.cumsum(a, dim)]


MATH = {
    "exp": (lambda x: T.exp(x), np.exp, False), "exp2": (lambda x: T.exp2(x), np.exp2, False),
    "log": (lambda x: T.log(x), np.log, True), "log2": (lambda x: T.log2(x), np.log2, True),
    "sqrt": (lambda x: T.sqrt(x), np.sqrt, True), "rsqrt": (lambda x: T.rsqrt(x), lambda x: 1 / np.sqrt(x), True),
    "abs": (lambda x: T.abs(x), np.abs, False), "tanh": (lambda x: T.tanh(x), np.tanh, False),
    "relu": (lambda x: T.max(x, 0), lambda x: np.maximum(x, 0), False),
    "min": (lambda x: T.min(x, 0.5), lambda x: np.minimum(x, 0.5), False),
    "select": (lambda x: T.if_then_else(x > 0, x * 2, -x), lambda x: np.where(x > 0, x * 2, -x), False),
    "mul_add": (lambda x: x * 3 + 1, lambda x: x * 3 + 1, False),
    "div": (lambda x: 1 / x, lambda x: 1 / x, True),
}


def math_cases() -> list:
    return [Case(f"elementwise/{name}/{dtype}", "elementwise", {"fn": name, "dtype": dtype},
                 (f"dtype:{dtype}:storage", f"dtype:{dtype}:arith"), _math_kernel, _math_inputs, _math_ref,
                 out_dtype=dtype)
            for name in MATH for dtype in FLOATS]


def _math_kernel(fn, dtype):
    f = MATH[fn][0]
    n = T.dynamic("n")

    @T.prim_func
    def elementwise(A: T.Tensor((n,), dtype), B: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, 64)) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < n:
                    B[bx * 64 + i] = f(A[bx * 64 + i])
    return elementwise


def _math_inputs(rng, fn, dtype):
    return [make(rng, (200,), dtype, positive=MATH[fn][2])]


def _math_ref(inputs, fn, dtype):
    return [MATH[fn][1](f64(inputs[0]))]


def atomic_cases() -> list:
    out = []
    for op in ("add", "max", "min"):
        for dtype in ("int32", "float32", "float16", "float64"):
            for form in ("point", "region"):
                if form == "region" and op != "add":
                    continue
                out.append(Case(f"atomic/{op}/{form}/{dtype}", "atomic", {"op": op, "form": form, "dtype": dtype},
                                ("feature:atomics", f"dtype:{dtype}:storage", f"dtype:{dtype}:atomic_add"),
                                _atomic_kernel, _atomic_inputs, _atomic_ref, out_idx=(),
                                op_class="reduction" if op == "add" else "data", reduce_len=64, out_dtype=dtype,
                                acc_dtype=dtype))  # every atomic add rounds to the element type
    return out


def _atomic_kernel(op, form, dtype):
    if form == "region":
        @T.prim_func
        def atomic_region(V: T.Tensor((8, 16), dtype), H: T.Tensor((16,), dtype)):
            with T.Kernel(8) as bx:
                f = T.alloc_fragment((16,), dtype)
                T.copy(V[bx, 0:16], f)
                T.atomic_add(H[0:16], f)
        return atomic_region

    @T.prim_func
    def atomic_point(V: T.Tensor((256,), dtype), I: T.Tensor((256,), "int32"), H: T.Tensor((16,), dtype)):
        with T.Kernel(4) as bx:
            for i in T.serial(64):
                if op == "add":
                    T.atomic_add(H[I[bx * 64 + i]], V[bx * 64 + i])
                elif op == "max":
                    T.atomic_max(H[I[bx * 64 + i]], V[bx * 64 + i])
                else:
                    T.atomic_min(H[I[bx * 64 + i]], V[bx * 64 + i])
    return atomic_point


def _atomic_inputs(rng, op, form, dtype):
    if form == "region":
        return [make(rng, (8, 16), dtype), make(rng, (16,), dtype)]
    return [make(rng, (256,), dtype), rng.integers(0, 16, 256).astype(np.int32), make(rng, (16,), dtype)]


def _atomic_ref(inputs, op, form, dtype):
    if form == "region":
        return [f64(inputs[1]) + f64(inputs[0]).sum(0)]
    v, idx, h = f64(inputs[0]), np.asarray(inputs[1]), f64(inputs[2]).copy()
    ufunc = {"add": np.add, "max": np.maximum, "min": np.minimum}[op]
    ufunc.at(h, idx, v)
    return [h]


def dynamic_cases() -> list:
    out = [Case(f"dynamic/axpy/n{n}", "dynamic", {"n": n}, ("dtype:float32:storage", "dtype:float32:arith"),
                lambda n: _axpy(), lambda rng, n: [make(rng, (n,), "float32")],
                lambda inputs, n: [2 * f64(inputs[0]) + 1]) for n in (1, 63, 64, 1000)]
    # a pipelined GEMM whose M, N, K are shape symbols: where the target copies T.Pipelined tiles
    # asynchronously, the copies are versioned on N % 8 and K % 8 (16-byte runs of float16, D20); one
    # shape takes the wide copies, the other (ragged too) the narrow ones
    for m, n, k in ((70, 72, 96), (33, 77, 90)):
        out.append(Case(f"dynamic/gemm_pipelined/float16/{m}x{n}x{k}", "dynamic",
                        {"dtype": "float16", "acc": "float32", "ta": False, "tb": False, "m": m, "n": n, "k": k},
                        ("dtype:float16:storage", "dtype:float16:mma"), _dynamic_gemm_kernel, _gemm_inputs,
                        _gemm_ref, op_class="matmul", reduce_len=k, out_dtype="float32"))
    return out


def _dynamic_gemm_kernel(dtype, acc, ta, tb, m, n, k, tile=(64, 64, 32, 128), stages=3):
    bm, bn, bk, threads = tile
    M, N, K = T.dynamic("M"), T.dynamic("N"), T.dynamic("K")

    @T.prim_func
    def gemm_dyn(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), acc)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), acc)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])
    return gemm_dyn


def _axpy():
    n = T.symbolic("n")

    @T.prim_func
    def axpy(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 128)) as bx:
            for i in T.Parallel(128):
                if bx * 128 + i < n:
                    Y[bx * 128 + i] = X[bx * 128 + i] * 2.0 + 1.0
    return axpy


def composite_cases() -> list:
    from . import composite

    out = []
    for dtype in ("float32", "float16"):
        # block memory these kernels need where fragments live in it (WebGPU, the generic CUDA path): the
        # float32 variants do not fit the WebGPU baseline's 16 KiB, which must say NOT_SUPPORTED, not FAIL
        block = {"rmsnorm": "17KiB", "layernorm": "17KiB", "attention": "25KiB"} if dtype == "float32" else {}
        for name in ("softmax", "rmsnorm", "layernorm"):
            need = (f"limit:max_shared_bytes_per_block>={block[name]}",) if name in block else ()
            out.append(Case(f"{name}/{dtype}", name, {"dtype": dtype},
                            (f"dtype:{dtype}:storage", "dtype:float32:arith") + need,
                            getattr(composite, name), composite.row_inputs, getattr(composite, name + "_ref"),
                            op_class="reduction", reduce_len=128, out_dtype=dtype))
        for causal in (False, True):
            out.append(Case(f"attention/{'causal' if causal else 'full'}/{dtype}", "attention",
                            {"dtype": dtype, "causal": causal},
                            (f"dtype:{dtype}:storage", f"dtype:{dtype}:mma", "dtype:float32:mma")
                            + ((f"limit:max_shared_bytes_per_block>={block['attention']}",) if block else ()),
                            composite.attention, composite.attention_inputs, composite.attention_ref,
                            # P is rounded to the input dtype before P @ V (as TileLang kernels do)
                            op_class="matmul", reduce_len=80 if dtype == "float32" else 4, out_dtype=dtype,
                            acc_dtype=dtype))
    for causal in (False, True):  # its shared buffers: Q, K and V tiles of 64 x 64 float16 (24 KiB); a backend
        # that also keeps the fragments in block memory may refuse it for the limit (NOT_SUPPORTED)
        out.append(Case(f"attention/{'causal' if causal else 'full'}/float16/warpgroup_tile", "attention",
                        {"dtype": "float16", "causal": causal},
                        ("dtype:float16:storage", "dtype:float16:mma", "dtype:float32:mma",
                         "limit:max_shared_bytes_per_block>=24KiB"),
                        composite.attention_tile, composite.attention_tile_inputs, composite.attention_tile_ref,
                        op_class="matmul", reduce_len=4, out_dtype="float16", acc_dtype="float16"))
    return out


#: features that have a case of their own: a pipelined GEMM that must be compiled with the feature
FEATURES = ("async_copy", "bulk_tensor_copy", "async_barrier", "matrix_unit", "warp_specialization", "clusters",
            "subgroup_ops")


def feature_cases() -> list:
    params = {"dtype": "float16", "acc": "float32", "ta": False, "tb": False, "m": 64, "n": 64, "k": 64}
    return [Case(f"feature/{feat}/gemm_float16", "feature", params,
                 (f"feature:{feat}", "dtype:float16:mma"), _gemm_kernel, _gemm_inputs, _gemm_ref,
                 op_class="matmul", reduce_len=64, pass_configs={"tilecore.require": [f"feature:{feat}"]})
            for feat in FEATURES]


def catalog() -> list:
    cases = (copy_cases() + fill_cases() + gemm_cases() + reduce_cases() + reduce_nan_cases() + cumsum_cases()
             + math_cases()
             + atomic_cases() + dynamic_cases() + composite_cases() + feature_cases())
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    return cases


__all__ = ["catalog", "make", "f64", "math"]
