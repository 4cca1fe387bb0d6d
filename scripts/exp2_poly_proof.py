"""The exact build's exp2 on the FMA pipe (docs/decisions.md D60, ``tilecore.cuda.exp2_poly``,
``backends/cuda/tilecore_cuda/prelude/tc_ex2_poly.cuh``): its error against 2^x, for every float32 argument the
register programs' softmax can pass it.

The softmax's argument is ``x = round(s c) - round(m c)`` with ``m`` the row maximum of the scores ``s`` and ``c > 0``,
so ``x <= 0`` (IEEE rounding is monotone), ``-inf`` for masked scores, NaN only from NaN inputs. ``tc_ex2_poly``
clamps ``x`` below -190 to -190 (max.NaN: NaN stays), so every argument below -190 gives what -190 gives (0, the
correctly rounded 2^x there). The model below performs the function's operations in float32 with IEEE
round-to-nearest-even and no flushing, as the exact build does (``--fmad=false``; the FMAs are explicit
``__fmaf_rn``, emulated here exactly: the product is exact in float64 and the sum is rounded to odd in float64, then
to float32), and the script measures, for every float32 ``x`` in [-190, 0] (bit patterns 0x80000000..0xC33E0000,
1,128,136,705 values) and +0, -inf and NaN, the error ``|model(x) - 2^x| / ulp(2^x)`` (2^x in float64; ulp
2^-149 for subnormal results). exp2f's documented bound (CUDA Math API) is 2 ulp.

    python scripts/exp2_poly_proof.py             # exhaustive: about 15 minutes on one core
    python scripts/exp2_poly_proof.py --sample    # every binade, 4096 values each, and the edges: seconds

Result of the exhaustive run (2026-11-27, 16 minutes): at most 0.9483 ulp (at x = -0.497119...), subnormal results
at most 0.9417 ulp (near 2^-126 the polynomial's relative error is about a whole ulp of the subnormal scale); NaN ->
NaN, -inf -> 0, +-0 -> 1. The model's bits equal the GPU's (tests/test_cuda_exp2_poly.py, on an
sm_90 GPU); they are not exp2f's (MUFU.EX2's approximation is not published; the device test counts how often they
differ).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

#: the degree-6 fit to 2^f on [-1/2, 1/2] (relative error 1.6e-8), float32, constant term first; the prelude's
#: literals (tests/test_cuda_exp2_poly.py checks they are these)
COEFFS = (1.0, float.fromhex("0x1.62e430p-1"), float.fromhex("0x1.ebfbdcp-3"), float.fromhex("0x1.c6aee8p-5"),
          float.fromhex("0x1.3b2d4ap-7"), float.fromhex("0x1.5f3e78p-10"), float.fromhex("0x1.41fd68p-13"))
CLAMP = -190.0
MAGIC = 12582912.0  # 1.5 * 2^23
BOUND = 2.0  # exp2f's documented maximum ulp error


def fma32(a, b, c):
    """float32 ``fma(a, b, c)`` correctly rounded, elementwise."""
    p = a.astype(np.float64) * np.float64(b) if np.ndim(b) == 0 else a.astype(np.float64) * b.astype(np.float64)
    c = np.full(p.shape, np.float64(c)) if np.ndim(c) == 0 else c.astype(np.float64)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)  # s + err = p + c exactly (TwoSum)
    odd = (s.view(np.int64) & 1) == 1
    fix = (err != 0) & ~odd & np.isfinite(s)
    s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)  # round to odd
    return s.astype(np.float32)


def model(x, coeffs=COEFFS):
    """``tc_ex2_poly`` operation for operation (float32 arrays in, float32 out)."""
    f32 = np.float32
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        xc = np.where(np.isnan(x), x, np.maximum(x, f32(CLAMP)))
        t = xc + f32(MAGIC)
        j = t - f32(MAGIC)
        f = xc - j
        p = np.full_like(f, f32(coeffs[-1]))
        for c in coeffs[-2::-1]:
            p = fma32(p, f, f32(c))
        s = ((t.view(np.uint32) << np.uint32(23)) + np.uint32(191 << 23)).view(np.float32)
        return (p * s) * f32(2.0 ** -64)


def ulp_error(out, x):
    """``|out - 2^x| / ulp(2^x)`` in float64 (ulp 2^-149 below 2^-126); NaN where x is NaN."""
    ref = np.exp2(np.asarray(x, np.float64))
    e = np.floor(np.log2(np.maximum(ref, 2.0 ** -149)))
    ulp = np.exp2(np.maximum(e - 23, -149))
    return np.abs(out.astype(np.float64) - ref) / ulp


def edges():
    v = [0.0, -0.0, -1e-45, -2.0 ** -24, -0.5, -1.0, -125.0, -125.5, -126.0, -126.5, -127.0, -148.5, -149.0,
         -149.5, -150.0, -151.0, -189.5, -190.0, -190.5, -1000.0, -3.0e38, -np.inf]
    x = np.array(v, np.float32)
    return np.concatenate([x, np.nextafter(x, np.float32(0)), np.nextafter(x, np.float32(-np.inf))])


def sample(per_binade: int = 4096, seed: int = 0):
    """``per_binade`` values in each binade of [-190, 0] (exponents -149..7, subnormal arguments included), and
    :func:`edges`."""
    rng = np.random.default_rng(seed)
    out = [edges()]
    for e in range(-149, 8):
        lo = np.float32(-(2.0 ** e))
        bits = rng.integers(0, 1 << 23, per_binade, dtype=np.uint32) + lo.view(np.uint32)
        out.append(bits.view(np.float32))
    x = np.concatenate(out)
    return x[~(x < CLAMP)]


def check(x, coeffs=COEFFS):
    """(largest ulp error, the argument there, largest error among subnormal results) over ``x`` (no NaN)."""
    out = model(x, coeffs)
    err = ulp_error(out, x)
    k = int(err.argmax())
    sub = np.exp2(x.astype(np.float64)) < 2.0 ** -126
    return float(err[k]), float(x[k]), float(err[sub].max()) if sub.any() else 0.0


def exhaustive(step: int = 1 << 24, log=print):
    hi = int(np.float32(CLAMP).view(np.uint32))
    worst, at, sub_worst, n, b, t0 = 0.0, None, 0.0, 0, 0x80000000, time.time()
    while b <= hi:
        e = min(hi, b + step - 1)
        x = np.arange(b, e + 1, dtype=np.uint64).astype(np.uint32).view(np.float32)
        w, a, s = check(x)
        if w > worst:
            worst, at = w, a
        sub_worst = max(sub_worst, s)
        n += x.size
        b = e + 1
        log(f"{n} values: max {worst:.4f} ulp at {at!r}, subnormal results max {sub_worst:.4f} ({time.time() - t0:.0f} s)")
    return n, worst, at, sub_worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", action="store_true", help="every binade, 4096 values each, and the edges")
    args = ap.parse_args(argv)
    special = model(np.array([np.nan, -np.inf, 0.0, -0.0], np.float32))
    assert np.isnan(special[0]) and special[1] == 0 and special[2] == 1 and special[3] == 1, special
    if args.sample:
        x = sample()
        w, a, s = check(x)
        print(f"{x.size} sampled values: max {w:.4f} ulp at {a!r}, subnormal results max {s:.4f}")
    else:
        n, w, a, s = exhaustive(log=lambda m: print(m, flush=True))
        print(f"exhaustive, {n} values in [-190, 0]: max {w:.4f} ulp at {a!r}, subnormal results max {s:.4f}")
    print("NaN -> NaN, -inf -> 0, +-0 -> 1")
    return 0 if w <= BOUND else 1


if __name__ == "__main__":
    sys.exit(main())
