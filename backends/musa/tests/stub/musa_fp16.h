/* MUSA stub (tilecore-musa tests): the musa_fp16.h declarations the generated code uses. Not the vendor's
   header: types and signatures only, for `clang -x cuda -nocudainc -fsyntax-only`. */
#pragma once
struct __half { unsigned short x; };
__device__ float __half2float(__half h);
__device__ __half __float2half_rn(float f);
