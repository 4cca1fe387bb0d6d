/* device-only: begin (tests/cuda_host_emulator.py has the host's) */
/* 2^x on the FMA pipe (D60, tilecore.cuda.exp2_poly): a fraction of a register program's exponentials off the
 * MUFU unit. 2^x = p(f) 2^j with j = rint(x) (the 1.5 * 2^23 trick: three FADD), f = x - j in [-1/2, 1/2] exactly,
 * p a degree-6 polynomial fit to 2^f (relative error 1.6e-8) in Horner form with explicit FMAs (the exact build
 * compiles with --fmad=false; these are written as FMAs), scaled by 2^(j + 64) (a power of two: exact) and then by
 * 2^-64, whose one rounding gives subnormal results. Arguments below -190 (and -inf) are clamped to -190 (the
 * result rounds to 0 either way); NaN stays NaN (max.NaN). Checked exhaustively on the host (scripts/exp2_poly_proof.py)
 * over every float32 in [-190, 0] and -inf: at most 0.95 ulp from 2^x (exp2f documents 2), subnormal results
 * included; the bits are not exp2f's (MUFU.EX2's are not published). For the register programs' softmax, whose
 * arguments are at most 0 (x = s c - m c with m the row maximum); valid up to x < 64. */
__device__ __forceinline__ float tc_ex2_poly(float x) {
  float xc;
  asm("max.NaN.f32 %0, %1, 0fC33E0000;" : "=f"(xc) : "f"(x));  /* max(x, -190), NaN kept */
  const float t = __fadd_rn(xc, 12582912.0f);                   /* 1.5 * 2^23 + rint(x) */
  const float j = __fadd_rn(t, -12582912.0f);
  const float f = __fadd_rn(xc, -j);
  float p = 0x1.41fd68p-13f;
  p = __fmaf_rn(p, f, 0x1.5f3e78p-10f);
  p = __fmaf_rn(p, f, 0x1.3b2d4ap-7f);
  p = __fmaf_rn(p, f, 0x1.c6aee8p-5f);
  p = __fmaf_rn(p, f, 0x1.ebfbdcp-3f);
  p = __fmaf_rn(p, f, 0x1.62e430p-1f);
  p = __fmaf_rn(p, f, 1.0f);
  const float s = __int_as_float((int)(((unsigned)__float_as_int(t) << 23) + (191u << 23)));  /* 2^(j + 64) */
  return __fmul_rn(__fmul_rn(p, s), 0x1p-64f);
}
/* device-only: end */
