// Host harness for the cluster sum of a split-K tile, tc_splitk_cluster_fixup in
// backends/cuda/tilecore_cuda/prelude/tc_splitk.cuh (docs/decisions.md D41; tests/test_cuda_splitk.py).
//
// The header is compiled as it ships (or mutated by the test) with TC_SPLITK_FIXUP_ONLY, the CUDA built-ins it
// uses shimmed: one std::thread per consumer thread of every block of the cluster (the SPLITS blocks of one
// output tile run at the same time, as the hardware starts a cluster); the cluster barrier (tc_cluster_sync) as
// a std::barrier over all of them that counts its completions; each block's shared memory as its own array
// (the pipeline's stages: the receive area, then guard floats), filled with NaN before every launch; the DSMEM
// store (tc_dsmem_store4) as a store into the target block's array at the same offset, aborting outside the
// receive area, outside the two barriers, to a rank outside the cluster, or twice to one float4. A stand-in
// for the main loop gives each consumer thread its block's partial tile (drawn by the harness) in the m64nN
// register layout and calls the fixup, as tc_wgmma_splitk does.
//
// It checks, for a few tile shapes, split counts and ragged edges: C equals the float32 sum of the partials
// in split order, bit for bit (the same operations as the global fixup, tc_splitk_fixup); every valid element
// of C is stored exactly once and nothing outside C's valid rows and columns; every consumer thread meets the
// cluster barrier exactly twice. It prints "ok" or the first failure, and exits 0 or 1. The fences and the
// barriers' memory semantics are checked in the SASS (tests/test_cuda_splitk.py).
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <thread>
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

static void die(const char* what, long long a = 0, long long b = 0) {
  std::fprintf(stderr, "FAIL: %s (%lld, %lld)\n", what, a, b);
  std::printf("FAIL: %s (%lld, %lld)\n", what, a, b);
  std::fflush(stdout);
  std::exit(1);
}

struct Cluster {  // what the threads of one running cluster share
  int splits;
  long long recv4, guard4;                          // float4s of the receive area, of the guard after it
  std::vector<std::vector<float4>> smem;           // [rank][recv4 + guard4]
  std::vector<std::vector<std::atomic<int>>> got;  // DSMEM stores per float4 of each block's receive area
  std::atomic<int> phase{0};                       // completed cluster barriers
  std::barrier<std::function<void()>> bar;
  Cluster(int s, long long r, long long g, int threads)
      : splits(s), recv4(r), guard4(g), smem(s), got(s), bar(threads, std::function<void()>([this]() { ++phase; })) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int b = 0; b < s; ++b) {
      smem[b].assign(r + g, float4{nan, nan, nan, nan});
      got[b] = std::vector<std::atomic<int>>(r);
    }
  }
};
static thread_local Cluster* tc_cl;
static thread_local int tc_rank, tc_syncs;

inline void tc_cluster_sync() {
  ++tc_syncs;
  tc_cl->bar.arrive_and_wait();
}
inline void tc_splitk_proxy_fence() {}
inline void tc_dsmem_store4(float4* local, unsigned rank, float4 v) {
  const long long at = local - tc_cl->smem[tc_rank].data();
  if (rank >= (unsigned)tc_cl->splits) die("DSMEM store to a rank outside the cluster", rank, tc_cl->splits);
  if (at < 0 || at >= tc_cl->recv4) die("DSMEM store outside the receive area", at, tc_cl->recv4);
  if (tc_cl->phase.load() != 1) die("DSMEM store outside the two cluster barriers", tc_cl->phase.load(), at);
  if (rank == (unsigned)tc_rank) die("a block stores its own columns to itself", rank, at);
  if (tc_cl->got[rank][at].fetch_add(1) != 0) die("two DSMEM stores to one float4", rank, at);
  tc_cl->smem[rank][at] = v;
}
// the global fixup's built-ins: compiled with it, never called here
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
inline void tc_splitk_fence() { std::atomic_thread_fence(std::memory_order_acq_rel); }
template <int N> inline void tc_splitk_bar() { die("the cluster sum met the global fixup's barrier"); }
template <int N> inline int tc_splitk_bar_or(int) { die("the cluster sum met the global fixup's barrier"); return 0; }
inline float4 __ldcg(const float4* p) { return *p; }
inline void __stcg(float4* p, float4 v) { *p = v; }

static float* g_c;  // C, whose stores are counted per element
static std::atomic<int>* g_writes;
template <typename T> inline void tc_store1(T* p, float v) {
  *p = v;
  if (p >= g_c) g_writes[p - g_c].fetch_add(1);
}
template <typename T> inline void tc_store2(T* p, float a, float b) {
  if (reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T))) die("misaligned pair store");
  tc_store1(p, a);
  tc_store1(p + 1, b);
}

#define TC_SPLITK_FIXUP_ONLY
#include "tc_splitk.cuh"

// The main loop's stand-in: consumer c's thread holds rows [(c MR + i) 64, + 64) of its block's partial tile as
// m64nBN accumulators (warp w: rows 16 w + lane / 4 (+ 8); register 4 j + 2 h + e is column 8 j + 2 (lane % 4)
// + e of row + 8 h), then runs the cluster sum, as tc_wgmma_splitk does with CLUSTER.
template <int BM, int BN, int NC, int MR, int EPI, int SPLITS>
void block_thread(const float* part, float* C, long long m_valid, long long n_valid, long long ldc, int yields) {
  const int c = (threadIdx.x - 128) / 128, t = threadIdx.x % 128, w = t / 32, l = t % 32;
  float acc[MR][BN / 2];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < BN / 2; ++r) {
      const int j = r / 4, h = (r / 2) % 2, e = r % 2;
      const int row = (c * MR + i) * 64 + w * 16 + l / 4 + 8 * h, col = 8 * j + 2 * (l % 4) + e;
      acc[i][r] = part[row * BN + col];
    }
  for (int y = 0; y < yields; ++y) std::this_thread::yield();  // blocks finish their main loops in any order
  tc_splitk_cluster_fixup<NC, MR, BM, BN, EPI, SPLITS>(acc, C, m_valid, n_valid, ldc, tc_rank,
                                                       tc_cl->smem[tc_rank].data());
}

// One GEMM: a grid of TM x TN tiles of BM x BN over an M x N C (row stride ldc), a cluster of SPLITS blocks per tile.
template <int BM, int BN, int NC, int MR, int SPLITS, int TM, int TN, int EPI>
static void run_case(std::mt19937& rng, int M, int N, int ldc, int launches) {
  constexpr int Q = BN / 8, QS = (Q + SPLITS - 1) / SPLITS, TILES = TM * TN, NTHREADS = 128 * (NC + 1);
  const long long recv4 = (long long)SPLITS * NC * MR * QS * 128;  // hopper.splitk_cluster_bytes / 16
  std::vector<float> parts((size_t)TILES * SPLITS * BM * BN);
  std::vector<float4> cmem(((size_t)(TM * BM + 1) * ldc) / 4 + 2);
  float* C = reinterpret_cast<float*>(cmem.data());
  std::vector<std::atomic<int>> writes(cmem.size() * 4);
  g_c = C;
  g_writes = writes.data();
  for (int launch = 0; launch < launches; ++launch) {
    // partials over a wide range of magnitudes and signs: the order of the sum shows in the bits
    std::uniform_int_distribution<int> ex(-24, 24);
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);
    for (float& p : parts) p = std::ldexp(mant(rng), ex(rng)) * (rng() % 2 ? 1.0f : -1.0f);
    const float sentinel = -777.25f;
    std::fill(C, C + cmem.size() * 4, sentinel);
    for (auto& w : writes) w.store(0);
    std::vector<int> order(TILES);
    for (int k = 0; k < TILES; ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), rng);
    for (int tile : order) {  // one cluster at a time: clusters share nothing but C
      const int tm = tile / TN, tn = tile % TN;
      Cluster cl(SPLITS, recv4, 64, SPLITS * 128 * NC);
      std::vector<std::thread> threads;
      std::vector<int> syncs(SPLITS * NTHREADS, 0);
      for (int b = 0; b < SPLITS; ++b) {
        const int yields = (int)(rng() % 16);
        for (int t = 128; t < NTHREADS; ++t)  // the producer warpgroup only meets the barriers on the GPU: not run
          threads.emplace_back([&, b, t, tm, tn, yields]() {
            tc_cl = &cl;
            tc_rank = b;
            tc_syncs = 0;
            threadIdx.x = (unsigned)t;
            const float* part = parts.data() + ((long long)tile * SPLITS + b) * BM * BN;
            float* c0 = C + (long long)tm * BM * ldc + (long long)tn * BN;
            block_thread<BM, BN, NC, MR, EPI, SPLITS>(part, c0, M - tm * BM, N - tn * BN, ldc, yields);
            syncs[b * NTHREADS + t] = tc_syncs;
          });
      }
      for (auto& th : threads) th.join();
      for (int b = 0; b < SPLITS; ++b)
        for (int t = 128; t < NTHREADS; ++t)
          if (syncs[b * NTHREADS + t] != 2) die("a consumer thread met the cluster barrier other than twice", b, t);
      for (int b = 0; b < SPLITS; ++b)
        for (long long g = recv4; g < recv4 + 64; ++g)
          if (!std::isnan(cl.smem[b][g].x)) die("shared memory written past the receive area", b, g);
    }
    for (int r = 0; r < TM * BM + 1; ++r) {
      for (int c = 0; c < ldc; ++c) {
        const float got = C[(long long)r * ldc + c];
        if (r >= M || c >= N || c >= TN * BN) {
          if (std::memcmp(&got, &sentinel, 4)) die("store outside C's valid rows and columns", r, c);
          continue;
        }
        const int tile = (r / BM) * TN + c / BN;
        const long long at = (long long)(r % BM) * BN + c % BN;
        float want = parts[((long long)tile * SPLITS) * BM * BN + at];
        for (int s = 1; s < SPLITS; ++s) want += parts[((long long)tile * SPLITS + s) * BM * BN + at];
        if (std::memcmp(&got, &want, 4)) die("element differs from the split-order sum", r, c);
        if (writes[(long long)r * ldc + c].load() != 1) die("element not stored exactly once", r, c);
      }
    }
  }
}

int main(int argc, char** argv) {
  std::mt19937 rng(argc > 1 ? (unsigned)std::atoi(argv[1]) : 1u);
  // run_case<BM, BN, NC, MR, SPLITS, TM, TN, EPI>(rng, M, N, ldc, launches)
  // ragged rows and columns, an odd row stride (no pair stores), every check compiled; 3 blocks own 1, 1, 2 of
  // the 4 float4 columns
  run_case<64, 32, 1, 1, 3, 2, 2, 0>(rng, 100, 51, 51, 2);
  // whole tiles, two consumer warpgroups, four splits of 8 columns, the checks the code generator proved away
  run_case<128, 64, 2, 1, 4, 1, 2, TC_EPI_ROWS | TC_EPI_COLS | TC_EPI_PAIRS>(rng, 128, 128, 128, 2);
  // 16 valid rows of a 64-row tile (the 16x8192 GEMM's shape), two splits
  run_case<64, 32, 1, 1, 2, 1, 3, TC_EPI_COLS | TC_EPI_PAIRS>(rng, 16, 96, 96, 2);
  // two 64-row slices per consumer (MR = 2), five splits of 4 columns (block 0 owns none), 22 valid rows
  run_case<128, 32, 1, 2, 5, 2, 1, 0>(rng, 150, 32, 40, 2);
  // the most a portable cluster holds: 8 splits of a 64x128 tile
  run_case<64, 128, 1, 1, 8, 1, 1, TC_EPI_PAIRS>(rng, 64, 128, 128, 1);
  std::printf("ok\n");
  return 0;
}
