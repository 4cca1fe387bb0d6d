/* ---- matrix units on register arrays (MatrixOp from tilecore.passes.matrix; layouts in units.py) ------ */
/* Each wrapper packs the unit's registers (in the unit's register order) into the vector operands of one
   clang builtin and unpacks the accumulators. MFMA (CDNA, wave 64): 16x16x16 f16 / bf16 (bf16_1k),
   gfx950's 16x16x32 f16 / bf16, 16x16x32 fp8 (FNUZ bytes on gfx942: operands re-encoded from OCP with the
   hardware conversion; OCP on gfx950). WMMA (RDNA3, wave 32): 16x16x16 f16 / bf16, A and B replicated in
   both half-waves. */
typedef float tc_f4 __attribute__((ext_vector_type(4)));
typedef float tc_f8 __attribute__((ext_vector_type(8)));
typedef _Float16 tc_h4 __attribute__((ext_vector_type(4)));
typedef _Float16 tc_h8 __attribute__((ext_vector_type(8)));
typedef _Float16 tc_h16 __attribute__((ext_vector_type(16)));
typedef short tc_s4 __attribute__((ext_vector_type(4)));
typedef short tc_s16 __attribute__((ext_vector_type(16)));
typedef __bf16 tc_b8 __attribute__((ext_vector_type(8)));
template <typename V, int N, typename T> __device__ __forceinline__ V tc_vec(const T* p) {
  V v;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = p[i];
  return v;
}
template <int N, typename V> __device__ __forceinline__ void tc_unvec(float* c, V v) {
#pragma unroll
  for (int i = 0; i < N; ++i) c[i] = v[i];
}
template <typename V, int N> __device__ __forceinline__ V tc_vec_bits(const __bf16* p) {
  V v;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = __builtin_bit_cast(short, p[i]);
  return v;
}
/* N consecutive operand elements from LDS into registers as 8- or 16-byte reads (ds_read_b64 / _b128); the
   caller proved the source aligned to the run */
template <int N, typename T> __device__ __forceinline__ void tc_lds_vec(T* dst, const T* src) {
  constexpr int B = N * (int)sizeof(T);
  typedef int tc_v __attribute__((ext_vector_type(B >= 16 ? 4 : 2)));
#pragma unroll
  for (int i = 0; i < B / (int)sizeof(tc_v); ++i) {
    const tc_v v = reinterpret_cast<const tc_v*>(src)[i];
    __builtin_memcpy(reinterpret_cast<char*>(dst) + i * sizeof(tc_v), &v, sizeof(tc_v));
  }
}
/* device-only: begin (tests/hip_host_emulator.py swaps these for a host emulation) */
#if defined(__gfx90a__) || defined(__gfx942__) || defined(__gfx950__)
__device__ __forceinline__ void tc_mfma_16x16x16(float* c, const _Float16* a, const _Float16* b) {
  tc_unvec<4>(c, __builtin_amdgcn_mfma_f32_16x16x16f16(tc_vec<tc_h4, 4>(a), tc_vec<tc_h4, 4>(b), tc_vec<tc_f4, 4>(c),
                                                       0, 0, 0));
}
__device__ __forceinline__ void tc_mfma_16x16x16(float* c, const __bf16* a, const __bf16* b) {
  tc_unvec<4>(c, __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(tc_vec_bits<tc_s4, 4>(a), tc_vec_bits<tc_s4, 4>(b),
                                                           tc_vec<tc_f4, 4>(c), 0, 0, 0));
}
#endif
#if defined(__gfx950__)
__device__ __forceinline__ void tc_mfma_16x16x32(float* c, const _Float16* a, const _Float16* b) {
  tc_unvec<4>(c, __builtin_amdgcn_mfma_f32_16x16x32_f16(tc_vec<tc_h8, 8>(a), tc_vec<tc_h8, 8>(b), tc_vec<tc_f4, 4>(c),
                                                        0, 0, 0));
}
__device__ __forceinline__ void tc_mfma_16x16x32(float* c, const __bf16* a, const __bf16* b) {
  tc_unvec<4>(c, __builtin_amdgcn_mfma_f32_16x16x32_bf16(tc_vec<tc_b8, 8>(a), tc_vec<tc_b8, 8>(b), tc_vec<tc_f4, 4>(c),
                                                         0, 0, 0));
}
#endif
#if defined(__gfx942__) || defined(__gfx950__)
/* 8 fp8 operands as one 64-bit register; FNUZ hardware gets them re-encoded (v_cvt_pk_fp8/bf8_f32) */
template <typename T, bool E5M2> __device__ __forceinline__ long tc_fp8_pack(const T* p) {
  unsigned long long v = 0;
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    unsigned w;
#if TC_FP8_FNUZ
    const float x0 = E5M2 ? tc_fp8_to_f(p[i].bits, 2, 15, false) : tc_fp8_to_f(p[i].bits, 3, 7, true);
    const float x1 = E5M2 ? tc_fp8_to_f(p[i + 1].bits, 2, 15, false) : tc_fp8_to_f(p[i + 1].bits, 3, 7, true);
    w = E5M2 ? (unsigned)__builtin_amdgcn_cvt_pk_bf8_f32(x0, x1, 0, false)
             : (unsigned)__builtin_amdgcn_cvt_pk_fp8_f32(x0, x1, 0, false);
    w &= 0xffffu;
#else
    w = (unsigned)p[i].bits | ((unsigned)p[i + 1].bits << 8);
#endif
    v |= (unsigned long long)w << (8 * i);
  }
  return (long)v;
}
__device__ __forceinline__ void tc_mfma_16x16x32_fp8(float* c, const tc_fp8_e4m3* a, const tc_fp8_e4m3* b) {
  tc_unvec<4>(c, __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(tc_fp8_pack<tc_fp8_e4m3, false>(a),
                                                            tc_fp8_pack<tc_fp8_e4m3, false>(b), tc_vec<tc_f4, 4>(c), 0, 0, 0));
}
__device__ __forceinline__ void tc_mfma_16x16x32_fp8(float* c, const tc_fp8_e5m2* a, const tc_fp8_e5m2* b) {
  tc_unvec<4>(c, __builtin_amdgcn_mfma_f32_16x16x32_bf8_bf8(tc_fp8_pack<tc_fp8_e5m2, true>(a),
                                                            tc_fp8_pack<tc_fp8_e5m2, true>(b), tc_vec<tc_f4, 4>(c), 0, 0, 0));
}
#endif
#if defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__)
__device__ __forceinline__ void tc_wmma_16x16x16(float* c, const _Float16* a, const _Float16* b) {
  tc_unvec<8>(c, __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(tc_vec<tc_h16, 16>(a), tc_vec<tc_h16, 16>(b),
                                                            tc_vec<tc_f8, 8>(c)));
}
__device__ __forceinline__ void tc_wmma_16x16x16(float* c, const __bf16* a, const __bf16* b) {
  tc_unvec<8>(c, __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(tc_vec_bits<tc_s16, 16>(a), tc_vec_bits<tc_s16, 16>(b),
                                                             tc_vec<tc_f8, 8>(c)));
}
#endif
/* device-only: end */
