/* tilecore-cuda split-K for the Hopper GEMM pipeline (docs/decisions.md D27). Included after tc_hopper.cuh,
 * only in kernels whose K loop hopper.py split over several blocks per output tile. */
#pragma once

/* One output tile's share of a GEMM split over K: block `split` of SPLITS runs tc_wgmma_pipeline over its
 * k tiles (a_r0 .. b_c0 and k_tiles are already its share) and stores its float32 accumulators, unrounded,
 * to its partial tile in the workspace `ws`. The tile's last block to arrive (counted on the tile's uint32
 * counter at the front of `ws`) sums the SPLITS partials in split order (0, 1, ..., SPLITS - 1, whichever
 * block is last: results are the same bits run to run), rounds once to TOUT and stores C like
 * tc_wgmma_pipeline's global epilogue (EPI: the checks the code generator proved unneeded). It resets the
 * counter to zero, so the workspace is ready for the next launch without a memset.
 *
 * No block waits for another: a block that is not last leaves. So the blocks of a tile need not be resident
 * together (fewer SMs than the profile says, other kernels beside this one: slower, never a deadlock).
 * Ordering: each consumer's partial stores, then a block barrier, then thread 0's fence and atomic add
 * (release); the last block's thread 0 fences after its add (acquire) before the barrier that tells the
 * others, and the partials are read with ld.global.cg (L2, where the other SMs' stores are; never a stale
 * L1 line).
 *
 * Workspace layout (hopper.splitk_workspace_bytes): TILES uint32 counters padded to 256 bytes, then the
 * partials, tile-major: partial (tile, s) at float offset (tile * SPLITS + s) * BM * BN, row stride BN. */
template <int NTHREADS, int BM, int BN, int BK, int STAGES, int NC, int MR, bool B_KMAJOR, int A_RS, int A_CS,
          int B_RS, int B_CS, int EPI, int KSTEP, typename MMA, int SPLITS, int TILES, typename TOUT>
__device__ __forceinline__ void tc_wgmma_splitk(unsigned char* pipe, TOUT* __restrict__ C, long long a_r0,
                                                long long a_c0, long long b_r0, long long b_c0, long long k_tiles,
                                                long long m_valid, long long n_valid, long long ldc, long long tile,
                                                long long split, const tc_tmap* tma, const tc_tmap* tmb,
                                                unsigned char* ws) {
  static_assert(SPLITS >= 2 && BN % 4 == 0, "tc_wgmma_splitk: two splits or more, whole float4 columns");
  constexpr long long COUNTERS = (TILES * 4LL + 255) / 256 * 256;
  constexpr long long PART = (long long)BM * BN;
  unsigned* counter = reinterpret_cast<unsigned*>(ws) + tile;
  float* parts = reinterpret_cast<float*>(ws + COUNTERS) + tile * SPLITS * PART;
  /* the partial: the pipeline's global epilogue, float32, the tile's rows below m_valid (the only ones the
   * sum reads: a 16-row GEMM on 64-row tiles stores a quarter), every column */
  tc_wgmma_pipeline<NTHREADS, BM, BN, BK, STAGES, NC, MR, B_KMAJOR, A_RS, A_CS, B_RS, B_CS, true,
                    (EPI & TC_EPI_ROWS) | TC_EPI_COLS | TC_EPI_PAIRS, KSTEP, MMA, float>(
      pipe, parts + split * PART, a_r0, a_c0, b_r0, b_c0, k_tiles, m_valid, BN, BN, tma, tmb);
  __syncthreads();
  int last = 0;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(counter, 1u) == (unsigned)(SPLITS - 1);
    if (last) {
      atomicExch(counter, 0u);  /* as the launch found it */
      __threadfence();
    }
  }
  if (!__syncthreads_or(last) || threadIdx.x < 128) return;  /* the consumer warpgroups sum */
  const int t = threadIdx.x - 128;
  const bool pairs = (EPI & TC_EPI_PAIRS) ||
                     (((reinterpret_cast<unsigned long long>(C) % (2 * sizeof(TOUT))) == 0) && (ldc % 2 == 0));
  constexpr int Q = BN / 4;  /* float4 columns per row */
  /* chunks unrolled together: loads in flight hide L2 latency, within the registers left after the pipeline
   * (with two consumer warpgroups the producer's setmaxnreg leaves this code about 40; more spills) */
  constexpr int U = (NC == 1 ? 8 : 4) / SPLITS > 1 ? (NC == 1 ? 8 : 4) / SPLITS : 1;
#pragma unroll U
  for (int i = t; i < BM * Q; i += 128 * NC) {
    const int row = i / Q, col = (i % Q) * 4;
    if (!(EPI & TC_EPI_ROWS) && row >= m_valid) continue;
    const float* p = parts + row * BN + col;
    float4 v = __ldcg(reinterpret_cast<const float4*>(p));
#pragma unroll
    for (int s = 1; s < SPLITS; ++s) {  /* split order, whichever block is last */
      const float4 w = __ldcg(reinterpret_cast<const float4*>(p + s * PART));
      v.x += w.x;
      v.y += w.y;
      v.z += w.z;
      v.w += w.w;
    }
    TOUT* q = C + (long long)row * ldc + col;
    const float o[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int h = 0; h < 4; h += 2) {
      if (pairs && ((EPI & TC_EPI_COLS) || col + h + 1 < n_valid)) {
        tc_store2<TOUT>(q + h, o[h], o[h + 1]);
      } else {
        if ((EPI & TC_EPI_COLS) || col + h < n_valid) tc_store1<TOUT>(q + h, o[h]);
        if ((EPI & TC_EPI_COLS) || col + h + 1 < n_valid) tc_store1<TOUT>(q + h + 1, o[h + 1]);
      }
    }
  }
}
