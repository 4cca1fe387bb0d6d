/* tilecore SIMT C++ prelude: the language-neutral helpers of the SIMT C++ dialects (integer floor division,
   min / max, the assertion status word, compare-and-swap atomic loops). A backend's prelude includes it
   (#include "tc_simt.h"); the backend's code generator inlines it there (SIMTCppEmitter.inline_prelude),
   so the kernel source is one self-contained text. */
#pragma once

__device__ __forceinline__ long long tc_floordiv(long long a, long long b) {
  long long q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__device__ __forceinline__ long long tc_floormod(long long a, long long b) {
  long long r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> __device__ __forceinline__ T tc_iabs(T x) { return x < 0 ? -x : x; }
template <typename A, typename B> __device__ __forceinline__ auto tc_max(A a, B b) -> decltype(a + b) {
  return a > b ? a : b;
}
template <typename A, typename B> __device__ __forceinline__ auto tc_min(A a, B b) -> decltype(a + b) {
  return a < b ? a : b;
}
/* float min / max that propagate NaN (fmaxf / fminf drop it); fast math uses tc_max / tc_min */
template <typename A, typename B> __device__ __forceinline__ auto tc_nanmax(A a, B b) -> decltype(a + b) {
  return (a != a || b != b) ? a + b : (a > b ? a : b);
}
template <typename A, typename B> __device__ __forceinline__ auto tc_nanmin(A a, B b) -> decltype(a + b) {
  return (a != a || b != b) ? a + b : (a < b ? a : b);
}

/* device assertions: the first failing assertion's number goes to a status word in global memory */
__device__ __forceinline__ void tc_set_status(int* status, int code) { atomicCAS(status, 0, code); }

/* compare-and-swap loops for the rest: 32-bit and 64-bit words */
#define TC_ATOMIC_CAS32(NAME, T, OP)                                                              \
  __device__ __forceinline__ void NAME(T* p, T v) {                                              \
    unsigned int* a = (unsigned int*)p;                                                          \
    unsigned int old = *a, assumed;                                                              \
    do {                                                                                         \
      assumed = old;                                                                             \
      T cur = __uint_as_float_t<T>(assumed);                                                     \
      T nxt = OP(cur, v);                                                                        \
      old = atomicCAS(a, assumed, __t_as_uint<T>(nxt));                                          \
    } while (assumed != old);                                                                    \
  }
template <typename T> __device__ __forceinline__ T __uint_as_float_t(unsigned int x);
template <> __device__ __forceinline__ float __uint_as_float_t<float>(unsigned int x) { return __uint_as_float(x); }
template <typename T> __device__ __forceinline__ unsigned int __t_as_uint(T x);
template <> __device__ __forceinline__ unsigned int __t_as_uint<float>(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float tc_fmax_(float a, float b) { return a > b ? a : b; }
__device__ __forceinline__ float tc_fmin_(float a, float b) { return a < b ? a : b; }
__device__ __forceinline__ void tc_atomic_add_float32(float* p, float v) { atomicAdd(p, v); }
TC_ATOMIC_CAS32(tc_atomic_max_float32, float, tc_fmax_)
TC_ATOMIC_CAS32(tc_atomic_min_float32, float, tc_fmin_)

__device__ __forceinline__ double tc_dmax_(double a, double b) { return a > b ? a : b; }
__device__ __forceinline__ double tc_dmin_(double a, double b) { return a < b ? a : b; }
__device__ __forceinline__ void tc_atomic_add_float64(double* p, double v) { atomicAdd(p, v); }
#define TC_ATOMIC_CAS64(NAME, OP)                                                                 \
  __device__ __forceinline__ void NAME(double* p, double v) {                                    \
    unsigned long long* a = (unsigned long long*)p;                                              \
    unsigned long long old = *a, assumed;                                                        \
    do {                                                                                         \
      assumed = old;                                                                             \
      double nxt = OP(__longlong_as_double((long long)assumed), v);                              \
      old = atomicCAS(a, assumed, (unsigned long long)__double_as_longlong(nxt));                \
    } while (assumed != old);                                                                    \
  }
TC_ATOMIC_CAS64(tc_atomic_max_float64, tc_dmax_)
TC_ATOMIC_CAS64(tc_atomic_min_float64, tc_dmin_)

/* 16-bit floats: CAS on the 16-bit word (atomicCAS on unsigned short needs compute capability 7.0) */
#define TC_ATOMIC_CAS16(NAME, T, TO_F, FROM_F, OP)                                                \
  __device__ __forceinline__ void NAME(T* p, float v) {                                          \
    unsigned short* a = (unsigned short*)p;                                                      \
    unsigned short old = *a, assumed;                                                            \
    do {                                                                                         \
      assumed = old;                                                                             \
      T cur = *(T*)&assumed;                                                                     \
      T nxt = FROM_F(OP(TO_F(cur), v));                                                          \
      old = atomicCAS(a, assumed, *(unsigned short*)&nxt);                                       \
    } while (assumed != old);                                                                    \
  }
__device__ __forceinline__ float tc_fadd_(float a, float b) { return a + b; }
