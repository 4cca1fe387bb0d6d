/* tilecore Metal prelude: the helpers generated MSL calls (integer floor division, NaN-propagating
   min / max, erf, atomics on device and threadgroup memory, the assertion status word, the
   simdgroup-matrix gemm). Inlined into every kernel source after <metal_stdlib>. */
#pragma once

inline long tc_floordiv(long a, long b) {
  long q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
inline long tc_floormod(long a, long b) {
  long r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> inline T tc_iabs(T x) { return x < 0 ? -x : x; }
template <typename A, typename B> inline auto tc_max(A a, B b) -> decltype(a + b) { return a > b ? a : b; }
template <typename A, typename B> inline auto tc_min(A a, B b) -> decltype(a + b) { return a < b ? a : b; }
/* float min / max that propagate NaN (fmax / fmin drop it); fast math uses tc_max / tc_min */
template <typename A, typename B> inline auto tc_nanmax(A a, B b) -> decltype(a + b) {
  return (a != a || b != b) ? a + b : (a > b ? a : b);
}
template <typename A, typename B> inline auto tc_nanmin(A a, B b) -> decltype(a + b) {
  return (a != a || b != b) ? a + b : (a < b ? a : b);
}
/* MSL has no erf: erfc by a Chebyshev fit (fractional error below 1.2e-7), erf = 1 - erfc */
inline float tc_erf(float x) {
  float z = fabs(x), t = 1.0f / (1.0f + 0.5f * z);
  float r = t * precise::exp(-z * z - 1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f +
            t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f +
            t * (-0.82215223f + t * 0.17087277f)))))))));
  return x >= 0.0f ? 1.0f - r : r - 1.0f;
}

/* a simdgroup's maximum / minimum that is NaN when any lane holds NaN (as the butterfly of tc_nanmax) */
template <typename T> inline T tc_simd_max(T x) { return simd_any(x != x) ? x + simd_sum(x) : simd_max(x); }
template <typename T> inline T tc_simd_min(T x) { return simd_any(x != x) ? x + simd_sum(x) : simd_min(x); }

/* device assertions: the first failing assertion's number goes to the status word (buffer after the scalars) */
inline int tc_cas_int(device int* p, int expected, int desired) {
  int e = expected;
  while (!atomic_compare_exchange_weak_explicit((device atomic_int*)p, &e, desired, memory_order_relaxed,
                                                memory_order_relaxed) && e == expected) {
  }
  return e;
}
inline void tc_set_status(device int* status, int code) { tc_cas_int(status, 0, code); }
/* a barrier after which every thread of the threadgroup knows whether any failed an assertion */
inline bool tc_barrier_or(int fail, threadgroup int* any) {
  threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
  *any = 0;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (fail) *any = 1;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  bool r = *any != 0;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return r;
}

/* atomics: tc_atomic_<op>_<dtype>[_tg](pointer, value) on device memory (and, _tg, threadgroup memory: named
   apart rather than overloaded on the address space). 32-bit integers have fetch_add / max / min; float
   has fetch_add (atomic_float, MSL 3.0); float max / min are CAS loops */
#define TC_ATOMIC_INT(AS, TG, SUFFIX, T, AT)                                                           \
  inline void tc_atomic_add_##SUFFIX##TG(AS T* p, T v) { atomic_fetch_add_explicit((AS AT*)p, v, memory_order_relaxed); } \
  inline void tc_atomic_max_##SUFFIX##TG(AS T* p, T v) { atomic_fetch_max_explicit((AS AT*)p, v, memory_order_relaxed); } \
  inline void tc_atomic_min_##SUFFIX##TG(AS T* p, T v) { atomic_fetch_min_explicit((AS AT*)p, v, memory_order_relaxed); }
#define TC_ATOMIC_FLOAT(AS, TG)                                                                        \
  inline void tc_atomic_add_float32##TG(AS float* p, float v) {                                        \
    atomic_fetch_add_explicit((AS atomic_float*)p, v, memory_order_relaxed);                           \
  }                                                                                                    \
  inline void tc_atomic_max_float32##TG(AS float* p, float v) {                                            \
    uint old = atomic_load_explicit((AS atomic_uint*)p, memory_order_relaxed);                         \
    while (true) {                                                                                     \
      float cur = as_type<float>(old);                                                                 \
      float nxt = (cur != cur || v != v) ? cur + v : (cur > v ? cur : v);                              \
      if (atomic_compare_exchange_weak_explicit((AS atomic_uint*)p, &old, as_type<uint>(nxt),          \
                                                memory_order_relaxed, memory_order_relaxed)) break;    \
    }                                                                                                  \
  }                                                                                                    \
  inline void tc_atomic_min_float32##TG(AS float* p, float v) {                                            \
    uint old = atomic_load_explicit((AS atomic_uint*)p, memory_order_relaxed);                         \
    while (true) {                                                                                     \
      float cur = as_type<float>(old);                                                                 \
      float nxt = (cur != cur || v != v) ? cur + v : (cur < v ? cur : v);                              \
      if (atomic_compare_exchange_weak_explicit((AS atomic_uint*)p, &old, as_type<uint>(nxt),          \
                                                memory_order_relaxed, memory_order_relaxed)) break;    \
    }                                                                                                  \
  }
TC_ATOMIC_INT(device, , int32, int, atomic_int)
TC_ATOMIC_INT(device, , uint32, uint, atomic_uint)
TC_ATOMIC_INT(threadgroup, _tg, int32, int, atomic_int)
TC_ATOMIC_INT(threadgroup, _tg, uint32, uint, atomic_uint)
TC_ATOMIC_FLOAT(device, )
TC_ATOMIC_FLOAT(threadgroup, _tg)

/* T.gemm on simdgroup matrices: C (M x N, float, in threadgroup memory) += A (M x K) B (K x N), operands
   in threadgroup memory; element (m, k) of A at A[m * SAM + k * SAK] (a transpose swaps the strides), so
   one of each operand's strides is 1 and simdgroup_load reads it as rows (or transposed). The block's
   simdgroups take RM x RN chunks of 8x8 accumulator tiles in turn; a chunk's accumulators stay in the
   simdgroup's (opaque) matrix registers over the whole K loop and go back to threadgroup memory once. */
template <int THREADS, int M, int N, int K, int SAM, int SAK, int SBK, int SBN, int SCM, int RM, int RN, bool CLEAR,
          typename TA, typename TB, typename TC>
inline void tc_sg_gemm(threadgroup TA* A, threadgroup TB* B, threadgroup TC* C, uint tid) {
  const int sg = (int)tid / 32;
  constexpr int NSG = THREADS / 32, CM = M / (8 * RM), CN = N / (8 * RN);
  for (int chunk = sg; chunk < CM * CN; chunk += NSG) {
    const int m0 = (chunk % CM) * 8 * RM, n0 = (chunk / CM) * 8 * RN;
    simdgroup_matrix<float, 8, 8> acc[RM * RN];
    for (int i = 0; i < RM; ++i)
      for (int j = 0; j < RN; ++j) {
        if (CLEAR) acc[i * RN + j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
        else simdgroup_load(acc[i * RN + j], C + (m0 + 8 * i) * SCM + (n0 + 8 * j), SCM);
      }
    for (int k = 0; k < K; k += 8) {
      simdgroup_matrix<TA, 8, 8> a[RM];
      simdgroup_matrix<TB, 8, 8> b[RN];
      for (int i = 0; i < RM; ++i) {
        threadgroup TA* p = A + (m0 + 8 * i) * SAM + k * SAK;
        if (SAK == 1) simdgroup_load(a[i], p, SAM);
        else simdgroup_load(a[i], p, SAK, ulong2(0, 0), true);
      }
      for (int j = 0; j < RN; ++j) {
        threadgroup TB* p = B + k * SBK + (n0 + 8 * j) * SBN;
        if (SBN == 1) simdgroup_load(b[j], p, SBK);
        else simdgroup_load(b[j], p, SBN, ulong2(0, 0), true);
      }
      for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN; ++j) simdgroup_multiply_accumulate(acc[i * RN + j], a[i], b[j], acc[i * RN + j]);
    }
    for (int i = 0; i < RM; ++i)
      for (int j = 0; j < RN; ++j) simdgroup_store(acc[i * RN + j], C + (m0 + 8 * i) * SCM + (n0 + 8 * j), SCM);
  }
}

/* The same gemm with the accumulator tiles held in simdgroup registers over a whole K loop (the
   metal.resident_accumulators pass): tc_sg_acc_load before the loop, tc_sg_gemm_acc in it, tc_sg_acc_store
   after it. Simdgroup sg holds chunks sg, sg + NSG, ...: slot s of its array is its s-th chunk. The array
   is passed by reference (its size deduced), as MSL code passes simdgroup matrices. */
template <int THREADS, int M, int N, int SCM, int RM, int RN, typename TC, int TILES>
inline void tc_sg_acc_load(threadgroup TC* C, thread simdgroup_matrix<float, 8, 8> (&acc)[TILES], uint tid) {
  constexpr int NSG = THREADS / 32, CM = M / (8 * RM), CN = N / (8 * RN);
  int slot = 0;
  for (int chunk = (int)tid / 32; chunk < CM * CN; chunk += NSG, ++slot) {
    const int m0 = (chunk % CM) * 8 * RM, n0 = (chunk / CM) * 8 * RN;
    for (int i = 0; i < RM; ++i)
      for (int j = 0; j < RN; ++j) simdgroup_load(acc[slot * RM * RN + i * RN + j], C + (m0 + 8 * i) * SCM + (n0 + 8 * j), SCM);
  }
}
template <int THREADS, int M, int N, int SCM, int RM, int RN, typename TC, int TILES>
inline void tc_sg_acc_store(threadgroup TC* C, thread simdgroup_matrix<float, 8, 8> (&acc)[TILES], uint tid) {
  constexpr int NSG = THREADS / 32, CM = M / (8 * RM), CN = N / (8 * RN);
  int slot = 0;
  for (int chunk = (int)tid / 32; chunk < CM * CN; chunk += NSG, ++slot) {
    const int m0 = (chunk % CM) * 8 * RM, n0 = (chunk / CM) * 8 * RN;
    for (int i = 0; i < RM; ++i)
      for (int j = 0; j < RN; ++j) simdgroup_store(acc[slot * RM * RN + i * RN + j], C + (m0 + 8 * i) * SCM + (n0 + 8 * j), SCM);
  }
}
template <int THREADS, int M, int N, int K, int SAM, int SAK, int SBK, int SBN, int RM, int RN, typename TA, typename TB,
          int TILES>
inline void tc_sg_gemm_acc(threadgroup TA* A, threadgroup TB* B, thread simdgroup_matrix<float, 8, 8> (&acc)[TILES],
                           uint tid) {
  constexpr int NSG = THREADS / 32, CM = M / (8 * RM), CN = N / (8 * RN);
  int slot = 0;
  for (int chunk = (int)tid / 32; chunk < CM * CN; chunk += NSG, ++slot) {
    const int m0 = (chunk % CM) * 8 * RM, n0 = (chunk / CM) * 8 * RN;
    const int c = slot * RM * RN;
    for (int k = 0; k < K; k += 8) {
      simdgroup_matrix<TA, 8, 8> a[RM];
      simdgroup_matrix<TB, 8, 8> b[RN];
      for (int i = 0; i < RM; ++i) {
        threadgroup TA* p = A + (m0 + 8 * i) * SAM + k * SAK;
        if (SAK == 1) simdgroup_load(a[i], p, SAM);
        else simdgroup_load(a[i], p, SAK, ulong2(0, 0), true);
      }
      for (int j = 0; j < RN; ++j) {
        threadgroup TB* p = B + k * SBK + (n0 + 8 * j) * SBN;
        if (SBN == 1) simdgroup_load(b[j], p, SBK);
        else simdgroup_load(b[j], p, SBN, ulong2(0, 0), true);
      }
      for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN; ++j)
          simdgroup_multiply_accumulate(acc[c + i * RN + j], a[i], b[j], acc[c + i * RN + j]);
    }
  }
}
