/* ---- registered matrix units on register arrays (MatrixOp, from tilecore.passes.matrix) -------------- */
/* mma.sync m16n8k16: A is 8 and B 4 16-bit elements per lane, in the unit's register order; pairs of
 * consecutive elements are packed into the 32-bit registers the instruction reads (low half first) */
__device__ __forceinline__ unsigned tc_pack_bits(__half lo, __half hi) {
  return (unsigned)__half_as_ushort(lo) | ((unsigned)__half_as_ushort(hi) << 16);
}
__device__ __forceinline__ unsigned tc_pack_bits(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return (unsigned)__bfloat16_as_ushort(lo) | ((unsigned)__bfloat16_as_ushort(hi) << 16);
}
template <bool BF16, typename T>
__device__ __forceinline__ void tc_mma_16816_regs(float* c, const T* a, const T* b) {
  const unsigned ar[4] = {tc_pack_bits(a[0], a[1]), tc_pack_bits(a[2], a[3]), tc_pack_bits(a[4], a[5]),
                          tc_pack_bits(a[6], a[7])};
  const unsigned br[2] = {tc_pack_bits(b[0], b[1]), tc_pack_bits(b[2], b[3])};
  tc_mma_16816<BF16>(c, ar, br);
}
__device__ __forceinline__ void tc_mma_16816_r(float* c, const __half* a, const __half* b) {
  tc_mma_16816_regs<false>(c, a, b);
}
__device__ __forceinline__ void tc_mma_16816_r(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b) {
  tc_mma_16816_regs<true>(c, a, b);
}
/* an operand of mma.sync m16n8k16 from shared memory by ldmatrix (MatrixLoad): N 8x8 matrices (.trans
 * where the tile is stored transposed) land as N 32-bit registers, unpacked into the unit's register
 * order (low half first); `p` is this lane's row address (16 bytes, 16-byte aligned) */
__device__ __forceinline__ void tc_unpack_bits(__half* d, unsigned r) {
  d[0] = __ushort_as_half((unsigned short)(r & 0xffffu));
  d[1] = __ushort_as_half((unsigned short)(r >> 16));
}
__device__ __forceinline__ void tc_unpack_bits(__nv_bfloat16* d, unsigned r) {
  d[0] = __ushort_as_bfloat16((unsigned short)(r & 0xffffu));
  d[1] = __ushort_as_bfloat16((unsigned short)(r >> 16));
}
template <int N, bool TRANS, typename T>
__device__ __forceinline__ void tc_ldsm_regs(T* dst, const T* p) {
  unsigned r[4];
  if (N == 4) {
    if (TRANS) tc_ldsm_x4_t(r, p); else tc_ldsm_x4(r, p);
  } else {
    if (TRANS) tc_ldsm_x2_t(r, p); else tc_ldsm_x2(r, p);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) tc_unpack_bits(dst + 2 * i, r[i]);
}
