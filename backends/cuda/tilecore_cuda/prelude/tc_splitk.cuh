/* tilecore-cuda split-K for the Hopper GEMM pipeline (docs/decisions.md D27, D31). Included after
 * tc_hopper.cuh, only in kernels whose K loop hopper.py split over several blocks per output tile. */
#pragma once

/* How a split tile is summed (tc_splitk_fixup, run by each consumer thread with its accumulators in registers):
 * every block of the tile stores its float32 accumulators, unrounded, to its partial tile in the workspace
 * `ws`, in the accumulators' own register order (thread-major float4s: a warp's stores and loads are 512
 * contiguous bytes). A warp whose 16-row slab of the tile lies at or past m_valid stores nothing (a 16-row GEMM
 * on 64-row tiles stores a quarter). The tile's last block to arrive (counted on the tile's uint32 counter at
 * the front of `ws`) keeps its accumulators in registers and reads the other SPLITS - 1 partials, in the same
 * order, each thread exactly the float4s it stored itself. It sums them in split order 0, 1, ..., SPLITS - 1
 * with its own registers at its own index `split`, whichever block is last: results are the same bits run to
 * run. It rounds once to TOUT and stores C like tc_wgmma_pipeline's global epilogue (EPI: the checks the code
 * generator proved unneeded). It resets the counter to zero, so the workspace is ready for the next launch
 * without a memset.
 *
 * No block waits for another: a block that is not last leaves. So the blocks of a tile need not be resident
 * together (fewer SMs than the profile says, other kernels beside this one: slower, never a deadlock).
 * Ordering: each consumer thread's partial stores, then the consumers' barrier, then one thread's
 * fence.acq_rel.gpu and relaxed atomic add (release); the last block's thread fences again after its add
 * (acquire) before the barrier that tells the others, and the partials are read with ld.global.cg (L2, where
 * the other SMs' stores are; never a stale L1 line). The producer warpgroup takes no part (once its copies are
 * issued it goes on to the kernel's closing barrier), so the sum runs in the consumers' registers (232 each
 * with two consumer warpgroups, after setmaxnreg), not in the 40 the producer keeps.
 *
 * Workspace layout (hopper.splitk_workspace_bytes): TILES uint32 counters padded to 256 bytes, then the
 * partials, tile-major: partial (tile, s) at float offset (tile * SPLITS + s) * BM * BN. Inside one, the
 * float4 of consumer c's thread t (0..127) holding acc[i][4 q .. 4 q + 3] is float4 ((c * MR + i) * BN / 8 + q)
 * * 128 + t. */

#ifndef TC_SPLITK_FIXUP_ONLY /* tests/splitk_fixup_host.cpp runs the fixup on the host, with its own barriers */
/* the consumer warpgroups' barrier: named barrier 15 over N threads (the producer warpgroup takes no part) */
template <int N> __device__ __forceinline__ void tc_splitk_bar() {
  asm volatile("bar.sync 15, %0;\n" ::"n"(N) : "memory");
}
/* a GPU-scope acquire-release fence: with the relaxed atomic add after it (before it), the release (acquire)
 * pattern of the PTX memory model. Lighter than __threadfence's fence.sc.gpu, which the protocol never needs. */
__device__ __forceinline__ void tc_splitk_fence() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
/* the same barrier, returning whether any thread's p was nonzero */
template <int N> __device__ __forceinline__ int tc_splitk_bar_or(int p) {
  int r;
  asm volatile("{\n .reg .pred tp, tq;\n setp.ne.s32 tp, %1, 0;\n bar.red.or.pred tq, 15, %2, tp;\n"
               " selp.s32 %0, 1, 0, tq;\n}\n"
               : "=r"(r) : "r"(p), "n"(N) : "memory");
  return r;
}
#endif

/* whether C takes two-element stores: proved by the code generator (TC_EPI_PAIRS) or checked here */
template <int EPI, typename TOUT>
__device__ __forceinline__ bool tc_splitk_pairs(const TOUT* C, long long ldc) {
  return (EPI & TC_EPI_PAIRS) ||
         (((reinterpret_cast<unsigned long long>(C) % (2 * sizeof(TOUT))) == 0) && (ldc % 2 == 0));
}

/* one summed float4 of a thread's accumulator order to C, rounded once to TOUT: v holds columns col, col + 1 of
 * rows r0 (x, y) and r0 + 8 (z, w), as the accumulators do; EPI: the checks the code generator proved unneeded */
template <int EPI, typename TOUT>
__device__ __forceinline__ void tc_splitk_store(TOUT* __restrict__ C, float4 v, int r0, int col, long long m_valid,
                                                long long n_valid, long long ldc, bool pairs) {
  const float out[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + 8 * h;
    TOUT* p = C + (long long)row * ldc + col;
    if ((EPI & TC_EPI_ROWS) || row < m_valid) {
      if (pairs && ((EPI & TC_EPI_COLS) || col + 1 < n_valid)) {
        tc_store2<TOUT>(p, out[2 * h], out[2 * h + 1]);
      } else {
        if ((EPI & TC_EPI_COLS) || col < n_valid) tc_store1<TOUT>(p, out[2 * h]);
        if ((EPI & TC_EPI_COLS) || col + 1 < n_valid) tc_store1<TOUT>(p + 1, out[2 * h + 1]);
      }
    }
  }
}

template <int NC, int MR, int BM, int BN, int EPI, int SPLITS, int TILES, typename TOUT>
__device__ __forceinline__ void tc_splitk_fixup(float (&acc)[MR][BN / 2], TOUT* __restrict__ C, long long m_valid,
                                                long long n_valid, long long ldc, long long tile, long long split,
                                                unsigned char* ws) {
  static_assert(SPLITS >= 2 && BN % 8 == 0 && BM == 64 * NC * MR, "tc_splitk_fixup: two splits or more, m64nBN tiles");
  constexpr long long COUNTERS = (TILES * 4LL + 255) / 256 * 256;
  constexpr long long PART4 = (long long)BM * BN / 4;  /* float4s per partial */
  constexpr int Q = BN / 8;                             /* float4s per thread per 64-row slice */
  const int ct = threadIdx.x - 128, c = ct / 128, t = ct % 128, w = t / 32, l = t % 32;
  unsigned* counter = reinterpret_cast<unsigned*>(ws) + tile;
  float4* parts = reinterpret_cast<float4*>(ws + COUNTERS) + tile * SPLITS * PART4;
  float4* mine = parts + split * PART4;
#pragma unroll
  for (int i = 0; i < MR; ++i) {
    const int slab = (c * MR + i) * 64 + 16 * w;  /* this warp's 16 rows of the tile */
    if (!(EPI & TC_EPI_ROWS) && slab >= m_valid) continue;  /* rows no block stores to C: not stored */
    float4* dst = mine + (c * MR + i) * Q * 128 + t;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      float4 v;
      v.x = acc[i][4 * q];
      v.y = acc[i][4 * q + 1];
      v.z = acc[i][4 * q + 2];
      v.w = acc[i][4 * q + 3];
      __stcg(dst + q * 128, v);
    }
  }
  tc_splitk_bar<128 * NC>();
  int last = 0;
  if (ct == 0) {
    tc_splitk_fence();
    last = atomicAdd(counter, 1u) == (unsigned)(SPLITS - 1);
    if (last) {
      atomicExch(counter, 0u);  /* as the launch found it */
      tc_splitk_fence();
    }
  }
  if (!tc_splitk_bar_or<128 * NC>(last)) return;  /* not the tile's last block: done */
  const bool pairs = tc_splitk_pairs<EPI>(C, ldc);
  /* G float4 columns at a time, the other splits' partials OC at a time: the group's loads are all issued
   * before its first add, at most LOADS float4s (4 LOADS registers) in flight per thread, 64 KiB per SM with two
   * consumer warpgroups. (Without the grouping the stores to C between columns keep every load behind the
   * previous column's sum: SPLITS - 1 in flight.) More than LOADS + 1 splits (only by tilecore.cuda.split_k)
   * take one column at a time in chunks of LOADS, so registers never run out. */
  constexpr int LOADS = 16;
  constexpr int OTHERS = SPLITS - 1;
  constexpr int OC = OTHERS < LOADS ? OTHERS : LOADS;
  constexpr int G = LOADS / OTHERS > 1 ? LOADS / OTHERS : 1;
#pragma unroll
  for (int i = 0; i < MR; ++i) {
    const int slab = (c * MR + i) * 64 + 16 * w;
    if (!(EPI & TC_EPI_ROWS) && slab >= m_valid) continue;  /* no block stored these: nothing to sum */
    const float4* src = parts + (c * MR + i) * Q * 128 + t;
    const int r0 = slab + l / 4;
#pragma unroll
    for (int q0 = 0; q0 < Q; q0 += G) {
      /* the sum in split order 0, 1, ..., SPLITS - 1 with this block's registers at its own index: the other
       * partials o = 0, 1, ... are splits o (o < split) and o + 1 (o >= split), so `own` goes in just before
       * other `split`, or last when split is SPLITS - 1 */
      float4 v[G], own[G];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const int q = q0 + g < Q ? q0 + g : Q - 1;
        own[g].x = acc[i][4 * q];
        own[g].y = acc[i][4 * q + 1];
        own[g].z = acc[i][4 * q + 2];
        own[g].w = acc[i][4 * q + 3];
      }
#pragma unroll 1
      for (int o0 = 0; o0 < OTHERS; o0 += OC) {
        float4 x[G][OC];  /* the other blocks' partials o0 .. o0 + OC - 1 */
#pragma unroll
        for (int g = 0; g < G; ++g) {
#pragma unroll
          for (int k = 0; k < OC; ++k) {
            const int o = o0 + k;
            if (q0 + g < Q && o < OTHERS) x[g][k] = __ldcg(src + (o < split ? o : o + 1) * PART4 + (q0 + g) * 128);
          }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
#pragma unroll
          for (int k = 0; k < OC; ++k) {
            const int o = o0 + k;
            if (o >= OTHERS) break;
            if (o == 0) {
              v[g] = split == 0 ? own[g] : x[g][0];
              if (split != 0) continue;
            } else if (o == split) {
              v[g].x += own[g].x;
              v[g].y += own[g].y;
              v[g].z += own[g].z;
              v[g].w += own[g].w;
            }
            v[g].x += x[g][k].x;
            v[g].y += x[g][k].y;
            v[g].z += x[g][k].z;
            v[g].w += x[g][k].w;
          }
        }
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const int q = q0 + g;
        if (q >= Q) break;
        if (split == OTHERS) {
          v[g].x += own[g].x;
          v[g].y += own[g].y;
          v[g].z += own[g].z;
          v[g].w += own[g].w;
        }
        tc_splitk_store<EPI>(C, v[g], r0, q * 8 + (l % 4) * 2, m_valid, n_valid, ldc, pairs);
      }
    }
  }
}

/* -- The cluster's sum (docs/decisions.md D41) ------------------------------------------------------------
 * With CLUSTER, the SPLITS blocks of a tile are one thread-block cluster (__cluster_dims__(1, 1, SPLITS): the
 * splits are the grid's z dimension, so block `split` is the cluster's block of that rank). The hardware starts
 * a cluster's blocks together on one GPC, so they may wait for each other: no workspace, no counter, no global
 * round trip. Each block owns a run of float4 columns of the tile's accumulator order, q in
 * [split Q / SPLITS, (split + 1) Q / SPLITS) (Q = BN / 8 float4s per thread and 64-row slice; the owner of q is
 * ((q + 1) SPLITS - 1) / Q), and sums and stores exactly those:
 *   1. the consumers fence (the WGMMA's shared-memory reads before the generic stores below) and every thread
 *      of the cluster meets at a cluster barrier: every block is past its main loop, its stages are free;
 *   2. each consumer thread stores the float4s of its accumulators that other blocks own into the owner's
 *      stages (st.shared::cluster, DSMEM; fire and forget), into slot `split` of the owner's receive area,
 *      and keeps its own block's columns in registers;
 *   3. a second cluster barrier (release / acquire at cluster scope: every slice has landed; nobody touches a
 *      peer's shared memory after it, so a block may then finish and leave);
 *   4. each consumer thread reads its own columns' SPLITS - 1 slots from its block's shared memory and sums them
 *      in split order 0, 1, ..., SPLITS - 1 with its own registers at index `split`: the same float32
 *      operations as tc_splitk_fixup's, so the same bits; then rounds once and stores C as it does.
 * Receive area (tc_splitk_cluster_bytes in hopper.py): at the pipeline's 1024-aligned base, float4 index
 * ((s * NC * MR + c * MR + i) * QS + q - q0) * 128 + t for sender s, consumer c's thread t, slice i, column q of
 * an owner whose run starts at q0, QS = ceil(Q / SPLITS). A warp whose 16-row slab is at or past m_valid sends
 * and sums nothing (no block stores those rows). The producer warpgroup only arrives at both barriers
 * (tc_wgmma_splitk). */
#ifndef TC_SPLITK_FIXUP_ONLY /* tests/splitk_cluster_host.cpp shims these */
/* every non-exited thread of the cluster arrives (release) and waits (acquire) */
__device__ __forceinline__ void tc_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
/* the generic proxy's accesses after the async proxy's (the WGMMA's operand reads of the stages) */
__device__ __forceinline__ void tc_splitk_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* a 16-byte store to the same offset of block `rank`'s shared memory (DSMEM) as `local` has in this block's */
__device__ __forceinline__ void tc_dsmem_store4(float4* local, unsigned rank, float4 v) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(tc_smem_addr(local)), "r"(rank));
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(remote), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w) : "memory");
}
#endif

template <int NC, int MR, int BM, int BN, int EPI, int SPLITS, typename TOUT>
__device__ __forceinline__ void tc_splitk_cluster_fixup(float (&acc)[MR][BN / 2], TOUT* __restrict__ C,
                                                        long long m_valid, long long n_valid, long long ldc,
                                                        long long split, float4* recv) {
  static_assert(SPLITS >= 2 && BN % 8 == 0 && BM == 64 * NC * MR, "tc_splitk_cluster_fixup: two splits or more");
  constexpr int Q = BN / 8;                          /* float4s per thread per 64-row slice */
  constexpr int QS = (Q + SPLITS - 1) / SPLITS;      /* the most columns one block owns */
  const int ct = threadIdx.x - 128, c = ct / 128, t = ct % 128, w = t / 32, l = t % 32;
  const int me = (int)split;
  tc_splitk_proxy_fence();
  tc_cluster_sync();  /* 1: every block of the cluster is past its main loop */
#pragma unroll
  for (int i = 0; i < MR; ++i) {
    const int slab = (c * MR + i) * 64 + 16 * w;  /* this warp's 16 rows of the tile */
    if (!(EPI & TC_EPI_ROWS) && slab >= m_valid) continue;  /* rows no block stores to C: not sent */
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const int owner = ((q + 1) * SPLITS - 1) / Q;
      if (owner == me) continue;  /* this block's own columns stay in its registers */
      const int q0 = owner * Q / SPLITS;
      float4 v;
      v.x = acc[i][4 * q];
      v.y = acc[i][4 * q + 1];
      v.z = acc[i][4 * q + 2];
      v.w = acc[i][4 * q + 3];
      tc_dsmem_store4(recv + ((me * NC * MR + c * MR + i) * QS + q - q0) * 128 + t, (unsigned)owner, v);
    }
  }
  tc_cluster_sync();  /* 2: every slice is in its owner's shared memory */
  const bool pairs = tc_splitk_pairs<EPI>(C, ldc);
  const int q0 = me * Q / SPLITS;
#pragma unroll
  for (int i = 0; i < MR; ++i) {
    const int slab = (c * MR + i) * 64 + 16 * w;
    if (!(EPI & TC_EPI_ROWS) && slab >= m_valid) continue;  /* nothing was sent: nothing to sum */
    const int r0 = slab + l / 4;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      if (((q + 1) * SPLITS - 1) / Q != me) continue;  /* another block's column */
      float4 own;
      own.x = acc[i][4 * q];
      own.y = acc[i][4 * q + 1];
      own.z = acc[i][4 * q + 2];
      own.w = acc[i][4 * q + 3];
      const float4* slot = recv + ((c * MR + i) * QS + q - q0) * 128 + t;  /* sender s at + s * NC * MR * QS * 128 */
      float4 v = me == 0 ? own : slot[0];
#pragma unroll
      for (int s = 1; s < SPLITS; ++s) {  /* split order, this block's registers at its own index */
        const float4 x = s == me ? own : slot[s * NC * MR * QS * 128];
        v.x += x.x;
        v.y += x.y;
        v.z += x.z;
        v.w += x.w;
      }
      tc_splitk_store<EPI>(C, v, r0, q * 8 + (l % 4) * 2, m_valid, n_valid, ldc, pairs);
    }
  }
}

#ifndef TC_SPLITK_FIXUP_ONLY
/* One output tile's share of a GEMM split over K: block `split` of SPLITS runs tc_wgmma_pipeline's main loop
 * (tc_wgmma_mainloop, tc_hopper.cuh: one copy for both kernels, docs/decisions.md D50; REGS as for a global
 * epilogue) over its k tiles (a_r0 .. b_c0 and k_tiles are already its share); then its consumer threads run
 * tc_splitk_fixup (or, CLUSTER, tc_splitk_cluster_fixup) with their accumulators. */
template <int NTHREADS, int BM, int BN, int BK, int STAGES, int NC, int MR, bool B_KMAJOR, int A_RS, int A_CS,
          int B_RS, int B_CS, int EPI, int KSTEP, typename MMA, int SPLITS, int TILES, bool CLUSTER = false,
          typename TOUT>
__device__ __forceinline__ void tc_wgmma_splitk(unsigned char* pipe, TOUT* __restrict__ C, long long a_r0,
                                                long long a_c0, long long b_r0, long long b_c0, long long k_tiles,
                                                long long m_valid, long long n_valid, long long ldc, long long tile,
                                                long long split, const tc_tmap* tma, const tc_tmap* tmb,
                                                unsigned char* ws) {
  const int wg = threadIdx.x / 128;
  tc_wgmma_mainloop<NTHREADS, BM, BN, BK, STAGES, NC, MR, B_KMAJOR, A_RS, A_CS, B_RS, B_CS, KSTEP, NC == 2, MMA>(
      pipe, a_r0, a_c0, b_r0, b_c0, k_tiles, tma, tmb, [&](float (&acc)[MR][BN / 2], int, unsigned char* stages) {
        if constexpr (CLUSTER) {  /* the tile's blocks are one cluster: the sum through their shared memory */
          tc_splitk_cluster_fixup<NC, MR, BM, BN, EPI, SPLITS>(acc, C, m_valid, n_valid, ldc, split,
                                                               reinterpret_cast<float4*>(stages));
        } else {
          tc_splitk_fixup<NC, MR, BM, BN, EPI, SPLITS, TILES>(acc, C, m_valid, n_valid, ldc, tile, split, ws);
        }
      });
  if constexpr (CLUSTER) {  /* the producer warpgroup meets the consumers at the cluster's two barriers */
    if (wg == 0) {
      tc_cluster_sync();
      tc_cluster_sync();
    }
  }
}
#endif
