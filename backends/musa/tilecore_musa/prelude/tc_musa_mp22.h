/* tilecore-musa, mp_22 (QY2) matrix unit: the 32x32x16 MMA atom one 128-wide warp executes
   (mute MP22_32x32x16_F32F16F16F32_TN: __musa_fmma_m32n32k16_mma(d, a, b, c, 0, 0, 0, 0, 1, 1)). Only the
   float16 atom is spelled: the bfloat16 atom's flags were not read, so bfloat16 gemms run as FMA loops. Registers are
   tilecore's per-thread arrays in the unit's register order (tilecore_musa/units.py): C 8 floats, A and
   B 4 16-bit values each, packed in pairs into the instruction's 32-bit registers. */
#pragma once
#if !defined(__MUSA_ARCH__) || __MUSA_ARCH__ == 220
__device__ __forceinline__ void tc_mp22_mma(float* c, const __half* a, const __half* b) {
  int pa[2], pb[2];
  __builtin_memcpy(pa, a, sizeof(pa));
  __builtin_memcpy(pb, b, sizeof(pb));
  /* d, a, b, c, then the flags of mute's TN form (A and B K-major) */
  __musa_fmma_m32n32k16_mma((int*)c, pa, pb, (const int*)c, 0, 0, 0, 0, 1, 1);
}
#endif
