/* tilecore-hip math: the C math functions the code generator spells, from ROCm's device library (ocml,
   linked by the compiler as bitcode when a kernel calls one; Debian/Ubuntu package rocm-device-libs).
   Rounding, square roots and absolute values are single instructions (clang builtins). The __oclc_*
   constants are the device library's configuration, defined here instead of linking its oclc_*.bc files
   (values of a default HIP compile: IEEE denormals, no finite-only or unsafe math, correctly rounded sqrt). */
#pragma once
/* device-only: begin (the host has its own libm) */
extern "C" {
extern __attribute__((constant, weak, visibility("hidden"))) const bool __oclc_finite_only_opt = false;
extern __attribute__((constant, weak, visibility("hidden"))) const bool __oclc_unsafe_math_opt = false;
extern __attribute__((constant, weak, visibility("hidden"))) const bool __oclc_daz_opt = false;
extern __attribute__((constant, weak, visibility("hidden"))) const bool __oclc_correctly_rounded_sqrt32 = true;
extern __attribute__((constant, weak, visibility("hidden"))) const bool __oclc_wavefrontsize64 = TC_WAVE == 64;
extern __attribute__((constant, weak, visibility("hidden"))) const unsigned __oclc_ISA_version = TC_ISA_VERSION;
extern __attribute__((constant, weak, visibility("hidden"))) const unsigned __oclc_ABI_version = 500;
__device__ float __ocml_exp_f32(float);
__device__ double __ocml_exp_f64(double);
__device__ float __ocml_exp2_f32(float);
__device__ double __ocml_exp2_f64(double);
__device__ float __ocml_exp10_f32(float);
__device__ double __ocml_exp10_f64(double);
__device__ float __ocml_log_f32(float);
__device__ double __ocml_log_f64(double);
__device__ float __ocml_log2_f32(float);
__device__ double __ocml_log2_f64(double);
__device__ float __ocml_log10_f32(float);
__device__ double __ocml_log10_f64(double);
__device__ float __ocml_tanh_f32(float);
__device__ double __ocml_tanh_f64(double);
__device__ float __ocml_erf_f32(float);
__device__ double __ocml_erf_f64(double);
__device__ float __ocml_sin_f32(float);
__device__ double __ocml_sin_f64(double);
__device__ float __ocml_cos_f32(float);
__device__ double __ocml_cos_f64(double);
__device__ float __ocml_tan_f32(float);
__device__ double __ocml_tan_f64(double);
__device__ float __ocml_pow_f32(float, float);
__device__ double __ocml_pow_f64(double, double);
}
__device__ __forceinline__ float expf(float x) { return __ocml_exp_f32(x); }
__device__ __forceinline__ double exp(double x) { return __ocml_exp_f64(x); }
__device__ __forceinline__ float exp2f(float x) { return __ocml_exp2_f32(x); }
__device__ __forceinline__ double exp2(double x) { return __ocml_exp2_f64(x); }
__device__ __forceinline__ float exp10f(float x) { return __ocml_exp10_f32(x); }
__device__ __forceinline__ double exp10(double x) { return __ocml_exp10_f64(x); }
__device__ __forceinline__ float logf(float x) { return __ocml_log_f32(x); }
__device__ __forceinline__ double log(double x) { return __ocml_log_f64(x); }
__device__ __forceinline__ float log2f(float x) { return __ocml_log2_f32(x); }
__device__ __forceinline__ double log2(double x) { return __ocml_log2_f64(x); }
__device__ __forceinline__ float log10f(float x) { return __ocml_log10_f32(x); }
__device__ __forceinline__ double log10(double x) { return __ocml_log10_f64(x); }
__device__ __forceinline__ float tanhf(float x) { return __ocml_tanh_f32(x); }
__device__ __forceinline__ double tanh(double x) { return __ocml_tanh_f64(x); }
__device__ __forceinline__ float erff(float x) { return __ocml_erf_f32(x); }
__device__ __forceinline__ double erf(double x) { return __ocml_erf_f64(x); }
__device__ __forceinline__ float sinf(float x) { return __ocml_sin_f32(x); }
__device__ __forceinline__ double sin(double x) { return __ocml_sin_f64(x); }
__device__ __forceinline__ float cosf(float x) { return __ocml_cos_f32(x); }
__device__ __forceinline__ double cos(double x) { return __ocml_cos_f64(x); }
__device__ __forceinline__ float tanf(float x) { return __ocml_tan_f32(x); }
__device__ __forceinline__ double tan(double x) { return __ocml_tan_f64(x); }
__device__ __forceinline__ float powf(float x, float y) { return __ocml_pow_f32(x, y); }
__device__ __forceinline__ double pow(double x, double y) { return __ocml_pow_f64(x, y); }
__device__ __forceinline__ float sqrtf(float x) { return __builtin_sqrtf(x); }
__device__ __forceinline__ double sqrt(double x) { return __builtin_sqrt(x); }
__device__ __forceinline__ float floorf(float x) { return __builtin_floorf(x); }
__device__ __forceinline__ double floor(double x) { return __builtin_floor(x); }
__device__ __forceinline__ float ceilf(float x) { return __builtin_ceilf(x); }
__device__ __forceinline__ double ceil(double x) { return __builtin_ceil(x); }
__device__ __forceinline__ float truncf(float x) { return __builtin_truncf(x); }
__device__ __forceinline__ double trunc(double x) { return __builtin_trunc(x); }
__device__ __forceinline__ float nearbyintf(float x) { return __builtin_rintf(x); }
__device__ __forceinline__ double nearbyint(double x) { return __builtin_rint(x); }
__device__ __forceinline__ float fabsf(float x) { return __builtin_fabsf(x); }
__device__ __forceinline__ double fabs(double x) { return __builtin_fabs(x); }
__device__ __forceinline__ float fmaf(float x, float y, float z) { return __builtin_fmaf(x, y, z); }
__device__ __forceinline__ double fma(double x, double y, double z) { return __builtin_fma(x, y, z); }
/* device-only: end */
