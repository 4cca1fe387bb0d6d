/* MUSA stub header (tilecore-musa tests): what mcc's implicit MUSA headers and built-ins give the
   generated code, declared with exact arities and types so that `clang++ -x cuda -nocudainc -nocudalib
   -fsyntax-only -include musa_stub.h` catches an unknown name, a wrong argument count or a wrong type.
   The vendor intrinsics' signatures restate their uses in MooreThreads/tilelang_musa
   (src/tl_templates/musa/copy_mp31.h, barrier.h, copy.h) and mute (arch/mma_*_mp31.hpp, mma_mp22.hpp).
   Declarations only: nothing here has a body, so nothing can run against it. */
#pragma once

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))

struct tc_stub_uint3 { unsigned x, y, z; };
extern const __device__ tc_stub_uint3 threadIdx;
extern const __device__ tc_stub_uint3 blockIdx;
extern const __device__ tc_stub_uint3 blockDim;
extern const __device__ tc_stub_uint3 gridDim;

/* barriers and lane exchanges (warps of 32 on mp_31, 128 on mp_22) */
__device__ void __syncthreads();
__device__ int __syncthreads_or(int pred);
__device__ int __shfl_xor_sync(unsigned mask, int v, int lane_mask, int width);
__device__ unsigned __shfl_xor_sync(unsigned mask, unsigned v, int lane_mask, int width);
__device__ long long __shfl_xor_sync(unsigned mask, long long v, int lane_mask, int width);
__device__ float __shfl_xor_sync(unsigned mask, float v, int lane_mask, int width);
__device__ double __shfl_xor_sync(unsigned mask, double v, int lane_mask, int width);
__device__ int __shfl_sync(unsigned mask, int v, int src_lane, int width);
__device__ unsigned __shfl_sync(unsigned mask, unsigned v, int src_lane, int width);
__device__ long long __shfl_sync(unsigned mask, long long v, int src_lane, int width);
__device__ float __shfl_sync(unsigned mask, float v, int src_lane, int width);
__device__ double __shfl_sync(unsigned mask, double v, int src_lane, int width);

/* atomics */
__device__ int atomicAdd(int* p, int v);
__device__ unsigned atomicAdd(unsigned* p, unsigned v);
__device__ unsigned long long atomicAdd(unsigned long long* p, unsigned long long v);
__device__ float atomicAdd(float* p, float v);
__device__ double atomicAdd(double* p, double v);
__device__ int atomicMax(int* p, int v);
__device__ unsigned atomicMax(unsigned* p, unsigned v);
__device__ int atomicMin(int* p, int v);
__device__ unsigned atomicMin(unsigned* p, unsigned v);
__device__ int atomicCAS(int* p, int expected, int desired);
__device__ unsigned atomicCAS(unsigned* p, unsigned expected, unsigned desired);
__device__ unsigned long long atomicCAS(unsigned long long* p, unsigned long long expected, unsigned long long desired);
__device__ unsigned short atomicCAS(unsigned short* p, unsigned short expected, unsigned short desired);

/* bit casts */
__device__ float __int_as_float(int x);
__device__ float __uint_as_float(unsigned x);
__device__ unsigned __float_as_uint(float x);
__device__ double __longlong_as_double(long long x);
__device__ long long __double_as_longlong(double x);
__device__ unsigned long long __cvta_generic_to_shared(const void* p);

/* math (float and double forms) */
#define TC_STUB_MATH1(F) __device__ float F##f(float); __device__ double F(double);
TC_STUB_MATH1(exp) TC_STUB_MATH1(exp2) TC_STUB_MATH1(log) TC_STUB_MATH1(log2) TC_STUB_MATH1(log10)
TC_STUB_MATH1(sqrt) TC_STUB_MATH1(rsqrt) TC_STUB_MATH1(tanh) TC_STUB_MATH1(erf) TC_STUB_MATH1(sin) TC_STUB_MATH1(cos)
TC_STUB_MATH1(tan) TC_STUB_MATH1(floor) TC_STUB_MATH1(ceil) TC_STUB_MATH1(nearbyint) TC_STUB_MATH1(trunc)
TC_STUB_MATH1(fabs)
#undef TC_STUB_MATH1
__device__ float powf(float, float);
__device__ double pow(double, double);
__device__ float fmaf(float, float, float);
__device__ double fma(double, double, double);
__device__ float __expf(float);
__device__ float __logf(float);
extern "C" __device__ int printf(const char* fmt, ...);

/* mp_22 (QY2): the 32x32x16 MMA atom (mute MP22_32x32x16_*: d, a, b, c and six flags) */
__device__ void __musa_fmma_m32n32k16_mma(int* d, const int* a, const int* b, const int* c, int, int, int, int, int,
                                          int);

/* mp_31 (PH1): TME, ASYNC barriers, SQMMA, per-thread async copies */
struct __align__(64) MUtensorDescriptor { unsigned long long opaque[16]; };
typedef int tc_stub_v2i __attribute__((vector_size(8)));
typedef int tc_stub_v3i __attribute__((vector_size(12)));
typedef int tc_stub_v4i __attribute__((vector_size(16)));
typedef int tc_stub_v5i __attribute__((vector_size(20)));
typedef __attribute__((address_space(3))) void tc_stub_smem;
typedef __attribute__((address_space(1))) void tc_stub_gmem;
/* (barrier id, shared destination, descriptor address, box dims, coordinates, swizzle granularity, swizzle
   stride, swizzle line, prefetch, inner cache hint, outer cache hint, 0) */
__device__ void __musa_tme_ld_tile_1d(unsigned bar, tc_stub_smem* smem, unsigned long long desc, int dim, int crd,
                                      int sg, int ss, int sl, int prefetch, int inner, int outer, int);
__device__ void __musa_tme_ld_tile_2d(unsigned bar, tc_stub_smem* smem, unsigned long long desc, tc_stub_v2i dim,
                                      tc_stub_v2i crd, int sg, int ss, int sl, int prefetch, int inner, int outer, int);
__device__ void __musa_tme_ld_tile_3d(unsigned bar, tc_stub_smem* smem, unsigned long long desc, tc_stub_v3i dim,
                                      tc_stub_v3i crd, int sg, int ss, int sl, int prefetch, int inner, int outer, int);
__device__ void __musa_tme_ld_tile_4d(unsigned bar, tc_stub_smem* smem, unsigned long long desc, tc_stub_v4i dim,
                                      tc_stub_v4i crd, int sg, int ss, int sl, int prefetch, int inner, int outer, int);
__device__ void __musa_tme_ld_tile_5d(unsigned bar, tc_stub_smem* smem, unsigned long long desc, tc_stub_v5i dim,
                                      tc_stub_v5i crd, int sg, int ss, int sl, int prefetch, int inner, int outer, int);
__device__ void __musa_async_bar_record(unsigned count);
__device__ void __musa_async_init_arrival(unsigned bar, unsigned warp_count, unsigned phase);
__device__ unsigned __musa_async_arrive(unsigned bar);
__device__ void __musa_async_add_trans(unsigned bar, unsigned bytes);
__device__ void __musa_async_wait(unsigned bar, int phase);
/* SQMMA: d, descriptor of A, descriptor of B, c, transpose A, transpose B, 0, 0, scale D, saturate, k, type */
#define TC_STUB_SQMMA(M, N)                                                                                  \
  __device__ void __musa_sqmma_m##M##n##N##_mma(int* d, const int* da, const int* db, int* c, int ta, int tb, int, \
                                                int, int scale, int sat, int k, int type);
TC_STUB_SQMMA(64, 64) TC_STUB_SQMMA(32, 32)
#undef TC_STUB_SQMMA
__device__ void __musa_sqmma_wait();
__device__ void __musa_memcpy_g2s(tc_stub_smem* smem, tc_stub_gmem* gmem, unsigned bytes, int prefetch);
__device__ void __musa_memcpy_g2s_wait();
