/* musa -> cuda mapping (tilecore-musa's H100 proxy smoke only): __mt_bfloat16 is CUDA's __nv_bfloat16, with
   the same conversion functions (__bfloat162float, __float2bfloat16_rn). */
#pragma once
#include <cuda_bf16.h>
typedef __nv_bfloat16 __mt_bfloat16;
