/* device-only: begin (tests/cuda_host_emulator.py has the host's) */
/* Division by a row value in the exact build (D60, tilecore.cuda.row_division): div.rn.f32's own fast path, as ptxas
 * emits it for each `/` (MUFU.RCP of the divisor, one Newton step, q0 = a r, the remainder, one correction), with the
 * reciprocal's part once a row. tc_div_safe: |x| in [2^-40, 2^40] (not zero, NaN or inf): where dividend and divisor
 * both are, the quotient and the remainder's correction stay normal, div.rn's check (FCHK) passes and its result is
 * this one; the caller divides as written otherwise. */
__device__ __forceinline__ float tc_div_rcp(float b) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  return __fmaf_rn(r, __fmaf_rn(r, -b, 1.0f), r);
}
__device__ __forceinline__ bool tc_div_safe(float x) {
  const float a = fabsf(x);
  return a >= 0x1p-40f && a <= 0x1p40f;
}
__device__ __forceinline__ float tc_div_fast(float a, float b, float r) {
  const float q = __fmaf_rn(a, r, 0.0f);
  return __fmaf_rn(r, __fmaf_rn(q, -b, a), q);
}
/* device-only: end */
