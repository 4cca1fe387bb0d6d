/* tilecore-cuda Hopper (sm_90a) prelude: WGMMA and the warp-specialized GEMM pipeline (on tc_tma.cuh's TMA and
 * mbarriers). Included after tc_tma.cuh, only in kernels that use tc_wgmma_pipeline or a register program. */
#pragma once

#ifndef TC_PERSISTENT_HOST /* the host harnesses of tc_persistent.cuh (tests/persistent_host.cpp) bring their own */
__device__ __forceinline__ void tc_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void tc_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void tc_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int R> __device__ __forceinline__ void tc_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> __device__ __forceinline__ void tc_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
/* a shared-memory matrix descriptor for WGMMA: 128-byte swizzle, byte offsets LBO / SBO */
__device__ __forceinline__ unsigned long long tc_wgmma_desc(unsigned addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
         ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32) | (1ULL << 62);
}
#endif

/* tc_wgmma_pipeline's EPI flags (hopper.py sets them) */
#define TC_EPI_ROWS 1
#define TC_EPI_COLS 2
#define TC_EPI_PAIRS 4

/* One k tile's WGMMAs of consumer warpgroup slice `c` (rows c * MR * 64 .. of the tile; MR m64nBN accumulators):
 * MMA::run (one wgmma.mma_async per KSTEP of K) from shared-memory descriptors of the stage's A tile at `sa` and
 * B tile at `sb`, committed as one WGMMA group. The one copy of the GEMM pipelines' main-loop body
 * (tc_wgmma_mainloop, tc_persistent.cuh's tc_wgmma_persistent; docs/decisions.md D50). Shared tiles are 128-byte
 * rows with the 128-byte swizzle; a tile whose rows are longer is a sequence of atoms of 128-byte columns. */
template <int BM, int BN, int BK, int MR, bool B_KMAJOR, int KSTEP, typename MMA>
__device__ __forceinline__ void tc_wgmma_ktile(float (&acc)[MR][BN / 2], unsigned sa, unsigned sb, int c) {
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
}

/* Consumer warpgroup slice `c`'s accumulators (MR m64nBN tiles) to C, converted to TOUT: TO_GLOBAL a global
 * tensor (rows < m_valid, cols < n_valid, row stride ldc; EPI says which checks the code generator proved
 * unneeded), otherwise a float buffer in shared memory with row stride ldc. The direct-store epilogue of
 * tc_wgmma_pipeline and tc_wgmma_persistent (one copy: D50). */
template <int BN, int MR, bool TO_GLOBAL, int EPI, typename TOUT>
__device__ __forceinline__ void tc_wgmma_store_acc(const float (&acc)[MR][BN / 2], TOUT* __restrict__ C, int c,
                                                   long long m_valid, long long n_valid, long long ldc) {
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

/* The main loop of a tiled GEMM, C[BM, BN] = sum over k tiles of A[BM, BK] * B[BK, BN], on a block of
 * NTHREADS = 128 * (NC + 1) threads, then `epi(acc, c, stages)` in each consumer warpgroup (`stages`: the
 * pipeline's stages, 1024-byte aligned in `pipe`, free once every consumer has passed its last wait). Warpgroup 0 is the producer:
 * its first thread issues, for k tile kt, the TMA copies of A's tile at (row a_r0 + kt * A_RS, col a_c0 + kt *
 * A_CS) and of B's tile likewise (B is (BN, BK) when B_KMAJOR, (BK, BN) otherwise) into stage kt % STAGES of
 * `pipe`, completing on that stage's `full` mbarrier, once the consumers have released the stage on its `empty`
 * mbarrier. Warpgroups 1..NC are consumers: consumer c owns rows [c * MR * 64, (c + 1) * MR * 64) of C as WGMMA
 * accumulators (MR m64nBN tiles), issues each k tile's WGMMAs (tc_wgmma_ktile), keeps one WGMMA group in flight
 * and releases the stage before it; after the loop it waits for the last group and hands its accumulators to
 * `epi` (tc_wgmma_pipeline: tc_wgmma_store_acc; tc_wgmma_splitk: the split sum). REGS: the producer gives
 * registers to the consumers (setmaxnreg: 40 and 232 a thread). One copy for both kernels (D50). */
template <int NTHREADS, int BM, int BN, int BK, int STAGES, int NC, int MR, bool B_KMAJOR, int A_RS, int A_CS,
          int B_RS, int B_CS, int KSTEP, bool REGS, typename MMA, typename EPI_FN>
__device__ __forceinline__ void tc_wgmma_mainloop(unsigned char* pipe, long long a_r0, long long a_c0,
                                                  long long b_r0, long long b_c0, long long k_tiles,
                                                  const tc_tmap* tma, const tc_tmap* tmb, EPI_FN epi) {
  static_assert(NTHREADS == 128 * (NC + 1), "tc_wgmma_pipeline: one producer and NC consumer warpgroups");
  constexpr int ESIZE = 32 / KSTEP;            /* bytes per element: k16 for 16-bit types, k32 for 8-bit */
  constexpr int ATOM = 128 / ESIZE;            /* elements in one 128-byte row */
  constexpr int A_BYTES = BM * BK * ESIZE;
  constexpr int B_BYTES = BK * BN * ESIZE;
  constexpr int STAGE = A_BYTES + B_BYTES;
  constexpr int B_ROWS = B_KMAJOR ? BN : BK;   /* B's tile rows in global orientation */
  constexpr int B_ATOMS = B_KMAJOR ? BK / ATOM : BN / ATOM;
  static_assert(BK % ATOM == 0 && (B_KMAJOR || BN % ATOM == 0), "tc_wgmma_pipeline: whole 128-byte rows");
  const unsigned raw = tc_smem_addr(pipe);
  const unsigned base = (raw + 1023u) & ~1023u;
  const unsigned bars = base + STAGES * STAGE;  /* full[s] at bars + 8 s, empty[s] at bars + 8 (STAGES + s) */
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      tc_mbar_init(bars + 8 * s, 1);
      tc_mbar_init(bars + 8 * (STAGES + s), 128 * NC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wg == 0) {
    if (REGS) tc_setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      tc_tma_prefetch_map(tma);
      tc_tma_prefetch_map(tmb);
      for (int kt = 0; kt < (int)k_tiles; ++kt) {
        const int s = kt % STAGES;
        if (kt >= STAGES) tc_mbar_wait(bars + 8 * (STAGES + s), ((kt / STAGES) + 1) & 1);
        const unsigned full = bars + 8 * s;
        tc_mbar_expect_tx(full, STAGE);
        const unsigned sa = base + s * STAGE, sb = sa + A_BYTES;
        const int ar = (int)(a_r0 + (long long)kt * A_RS), ac = (int)(a_c0 + (long long)kt * A_CS);
        const int br = (int)(b_r0 + (long long)kt * B_RS), bc = (int)(b_c0 + (long long)kt * B_CS);
#pragma unroll
        for (int a = 0; a < BK / ATOM; ++a) tc_tma_load_2d(sa + a * BM * 128, tma, full, ac + a * ATOM, ar);
#pragma unroll
        for (int a = 0; a < B_ATOMS; ++a) tc_tma_load_2d(sb + a * B_ROWS * 128, tmb, full, bc + a * ATOM, br);
      }
    }
  } else {
    if (REGS) tc_setmaxnreg_inc<232>();
    const int c = wg - 1;
    float acc[MR][BN / 2];
#pragma unroll
    for (int i = 0; i < MR; ++i) {
#pragma unroll
      for (int j = 0; j < BN / 2; ++j) acc[i][j] = 0.0f;
    }
    for (int kt = 0; kt < (int)k_tiles; ++kt) {
      const int s = kt % STAGES;
      tc_mbar_wait(bars + 8 * s, (kt / STAGES) & 1);
      const unsigned sa = base + s * STAGE, sb = sa + A_BYTES;
      tc_wgmma_ktile<BM, BN, BK, MR, B_KMAJOR, KSTEP, MMA>(acc, sa, sb, c);
      tc_wgmma_wait<1>();
      if (kt > 0) tc_mbar_arrive(bars + 8 * (STAGES + (kt - 1) % STAGES));
    }
    tc_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < MR; ++i) tc_reg_fence(acc[i]);
    epi(acc, c, pipe + (base - raw));
  }
}

/* tc_wgmma_mainloop with tc_wgmma_store_acc as its epilogue (REGS with two consumer warpgroups and a global C).
 * EPI says what the code generator proved about a global C, so those checks are not compiled at all (for the
 * 128x256 tile they were 71% of the SASS and 43% of NVRTC's time): TC_EPI_ROWS every row of the tile is <
 * m_valid, TC_EPI_COLS every column is < n_valid, TC_EPI_PAIRS C is aligned to two elements and ldc is even (the
 * launch checks C's address). */
template <int NTHREADS, int BM, int BN, int BK, int STAGES, int NC, int MR, bool B_KMAJOR, int A_RS, int A_CS,
          int B_RS, int B_CS, bool TO_GLOBAL, int EPI, int KSTEP, typename MMA, typename TOUT>
__device__ __forceinline__ void tc_wgmma_pipeline(unsigned char* pipe, TOUT* __restrict__ C, long long a_r0,
                                                  long long a_c0, long long b_r0, long long b_c0, long long k_tiles,
                                                  long long m_valid, long long n_valid, long long ldc,
                                                  const tc_tmap* tma, const tc_tmap* tmb) {
  tc_wgmma_mainloop<NTHREADS, BM, BN, BK, STAGES, NC, MR, B_KMAJOR, A_RS, A_CS, B_RS, B_CS, KSTEP,
                    TO_GLOBAL && NC == 2, MMA>(
      pipe, a_r0, a_c0, b_r0, b_c0, k_tiles, tma, tmb,
      [&](float (&acc)[MR][BN / 2], int c, unsigned char*) { tc_wgmma_store_acc<BN, MR, TO_GLOBAL, EPI>(acc, C, c, m_valid, n_valid, ldc); });
}
