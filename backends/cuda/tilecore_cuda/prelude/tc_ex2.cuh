/* device-only: begin (tests/cuda_host_emulator.py has the host's) */
/* 2^x as one MUFU.EX2, for arguments the caller has checked are >= -126 or NaN: exactly what exp2f runs for
 * them (its non-flushing lowering halves an argument below -126 and squares the result, for subnormal
 * results, and leaves the others to the same MUFU.EX2). regprog.py, tilecore.cuda.exp2_range_check (D35);
 * included only in kernels that call it. */
__device__ __forceinline__ float tc_ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
/* device-only: end */
