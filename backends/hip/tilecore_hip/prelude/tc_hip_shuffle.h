#pragma once
/* tilecore-hip: the indexed lane exchange, included after tc_hip.h only in kernels that use it (the core's
   ShuffleIndex: a layout conversion within a wave; decision D24) */

/* device-only: begin (tests/hip_host_emulator.py swaps these for a host emulation) */
/* indexed exchange (the core's ShuffleIndex): each lane reads lane `src` (0 .. width - 1) of its own
   `width`-aligned group, through ds_bpermute (a byte address per lane) */
__device__ __forceinline__ int tc_bperm_idx32(int v, int src, int width) {
  const int lane = (tc_lane_id() & ~(width - 1)) | (src & (width - 1));
  return __builtin_amdgcn_ds_bpermute(lane << 2, v);
}
template <typename T> __device__ __forceinline__ T tc_shfl_idx(T v, int src, int width) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "tc_shfl_idx: 32- or 64-bit values");
  if constexpr (sizeof(T) == 4) {
    return __builtin_bit_cast(T, tc_bperm_idx32(__builtin_bit_cast(int, v), src, width));
  } else {
    long long x = __builtin_bit_cast(long long, v);
    const int lo = tc_bperm_idx32((int)x, src, width), hi = tc_bperm_idx32((int)(x >> 32), src, width);
    return __builtin_bit_cast(T, (long long)(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo));
  }
}
/* device-only: end */
