/* MUSA stub (tilecore-musa tests): the musa_bf16.h declarations the generated code uses. */
#pragma once
struct __mt_bfloat16 { unsigned short x; };
__device__ float __bfloat162float(__mt_bfloat16 h);
__device__ __mt_bfloat16 __float2bfloat16_rn(float f);
