/* tilecore-cuda persistent Hopper GEMM (docs/decisions.md D34). Included after tc_hopper.cuh, only in kernels
 * that hopper.py made persistent (pass config tilecore.cuda.persistent). */
#pragma once

/* One output tile of a persistent GEMM, as the kernel's tile function computes it from the tile index (the
 * kernel's own block indices, T.use_swizzle included, with the tile's linear index as the block's): the offset of
 * the tile in C, the TMA coordinates of its first k tile, its k tiles, and its valid rows and columns. */
struct tc_gemm_tile {
  long long c_off, a_r0, a_c0, b_r0, b_c0, k_tiles, m_valid, n_valid;
};

#ifndef TC_PERSISTENT_HOST /* tests/persistent_host.cpp runs the protocol on the host, with its own barriers */
__device__ __forceinline__ void tc_mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
#endif

/* tc_wgmma_pipeline (tc_hopper.cuh) over several output tiles per block: block b runs tiles b, b + gridDim.x,
 * ... < tiles, each described by tile_of(t) (a tc_gemm_tile). The pipeline is set up once; its stage index
 * and phase run on across tiles (k step `it` of the block, counted over all its tiles, uses stage it % STAGES,
 * phase (it / STAGES) & 1), so the producer starts the next tile's loads as soon as the consumers release the
 * stages, under their epilogue of the tile before. The consumers zero their accumulators per tile; the last k
 * step of a tile waits for its own WGMMA group (so no accumulator read of the epilogue can be scheduled above
 * the wait: D29's ptxas hazard) and releases its stage at once. The epilogue is tc_wgmma_pipeline's global one
 * (tests/test_cuda_persistent.py keeps the two texts equal).
 * PINGPONG (two consumer warpgroups, MR = BM / 64): each consumer warpgroup owns whole tiles, the block's tiles
 * alternating between them, so one's epilogue runs under the other's main loop (CUTLASS's ping-pong kernel).
 * The stages still flow in tile order; a warpgroup counts the other's k steps past and starts a tile's main
 * loop only once the other has finished the tile before (its `done` mbarrier): before that, a stage's `full`
 * barrier may be phases behind, and a parity wait cannot tell phase u from u - 2. */
template <int NTHREADS, int BM, int BN, int BK, int STAGES, int NC, int MR, bool B_KMAJOR, int A_RS, int A_CS,
          int B_RS, int B_CS, int EPI, int KSTEP, bool PINGPONG, typename MMA, typename TOUT, typename TILE>
__device__ __forceinline__ void tc_wgmma_persistent(unsigned char* pipe, TOUT* __restrict__ C_base, long long tiles,
                                                    long long ldc, TILE tile_of, const tc_tmap* tma,
                                                    const tc_tmap* tmb) {
  static_assert(NTHREADS == 128 * (NC + 1), "tc_wgmma_persistent: one producer and NC consumer warpgroups");
  constexpr int ESIZE = 32 / KSTEP;            /* bytes per element: k16 for 16-bit types, k32 for 8-bit */
  constexpr int ATOM = 128 / ESIZE;            /* elements in one 128-byte row */
  constexpr int A_BYTES = BM * BK * ESIZE;
  constexpr int B_BYTES = BK * BN * ESIZE;
  constexpr int STAGE = A_BYTES + B_BYTES;
  constexpr int B_ROWS = B_KMAJOR ? BN : BK;   /* B's tile rows in global orientation */
  constexpr int B_ATOMS = B_KMAJOR ? BK / ATOM : BN / ATOM;
  constexpr bool TO_GLOBAL = true;             /* the epilogue's (tc_wgmma_pipeline's global one) */
  constexpr bool REGS = NC == 2;               /* move registers from the producer to the consumers */
  /* The producer keeps 56 (not tc_hopper.cuh's 40): its tile function and the 4-stage loop spilled at 40 (ptxas:
   * 116 bytes on the README GEMM at 1024^3). The block holds 168 x 384 = 64512 registers; 56 x 128 leaves the two
   * consumer warpgroups 224 each (232 would need 65536 and setmaxnreg.inc would wait forever); the consumers' SASS
   * at 224 is the same instructions as at 232 (4096^3, 3 and 4 stages, registers renamed). */
  static_assert(BK % ATOM == 0 && (B_KMAJOR || BN % ATOM == 0), "tc_wgmma_persistent: whole 128-byte rows");
  static_assert(!PINGPONG || (NC == 2 && BM == 64 * MR), "tc_wgmma_persistent: ping-pong gives each of two "
                                                         "consumer warpgroups whole tiles");
  constexpr int READERS = PINGPONG ? 128 : 128 * NC;  /* the threads that release a stage */
  const unsigned raw = tc_smem_addr(pipe);
  const unsigned base = (raw + 1023u) & ~1023u;
  const unsigned bars = base + STAGES * STAGE;  /* full[s] at bars + 8 s, empty[s] at bars + 8 (STAGES + s) */
  const unsigned done = bars + 16 * STAGES;     /* ping-pong: done[c] at done + 8 c, consumer c's main loops */
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      tc_mbar_init(bars + 8 * s, 1);
      tc_mbar_init(bars + 8 * (STAGES + s), READERS);
    }
    if (PINGPONG) {
      tc_mbar_init(done, 128);
      tc_mbar_init(done + 8, 128);
    }
    tc_mbar_init_fence();
  }
  __syncthreads();
  if (wg == 0) {
    if (REGS) tc_setmaxnreg_dec<56>();
    if (threadIdx.x == 0) {
      tc_tma_prefetch_map(tma);
      tc_tma_prefetch_map(tmb);
      unsigned it = 0;  /* the block's k steps so far, over all its tiles */
      for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const tc_gemm_tile g = tile_of(tile);
        for (int kt = 0; kt < (int)g.k_tiles; ++kt, ++it) {
          const int s = it % STAGES;
          if (it >= STAGES) tc_mbar_wait(bars + 8 * (STAGES + s), ((it / STAGES) + 1) & 1);
          const unsigned full = bars + 8 * s;
          tc_mbar_expect_tx(full, STAGE);
          const unsigned sa = base + s * STAGE, sb = sa + A_BYTES;
          const int ar = (int)(g.a_r0 + (long long)kt * A_RS), ac = (int)(g.a_c0 + (long long)kt * A_CS);
          const int br = (int)(g.b_r0 + (long long)kt * B_RS), bc = (int)(g.b_c0 + (long long)kt * B_CS);
#pragma unroll
          for (int a = 0; a < BK / ATOM; ++a) tc_tma_load_2d(sa + a * BM * 128, tma, full, ac + a * ATOM, ar);
#pragma unroll
          for (int a = 0; a < B_ATOMS; ++a) tc_tma_load_2d(sb + a * B_ROWS * 128, tmb, full, bc + a * ATOM, br);
        }
      }
    }
  } else {
    if (REGS) tc_setmaxnreg_inc<224>();
    const int me = wg - 1;            /* this consumer warpgroup */
    const int c = PINGPONG ? 0 : me;  /* its first 64-row slice of a tile (ping-pong: whole tiles) */
    unsigned it = 0;  /* as the producer's */
    long long j = 0;  /* the block's tiles so far */
    for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++j) {
      const tc_gemm_tile g = tile_of(tile);
      const int k_tiles = (int)g.k_tiles;
      if (PINGPONG && (int)(j & 1) != me) {  /* the other warpgroup's tile: its k steps go by */
        it += k_tiles;
        continue;
      }
      if (PINGPONG && j > 0) tc_mbar_wait(done + 8 * (1 - me), (unsigned)((j - 1) / 2) & 1u);  /* the tile before's loop */
      float acc[MR][BN / 2];
#pragma unroll
      for (int i = 0; i < MR; ++i) {
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc[i][j] = 0.0f;
      }
      /* k step `it` of the block: wait for its stage, issue its WGMMAs, commit them as one group */
      auto step = [&](unsigned it) {
        const int s = it % STAGES;
        tc_mbar_wait(bars + 8 * s, (it / STAGES) & 1);
        const unsigned sa = base + s * STAGE, sb = sa + A_BYTES;
        tc_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / KSTEP; ++kk) {
          const int kb = kk * 32;  /* byte offset of this K step inside the tile's rows */
          unsigned long long db;
          if (B_KMAJOR) {
            db = tc_wgmma_desc(sb + (kb / 128) * BN * 128 + kb % 128, 16, 1024);
          } else {  /* N-major: atoms of 64 N columns, BK rows each; a K step is KSTEP rows */
            db = tc_wgmma_desc(sb + kk * KSTEP * 128, BK * 128, 1024);
          }
#pragma unroll
          for (int i = 0; i < MR; ++i) {
            const unsigned long long da =
                tc_wgmma_desc(sa + (kb / 128) * BM * 128 + (c * MR + i) * 64 * 128 + kb % 128, 16, 1024);
            MMA::run(acc[i], da, db);
          }
        }
        tc_wgmma_commit();
      };
      /* all k steps but the last keep one group in flight and release the stage before theirs */
      for (int kt = 0; kt < k_tiles - 1; ++kt, ++it) {
        step(it);
        tc_wgmma_wait<1>();
        if (kt > 0) tc_mbar_arrive(bars + 8 * (STAGES + (it - 1) % STAGES));
      }
      /* the last waits for its own group (the epilogue reads the accumulators: D29's ptxas hazard) and releases
       * both stages at once, so the next tile's loads start under this tile's epilogue */
      if (k_tiles > 0) {
        step(it);
        tc_wgmma_wait<0>();
        if (k_tiles > 1) tc_mbar_arrive(bars + 8 * (STAGES + (it - 1) % STAGES));
        tc_mbar_arrive(bars + 8 * (STAGES + it % STAGES));
        ++it;
      }
      if (PINGPONG) tc_mbar_arrive(done + 8 * me);  /* the other warpgroup's next tile may start */
#pragma unroll
      for (int i = 0; i < MR; ++i) tc_reg_fence(acc[i]);
      TOUT* __restrict__ C = C_base + g.c_off;
      const long long m_valid = g.m_valid, n_valid = g.n_valid;
      /* accumulator layout of m64nN: warp w of the warpgroup holds rows 16 w + lane / 4 (+ 8); register
       * 4 j + 2 h + e is column 8 j + 2 (lane % 4) + e of row + 8 h */
      const int t = threadIdx.x % 128, w = t / 32, l = t % 32;
      const bool pairs = (EPI & TC_EPI_PAIRS) ||
                         (((reinterpret_cast<unsigned long long>(C) % (2 * sizeof(TOUT))) == 0) && (ldc % 2 == 0));
#pragma unroll
      for (int i = 0; i < MR; ++i) {
        const int r0 = (c * MR + i) * 64 + w * 16 + l / 4;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int col = j * 8 + (l % 4) * 2;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = r0 + 8 * h;
            const float v0 = acc[i][4 * j + 2 * h], v1 = acc[i][4 * j + 2 * h + 1];
            TOUT* p = C + (long long)row * ldc + col;
            if (!TO_GLOBAL) {
              tc_store2<TOUT>(p, v0, v1);
            } else if ((EPI & TC_EPI_ROWS) || row < m_valid) {
              if (pairs && ((EPI & TC_EPI_COLS) || col + 1 < n_valid)) {
                tc_store2<TOUT>(p, v0, v1);
              } else {
                if ((EPI & TC_EPI_COLS) || col < n_valid) tc_store1<TOUT>(p, v0);
                if ((EPI & TC_EPI_COLS) || col + 1 < n_valid) tc_store1<TOUT>(p + 1, v1);
              }
            }
          }
        }
      }
    }
  }
}
