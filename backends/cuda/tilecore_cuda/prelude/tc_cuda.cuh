/* tilecore-cuda prelude: helpers the generated CUDA C++ uses. Compiled by NVRTC or nvcc. */
#pragma once
/* cuda_bf16.h and cuda_fp8.h only in kernels that use them (codegen.prelude drops the lines: 7 and 19 ms of
   NVRTC's front end); what needs bfloat16 is inside #ifdef __CUDA_BF16_TYPES_EXIST__ (cuda_bf16.h's macro) */
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

/* 16-bit floats are stored as __half / __nv_bfloat16 and computed in float */
__device__ __forceinline__ float tc_round_h(float x) { return __half2float(__float2half_rn(x)); }
#ifdef __CUDA_BF16_TYPES_EXIST__
__device__ __forceinline__ float tc_round_bf(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
#endif

#include "tc_simt.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
/* float: one instruction (PTX max.NaN / min.NaN, sm_80+) instead of two compares and two selects; the
   exact FlashAttention row max lost 12% to the generic form on the H100 */
__device__ __forceinline__ float tc_nanmax(float a, float b) {
  float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
__device__ __forceinline__ float tc_nanmin(float a, float b) {
  float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
#endif

/* atomics: tc_atomic_<op>_<dtype>(pointer, value in the value type) */
#define TC_ATOMIC_NATIVE(SUFFIX, T)                                                               \
  __device__ __forceinline__ void tc_atomic_add_##SUFFIX(T* p, T v) { atomicAdd(p, v); }          \
  __device__ __forceinline__ void tc_atomic_max_##SUFFIX(T* p, T v) { atomicMax(p, v); }          \
  __device__ __forceinline__ void tc_atomic_min_##SUFFIX(T* p, T v) { atomicMin(p, v); }
TC_ATOMIC_NATIVE(int32, int)
TC_ATOMIC_NATIVE(uint32, unsigned int)
TC_ATOMIC_NATIVE(uint64, unsigned long long)
__device__ __forceinline__ void tc_atomic_add_int64(long long* p, long long v) {
  atomicAdd((unsigned long long*)p, (unsigned long long)v);
}
__device__ __forceinline__ void tc_atomic_max_int64(long long* p, long long v) { atomicMax(p, v); }
__device__ __forceinline__ void tc_atomic_min_int64(long long* p, long long v) { atomicMin(p, v); }

TC_ATOMIC_CAS16(tc_atomic_add_float16, __half, __half2float, __float2half_rn, tc_fadd_)
TC_ATOMIC_CAS16(tc_atomic_max_float16, __half, __half2float, __float2half_rn, tc_fmax_)
TC_ATOMIC_CAS16(tc_atomic_min_float16, __half, __half2float, __float2half_rn, tc_fmin_)
#ifdef __CUDA_BF16_TYPES_EXIST__
TC_ATOMIC_CAS16(tc_atomic_add_bfloat16, __nv_bfloat16, __bfloat162float, __float2bfloat16_rn, tc_fadd_)
TC_ATOMIC_CAS16(tc_atomic_max_bfloat16, __nv_bfloat16, __bfloat162float, __float2bfloat16_rn, tc_fmax_)
TC_ATOMIC_CAS16(tc_atomic_min_bfloat16, __nv_bfloat16, __bfloat162float, __float2bfloat16_rn, tc_fmin_)
#endif

/* ---------------------------------------------------------------------------------------------------
 * Block-collective operations (tilecore Collective statements). Every thread of the block calls them
 * with the same arguments; the caller puts a __syncthreads() before and after. The first template
 * argument is the number of threads in the (one-dimensional) block.
 * ------------------------------------------------------------------------------------------------- */

template <int BYTES> struct tc_raw;
template <> struct tc_raw<1> { typedef unsigned char type; };
template <> struct tc_raw<2> { typedef unsigned short type; };
template <> struct tc_raw<4> { typedef unsigned int type; };
template <> struct tc_raw<8> { typedef unsigned long long type; };

/* device-only: begin (tests/test_cuda_tensor_cores.py swaps these for a host emulation) */
__device__ __forceinline__ unsigned tc_smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

/* cp.async (sm_80+): global -> shared, 16 bytes per instruction; bytes past `src_bytes` are zero-filled */
__device__ __forceinline__ void tc_cp_async16(void* dst_smem, const void* src_global, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(tc_smem_addr(dst_smem)), "l"(src_global),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void tc_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void tc_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* device-only: end */

/* dst[r * DST_LD + c] = src[r * src_ld + c] for r < ROWS, c < COLS, zero where r >= rows_valid or
 * c >= cols_valid (the source tensor's edge). 16-byte cp.async chunks when the source rows are 16-byte
 * aligned (checked at run time: tensor views may start anywhere), element copies otherwise. Waits for
 * its own copies before returning. The caller guarantees COLS * sizeof(T), DST_LD * sizeof(T) and the
 * address of dst are multiples of 16. */
template <int NTHREADS, int ROWS, int COLS, int DST_LD, typename T>
__device__ __forceinline__ void tc_copy_g2s_async(T* __restrict__ dst, const T* __restrict__ src, long long src_ld,
                                                  long long rows_valid, long long cols_valid) {
  typedef typename tc_raw<sizeof(T)>::type R;
  constexpr int V = 16 / (int)sizeof(T);
  constexpr int CPR = COLS / V;
  constexpr int TOTAL = ROWS * CPR;
  static_assert(COLS % V == 0, "tc_copy_g2s_async: rows must be whole 16-byte chunks");
  R* d = reinterpret_cast<R*>(dst);
  const R* s = reinterpret_cast<const R*>(src);
  const bool vec = ((reinterpret_cast<unsigned long long>(src) | (unsigned long long)(src_ld * (long long)sizeof(T))) &
                    15ULL) == 0;
  if (vec) {
#pragma unroll 4
    for (int c = threadIdx.x; c < TOTAL; c += NTHREADS) {
      const int r = c / CPR, col = (c % CPR) * V;
      R* dp = d + r * DST_LD + col;
      const long long left = cols_valid - col;
      const int n = (r < rows_valid && left > 0) ? (left < V ? (int)left : V) : 0;
      if (n > 0) {
        tc_cp_async16(dp, s + r * src_ld + col, n * (int)sizeof(T));
      } else {
        *reinterpret_cast<uint4*>(dp) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    tc_cp_async_commit();
    tc_cp_async_wait<0>();
  } else {
    for (int e = threadIdx.x; e < ROWS * COLS; e += NTHREADS) {
      const int r = e / COLS, col = e % COLS;
      d[r * DST_LD + col] = (r < rows_valid && col < cols_valid) ? s[r * src_ld + col] : (R)0;
    }
  }
}

/* ---- warp-level matrix multiply: mma.sync.aligned.m16n8k16, 16-bit inputs, float32 accumulators ---- */
/* device-only: begin (tests/test_cuda_tensor_cores.py swaps these for a host emulation) */
template <bool BF16>
__device__ __forceinline__ void tc_mma_16816(float* d, const unsigned* a, const unsigned* b);
template <> __device__ __forceinline__ void tc_mma_16816<false>(float* d, const unsigned* a, const unsigned* b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void tc_mma_16816<true>(float* d, const unsigned* a, const unsigned* b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* ldmatrix: lane l gives the address of row l % 8 of 8x8 matrix l / 8 (16 bytes, 16-byte aligned) */
__device__ __forceinline__ void tc_ldsm_x4(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tc_smem_addr(p)));
}
__device__ __forceinline__ void tc_ldsm_x4_t(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tc_smem_addr(p)));
}
__device__ __forceinline__ void tc_ldsm_x2(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(tc_smem_addr(p)));
}
__device__ __forceinline__ void tc_ldsm_x2_t(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(tc_smem_addr(p)));
}
/* device-only: end */
__device__ __forceinline__ unsigned tc_pack2(unsigned short lo, unsigned short hi) {
  return (unsigned)lo | ((unsigned)hi << 16);
}

/* C[M, N] (+)= A[M, K] * B[K, N] over block-local memory. Element (m, k) of A is A[m * SAM + k * SAK],
 * (k, n) of B is B[k * SBK + n * SBN], (m, n) of C is C[m * SCM + n * SCN] (so every transpose is a
 * choice of strides). The C tile is cut into chunks of WM x WN mma tiles (16 x 8 each); warps take the
 * chunks round-robin, load them into registers (or zero them: CLEAR), run the K loop (ldmatrix where
 * LDSM_A / LDSM_B say the layout allows, 16-bit shared loads otherwise) and store them back. */
template <int NTHREADS, int M, int N, int K, int SAM, int SAK, int SBK, int SBN, int SCM, int SCN, int WM, int WN,
          bool BF16, bool CLEAR, bool LDSM_A, bool LDSM_B, typename TAB>
__device__ __forceinline__ void tc_gemm_mma(const TAB* __restrict__ A, const TAB* __restrict__ B, float* __restrict__ C) {
  static_assert(M % (16 * WM) == 0 && N % (8 * WN) == 0 && K % 16 == 0, "tc_gemm_mma: shapes must be whole mma tiles");
  static_assert(NTHREADS % 32 == 0, "tc_gemm_mma: the block must be whole warps");
  constexpr int NWARPS = NTHREADS / 32;
  constexpr int CN = N / (8 * WN);
  constexpr int CHUNKS = (M / (16 * WM)) * CN;
  const unsigned short* a16 = reinterpret_cast<const unsigned short*>(A);
  const unsigned short* b16 = reinterpret_cast<const unsigned short*>(B);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  for (int chunk = warp; chunk < CHUNKS; chunk += NWARPS) {
    const int m0 = (chunk / CN) * (16 * WM), n0 = (chunk % CN) * (8 * WN);
    float acc[WM][WN][4];
#pragma unroll
    for (int i = 0; i < WM; ++i) {
#pragma unroll
      for (int j = 0; j < WN; ++j) {
        const int r = m0 + i * 16 + g, c = n0 + j * 8 + 2 * t;
        if (CLEAR) {
          acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
        } else if (SCN == 1 && SCM % 2 == 0) {
          const float2 lo = *reinterpret_cast<const float2*>(C + r * SCM + c);
          const float2 hi = *reinterpret_cast<const float2*>(C + (r + 8) * SCM + c);
          acc[i][j][0] = lo.x; acc[i][j][1] = lo.y; acc[i][j][2] = hi.x; acc[i][j][3] = hi.y;
        } else {
          acc[i][j][0] = C[r * SCM + c * SCN];
          acc[i][j][1] = C[r * SCM + (c + 1) * SCN];
          acc[i][j][2] = C[(r + 8) * SCM + c * SCN];
          acc[i][j][3] = C[(r + 8) * SCM + (c + 1) * SCN];
        }
      }
    }
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
      unsigned af[WM][4], bfr[WN][2];
#pragma unroll
      for (int i = 0; i < WM; ++i) {
        const int mb = m0 + i * 16;
        if (LDSM_A && SAK == 1) {  /* A rows (m) contiguous in k: plain ldmatrix */
          tc_ldsm_x4(af[i], a16 + (mb + (lane & 15)) * SAM + k0 + 8 * (lane >> 4));
        } else if (LDSM_A && SAM == 1) {  /* A stored k-major: transposing ldmatrix */
          const int q = lane >> 3;
          tc_ldsm_x4_t(af[i], a16 + (k0 + (lane & 7) + 8 * (q >> 1)) * SAK + mb + 8 * (q & 1));
        } else {
          af[i][0] = tc_pack2(a16[(mb + g) * SAM + (k0 + 2 * t) * SAK], a16[(mb + g) * SAM + (k0 + 2 * t + 1) * SAK]);
          af[i][1] = tc_pack2(a16[(mb + g + 8) * SAM + (k0 + 2 * t) * SAK],
                              a16[(mb + g + 8) * SAM + (k0 + 2 * t + 1) * SAK]);
          af[i][2] = tc_pack2(a16[(mb + g) * SAM + (k0 + 2 * t + 8) * SAK],
                              a16[(mb + g) * SAM + (k0 + 2 * t + 9) * SAK]);
          af[i][3] = tc_pack2(a16[(mb + g + 8) * SAM + (k0 + 2 * t + 8) * SAK],
                              a16[(mb + g + 8) * SAM + (k0 + 2 * t + 9) * SAK]);
        }
      }
#pragma unroll
      for (int j = 0; j < WN; j += 2) {
        const int nb = n0 + j * 8;
        const int q = (lane >> 3) & 3;
        if (LDSM_B && SBN == 1) {  /* B stored k-major (rows of n): transposing ldmatrix */
          const unsigned short* p = b16 + (k0 + (lane & 7) + 8 * (q & 1)) * SBK + nb + 8 * (q >> 1);
          if (j + 1 < WN) {
            unsigned r4[4];
            tc_ldsm_x4_t(r4, p);
            bfr[j][0] = r4[0]; bfr[j][1] = r4[1]; bfr[j + 1][0] = r4[2]; bfr[j + 1][1] = r4[3];
          } else {
            tc_ldsm_x2_t(bfr[j], b16 + (k0 + (lane & 7) + 8 * (q & 1)) * SBK + nb);
          }
        } else if (LDSM_B && SBK == 1) {  /* B stored n-major (rows of k): plain ldmatrix */
          const unsigned short* p = b16 + (nb + (lane & 7) + 8 * (q >> 1)) * SBN + k0 + 8 * (q & 1);
          if (j + 1 < WN) {
            unsigned r4[4];
            tc_ldsm_x4(r4, p);
            bfr[j][0] = r4[0]; bfr[j][1] = r4[1]; bfr[j + 1][0] = r4[2]; bfr[j + 1][1] = r4[3];
          } else {
            tc_ldsm_x2(bfr[j], b16 + (nb + (lane & 7)) * SBN + k0 + 8 * (q & 1));
          }
        } else {
#pragma unroll
          for (int jj = j; jj < j + 2 && jj < WN; ++jj) {
            const int n = n0 + jj * 8 + g;
            bfr[jj][0] = tc_pack2(b16[(k0 + 2 * t) * SBK + n * SBN], b16[(k0 + 2 * t + 1) * SBK + n * SBN]);
            bfr[jj][1] = tc_pack2(b16[(k0 + 2 * t + 8) * SBK + n * SBN], b16[(k0 + 2 * t + 9) * SBK + n * SBN]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < WM; ++i) {
#pragma unroll
        for (int j = 0; j < WN; ++j) tc_mma_16816<BF16>(acc[i][j], af[i], bfr[j]);
      }
    }
#pragma unroll
    for (int i = 0; i < WM; ++i) {
#pragma unroll
      for (int j = 0; j < WN; ++j) {
        const int r = m0 + i * 16 + g, c = n0 + j * 8 + 2 * t;
        if (SCN == 1 && SCM % 2 == 0) {
          *reinterpret_cast<float2*>(C + r * SCM + c) = make_float2(acc[i][j][0], acc[i][j][1]);
          *reinterpret_cast<float2*>(C + (r + 8) * SCM + c) = make_float2(acc[i][j][2], acc[i][j][3]);
        } else {
          C[r * SCM + c * SCN] = acc[i][j][0];
          C[r * SCM + (c + 1) * SCN] = acc[i][j][1];
          C[(r + 8) * SCM + c * SCN] = acc[i][j][2];
          C[(r + 8) * SCM + (c + 1) * SCN] = acc[i][j][3];
        }
      }
    }
  }
}

/* ---- register-program helpers (any arch): packing, quad shuffles, register fences, stores ---------- */
/* device-only: begin (tests/test_cuda_tensor_cores.py swaps these for a host emulation) */
__device__ __forceinline__ unsigned tc_pack_h2(float a, float b) {
  __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<unsigned*>(&h);
}
#ifdef __CUDA_BF16_TYPES_EXIST__
__device__ __forceinline__ unsigned tc_pack_bf2(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<unsigned*>(&h);
}
#endif
/* cp.async of 16 bytes to a shared-window address; bytes past `src_bytes` are zero-filled */
__device__ __forceinline__ void tc_cp_async16_raw(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
/* ldmatrix from a shared-window address (register programs compute swizzled addresses themselves) */
__device__ __forceinline__ void tc_ldsm_x4_raw(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void tc_ldsm_x4_t_raw(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ float tc_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
/* keep the compiler from moving reads or writes of accumulator registers across a WGMMA wait: to it
 * an asynchronous WGMMA's results look ready as soon as the instruction is issued */
template <int N> __device__ __forceinline__ void tc_reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void tc_reg_fence_u(unsigned (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
template <typename T> __device__ __forceinline__ void tc_store1(T* p, float v);
template <> __device__ __forceinline__ void tc_store1<float>(float* p, float v) { *p = v; }
template <> __device__ __forceinline__ void tc_store1<__half>(__half* p, float v) { *p = __float2half_rn(v); }
#ifdef __CUDA_BF16_TYPES_EXIST__
template <> __device__ __forceinline__ void tc_store1<__nv_bfloat16>(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}
#endif
template <typename T> __device__ __forceinline__ void tc_store2(T* p, float a, float b);
template <> __device__ __forceinline__ void tc_store2<float>(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
template <> __device__ __forceinline__ void tc_store2<__half>(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}
#ifdef __CUDA_BF16_TYPES_EXIST__
template <> __device__ __forceinline__ void tc_store2<__nv_bfloat16>(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
#endif
/* device-only: end */
