/* musa -> cuda mapping (tilecore-musa's H100 proxy smoke only): MUSA's 16-bit float header is CUDA's. */
#pragma once
#include <cuda_fp16.h>
