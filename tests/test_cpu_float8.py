"""float8 storage on the cpu target (float8_e4m3fn, float8_e5m2), through the DSL + tilecore.compile: the
prelude's conversions agree with torch's bit for bit, for all 256 byte values both ways and for float32
values rounded to float8 (random bit patterns, values in range, exact ties and their neighbours)."""
from __future__ import annotations

import numpy as np
import pytest

import tilecore
import tilecore.language as T

torch = pytest.importorskip("torch")

FP8 = [("float8_e4m3", torch.float8_e4m3fn), ("float8_e5m2", torch.float8_e5m2)]
NOCACHE = {"tilecore.disable_cache": True}


def _kernel(n, src, dst, via=None):
    """``Y[i] = X[i]`` from ``src`` to ``dst`` (a load or a store conversion); with ``via``, the value is cast
    to ``via`` and back to ``dst`` in the expression (the rounding conversion of ``T.cast``)."""

    @T.prim_func
    def convert(X: T.Tensor((n,), src), Y: T.Tensor((n,), dst)):
        with T.Kernel(T.ceildiv(n, 256), threads=128) as bx:
            for i in T.Parallel(256):
                if bx * 256 + i < n:
                    if via is None:
                        Y[bx * 256 + i] = X[bx * 256 + i]
                    else:
                        Y[bx * 256 + i] = T.cast(T.cast(X[bx * 256 + i], via), dst)

    return tilecore.compile(convert, target="cpu", out_idx=[-1], pass_configs=NOCACHE)


def _all_bytes(tdt):
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(tdt)


def _bits32(x):
    return x.view(torch.int32).numpy()


def _floats_to_round(name, tdt):
    """float32 values to round to ``tdt``: every float8 value, the midpoints between neighbours (exact ties)
    and the floats just above and below them, values spread over the range, and random bit patterns (NaN,
    inf, float32 subnormals, overflow)."""
    exact = _all_bytes(tdt).to(torch.float64)
    finite = torch.sort(torch.unique(exact[torch.isfinite(exact)])).values
    mids = ((finite[1:] + finite[:-1]) / 2).to(torch.float32)  # exact in float32 (a few more bits)
    up = torch.nextafter(mids, torch.tensor(float("inf")))
    down = torch.nextafter(mids, torch.tensor(float("-inf")))
    g = torch.Generator().manual_seed(8)
    big = float(finite.max()) * 1.5
    spread = (torch.rand(4096, generator=g, dtype=torch.float64) * 2 - 1) * big
    tiny = (torch.rand(1024, generator=g, dtype=torch.float64) * 2 - 1) * float(finite[finite > 0].min()) * 4
    bits = torch.randint(-2**31, 2**31, (8192,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    edges = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"), 464.0, 480.0,
                          61440.0, 65536.0, 1e30, -1e30, 2.0**-140])
    return torch.cat([exact.to(torch.float32), mids, up, down, spread.to(torch.float32), tiny.to(torch.float32),
                      bits, edges.to(torch.float32)])


@pytest.mark.parametrize("name,tdt", FP8)
def test_all_256_float8_values_load_as_torch_converts_them(name, tdt):
    x = _all_bytes(tdt)
    y = _kernel(256, name, "float32")(x)
    np.testing.assert_array_equal(_bits32(y), _bits32(x.to(torch.float32)))  # NaN payloads included


@pytest.mark.parametrize("name,tdt", FP8)
def test_all_256_float8_values_store_back_to_the_same_byte_except_nan(name, tdt):
    x = _all_bytes(tdt).to(torch.float32)
    y = _kernel(256, "float32", name)(x)
    assert y.dtype == tdt
    np.testing.assert_array_equal(y.view(torch.uint8).numpy(), x.to(tdt).view(torch.uint8).numpy())
    finite = torch.isfinite(x) | torch.isinf(x)
    assert (y.view(torch.uint8)[finite] == torch.arange(256)[finite]).all()  # round trip, not just agreement


@pytest.mark.parametrize("name,tdt", FP8)
def test_float32_rounds_to_float8_as_torch_bit_for_bit(name, tdt):
    x = _floats_to_round(name, tdt)
    want = x.to(tdt).view(torch.uint8).numpy()
    got = _kernel(x.numel(), "float32", name)(x).view(torch.uint8).numpy()
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(float(x[i]), int(got[i]), int(want[i])) for i in bad[:8]]
    # T.cast to float8 inside an expression rounds the same way
    r = _kernel(x.numel(), "float32", "float32", via=name)(x)
    np.testing.assert_array_equal(_bits32(r), _bits32(x.to(tdt).to(torch.float32)))


@pytest.mark.parametrize("name,tdt", FP8)
def test_float64_and_float16_store_to_float8_as_torch(name, tdt):
    g = torch.Generator().manual_seed(9)
    x64 = torch.randn(4096, generator=g, dtype=torch.float64) * 100
    got = _kernel(x64.numel(), "float64", name)(x64).view(torch.uint8).numpy()
    np.testing.assert_array_equal(got, x64.to(tdt).view(torch.uint8).numpy())
    x16 = (torch.randn(4096, generator=g) * 100).half()
    got = _kernel(x16.numel(), "float16", name)(x16).view(torch.uint8).numpy()
    np.testing.assert_array_equal(got, x16.to(tdt).view(torch.uint8).numpy())


def test_float8_arithmetic_is_refused_like_on_cuda():
    @T.prim_func
    def add(X: T.Tensor((16,), "float8_e4m3"), Y: T.Tensor((16,), "float8_e4m3")):
        with T.Kernel(1):
            for i in T.Parallel(16):
                Y[i] = X[i] + X[i]

    with pytest.raises(tilecore.errors.UnsupportedFeatureError, match="float8_e4m3"):
        tilecore.compile(add, target="cpu", pass_configs=NOCACHE)
