// Host harness for the split-K fixup of backends/cuda/tilecore_cuda/prelude/tc_splitk.cuh (tests/test_cuda_splitk.py).
//
// The header is compiled as it ships (or mutated by the test) with TC_SPLITK_FIXUP_ONLY: its fixup,
// tc_splitk_fixup, without the WGMMA main loop, and the CUDA built-ins it uses shimmed: one std::thread per
// CUDA thread; the consumers' named barrier (tc_splitk_bar, tc_splitk_bar_or) as a barrier over the block's
// consumer threads; atomicAdd / atomicExch / tc_splitk_fence as C++ relaxed atomics and acquire-release fences;
// __ldcg / __stcg as plain 16-byte loads and stores, and a pair store, each aborting when misaligned (faults on
// the GPU). A stand-in for the main loop gives each consumer thread the accumulators the block's main loop would
// have produced (a partial tile drawn by the harness), in the m64nN register layout, and calls the fixup, as
// tc_wgmma_splitk does (the producer warpgroup takes no part, as on the GPU).
//
// For a few tile shapes, split counts and ragged edges it runs launches in which a tile's blocks arrive in
// random orders, one after another or at the same time, on one workspace that is never cleared, and checks:
// C equals the float32 sum of the partials in split order, bit for bit, whatever the arrival order; no
// element outside C's valid rows and columns is written, nor any workspace byte outside the counters and the
// tiles' partials; every counter is back at zero; every valid element of C is stored exactly once per launch.
// It prints "ok" or the first failure, and exits 0 or 1. The host's ordering is stronger than the GPU's: the
// fences are checked in the SASS (tests/test_cuda_splitk.py).
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

struct float4 {
  float x, y, z, w;
};
struct tc_tmap {
  unsigned long long opaque[16];
};
struct tc_dim {
  unsigned x;
};
static thread_local tc_dim threadIdx;
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define TC_EPI_ROWS 1
#define TC_EPI_COLS 2
#define TC_EPI_PAIRS 4

struct Block {  // what the threads of one running block share
  std::barrier<> consumers;
  std::atomic<int> any{0};
  int tile, split, nconsumers;
  explicit Block(int nc) : consumers(nc), nconsumers(nc) {}
};
static thread_local Block* tc_block;

// on the GPU a named barrier over more threads than arrive never completes: the count must be the consumers'
template <int N> inline void consumer_count() {
  if (N != tc_block->nconsumers) {
    std::fprintf(stderr, "named barrier over %d threads, but %d consumer threads arrive\n", N, tc_block->nconsumers);
    std::abort();
  }
}
template <int N> inline void tc_splitk_bar() {
  consumer_count<N>();
  tc_block->consumers.arrive_and_wait();
}
template <int N> inline int tc_splitk_bar_or(int p) {  // one call per block run: `any` starts at 0
  consumer_count<N>();
  if (p) tc_block->any.fetch_or(1);
  tc_block->consumers.arrive_and_wait();
  return tc_block->any.load();
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
inline void tc_splitk_fence() { std::atomic_thread_fence(std::memory_order_acq_rel); }
inline void aligned16(const void* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 16) {
    std::fprintf(stderr, "misaligned 16-byte %s\n", what);
    std::abort();
  }
}
inline float4 __ldcg(const float4* p) {
  aligned16(p, "load");
  return *p;
}
inline void __stcg(float4* p, float4 v) {
  aligned16(p, "store");
  *p = v;
}
static float* g_c;                    // C, whose stores are counted per element
static std::atomic<int>* g_writes;
template <typename T> inline void tc_store1(T* p, float v) {
  *p = v;
  if (p >= g_c) g_writes[p - g_c].fetch_add(1);
}
template <typename T> inline void tc_store2(T* p, float a, float b) {
  if (reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T))) {
    std::fprintf(stderr, "misaligned pair store\n");
    std::abort();
  }
  tc_store1(p, a);
  tc_store1(p + 1, b);
}

// the cluster sum's built-ins (D41; tests/splitk_cluster_host.cpp runs it): compiled with the header, never called
inline void tc_cluster_sync() { std::abort(); }
inline void tc_splitk_proxy_fence() { std::abort(); }
inline void tc_dsmem_store4(float4*, unsigned, float4) { std::abort(); }

#define TC_SPLITK_FIXUP_ONLY
#include "tc_splitk.cuh"

static const float* g_parts;  // [tile][split][BM][BN]: what each block's main loop produces
static int g_splits;

// The main loop's stand-in: consumer c's thread holds rows [(c MR + i) 64, + 64) of the block's partial tile as
// m64nBN accumulators (warp w: rows 16 w + lane / 4 (+ 8); register 4 j + 2 h + e is column 8 j + 2 (lane % 4)
// + e of row + 8 h), then runs the fixup, as tc_wgmma_splitk does.
template <int NTHREADS, int BM, int BN, int NC, int MR, int EPI, int SPLITS, int TILES>
void block_thread(float* C, long long m_valid, long long n_valid, long long ldc, unsigned char* ws) {
  const int c = (threadIdx.x - 128) / 128, t = threadIdx.x % 128, w = t / 32, l = t % 32;
  const float* src = g_parts + ((long long)tc_block->tile * g_splits + tc_block->split) * BM * BN;
  float acc[MR][BN / 2];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < BN / 2; ++r) {
      const int j = r / 4, h = (r / 2) % 2, e = r % 2;
      const int row = (c * MR + i) * 64 + w * 16 + l / 4 + 8 * h, col = 8 * j + 2 * (l % 4) + e;
      acc[i][r] = src[row * BN + col];
    }
  tc_splitk_fixup<NC, MR, BM, BN, EPI, SPLITS, TILES>(acc, C, m_valid, n_valid, ldc, tc_block->tile,
                                                      tc_block->split, ws);
}

static int fail(const char* what, int a, int b) {
  std::printf("FAIL: %s (%d, %d)\n", what, a, b);
  return 1;
}

// One GEMM: a grid of TM x TN tiles of BM x BN over an M x N C (row stride ldc), SPLITS blocks per tile.
template <int BM, int BN, int NC, int MR, int SPLITS, int TM, int TN, int EPI>
static int run_case(std::mt19937& rng, int M, int N, int ldc, int launches, bool together) {
  constexpr int TILES = TM * TN, NTHREADS = 128 * (NC + 1);
  const long long counters = (TILES * 4LL + 255) / 256 * 256;
  const long long ws_bytes = counters + (long long)TILES * SPLITS * BM * BN * 4, guard = 4096;
  std::vector<float4> wsmem((ws_bytes + guard) / 16);
  unsigned char* ws = reinterpret_cast<unsigned char*>(wsmem.data());
  std::memset(ws, 0, ws_bytes);  // zero-filled once, as the runtime allocates it
  std::memset(ws + ws_bytes, 0x5a, guard);  // past the workspace: must stay as it is
  std::memset(ws + TILES * 4, 0x5a, counters - TILES * 4);  // the counters' padding, likewise
  std::vector<float> parts((size_t)TILES * SPLITS * BM * BN);
  std::vector<float4> cmem(((size_t)(TM * BM + 1) * ldc) / 4 + 2);
  float* C = reinterpret_cast<float*>(cmem.data());
  std::vector<std::atomic<int>> writes(cmem.size() * 4);
  g_splits = SPLITS;
  g_c = C;
  g_writes = writes.data();
  for (int launch = 0; launch < launches; ++launch) {
    // partials over a wide range of magnitudes and signs: the order of the sum shows in the bits
    std::uniform_int_distribution<int> ex(-24, 24);
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);
    for (float& p : parts) p = std::ldexp(mant(rng), ex(rng)) * (rng() % 2 ? 1.0f : -1.0f);
    g_parts = parts.data();
    const float sentinel = -777.25f;
    std::fill(C, C + cmem.size() * 4, sentinel);
    for (auto& w : writes) w.store(0);
    auto run_block = [&](Block* b, int tm, int tn) {
      std::vector<std::thread> threads;
      for (int t = 128; t < NTHREADS; ++t)  // the producer warpgroup (threads 0-127) leaves at once: not run
        threads.emplace_back([=]() {
          tc_block = b;
          threadIdx.x = (unsigned)t;
          float* c0 = C + (long long)tm * BM * ldc + (long long)tn * BN;
          block_thread<NTHREADS, BM, BN, NC, MR, EPI, SPLITS, TILES>(c0, M - tm * BM, N - tn * BN, ldc, ws);
        });
      for (auto& th : threads) th.join();
    };
    // every block of the grid in a random order: tiles interleave
    std::vector<Block*> blocks;
    for (int tile = 0; tile < TILES; ++tile)
      for (int s = 0; s < SPLITS; ++s) {
        blocks.push_back(new Block(128 * NC));
        blocks.back()->tile = tile;
        blocks.back()->split = s;
      }
    std::shuffle(blocks.begin(), blocks.end(), rng);
    if (together) {  // the blocks of a tile at once (arrivals race), the tiles in turn
      for (int tile = 0; tile < TILES; ++tile) {
        std::vector<std::thread> runners;
        for (Block* b : blocks)
          if (b->tile == tile) runners.emplace_back(run_block, b, tile / TN, tile % TN);
        for (auto& r : runners) r.join();
      }
    } else {
      for (Block* b : blocks) run_block(b, b->tile / TN, b->tile % TN);
    }
    for (Block* b : blocks) delete b;
    for (int tile = 0; tile < TILES; ++tile)
      if (reinterpret_cast<unsigned*>(ws)[tile] != 0) return fail("counter not back at zero", launch, tile);
    for (long long at = TILES * 4; at < counters; ++at)
      if (ws[at] != 0x5a) return fail("workspace written between the counters and the partials", launch, (int)at);
    for (long long at = ws_bytes; at < ws_bytes + guard; ++at)
      if (ws[at] != 0x5a) return fail("workspace written past its end", launch, (int)(at - ws_bytes));
    for (int r = 0; r < TM * BM + 1; ++r) {
      for (int c = 0; c < ldc; ++c) {
        const float got = C[(long long)r * ldc + c];
        if (r >= M || c >= N || c >= TN * BN) {
          if (std::memcmp(&got, &sentinel, 4)) return fail("store outside C's valid rows and columns", r, c);
          continue;
        }
        const int tile = (r / BM) * TN + c / BN;
        const long long at = (long long)(r % BM) * BN + c % BN;
        float want = parts[((long long)tile * SPLITS) * BM * BN + at];
        for (int s = 1; s < SPLITS; ++s) want += parts[((long long)tile * SPLITS + s) * BM * BN + at];
        if (std::memcmp(&got, &want, 4)) return fail("element differs from the split-order sum", r, c);
        if (writes[(long long)r * ldc + c].load() != 1) return fail("element not stored exactly once", r, c);
      }
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  std::mt19937 rng(argc > 1 ? (unsigned)std::atoi(argv[1]) : 1u);
  int bad = 0;
  // run_case<BM, BN, NC, MR, SPLITS, TM, TN, EPI>(rng, M, N, ldc, launches, together)
  // ragged rows and columns, an odd row stride (no pair stores), every check compiled
  bad |= run_case<64, 32, 1, 1, 3, 2, 2, 0>(rng, 100, 51, 51, 3, false);
  // ragged rows, aligned pairs; blocks of a tile at the same time
  bad |= run_case<64, 32, 1, 1, 3, 2, 2, TC_EPI_PAIRS>(rng, 70, 64, 64, 2, true);
  // whole tiles, two consumer warpgroups, four splits (loads grouped 5 columns at a time, 8 columns), the
  // checks the code generator proved away
  bad |= run_case<128, 64, 2, 1, 4, 1, 2, TC_EPI_ROWS | TC_EPI_COLS | TC_EPI_PAIRS>(rng, 128, 128, 128, 3, false);
  // 16 valid rows of a 64-row tile (the 16x8192 GEMM's shape), two splits, racing
  bad |= run_case<64, 32, 1, 1, 2, 1, 3, TC_EPI_COLS | TC_EPI_PAIRS>(rng, 16, 96, 96, 3, true);
  // two 64-row slices per consumer (MR = 2), five splits, 22 valid rows in the second tile row, racing
  bad |= run_case<128, 32, 1, 2, 5, 2, 1, 0>(rng, 150, 32, 40, 2, true);
  // more splits than loads in flight (only by tilecore.cuda.split_k): the other partials in two chunks
  bad |= run_case<64, 32, 1, 1, 20, 1, 2, TC_EPI_PAIRS>(rng, 64, 64, 64, 2, false);
  std::printf(bad ? "FAIL\n" : "ok\n");
  return bad;
}
