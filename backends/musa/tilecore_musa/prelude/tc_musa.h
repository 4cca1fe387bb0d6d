/* tilecore-musa prelude: what the generated MUSA C++ uses beyond the MUSA toolkit. Compiled by mcc
   (-x musa --cuda-gpu-arch=mp_XX), which provides the CUDA-style built-ins (threadIdx, __syncthreads,
   __shfl_xor_sync, atomics, math); the 16-bit float types come from the toolkit's musa_fp16.h / musa_bf16.h
   (__half, __mt_bfloat16). The code generator defines TC_WARP (the profile's execution.simd_width: 128 on
   mp_22, 32 on mp_31) and TC_MUSA_ARCH (22 or 31) before it; vendor-only paths are also guarded by the
   compiler's own __MUSA_ARCH__ (220 / 310) where mcc defines it. */
#pragma once
#include <musa_fp16.h>
#include <musa_bf16.h>

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

/* 16-bit floats are stored as __half / __mt_bfloat16 and computed in float */
__device__ __forceinline__ float tc_h2f(__half h) { return __half2float(h); }
__device__ __forceinline__ __half tc_f2h(float f) { return __float2half_rn(f); }
__device__ __forceinline__ float tc_bf2f(__mt_bfloat16 h) { return __bfloat162float(h); }
__device__ __forceinline__ __mt_bfloat16 tc_f2bf(float f) { return __float2bfloat16_rn(f); }
__device__ __forceinline__ float tc_round_h(float x) { return tc_h2f(tc_f2h(x)); }
__device__ __forceinline__ float tc_round_bf(float x) { return tc_bf2f(tc_f2bf(x)); }

#include "tc_simt.h"

/* atomics: tc_atomic_<op>_<dtype>(pointer, value in the value type) */
#define TC_ATOMIC_NATIVE(SUFFIX, T)                                                               \
  __device__ __forceinline__ void tc_atomic_add_##SUFFIX(T* p, T v) { atomicAdd(p, v); }          \
  __device__ __forceinline__ void tc_atomic_max_##SUFFIX(T* p, T v) { atomicMax(p, v); }          \
  __device__ __forceinline__ void tc_atomic_min_##SUFFIX(T* p, T v) { atomicMin(p, v); }
TC_ATOMIC_NATIVE(int32, int)
TC_ATOMIC_NATIVE(uint32, unsigned int)
/* no 16-bit float atomics: the profiles declare float16 / bfloat16 atomic_add false until a 16-bit atomicCAS
   is confirmed on MUSA */
