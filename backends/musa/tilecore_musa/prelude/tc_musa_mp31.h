/* tilecore-musa, mp_31 (PH1) vendor paths: TME bulk tensor copies, ASYNC barrier IDs, SQMMA on 4-warp
   squads and per-thread asynchronous copies (the force_async_copy / LDLMS path). Written from the
   instruction spellings of MooreThreads/tilelang_musa (src/tl_templates/musa/copy_mp31.h, barrier.h,
   copy.h) and mute (arch/mma_sqmma_mp31.hpp); tilecore's own helpers only. None of it has run: no PH1
   device or mcc was reachable when it was written (mode codegen-only). */
#pragma once
/* device-only: begin (tests/musa_host_emulator.py swaps these for a host emulation) */
#if !defined(__MUSA_ARCH__) || __MUSA_ARCH__ >= 310
typedef int tc_v2i __attribute__((vector_size(8)));
typedef int tc_v3i __attribute__((vector_size(12)));
typedef int tc_v4i __attribute__((vector_size(16)));
typedef int tc_v5i __attribute__((vector_size(20)));
typedef __attribute__((address_space(3))) void tc_smem_void;
typedef __attribute__((address_space(1))) void tc_gmem_void;

__device__ __forceinline__ tc_smem_void* tc_smem_ptr(const void* p) {
  return (tc_smem_void*)(unsigned long long)(unsigned)__cvta_generic_to_shared(p);
}

/* TME tile loads: barrier id, shared destination, descriptor address, box dims, coordinates (innermost
   first), then swizzle granularity / stride / line (0 = none, 256-byte stride and line), prefetch and the
   inner / outer cache hints (CACHE_NORMAL = 2) */
#define TC_TME_TAIL 0, 3, 1, 0, 2, 2, 0
__device__ __forceinline__ void tc_tme_load_1d(const MUtensorDescriptor& d, unsigned bar, void* s, int c0, int d0) {
  __musa_tme_ld_tile_1d(bar, tc_smem_ptr(s), (unsigned long long)&d, d0, c0, TC_TME_TAIL);
}
__device__ __forceinline__ void tc_tme_load_2d(const MUtensorDescriptor& d, unsigned bar, void* s, int c0, int c1,
                                               int d0, int d1) {
  tc_v2i crd = {c0, c1}, dim = {d0, d1};
  __musa_tme_ld_tile_2d(bar, tc_smem_ptr(s), (unsigned long long)&d, dim, crd, TC_TME_TAIL);
}
__device__ __forceinline__ void tc_tme_load_3d(const MUtensorDescriptor& d, unsigned bar, void* s, int c0, int c1,
                                               int c2, int d0, int d1, int d2) {
  tc_v3i crd = {c0, c1, c2}, dim = {d0, d1, d2};
  __musa_tme_ld_tile_3d(bar, tc_smem_ptr(s), (unsigned long long)&d, dim, crd, TC_TME_TAIL);
}
__device__ __forceinline__ void tc_tme_load_4d(const MUtensorDescriptor& d, unsigned bar, void* s, int c0, int c1,
                                               int c2, int c3, int d0, int d1, int d2, int d3) {
  tc_v4i crd = {c0, c1, c2, c3}, dim = {d0, d1, d2, d3};
  __musa_tme_ld_tile_4d(bar, tc_smem_ptr(s), (unsigned long long)&d, dim, crd, TC_TME_TAIL);
}
__device__ __forceinline__ void tc_tme_load_5d(const MUtensorDescriptor& d, unsigned bar, void* s, int c0, int c1,
                                               int c2, int c3, int c4, int d0, int d1, int d2, int d3, int d4) {
  tc_v5i crd = {c0, c1, c2, c3, c4}, dim = {d0, d1, d2, d3, d4};
  __musa_tme_ld_tile_5d(bar, tc_smem_ptr(s), (unsigned long long)&d, dim, crd, TC_TME_TAIL);
}

/* per-thread asynchronous copy global -> shared (tilecore.plan_pipelines' AsyncCopy): N bytes, zeros where
   the predicate is false; the hardware waits for all of a thread's copies at once */
template <int N> __device__ __forceinline__ void tc_async_copy(void* dst, const void* src, bool pred) {
  if (pred) {
    __musa_memcpy_g2s(tc_smem_ptr(dst), (tc_gmem_void*)src, N, 0);
  } else {
    typedef int tc_w __attribute__((ext_vector_type(N / 4)));
    *(tc_w*)dst = (tc_w)0;
  }
}
__device__ __forceinline__ void tc_async_wait() { __musa_memcpy_g2s_wait(); }

/* SQMMA (TCE): C (M x N, float32, shared) += A (M x K) B (K x N) (16-bit, shared), every squad of 128
   threads issuing IM x IN instructions over K in steps of IK on operand descriptors, then warpsquad_wait
   (__musa_sqmma_wait). The accumulator registers follow makePHSqmmaFragmentC (tilelang_musa
   gemm_layouts.cc): register j of squad lane l holds row 16 (j % (IM / 16)) + 4 (l / 32) + (l / 8) % 4,
   column 8 (j / (IM / 16)) + l % 8. tc_sqmma_desc is tilecore's stand-in for the TCE shared-memory
   descriptor (mute arch/tce_desc.hpp, not read): its encoding is unverified. */
__device__ __forceinline__ int tc_sqmma_desc(const void* p, int ld_bytes) {
  return (int)((((unsigned)__cvta_generic_to_shared(p)) >> 4) | (((unsigned)ld_bytes >> 4) << 18));
}
template <int IM, int IN> struct tc_sqmma_op;
template <> struct tc_sqmma_op<64, 64> {
  static __device__ __forceinline__ void run(int* d, const int* da, const int* db, int ta, int tb, int scale, int k,
                                             int type) {
    __musa_sqmma_m64n64_mma(d, da, db, d, ta, tb, 0, 0, scale, 0, k, type);
  }
};
template <> struct tc_sqmma_op<32, 32> {
  static __device__ __forceinline__ void run(int* d, const int* da, const int* db, int ta, int tb, int scale, int k,
                                             int type) {
    __musa_sqmma_m32n32_mma(d, da, db, d, ta, tb, 0, 0, scale, 0, k, type);
  }
};
/* TceABDtype: F16F16 = 2, BF16BF16 = 3 (mute arch/mma_mp31.hpp) */
template <int THREADS, int M, int N, int K, int IM, int IN, int IK, bool TA, bool TB, bool BF16, bool CLEAR, typename T>
__device__ __forceinline__ void tc_sqmma_gemm(const T* A, const T* B, float* C, int lda, int ldb, int ldc) {
  constexpr int SQUADS = THREADS / 128, TILES_M = M / IM, TILES_N = N / IN, REGS = IM * IN / 128;
  const int tid = (int)threadIdx.x, squad = tid / 128, lane = tid % 128;
  for (int t = squad; t < TILES_M * TILES_N; t += SQUADS) {
    const int m0 = (t % TILES_M) * IM, n0 = (t / TILES_M) * IN;
    float acc[REGS];
    for (int j = 0; j < REGS; ++j) {
      const int r = 16 * (j % (IM / 16)) + 4 * (lane / 32) + (lane / 8) % 4, c = 8 * (j / (IM / 16)) + lane % 8;
      acc[j] = CLEAR ? 0.0f : C[(m0 + r) * ldc + n0 + c];
    }
    for (int k0 = 0; k0 < K; k0 += IK) {
      const T* pa = TA ? A + k0 * lda + m0 : A + m0 * lda + k0;
      const T* pb = TB ? B + n0 * ldb + k0 : B + k0 * ldb + n0;
      const int da = tc_sqmma_desc(pa, lda * (int)sizeof(T)), db = tc_sqmma_desc(pb, ldb * (int)sizeof(T));
      tc_sqmma_op<IM, IN>::run((int*)acc, &da, &db, TA ? 1 : 0, TB ? 0 : 1, 0, IK, BF16 ? 3 : 2);
    }
    __musa_sqmma_wait(); /* warpsquad_wait: this squad's SQMMAs are complete */
    for (int j = 0; j < REGS; ++j) {
      const int r = 16 * (j % (IM / 16)) + 4 * (lane / 32) + (lane / 8) % 4, c = 8 * (j / (IM / 16)) + lane % 8;
      C[(m0 + r) * ldc + n0 + c] = acc[j];
    }
  }
}
#endif
/* device-only: end */
