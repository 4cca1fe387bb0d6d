/* tilecore-cuda persistent Hopper GEMM (docs/decisions.md D34). Included after tc_hopper.cuh, only in kernels
 * that hopper.py made persistent (pass config tilecore.cuda.persistent). */
#pragma once

/* One output tile of a persistent GEMM, as the kernel's tile function computes it from the tile index (the
 * kernel's own block indices, T.use_swizzle included, with the tile's linear index as the block's): the offset of
 * the tile in C, the TMA coordinates of its first k tile, its k tiles, and its valid rows and columns. */
struct tc_gemm_tile {
  long long c_off, a_r0, a_c0, b_r0, b_c0, k_tiles, m_valid, n_valid;
};

/* tc_wgmma_persistent's EPI flag for the epilogue through shared memory and TMA stores (tilecore.cuda.tma_store,
 * docs/decisions.md D38; TC_EPI_ROWS / COLS / PAIRS are tc_hopper.cuh's, for the direct stores) */
#ifndef TC_EPI_TMA
#define TC_EPI_TMA 8
#define TC_EPI_TMA_HALF 16 /* with TC_EPI_TMA: the C buffer holds half the tile's columns, staged and stored twice */
#endif

#ifndef TC_PERSISTENT_HOST /* tests/persistent_host.cpp runs the protocol on the host, with its own barriers */
/* (the TMA store epilogue's TMA store, bulk groups and proxy fence are tc_tma.cuh's, shared with the core's bulk
 * stores: D50) */
__device__ __forceinline__ void tc_mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void tc_consumer_sync(int id, int count) {  /* named barrier `id` over `count` threads */
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
/* four 8x8 matrices of 16-bit elements: lane l gives the address of row l % 8 of matrix l / 8 and holds, in rK,
 * the pair at row l / 4, columns 2 (l % 4) and + 1 of matrix K (a WGMMA accumulator pair, converted) */
__device__ __forceinline__ void tc_stmatrix_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void tc_st_shared_v2(unsigned addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
/* thread-block clusters of two with TMA multicast (tilecore.cuda.cluster_multicast, docs/decisions.md D44) */
__device__ __forceinline__ unsigned tc_cluster_ctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
/* every non-exited thread of the cluster arrives (release) and waits (acquire) */
__device__ __forceinline__ void tc_mc_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
/* one arrival on the mbarrier at the same offset of block `rank`'s shared memory. CLUSTER_SCOPE (D44's form,
 * release at cluster scope) compiles to MEMBAR.ALL.CTA + MEMBAR.ALL.GPU + ERRBAR + CGAERRBAR before the arrival, in
 * every consumer warp at every k step: the multicast kernel's 35% (docs/decisions.md D49). The default is CUTLASS's
 * form (the arrival's default semantics, release at CTA scope: no fence). A release needs no fence here: the stage's
 * readers are WGMMAs, whose shared-memory reads are complete when wgmma.wait_group returns, before the arrival. */
template <bool CLUSTER_SCOPE = false>
__device__ __forceinline__ void tc_mbar_arrive_remote(unsigned bar, unsigned rank) {
  if (CLUSTER_SCOPE)
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar), "r"(rank)
                 : "memory");
  else
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar), "r"(rank)
                 : "memory");
}
/* the pipeline profile (tc_mc's PROF, tilecore.cuda.pipeline_profile, D49): the SM's cycle counter and the global
 * nanosecond timer */
__device__ __forceinline__ long long tc_clock() { return clock64(); }
__device__ __forceinline__ unsigned long long tc_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned tc_smid() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(r));
  return r;
}
/* tc_tma_load_2d to the same offset of the shared memory of every block of the cluster in `mask`, completing on
 * the mbarrier at `bar`'s offset in each of them */
__device__ __forceinline__ void tc_tma_load_2d_mc(unsigned dst, const tc_tmap* map, unsigned bar, int c0, int c1,
                                                  unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}
/* stream-K's fixup (tilecore.cuda.stream_k, docs/decisions.md D53): a partial accumulator through L2 (.cg: not
 * cached in the SM's L1, which another SM's writes do not invalidate), a flag released at GPU scope after a fence
 * (CUTLASS's generic barrier: fence.acq_rel.gpu, then the store) and acquired by a spinning load */
__device__ __forceinline__ void tc_sk_st4(float* p, float a, float b, float c, float d) {
  asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ void tc_sk_ld4(const float* p, float& a, float& b, float& c, float& d) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "l"(p) : "memory");
}
__device__ __forceinline__ void tc_sk_flag_release(unsigned* f, unsigned v) {
  asm volatile("fence.acq_rel.gpu;\nst.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(f), "r"(v) : "memory");
}
__device__ __forceinline__ void tc_sk_flag_wait(unsigned* f, unsigned v) {
  unsigned x;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(x) : "l"(f) : "memory");
  } while (x != v);
}
/* two floats as one register of two 16-bit values (round to nearest even, as tc_store2) */
template <typename T> __device__ __forceinline__ unsigned tc_pack_c2(float a, float b);
template <> __device__ __forceinline__ unsigned tc_pack_c2<__half>(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&h);
}
#ifdef __CUDA_BF16_TYPES_EXIST__
template <> __device__ __forceinline__ unsigned tc_pack_c2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&h);
}
#endif
#endif

/* Part `part` of PARTS (columns [part, part + 1) x BN / PARTS) of one consumer warpgroup's 64 x BN slice of C (its
 * m64nBN accumulators, lane t of the warpgroup) into shared memory at `dst` as the TMA store reads it:
 * BN / PARTS / (128 / sizeof(TOUT)) boxes of 64 rows x 128 bytes, 8 KB apart,
 * each with the 128-byte swizzle of the tensor map (16-byte chunk q of row r at r * 128 + ((q ^ (r % 8)) * 16);
 * `dst` 1024-byte aligned), so the eight rows of one 16-byte column go to eight different bank groups.
 * 16-bit C: stmatrix, four 8x8 matrices (16 rows x 16 columns) an instruction; float C: 8-byte stores. */
template <int BN, int PARTS, typename TOUT>
__device__ __forceinline__ void tc_stage_c_slice(unsigned dst, const float (&acc)[BN / 2], int t, int part) {
  constexpr int OATOM = 128 / (int)sizeof(TOUT);  /* columns of C in one 128-byte box row */
  constexpr int BOX = 64 * 128;
  constexpr int W = BN / PARTS;                   /* the part's columns: whole boxes */
  static_assert(W % OATOM == 0, "tc_stage_c_slice: whole 128-byte boxes a part");
  const int w = t / 32, l = t % 32, c0 = part * W;
  if constexpr (sizeof(TOUT) == 2) {
    const int m = l / 8, r = w * 16 + (m & 1) * 8 + (l & 7);  /* the row this lane addresses */
#pragma unroll
    for (int q = c0 / 16; q < (c0 + W) / 16; ++q) {
      const int col = q * 16 + (m >> 1) * 8;
      const unsigned a = dst + ((col - c0) / OATOM) * BOX + r * 128 + ((((col % OATOM) / 8) ^ (r & 7)) << 4);
      tc_stmatrix_x4(a, tc_pack_c2<TOUT>(acc[8 * q], acc[8 * q + 1]),       /* rows 0-7, columns 0-7 */
                     tc_pack_c2<TOUT>(acc[8 * q + 2], acc[8 * q + 3]),      /* rows 8-15 */
                     tc_pack_c2<TOUT>(acc[8 * q + 4], acc[8 * q + 5]),      /* rows 0-7, columns 8-15 */
                     tc_pack_c2<TOUT>(acc[8 * q + 6], acc[8 * q + 7]));     /* rows 8-15 */
    }
  } else {
    static_assert(sizeof(TOUT) == 4, "tc_stage_c_slice: 16- or 32-bit C");
#pragma unroll
    for (int j = c0 / 8; j < (c0 + W) / 8; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = w * 16 + l / 4 + 8 * h, col = j * 8 + (l % 4) * 2;
        const unsigned a =
            dst + ((col - c0) / OATOM) * BOX + r * 128 + ((((col % OATOM) / 4) ^ (r & 7)) << 4) + (col % 4) * 4;
        tc_st_shared_v2(a, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
    }
  }
}

/* Stream-K for the persistent grid's last wave (tilecore.cuda.stream_k, docs/decisions.md D53): tc_mc's SK.
 * TC_SK_OFF: every block runs whole tiles, blockIdx.x step gridDim.x. TC_SK_WAVE (on): the tiles past the last
 * whole wave and one whole wave more (tiles - (tiles / blocks - 1) x blocks, all of them below two waves) run
 * stream-K; TC_SK_TAIL: only the tiles past the last whole wave. No stream-K (tc_sk_tiles 0) where the tiles are
 * a whole number of waves, fewer than two waves' worth of k iterations, or more blocks than the workspace has
 * slots. The stream-K tiles are tiles [0, S) (the first in the kernel's tile order, swizzle included) and their
 * S x K k iterations (K each, the same for every tile) are dealt in contiguous ranges, block b
 * [S K b / blocks, S K (b + 1) / blocks) (within one of even), tile by tile; then block b runs whole tiles
 * S + b, S + b + blocks, ... (the data-parallel waves). A piece of a tile that starts at k 0 but ends before K is
 * the tile's owner's (always the last piece of the owner's range); one that starts inside the tile is a
 * contributor's (always the first piece of its block's range: a block contributes at most one).
 * TC_SK_STAGGER: TC_SK_TAIL's tiles and ranges, but each block runs its stream-K range between its whole tiles, block
 * b after j_b = (blocks - 1 - b) (n + 1) / blocks of its n whole tiles (block 0 last, the last block first), so only
 * about q / (n K + q) of the blocks run stream-K pieces at any time: their k offsets are spread over K (no L2 reuse
 * between them: D53's round 1), while the others run whole tiles in two lockstep groups (before and after their
 * stream-K range). A later block's range never starts later than an earlier block's, so an owner still finds its
 * contributors' partials written. */
#define TC_SK_OFF 0
#define TC_SK_WAVE 1
#define TC_SK_TAIL 2
#define TC_SK_STAGGER 3
__device__ __forceinline__ long long tc_sk_tiles(int mode, long long tiles, long long blocks, long long k,
                                                 long long slots) {
  if (mode == TC_SK_OFF || blocks <= 1 || tiles <= blocks || tiles % blocks == 0 || blocks > slots || k <= 0)
    return 0;
  const long long waves = tiles / blocks;
  const long long sk = mode != TC_SK_WAVE ? tiles % blocks : tiles - (waves - 1) * blocks;
  /* every block two k iterations or more; the schedule's arithmetic in 32 bits (iterations x blocks < 2^32: a
   * 64-bit division in the consumers' tile loop spilled) */
  return sk * k >= 2 * blocks && sk * k * blocks < (1ll << 32) ? sk : 0;
}
/* the first stream-K k iteration of block b (of `iters`); the block whose range holds iteration i */
__device__ __forceinline__ unsigned tc_sk_begin(unsigned b, unsigned blocks, unsigned iters) {
  return iters * b / blocks;
}
__device__ __forceinline__ unsigned tc_sk_block_of(unsigned i, unsigned blocks, unsigned iters) {
  return ((i + 1) * blocks - 1) / iters;
}
/* the block's work, in order: whole tiles (ke = -1: the tile's own k tiles) up to `ins`, its stream-K pieces
 * (tile, k tiles [kb, ke)), then the rest of its whole tiles; `ins` the block's first whole tile (stream-K first)
 * unless `stagger`. The producer and the consumers walk the same sequence. ON false (no stream-K compiled): whole
 * tiles blockIdx.x, + gridDim.x, ... (the loop before D53, the same SASS). */
template <bool ON> struct tc_sk_walk {
  long long tiles, dp, ins;
  unsigned blocks, k, i, i1;
  __device__ __forceinline__ tc_sk_walk(long long tiles_, long long blocks_, long long b, long long sk, long long k_,
                                        bool stagger = false)
      : tiles(tiles_), dp(sk + b), ins(sk + b), blocks((unsigned)blocks_), k((unsigned)k_), i(0), i1(0) {
    if (ON && sk > 0) {
      i = tc_sk_begin((unsigned)b, blocks, (unsigned)(sk * k_));
      i1 = tc_sk_begin((unsigned)b + 1, blocks, (unsigned)(sk * k_));
      if (stagger) {
        const long long n = (tiles_ - sk) / blocks_;  /* the block's whole tiles */
        ins += (blocks_ - 1 - b) * (n + 1) / blocks_ * blocks_;
      }
    }
  }
  __device__ __forceinline__ bool next(long long& tile, int& kb, int& ke) {
    if (ON && i < i1 && dp >= ins) {
      const unsigned t = i / k;
      tile = t;
      kb = (int)(i - t * k);
      ke = (int)(i1 - i < k - kb ? kb + (i1 - i) : k);
      i += ke - kb;
      return true;
    }
    if (dp >= tiles) return false;
    tile = dp;
    if (ON)
      dp += blocks;
    else
      dp += gridDim.x;
    kb = 0;
    ke = -1;
    return true;
  }
};

/* how the consumers release a stage (tc_mc's REL; tilecore.cuda.stage_release, docs/decisions.md D49) */
#define TC_REL_THREAD 0 /* every consumer thread arrives on its block's `empty`; with a cluster each warp's first lane
                         * also on the partner's (CTA-scope arrival) */
#define TC_REL_WARP 1   /* each consumer warp's first lane, after the warp's WGMMA wait, arrives once on its block's
                         * `empty` and, with a cluster, once on the partner's */
#define TC_REL_D44 2    /* TC_REL_THREAD with D44's remote arrival (release at cluster scope: a MEMBAR.ALL.GPU before
                         * each), kept to measure against */
/* the profile's words per block (PROF, tc_mc's `prof`: blockIdx.x * TC_PROF_WORDS ..): 0 start (globaltimer ns, after
 * the init's barrier), 1 the producer's end (ns), 2 producer cycles, 3 its cycles in `empty` waits, 4 its k steps,
 * 5 consumer warpgroup 0's (thread 128's) cycles, 6 its cycles in `full` waits, 7 its cycles releasing stages,
 * 8 its k steps, 9 its end (ns), 10 consumer warpgroup 1's (thread 256's) cycles in `full` waits, 11 its cycles
 * releasing, 12 the SM, 13 the cluster rank, 14 (stream-K, D53) consumer warpgroup 0's cycles in stream-K pieces
 * (from a piece's start to the next unit's, fixups and epilogue included), 15 its cycles in the fixups (partial
 * stores, flag waits, partial loads); accumulated over launches (the benchmark zeroes them) */
#define TC_PROF_WORDS 16
#define TC_PROF_BLOCKS 2048 /* blocks profiled (the array's; block b writes slot b % TC_PROF_BLOCKS) */

/* tc_wgmma_persistent's last argument: no cluster (tc_mc<0>, the default), or clusters of two blocks that share
 * A (tc_mc<1>: tilecore.cuda.cluster_multicast "1x2") or B (tc_mc<2>: "2x1"), docs/decisions.md D44; REL how the
 * consumers release a stage (TC_REL_*: per warp by default in a cluster, per thread without, D49); PROF: the
 * pipeline profile into `prof` (a __device__ array the kernel declares, TC_PROF_WORDS per block) */
template <int SHARE, int REL = (SHARE ? TC_REL_WARP : TC_REL_THREAD), int PROF = 0, int SK = TC_SK_OFF> struct tc_mc {
  static constexpr int share = SHARE;
  static constexpr int rel = REL;
  static constexpr int prof_on = PROF;
  static constexpr int sk = SK;  /* stream-K (TC_SK_*, D53) */
  unsigned long long* prof = nullptr;
  unsigned char* ws = nullptr;   /* stream-K's workspace: flags, then partial tiles (tc_sk_ws) */
  long long slots = 0;           /* ... its slots: the most blocks it serves */
};
/* stream-K's workspace (hopper.streamk_workspace_bytes): a uint32 flag per (slot, consumer warpgroup), padded to
 * 256 bytes, then a float32 BM x BN partial tile per slot (a block's contributor piece: a block has at most one) */
__device__ __forceinline__ unsigned* tc_sk_flag(unsigned char* ws, long long slot, int nc, int me) {
  return reinterpret_cast<unsigned*>(ws) + slot * nc + me;
}
__device__ __forceinline__ float* tc_sk_part(unsigned char* ws, long long slots, int nc, long long slot, int bm,
                                            int bn) {
  const long long flags = (slots * nc * 4 + 255) / 256 * 256;
  return reinterpret_cast<float*>(ws + flags) + slot * bm * bn;
}

/* tc_wgmma_pipeline (tc_hopper.cuh) over several output tiles per block: block b runs tiles b, b + gridDim.x,
 * ... < tiles, each described by tile_of(t) (a tc_gemm_tile). The pipeline is set up once; its stage index
 * and phase run on across tiles (k step `it` of the block, counted over all its tiles, uses stage it % STAGES,
 * phase (it / STAGES) & 1), so the producer starts the next tile's loads as soon as the consumers release the
 * stages, under their epilogue of the tile before. The consumers zero their accumulators per tile; every k step
 * of a tile is in one loop (D50), and after it the consumers wait for the last WGMMA group (so no accumulator read
 * of the epilogue can be scheduled above the wait: D29's ptxas hazard) and release its stage at once. The epilogue is tc_wgmma_pipeline's global one
 * (tc_wgmma_store_acc), and each k step's WGMMAs are its tc_wgmma_ktile: one copy of each (D50).
 * PINGPONG (two consumer warpgroups, MR = BM / 64): each consumer warpgroup owns whole tiles, the block's tiles
 * alternating between them, so one's epilogue runs under the other's main loop (CUTLASS's ping-pong kernel).
 * The stages still flow in tile order; a warpgroup counts the other's k steps past and starts a tile's main
 * loop only once the other has finished the tile before (its `done` mbarrier): before that, a stage's `full`
 * barrier may be phases behind, and a parity wait cannot tell phase u from u - 2.
 * EPI & TC_EPI_TMA (tilecore.cuda.tma_store, D38): the epilogue goes through shared memory: after the pipeline's
 * stages and barriers (at base + STAGES * STAGE + 1024) a C buffer of NC * MR slices, each 64 rows x BN columns of
 * TOUT (tc_stage_c_slice). Consumer warpgroup `me` writes its slices (me * MR + i), every thread fences its writes
 * to the async proxy, the warpgroup meets on named barrier 1 + me, and its first thread issues one TMA store per
 * 64 x 128-byte box through C's tensor map `tmc` (rows and columns outside C are not written: no checks) and
 * commits them as one bulk group; the warpgroup goes straight on to its next tile's main loop. Only before it
 * writes the buffer again does that thread wait until its stores have read it (cp.async.bulk.wait_group.read 0),
 * the warpgroup meeting on the barrier after it; the thread waits for them to complete before it exits.
 * EPI & TC_EPI_TMA_HALF: the buffer holds half of each slice's columns; the left half is staged and stored, then
 * (after the wait for those stores' reads) the right half.
 * MC = tc_mc<1> or tc_mc<2> (tilecore.cuda.cluster_multicast, D44): the grid is clusters of two blocks
 * (__cluster_dims__(2, 1, 1)); tile_of gives slots 2 p and 2 p + 1 (ranks 0 and 1 of the cluster that runs pair p,
 * gridDim.x and `tiles` even, so both blocks run the same number of pairs) two tiles with the same k tiles and the
 * same A (tc_mc<1>) or B (tc_mc<2>) boxes. That operand's tensor map has boxes of half its rows: each block's
 * producer loads its half (rank r: rows r ROWS / 2 ..) with .multicast::cluster to both blocks' stages, at the same
 * offset, completing on both blocks' `full` barriers; each block's `full` still expects the whole STAGE bytes (the
 * partner's half may land before this block's expect_tx: the phase cannot complete before that arrival). A stage is
 * overwritten by both producers, so each block's `empty` barrier counts both blocks' releases: by default (REL
 * TC_REL_WARP, D49) each releasing warp's first lane, after the warp's WGMMA wait, arrives once on its own block's
 * and once, by mapa + mbarrier.arrive.shared::cluster, on the partner's (16 arrivals a stage with two consumer
 * warpgroups); TC_REL_THREAD and TC_REL_D44 count every local reader and the partner's warps (264). The remote
 * arrival has CTA-scope release semantics, as CUTLASS's ClusterBarrier::arrive(cta_id): D44's release at cluster
 * scope (TC_REL_D44) put a MEMBAR.ALL.GPU before each; the producer waits on its own `empty` only.
 * PROF (tc_mc's third argument, tilecore.cuda.pipeline_profile, D49): cycle counts of the producer's `empty` waits,
 * the consumers' `full` waits and releases, and start and end times, per block into mc.prof (TC_PROF_WORDS words a
 * block), for benchmarks/cuda_gemm.py --profile. Every thread of the cluster meets
 * at a cluster barrier after the barriers' init (fence.mbarrier_init.release.cluster: no multicast or remote
 * arrival reaches an uninitialised barrier) and before it exits (no block leaves while its partner may still
 * arrive on its barriers). A slot past the grid's tiles (the paired dimension's tile count odd) gets its
 * partner's tile with m_valid 0: it loads and multiplies as a real tile (the protocol is the same) and stores
 * nothing. */
template <int NTHREADS, int BM, int BN, int BK, int STAGES, int NC, int MR, bool B_KMAJOR, int A_RS, int A_CS,
          int B_RS, int B_CS, int EPI, int KSTEP, bool PINGPONG, typename MMA, typename TOUT, typename TILE,
          typename MC = tc_mc<0>>
__device__ __forceinline__ void tc_wgmma_persistent(unsigned char* pipe, TOUT* __restrict__ C_base, long long tiles,
                                                    long long ldc, TILE tile_of, const tc_tmap* tma,
                                                    const tc_tmap* tmb, const tc_tmap* tmc = nullptr, MC mc = MC()) {
  static_assert(NTHREADS == 128 * (NC + 1), "tc_wgmma_persistent: one producer and NC consumer warpgroups");
  constexpr int ESIZE = 32 / KSTEP;            /* bytes per element: k16 for 16-bit types, k32 for 8-bit */
  constexpr int ATOM = 128 / ESIZE;            /* elements in one 128-byte row */
  constexpr int A_BYTES = BM * BK * ESIZE;
  constexpr int B_BYTES = BK * BN * ESIZE;
  constexpr int STAGE = A_BYTES + B_BYTES;
  constexpr int B_ROWS = B_KMAJOR ? BN : BK;   /* B's tile rows in global orientation */
  constexpr int B_ATOMS = B_KMAJOR ? BK / ATOM : BN / ATOM;
  constexpr bool TO_GLOBAL = true;             /* the direct stores' (tc_wgmma_store_acc, as tc_wgmma_pipeline's) */
  constexpr bool REGS = NC == 2;               /* move registers from the producer to the consumers */
  /* The producer keeps 56 (not tc_hopper.cuh's 40): its tile function and the 4-stage loop spilled at 40 (ptxas:
   * 116 bytes on the README GEMM at 1024^3). The block holds 168 x 384 = 64512 registers; 56 x 128 leaves the two
   * consumer warpgroups 224 each (232 would need 65536 and setmaxnreg.inc would wait forever); the consumers' SASS
   * at 224 is the same instructions as at 232 (4096^3, 3 and 4 stages, registers renamed). */
  static_assert(BK % ATOM == 0 && (B_KMAJOR || BN % ATOM == 0), "tc_wgmma_persistent: whole 128-byte rows");
  static_assert(!PINGPONG || (NC == 2 && BM == 64 * MR), "tc_wgmma_persistent: ping-pong gives each of two "
                                                         "consumer warpgroups whole tiles");
  constexpr int READERS = PINGPONG ? 128 : 128 * NC;  /* the threads that release a stage */
  constexpr int MCAST = MC::share;  /* 0: no cluster; 1: A multicast in a cluster of two; 2: B */
  constexpr int REL = MC::rel;      /* TC_REL_*: how a stage is released (D49) */
  constexpr bool PROF = MC::prof_on != 0;  /* the pipeline profile (D49) */
  constexpr int SK = MC::sk;               /* stream-K (D53) */
  static_assert(SK == TC_SK_OFF || (!MCAST && !PINGPONG), "tc_wgmma_persistent: stream-K without clusters or "
                                                          "ping-pong");
  /* a stage's `empty` arrivals: per warp, each releasing warp once a block of the cluster; per thread, every reader
   * and, with a cluster, each of the partner's releasing warps (D44) */
  constexpr unsigned EMPTY_COUNT =
      REL == TC_REL_WARP ? (MCAST ? 2 : 1) * READERS / 32 : READERS + (MCAST ? READERS / 32 : 0);
  static_assert(REL == TC_REL_THREAD || REL == TC_REL_WARP || (REL == TC_REL_D44 && MCAST),
                "tc_wgmma_persistent: TC_REL_D44 is a cluster's");
  static_assert(MCAST == 0 || ((MCAST == 1 ? BM : B_ROWS) % 16 == 0), "tc_wgmma_persistent: half boxes of whole "
                                                                     "1024-byte swizzle atoms");
  const unsigned rank = MCAST ? tc_cluster_ctarank() : 0u;  /* this block's rank in its cluster */
  const unsigned raw = tc_smem_addr(pipe);
  const unsigned base = (raw + 1023u) & ~1023u;
  const unsigned bars = base + STAGES * STAGE;  /* full[s] at bars + 8 s, empty[s] at bars + 8 (STAGES + s) */
  const unsigned done = bars + 16 * STAGES;     /* ping-pong: done[c] at done + 8 c, consumer c's main loops */
  constexpr bool TMA_STORE = (EPI & TC_EPI_TMA) != 0;
  constexpr int OATOM = 128 / (int)sizeof(TOUT);  /* TMA store: C's columns in one 128-byte box row */
  constexpr int CPARTS = (EPI & TC_EPI_TMA_HALF) ? 2 : 1;  /* ... staged and stored in this many parts */
  constexpr int PBOXES = BN / OATOM / CPARTS;     /* ... boxes of 64 rows x 128 bytes a part of a 64-row slice */
  static_assert(!TMA_STORE || (BN % (OATOM * CPARTS) == 0 && 16 * STAGES + 16 <= 1024),
                "tc_wgmma_persistent: TMA store tiles");
  const unsigned cbuf = bars + 1024;            /* TMA store: the C buffer (1024-byte aligned) */
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      tc_mbar_init(bars + 8 * s, 1);
      tc_mbar_init(bars + 8 * (STAGES + s), EMPTY_COUNT);
    }
    if (PINGPONG) {
      tc_mbar_init(done, 128);
      tc_mbar_init(done + 8, 128);
    }
    tc_mbar_init_fence();
  }
  if (MCAST)
    tc_mc_cluster_sync();  /* both blocks' barriers initialised before any multicast or remote arrival */
  else
    __syncthreads();
  unsigned long long* const prof = PROF ? mc.prof + (unsigned long long)(blockIdx.x % TC_PROF_BLOCKS) * TC_PROF_WORDS : nullptr;
  if constexpr (PROF) {
    if (threadIdx.x == 0) {
      atomicAdd(prof + 0, tc_globaltimer());
      prof[12] = tc_smid();
      prof[13] = rank;
    }
  }
  /* stream-K (D53): every tile's k tiles (the first tile's: the same for all) and the stream-K tiles (0: none),
   * computed by each role after its setmaxnreg (a value live across it is spilled) */
  auto sk_plan = [&](long long& sk_k, long long& sk) {
    sk_k = SK != TC_SK_OFF ? tile_of(0).k_tiles : 0;
    sk = SK != TC_SK_OFF ? tc_sk_tiles(SK, tiles, gridDim.x, sk_k, mc.slots) : 0;
  };
  if (wg == 0) {
    if (REGS) tc_setmaxnreg_dec<56>();
    if (threadIdx.x == 0) {
      tc_tma_prefetch_map(tma);
      tc_tma_prefetch_map(tmb);
      unsigned it = 0;  /* the block's k steps so far, over all its tiles */
      long long p0 = 0, pw = 0;  /* the profile's: the loop's start, cycles in `empty` waits */
      if constexpr (PROF) p0 = tc_clock();
      long long sk_k, sk;
      sk_plan(sk_k, sk);
      tc_sk_walk<SK != TC_SK_OFF> walk(tiles, gridDim.x, blockIdx.x, sk, sk_k, SK == TC_SK_STAGGER);
      long long tile;
      int kb, ke;
      while (walk.next(tile, kb, ke)) {
        const tc_gemm_tile g = tile_of(tile);
        if (ke < 0) ke = (int)g.k_tiles;
#pragma unroll 1 /* one copy of the loads (NVVM unrolled them 4 times: 208 more SASS instructions; D50) */
        for (int kt = kb; kt < ke; ++kt, ++it) {
          const int s = it % STAGES;
          long long w0 = 0;
          if constexpr (PROF) w0 = tc_clock();
          if (it >= STAGES) tc_mbar_wait(bars + 8 * (STAGES + s), ((it / STAGES) + 1) & 1);
          if constexpr (PROF) pw += tc_clock() - w0;
          const unsigned full = bars + 8 * s;
          tc_mbar_expect_tx(full, STAGE);
          const unsigned sa = base + s * STAGE, sb = sa + A_BYTES;
          const int ar = (int)(g.a_r0 + (long long)kt * A_RS), ac = (int)(g.a_c0 + (long long)kt * A_CS);
          const int br = (int)(g.b_r0 + (long long)kt * B_RS), bc = (int)(g.b_c0 + (long long)kt * B_CS);
          if (MCAST == 1) {  /* this block's half of A's rows, to both blocks of the cluster */
#pragma unroll
            for (int a = 0; a < BK / ATOM; ++a)
              tc_tma_load_2d_mc(sa + a * BM * 128 + rank * (BM / 2) * 128, tma, full, ac + a * ATOM,
                                ar + (int)rank * (BM / 2), (unsigned short)3);
          } else {
#pragma unroll
            for (int a = 0; a < BK / ATOM; ++a) tc_tma_load_2d(sa + a * BM * 128, tma, full, ac + a * ATOM, ar);
          }
          if (MCAST == 2) {  /* this block's half of B's rows, to both */
#pragma unroll
            for (int a = 0; a < B_ATOMS; ++a)
              tc_tma_load_2d_mc(sb + a * B_ROWS * 128 + rank * (B_ROWS / 2) * 128, tmb, full, bc + a * ATOM,
                                br + (int)rank * (B_ROWS / 2), (unsigned short)3);
          } else {
#pragma unroll
            for (int a = 0; a < B_ATOMS; ++a) tc_tma_load_2d(sb + a * B_ROWS * 128, tmb, full, bc + a * ATOM, br);
          }
        }
      }
      if constexpr (PROF) {
        atomicAdd(prof + 1, tc_globaltimer());
        atomicAdd(prof + 2, (unsigned long long)(tc_clock() - p0));
        atomicAdd(prof + 3, (unsigned long long)pw);
        atomicAdd(prof + 4, (unsigned long long)it);
      }
    }
  } else {
    if (REGS) tc_setmaxnreg_inc<224>();
    const int me = wg - 1;            /* this consumer warpgroup */
    const int c = PINGPONG ? 0 : me;  /* its first 64-row slice of a tile (ping-pong: whole tiles) */
    unsigned it = 0;  /* as the producer's */
    long long j = 0;  /* the block's tiles so far */
    /* stage s read (every lane of the warp is past the warp's WGMMA wait: .sync.aligned): per warp, the warp's
     * first lane arrives on its block's `empty` and, with a cluster, on the partner's (its producer multicasts into
     * this block's stage); per thread, every thread on its block's and each warp's first lane on the partner's */
    const bool lead = threadIdx.x % 32 == 0;
    long long rc = 0, fw = 0;  /* the profile's: cycles releasing, cycles in `full` waits */
    auto release = [&](unsigned s) {
      const unsigned e = bars + 8 * (STAGES + s);
      long long r0 = 0;
      if constexpr (PROF) r0 = tc_clock();
      if (REL != TC_REL_WARP) tc_mbar_arrive(e);
      if (lead) {
        if (REL == TC_REL_WARP) tc_mbar_arrive(e);
        if (MCAST) tc_mbar_arrive_remote<REL == TC_REL_D44>(e, rank ^ 1u);
      }
      if constexpr (PROF) rc += tc_clock() - r0;
    };
    long long c0 = 0;
    if constexpr (PROF) c0 = tc_clock();
    long long sk_k, sk;
    sk_plan(sk_k, sk);
    tc_sk_walk<SK != TC_SK_OFF> walk(tiles, gridDim.x, blockIdx.x, sk, sk_k, SK == TC_SK_STAGGER);
    long long tile;
    int kb, ke;
    long long skc = 0, fx = 0, u0 = 0;  /* the profile's (stream-K): cycles in stream-K pieces, in their fixups */
    for (; walk.next(tile, kb, ke); ++j) {
      if constexpr (PROF && SK != TC_SK_OFF) {  /* the unit before was a stream-K piece: its cycles */
        const long long now = tc_clock();
        if (u0) skc += now - u0;
        u0 = tile < sk ? now : 0;
      }
      const tc_gemm_tile g = tile_of(tile);
      if (ke < 0) ke = (int)g.k_tiles;
      const int k_tiles = ke - kb;  /* the piece's k steps (a whole tile's: all of them) */
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
        long long w0 = 0;
        if constexpr (PROF) w0 = tc_clock();
        tc_mbar_wait(bars + 8 * s, (it / STAGES) & 1);
        if constexpr (PROF) fw += tc_clock() - w0;
        const unsigned sa = base + s * STAGE, sb = sa + A_BYTES;
        tc_wgmma_ktile<BM, BN, BK, MR, B_KMAJOR, KSTEP, MMA>(acc, sa, sb, c);
      };
      /* every k step keeps one group in flight and releases the stage before its own; one copy of the main loop
       * (a peeled last step made NVVM and ptxas emit it three times, and NVVM unrolled the loop twice:
       * docs/decisions.md D48, D50; CUTLASS's Hopper main loops are not unrolled either) */
#pragma unroll 1
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        step(it);
        tc_wgmma_wait<1>();
        if (kt > 0) release((it - 1) % STAGES);
      }
      /* then the last group, before the epilogue reads the accumulators (D29's ptxas hazard), and its stage, so the
       * next tile's loads start under this tile's epilogue */
      tc_wgmma_wait<0>();
      if (k_tiles > 0) release((it - 1) % STAGES);
      if (PINGPONG) tc_mbar_arrive(done + 8 * me);  /* the other warpgroup's next tile may start */
#pragma unroll
      for (int i = 0; i < MR; ++i) tc_reg_fence(acc[i]);
      if (MCAST && g.m_valid <= 0) continue;  /* a slot past the grid's tiles: its partner's tile, not stored */
      if (SK != TC_SK_OFF && (kb > 0 || ke < sk_k) && tile < sk) {  /* a piece of a stream-K tile (D53) */
        const int t = threadIdx.x % 128;
        constexpr int V = MR * BN / 8;  /* float4s a thread of the warpgroup holds */
        long long f0 = 0;
        if constexpr (PROF) f0 = tc_clock();
        if (kb > 0) {  /* a contributor's piece: the partial to this block's slot, then its flag */
          float* part = tc_sk_part(mc.ws, mc.slots, NC, blockIdx.x, BM, BN) + me * 128 * V * 4;
#pragma unroll
          for (int q = 0; q < V; ++q) {
            const int i = q / (BN / 8), jj = (q % (BN / 8)) * 4;
            tc_sk_st4(part + ((long long)q * 128 + t) * 4, acc[i][jj], acc[i][jj + 1], acc[i][jj + 2], acc[i][jj + 3]);
          }
          tc_consumer_sync(1 + me, 128);  /* the warpgroup's stores, then the flag (cumulative release) */
          if (t == 0) tc_sk_flag_release(tc_sk_flag(mc.ws, blockIdx.x, NC, me), 1u);
          if constexpr (PROF) fx += tc_clock() - f0;
          continue;
        }
        /* the owner's piece: each later block whose range holds some of the tile's k iterations, in order */
        const unsigned iters = (unsigned)(sk * sk_k);
        const unsigned last = tc_sk_block_of((unsigned)((tile + 1) * sk_k) - 1, gridDim.x, iters);
        for (unsigned b = blockIdx.x + 1; b <= last; ++b) {
          if (t == 0) {
            tc_sk_flag_wait(tc_sk_flag(mc.ws, b, NC, me), 1u);
            tc_sk_flag_release(tc_sk_flag(mc.ws, b, NC, me), 0u);  /* (read before any later launch writes it) */
          }
          tc_consumer_sync(1 + me, 128);
          const float* part = tc_sk_part(mc.ws, mc.slots, NC, b, BM, BN) + me * 128 * V * 4;
#pragma unroll
          for (int q = 0; q < V; ++q) {
            const int i = q / (BN / 8), jj = (q % (BN / 8)) * 4;
            float x0, x1, x2, x3;
            tc_sk_ld4(part + ((long long)q * 128 + t) * 4, x0, x1, x2, x3);
            acc[i][jj] += x0;
            acc[i][jj + 1] += x1;
            acc[i][jj + 2] += x2;
            acc[i][jj + 3] += x3;
          }
        }
        if constexpr (PROF) fx += tc_clock() - f0;
      }
      if constexpr (TMA_STORE) {  /* (discarded otherwise: tc_stage_c_slice needs whole boxes) */
        const int t = threadIdx.x % 128;
#pragma unroll
        for (int part = 0; part < CPARTS; ++part) {
          if (t == 0) tc_bulk_wait_read<0>();  /* the warpgroup's stores so far have read the buffer */
          tc_consumer_sync(1 + me, 128);
#pragma unroll
          for (int i = 0; i < MR; ++i)
            tc_stage_c_slice<BN, CPARTS, TOUT>(cbuf + (me * MR + i) * PBOXES * 8192, acc[i], t, part);
          tc_fence_proxy_async();
          tc_consumer_sync(1 + me, 128);
          if (t == 0) {
            const int row0 = (int)(g.c_off / ldc), col0 = (int)(g.c_off % ldc);
#pragma unroll
            for (int i = 0; i < MR; ++i) {
#pragma unroll
              for (int b = 0; b < PBOXES; ++b)
                tc_tma_store_2d(tmc, cbuf + ((me * MR + i) * PBOXES + b) * 8192, col0 + (part * PBOXES + b) * OATOM,
                                row0 + (c * MR + i) * 64);
            }
            tc_bulk_commit();
          }
        }
      } else {  /* the direct stores (not compiled with TMA stores) */
        tc_wgmma_store_acc<BN, MR, TO_GLOBAL, EPI>(acc, C_base + g.c_off, c, g.m_valid, g.n_valid, ldc);
      }
    }
    if (TMA_STORE && threadIdx.x % 128 == 0) tc_bulk_wait<0>();  /* the stores are done before the block exits */
    if constexpr (PROF) {
      if (threadIdx.x == 128) {
        atomicAdd(prof + 5, (unsigned long long)(tc_clock() - c0));
        atomicAdd(prof + 6, (unsigned long long)fw);
        atomicAdd(prof + 7, (unsigned long long)rc);
        atomicAdd(prof + 8, (unsigned long long)it);
        atomicAdd(prof + 9, tc_globaltimer());
        if (SK != TC_SK_OFF) {
          atomicAdd(prof + 14, (unsigned long long)(skc + (u0 ? tc_clock() - u0 : 0)));
          atomicAdd(prof + 15, (unsigned long long)fx);
        }
      } else if (threadIdx.x == 256) {
        atomicAdd(prof + 10, (unsigned long long)fw);
        atomicAdd(prof + 11, (unsigned long long)rc);
      }
    }
  }
  if (MCAST) tc_mc_cluster_sync();  /* no block exits while its partner may still arrive on its barriers */
}
