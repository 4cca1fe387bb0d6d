/* tilecore-hip prelude: everything the generated HIP C++ uses, with no ROCm header. Compiled by clang
   (-x hip -nogpuinc -nogpulib), so the HIP keywords, indices, barriers, atomics and math are spelled here
   from clang's AMDGPU builtins (clang's "HIP Support" and "AMDGPU builtins" documentation, LLVM's
   AMDGPUUsage). The code generator defines TC_WAVE (the profile's execution.simd_width) before it. */
#pragma once

/* device-only: begin (HIP's keywords, from clang's attributes) */
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
/* the kernel's block size: the register budget, and barriers of one-wave blocks dropped (clang does not
   apply CUDA's launch_bounds spelling to AMDGPU kernels) */
#define tc_block_size(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
#ifndef INFINITY
#define INFINITY __builtin_inff()
#endif
#ifndef NAN
#define NAN __builtin_nanf("")
#endif
/* device-only: end */

/* device-only: begin (tests/hip_host_emulator.py swaps these for a host emulation) */
/* indices: the workgroup (block) and work-item (thread) ids */
#define tc_thread_x() ((int)__builtin_amdgcn_workitem_id_x())
#define tc_block_x() ((long long)__builtin_amdgcn_workgroup_id_x())
#define tc_block_y() ((long long)__builtin_amdgcn_workgroup_id_y())
#define tc_block_z() ((long long)__builtin_amdgcn_workgroup_id_z())

/* __syncthreads: a workgroup barrier between a release and an acquire fence (LDS and global memory) */
__device__ __forceinline__ void tc_barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
/* a barrier that also tells every thread whether any thread passed a nonzero predicate */
__device__ __forceinline__ int tc_barrier_or(int pred) {
  __shared__ int tc_any;
  tc_barrier();
  if (tc_thread_x() == 0) tc_any = 0;
  tc_barrier();
  if (pred) __hip_atomic_fetch_or(&tc_any, 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
  tc_barrier();
  return tc_any;
}

/* lane exchange across the wave (TC_WAVE lanes): ds_bpermute reads lane (lane ^ mask) of the same
   `width`-aligned group; 64-bit values go as two 32-bit halves */
__device__ __forceinline__ int tc_lane_id() {
#if TC_WAVE == 64
  return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
#else
  return __builtin_amdgcn_mbcnt_lo(~0u, 0u);
#endif
}
__device__ __forceinline__ int tc_bperm32(int v, int mask, int width) {
  const int lane = tc_lane_id();
  const int src = (lane & ~(width - 1)) | ((lane ^ mask) & (width - 1));
  return __builtin_amdgcn_ds_bpermute(src << 2, v);
}
template <typename T> __device__ __forceinline__ T tc_shfl_xor(T v, int mask, int width) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "tc_shfl_xor: 32- or 64-bit values");
  if constexpr (sizeof(T) == 4) {
    return __builtin_bit_cast(T, tc_bperm32(__builtin_bit_cast(int, v), mask, width));
  } else {
    long long x = __builtin_bit_cast(long long, v);
    const int lo = tc_bperm32((int)x, mask, width), hi = tc_bperm32((int)(x >> 32), mask, width);
    return __builtin_bit_cast(T, (long long)(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo));
  }
}

/* atomics (device scope, relaxed, as CUDA's atomicAdd) */
template <typename T> __device__ __forceinline__ T atomicCAS(T* p, T expected, T desired) {
  __hip_atomic_compare_exchange_strong(p, &expected, desired, __ATOMIC_RELAXED, __ATOMIC_RELAXED,
                                       __HIP_MEMORY_SCOPE_AGENT);
  return expected;
}
template <typename T> __device__ __forceinline__ T atomicAdd(T* p, T v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
template <typename T> __device__ __forceinline__ T atomicMax(T* p, T v) {
  return __hip_atomic_fetch_max(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
template <typename T> __device__ __forceinline__ T atomicMin(T* p, T v) {
  return __hip_atomic_fetch_min(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
/* device-only: end */

__device__ __forceinline__ float __uint_as_float(unsigned x) { return __builtin_bit_cast(float, x); }
__device__ __forceinline__ unsigned __float_as_uint(float x) { return __builtin_bit_cast(unsigned, x); }
__device__ __forceinline__ double __longlong_as_double(long long x) { return __builtin_bit_cast(double, x); }
__device__ __forceinline__ long long __double_as_longlong(double x) { return __builtin_bit_cast(long long, x); }

/* 16-bit floats are stored as _Float16 / __bf16 and computed in float; conversions round to nearest even */
__device__ __forceinline__ float tc_round_h(float x) { return (float)(_Float16)x; }
__device__ __forceinline__ float tc_round_bf(float x) { return (float)(__bf16)x; }

/* float8 in memory is the OCP encoding (E4M3FN, E5M2: torch.float8_e4m3fn / float8_e5m2), stored as bytes
   and converted in software (every arch gets the same numbers); TC_FP8_FNUZ (the profile's
   features.float8_fnuz) re-encodes matrix-unit operands for hardware that reads FNUZ bytes */
__device__ __forceinline__ float tc_fp8_to_f(unsigned char b, int mbits, int bias, bool fn) {
  const int ebits = 7 - mbits;
  const int e = (b >> mbits) & ((1 << ebits) - 1), m = b & ((1 << mbits) - 1);
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (fn && e == (1 << ebits) - 1 && m == (1 << mbits) - 1) return __builtin_nanf("");
  if (!fn && e == (1 << ebits) - 1) return m ? __builtin_nanf("") : sign * __builtin_inff();
  if (e == 0) return sign * __builtin_ldexpf((float)m, 1 - bias - mbits);
  return sign * __builtin_ldexpf((float)(m + (1 << mbits)), e - bias - mbits);
}
/* round to nearest even, saturating to the largest finite value (NaN stays NaN) */
__device__ __forceinline__ unsigned char tc_f_to_fp8(float x, int mbits, int bias, float maxv, bool fn) {
  const unsigned char sign = __builtin_signbit(x) ? 0x80 : 0;
  if (x != x) return fn ? 0x7f : 0x7f;
  float a = __builtin_fabsf(x);
  if (a > maxv) a = maxv;
  int e;
  __builtin_frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1) */
  int ue = e - 1 + bias;   /* biased exponent of a normal number */
  if (ue < 1) ue = 1;      /* subnormals share the smallest exponent */
  const float q = __builtin_ldexpf(a, mbits - (ue - bias));
  float r = __builtin_rintf(q);
  int code = (int)r; /* (1 << mbits) + mantissa for normals */
  if (code >= (2 << mbits)) { ue += 1; code >>= 1; }
  const int enc = (code < (1 << mbits)) ? code : (((ue) << mbits) | (code - (1 << mbits)));
  return sign | (unsigned char)enc;
}
struct tc_fp8_e4m3 { unsigned char bits; };
struct tc_fp8_e5m2 { unsigned char bits; };
__device__ __forceinline__ float tc_e4m3_f(tc_fp8_e4m3 v) { return tc_fp8_to_f(v.bits, 3, 7, true); }
__device__ __forceinline__ float tc_e5m2_f(tc_fp8_e5m2 v) { return tc_fp8_to_f(v.bits, 2, 15, false); }
__device__ __forceinline__ tc_fp8_e4m3 tc_f_e4m3(float x) { return {tc_f_to_fp8(x, 3, 7, 448.0f, true)}; }
__device__ __forceinline__ tc_fp8_e5m2 tc_f_e5m2(float x) { return {tc_f_to_fp8(x, 2, 15, 57344.0f, false)}; }

#include "tc_simt.h"

/* atomics: tc_atomic_<op>_<dtype>(pointer, value in the value type) */
#define TC_ATOMIC_NATIVE(SUFFIX, T)                                                               \
  __device__ __forceinline__ void tc_atomic_add_##SUFFIX(T* p, T v) { atomicAdd(p, v); }          \
  __device__ __forceinline__ void tc_atomic_max_##SUFFIX(T* p, T v) { atomicMax(p, v); }          \
  __device__ __forceinline__ void tc_atomic_min_##SUFFIX(T* p, T v) { atomicMin(p, v); }
TC_ATOMIC_NATIVE(int32, int)
TC_ATOMIC_NATIVE(uint32, unsigned int)
TC_ATOMIC_NATIVE(int64, long long)
TC_ATOMIC_NATIVE(uint64, unsigned long long)
__device__ __forceinline__ float tc_h2f_(_Float16 h) { return (float)h; }
__device__ __forceinline__ _Float16 tc_f2h_(float f) { return (_Float16)f; }
__device__ __forceinline__ float tc_bf2f_(__bf16 h) { return (float)h; }
__device__ __forceinline__ __bf16 tc_f2bf_(float f) { return (__bf16)f; }
TC_ATOMIC_CAS16(tc_atomic_add_float16, _Float16, tc_h2f_, tc_f2h_, tc_fadd_)
TC_ATOMIC_CAS16(tc_atomic_max_float16, _Float16, tc_h2f_, tc_f2h_, tc_fmax_)
TC_ATOMIC_CAS16(tc_atomic_min_float16, _Float16, tc_h2f_, tc_f2h_, tc_fmin_)
TC_ATOMIC_CAS16(tc_atomic_add_bfloat16, __bf16, tc_bf2f_, tc_f2bf_, tc_fadd_)
TC_ATOMIC_CAS16(tc_atomic_max_bfloat16, __bf16, tc_bf2f_, tc_f2bf_, tc_fmax_)
TC_ATOMIC_CAS16(tc_atomic_min_bfloat16, __bf16, tc_bf2f_, tc_f2bf_, tc_fmin_)

/* ---- asynchronous copies global -> LDS (tilecore.plan_pipelines; features.async_copy) ----------------- */
/* device-only: begin (tests/hip_host_emulator.py swaps these for a host emulation) */
/* global_load_lds writes lane i's N bytes at (one LDS address per wave, in M0) + i * N: issued where the
   wave's destinations are exactly that run and every lane's predicate holds (checked with a ballot), plain
   loads and LDS stores otherwise (zero-filled where the predicate is false). N = 4 (gfx942) or 12 / 16
   (gfx950: limits.max_async_copy_bytes); 8 bytes has no such load and is always copied with plain loads. */
template <int N> __device__ __forceinline__ void tc_async_copy(void* dst, const void* src, bool pred) {
#if defined(__gfx942__) || defined(__gfx950__)
  if constexpr (N == 4 || (N == 16 && TC_ASYNC_MAX >= 16)) {
    typedef __attribute__((address_space(3))) unsigned char tc_lds_byte;
    const unsigned lds = (unsigned)(unsigned long long)(tc_lds_byte*)dst;
    const unsigned base = lds - (unsigned)(tc_lane_id() * N);
    const bool ok = pred && base == (unsigned)__builtin_amdgcn_readfirstlane((int)base);
#if TC_WAVE == 64
    const bool all = __builtin_amdgcn_ballot_w64(ok) == __builtin_amdgcn_read_exec();
#else
    const bool all = __builtin_amdgcn_ballot_w32(ok) == __builtin_amdgcn_read_exec_lo();
#endif
    if (all) {
      __attribute__((address_space(1))) void* g = (__attribute__((address_space(1))) void*)src;
      __attribute__((address_space(3))) void* l = (__attribute__((address_space(3))) void*)(unsigned long long)base;
      if constexpr (N == 4) {
        __builtin_amdgcn_global_load_lds(g, l, 4, 0, 0);
      } else {
#if defined(__gfx950__)
        __builtin_amdgcn_global_load_lds(g, l, 16, 0, 0);
#endif
      }
      return;
    }
  }
#endif
  typedef int tc_w __attribute__((ext_vector_type(N / 4)));
  *(tc_w*)dst = pred ? *(const tc_w*)src : (tc_w)0;
}
/* the hardware counts outstanding loads per wave (vmcnt), not groups: wait for all of this wave's loads;
   the pipeline planner's barrier after it makes the other waves' copies visible */
__device__ __forceinline__ void tc_async_wait() { asm volatile("s_waitcnt vmcnt(0)" ::: "memory"); }
/* device-only: end */
