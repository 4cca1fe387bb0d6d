// Host harness for the persistent Hopper GEMM's producer/consumer protocol across tiles
// (backends/cuda/tilecore_cuda/prelude/tc_persistent.cuh; tests/test_cuda_persistent.py).
//
// The header is compiled as it ships (or mutated by the test) with TC_PERSISTENT_HOST, and every CUDA built-in
// it uses shimmed: one std::thread per CUDA thread of a block (the producer warpgroup and NC consumer
// warpgroups), __syncthreads as a barrier over them, the blocks of the grid one after another (their state is
// their own). mbarriers keep the PTX rules: an arrival count and a transaction count per phase, the phase
// completing when both reach zero; try_wait.parity P returns once the phase of parity P has completed (the
// current phase's parity is not P). A TMA load writes a tag (which tensor, its coordinates, a sequence number)
// at its box's shared address and completes its bytes on the barrier. A WGMMA is asynchronous as on the GPU:
// MMA::run records the read, commit closes the thread's group, and wgmma.wait_group N performs the reads of all
// but the newest N groups then (after a short sleep that gives a producer that was let in too early the time
// to overwrite the stage), adding to the accumulators a value made of the k, the rows and the columns the tags
// say, and at a tile's first k a term of each element's place in its 64-row slice (the m64nN accumulator layout:
// a slice stored with its elements moved shows). So a stage released before its group completed, a wrong stage or phase, accumulators not zeroed per tile
// or read before the tile's last group, a tile run twice or left out: each changes C or trips a check.
//
// Checks: no TMA box written while a WGMMA read of it is pending; A and B of one WGMMA come from the same k;
// no more bytes than announced; no wait longer than 3 s (a deadlock); C's valid elements each written once
// per launch with the exact expected sum; nothing written outside them; pair stores aligned. Cases: both B
// layouts, one and two consumer warpgroups (MR 2 and 1), 2 and 3 stages, ragged edges, grids with fewer
// blocks than tiles (not a multiple) and with more, and tiles of different k lengths (1 to 4 k tiles); the same
// with PINGPONG (each consumer warpgroup whole tiles in turn, MR = BM / 64).
//
// The epilogue through shared memory and TMA stores (EPI & TC_EPI_TMA, tilecore.cuda.tma_store, D38) runs with C's
// tensor map, shared-memory stores, fence.proxy.async, named barriers and bulk groups shimmed: a store stamps every
// byte it writes 'written, not fenced' (a thread's fence makes its own bytes fenced) and fails if a TMA store that
// has not yet been waited for (cp.async.bulk.wait_group.read) covers it; a TMA store needs every byte of its box
// written for this tile and fenced, reads the box at once through the 128-byte swizzle (decoded here on its own),
// writes the parts inside the map's dims to C (clipped as TMA clips) and keeps the box 'being read' until the
// issuing thread's wait retires its committed group (an uncommitted store is never retired). The waiting thread
// sleeps 3 ms and the other threads sleep 1 ms before their first write of a tile, so a missing barrier on either
// side of the writes shows. stmatrix meets the warp's lanes and writes each lane's row from the four lanes that hold
// it; a 16-bit C element is an index into the values the conversion has seen (exact, whatever the value). A thread
// must leave with no store uncommitted or in flight. With
// TC_HOST_PADDED_CMAP the harness builds C's map as a runtime that took the tiles' extent for C's would: the edge
// tiles then write outside C (the case must fail: tests/test_cuda_persistent.py).
// Prints "ok" or the first failure, and exits 0 or 1.
#include "persistent_host_shims.h"

// -- the running block ------------------------------------------------------------------------------------
struct Bar {
  unsigned count = 0, pending = 0, phase = 0;
  long long tx = 0;
};
struct Tag {
  int which = -1, c0 = 0, c1 = 0;
  unsigned long long seq = 0;
};
struct Geometry {  // the case's template constants, for decoding descriptors
  int BM, BN, BK, STAGE, A_BYTES, ESIZE, KSTEP;
  bool kmajor;
};
static Geometry G;
struct Store {  // a TMA store's box of shared memory, read until its group is waited for
  unsigned addr;
  bool retired = false;
};
struct Block {
  std::mutex mu;
  std::condition_variable cv;
  std::map<unsigned, Bar> bars;
  std::map<int, std::unique_ptr<std::barrier<>>> named;  // named barriers, made at their first use
  std::vector<Store> stores;
  std::vector<unsigned char> cstate = std::vector<unsigned char>(256 * 1024);  // per byte: 1 written, 2 not fenced
  std::map<unsigned, Tag> tags;          // by box address
  std::map<unsigned, int> reading;       // box address -> WGMMA reads pending
  std::barrier<> sync;
  unsigned long long seq = 0;
  alignas(1024) unsigned char smem[256 * 1024];
  std::vector<std::unique_ptr<std::barrier<>>> warps;  // stmatrix and wgmma.wait_group: the lanes of a warp meet
  struct Lane {
    unsigned addr, r[4];
  };
  std::vector<Lane> lanes;
  explicit Block(int n) : sync(n), lanes(n) {
    for (int w = 0; w < n / 32; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
  }
};
static thread_local Block* B_;  // each thread's block (stream-K cases run the blocks at once)

inline void __syncthreads() { B_->sync.arrive_and_wait(); }
inline unsigned tc_smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - B_->smem); }

static void complete_if_done(Bar& b) {
  if (b.pending == 0 && b.tx == 0) {
    ++b.phase;
    b.pending = b.count;
    B_->cv.notify_all();
  }
}
inline void tc_mbar_init(unsigned bar, unsigned count) {
  std::lock_guard<std::mutex> g(B_->mu);
  B_->bars[bar] = Bar{count, count, 0, 0};
}
inline void tc_mbar_init_fence() {}
static void arrive_locked(unsigned bar) {
  auto it = B_->bars.find(bar);
  if (it == B_->bars.end()) fail("arrival on an address that is no barrier", bar);
  if (it->second.pending == 0) fail("arrival on a barrier with no arrivals left in its phase", bar);
  --it->second.pending;
  complete_if_done(it->second);
}
inline void tc_mbar_arrive(unsigned bar) {
  std::lock_guard<std::mutex> g(B_->mu);
  arrive_locked(bar);
}
inline void tc_mbar_expect_tx(unsigned bar, unsigned bytes) {
  std::lock_guard<std::mutex> g(B_->mu);
  B_->bars[bar].tx += bytes;
  arrive_locked(bar);
}
inline void tc_mbar_wait(unsigned bar, unsigned parity) {
  std::unique_lock<std::mutex> g(B_->mu);
  auto it = B_->bars.find(bar);
  if (it == B_->bars.end()) fail("wait on an address that is no barrier", bar);
  if (!B_->cv.wait_for(g, std::chrono::seconds(3), [&] { return (it->second.phase & 1u) != parity; }))
    fail("deadlock: a barrier's phase never completed", bar, parity);
}
inline void tc_tma_prefetch_map(const tc_tmap*) {}
inline void tc_tma_load_2d(unsigned dst, const tc_tmap* map, unsigned bar, int c0, int c1) {
  std::lock_guard<std::mutex> g(B_->mu);
  if (B_->reading.count(dst) && B_->reading[dst] > 0) fail("a stage overwritten while a WGMMA still reads it", dst);
  B_->tags[dst] = Tag{map->which, c0, c1, ++B_->seq};
  auto it = B_->bars.find(bar);
  if (it == B_->bars.end()) fail("TMA completing on an address that is no barrier", bar);
  it->second.tx -= (long long)map->rows * 128;
  if (it->second.tx < 0) fail("more bytes landed than the barrier was told", bar);
  complete_if_done(it->second);
}
template <int R> inline void tc_setmaxnreg_inc() {}
template <int R> inline void tc_setmaxnreg_dec() {}
inline unsigned long long tc_wgmma_desc(unsigned addr, unsigned, unsigned) { return addr; }
inline void tc_wgmma_fence() {}
template <int N> inline void tc_reg_fence(float (&)[N]) {}

// -- asynchronous WGMMA ---------------------------------------------------------------------------------------
struct Op {
  float* acc;
  int n;
  unsigned a_box, b_box, a, b;
};
static thread_local std::vector<Op> open_group;
static thread_local std::deque<std::vector<Op>> groups;

static void box_of(unsigned a, unsigned b, unsigned& a_box, unsigned& b_box) {
  const unsigned s = a / G.STAGE, sa = s * G.STAGE, sb = sa + G.A_BYTES;
  a_box = sa + (a - sa) / (G.BM * 128) * (G.BM * 128);
  b_box = G.kmajor ? sb + (b - sb) / (G.BN * 128) * (G.BN * 128) : sb;
}
struct MMA {
  template <int N> static void run(float (&d)[N], unsigned long long da, unsigned long long db) {
    Op op{d, N, 0, 0, (unsigned)da, (unsigned)db};
    box_of(op.a, op.b, op.a_box, op.b_box);
    std::lock_guard<std::mutex> g(B_->mu);
    ++B_->reading[op.a_box];
    ++B_->reading[op.b_box];
    open_group.push_back(op);
  }
};
inline void tc_wgmma_commit() {
  groups.push_back(open_group);
  open_group.clear();
}
static float value(int k, int row, int n0) {  // what one WGMMA adds to every accumulator: exact in float
  return (float)(1 + k / G.KSTEP + 64 * ((row / 64) % 16) + 1024 * ((n0 / 8) % 16));
}
static float place(int r, int col) {  // exact in float beside the sums of value(): multiples of 2^19 below 2^24
  return (float)(((r * 5 + col * 3) % 32) * (1 << 19));
}
static void perform(const Op& op) {
  std::lock_guard<std::mutex> g(B_->mu);
  const Tag ta = B_->tags[op.a_box], tb = B_->tags[op.b_box];
  if (ta.which != 0 || tb.which != 1) fail("a WGMMA read a box no TMA load of its operand wrote", op.a_box, op.b_box);
  const unsigned off = op.a - op.a_box;
  const int k = ta.c0 + (int)(off % 128) / G.ESIZE, row = ta.c1 + (int)(off / 128);
  int kb, n0;
  if (G.kmajor) {
    kb = tb.c0 + (int)((op.b - op.b_box) % 128) / G.ESIZE;
    n0 = tb.c1;
  } else {
    kb = tb.c1 + (int)((op.b - op.b_box) / 128);
    n0 = tb.c0;
  }
  if (k != kb) fail("A and B of one WGMMA from different k", k, kb);
  const float v = value(k, row, n0);
  for (int j = 0; j < op.n; ++j) op.acc[j] += v;
  if (k == 0) {  // once per tile: a term of the element's place in the m64nN tile, as the accumulator layout says
    const int l = (int)(threadIdx.x % 32), w = (int)(threadIdx.x % 128 / 32);
    for (int j = 0; j < op.n; ++j) op.acc[j] += place(w * 16 + l / 4 + 8 * ((j / 2) % 2), 8 * (j / 4) + 2 * (l % 4) + j % 2);
  }
  --B_->reading[op.a_box];
  --B_->reading[op.b_box];
}
template <int N> inline void tc_wgmma_wait() {
  if ((int)groups.size() > N) std::this_thread::sleep_for(std::chrono::microseconds(300));
  while ((int)groups.size() > N) {
    for (const Op& op : groups.front()) perform(op);
    groups.pop_front();
  }
  B_->warps[threadIdx.x / 32]->arrive_and_wait();  // wgmma.wait_group.sync.aligned: the warp's lanes leave together
}

// -- C ----------------------------------------------------------------------------------------------------------
static float* g_c;
static std::atomic<int>* g_writes;
static long long g_c_size, g_ldc;
template <typename T> inline void tc_store1(T* p, float v) {
  if constexpr (!std::is_same_v<T, float>) {
    fail("a direct store of 16-bit C (the harness runs those through TMA)");
  } else {
    if (p < g_c || p >= g_c + g_c_size) fail("a store outside C", p - g_c);
    *p = v;
    g_writes[p - g_c].fetch_add(1);
  }
}
template <typename T> inline void tc_store2(T* p, float a, float b) {
  if (reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T))) fail("misaligned pair store");
  tc_store1(p, a);
  tc_store1(p + 1, b);
}

// -- the TMA store epilogue (TC_EPI_TMA) --------------------------------------------------------------------------
static thread_local std::vector<std::pair<unsigned, unsigned>> unfenced;  // this thread's writes since its fence
static thread_local bool wrote_since_fence = false;
static thread_local std::vector<int> open_stores;                           // issued, not yet committed
static thread_local std::deque<std::vector<int>> store_groups;              // committed, not yet waited for

inline void tc_fence_proxy_async() {
  std::lock_guard<std::mutex> g(B_->mu);
  for (auto [a, n] : unfenced)
    for (unsigned i = 0; i < n; ++i) B_->cstate[a + i] &= (unsigned char)~2u;
  unfenced.clear();
  wrote_since_fence = false;
}
inline void tc_consumer_sync(int id, int count) {
  std::barrier<>* b;
  {
    std::lock_guard<std::mutex> g(B_->mu);
    auto& slot = B_->named[id];
    if (!slot) slot = std::make_unique<std::barrier<>>(count);
    b = slot.get();
  }
  if (count != 128) fail("a consumer barrier not over one warpgroup", id, count);
  b->arrive_and_wait();
}
static void shared_write(unsigned a, const void* src, unsigned n) {
  if (!wrote_since_fence && threadIdx.x % 128 != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  wrote_since_fence = true;
  std::lock_guard<std::mutex> g(B_->mu);
  for (const Store& s : B_->stores)
    if (!s.retired && a + n > s.addr && a < s.addr + 8192) fail("C buffer rewritten while a TMA store still reads it", a);
  std::memcpy(B_->smem + a, src, n);
  for (unsigned i = 0; i < n; ++i) B_->cstate[a + i] = 3;
  unfenced.push_back({a, n});
}
inline void tc_st_shared_v2(unsigned a, float x, float y) {
  if (a % 8) fail("misaligned 8-byte shared store", a);
  const float v[2] = {x, y};
  shared_write(a, v, 8);
}
// stmatrix .x4: the warp's lanes meet; lane l writes row l % 8 of matrix l / 8 at its own address, the row's four
// 32-bit pairs from lanes 4 (l % 8) .. + 3, register l / 8 of each
inline void tc_stmatrix_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
  const int t = (int)threadIdx.x, w = t / 32, l = t % 32;
  if (addr % 16) fail("misaligned stmatrix row", addr);
  B_->lanes[t] = Block::Lane{addr, {r0, r1, r2, r3}};
  B_->warps[w]->arrive_and_wait();
  unsigned row[4];
  for (int q = 0; q < 4; ++q) row[q] = B_->lanes[w * 32 + 4 * (l % 8) + q].r[l / 8];
  shared_write(addr, row, 16);
  B_->warps[w]->arrive_and_wait();  // the lanes' registers may be reused
}
static std::mutex g_values_mu;
static std::map<float, unsigned short> g_ids;
static std::vector<float> g_values;
static unsigned short intern(float v) {
  std::lock_guard<std::mutex> g(g_values_mu);
  auto it = g_ids.find(v);
  if (it != g_ids.end()) return it->second;
  if (g_values.size() >= 65535) fail("more C values than 16-bit ids");
  g_values.push_back(v);
  return g_ids[v] = (unsigned short)(g_values.size() - 1);
}
template <typename T> unsigned tc_pack_c2(float a, float b);
template <> unsigned tc_pack_c2<h16>(float a, float b) { return intern(a) | ((unsigned)intern(b) << 16); }
inline void tc_tma_store_2d(const tc_tmap* map, unsigned src, int c0, int c1) {
  std::lock_guard<std::mutex> g(B_->mu);
  if (map == nullptr || map->which != 2) fail("a TMA store through a map that is not C's");
  if (src % 1024) fail("a TMA store from a box not aligned for the 128-byte swizzle", src);
  for (unsigned i = 0; i < 8192; ++i) {
    if (!(B_->cstate[src + i] & 1)) fail("a TMA store of C-buffer bytes not written for this tile", src, i);
    if (B_->cstate[src + i] & 2) fail("a TMA store of C-buffer bytes written without fence.proxy.async", src, i);
  }
  const int per = 16 / map->esize;  // columns in a 16-byte chunk
  for (int r = 0; r < 64; ++r)
    for (int q = 0; q < 8; ++q)
      for (int e = 0; e < per; ++e) {
        const long long row = c1 + r, col = c0 + q * per + e;
        if (row < 0 || col < 0 || row >= map->nrows || col >= map->cols) continue;  // TMA writes nothing there
        const unsigned char* at = B_->smem + src + r * 128 + ((q ^ (r & 7)) << 4) + e * map->esize;
        float v;
        if (map->esize == 4) {
          std::memcpy(&v, at, 4);
        } else {
          unsigned short id;
          std::memcpy(&id, at, 2);
          std::lock_guard<std::mutex> gv(g_values_mu);
          if (id >= g_values.size()) fail("a 16-bit C element the conversion never made", row, col);
          v = g_values[id];
        }
        tc_store1<float>(g_c + row * g_ldc + col, v);
      }
  for (unsigned i = 0; i < 8192; ++i) B_->cstate[src + i] &= (unsigned char)~1u;  // this tile's bytes, stored
  B_->stores.push_back(Store{src});
  open_stores.push_back((int)B_->stores.size() - 1);
}
inline void tc_bulk_commit() {
  store_groups.push_back(open_stores);
  open_stores.clear();
}
static void retire(int n) {
  if ((int)store_groups.size() > n) std::this_thread::sleep_for(std::chrono::milliseconds(3));
  std::lock_guard<std::mutex> g(B_->mu);
  while ((int)store_groups.size() > n) {
    for (int i : store_groups.front()) B_->stores[i].retired = true;
    store_groups.pop_front();
  }
}
template <int N> inline void tc_bulk_wait_read() { retire(N); }
template <int N> inline void tc_bulk_wait() { retire(N); }

// clusters with TMA multicast (tc_mc<1>, tc_mc<2>: tests/mcast_host.cpp runs them): never called here
inline unsigned tc_cluster_ctarank() { fail("a cluster built-in in a kernel without clusters"); }
inline void tc_mc_cluster_sync() { fail("a cluster barrier in a kernel without clusters"); }
template <bool CLUSTER_SCOPE = false> inline void tc_mbar_arrive_remote(unsigned, unsigned) {
  fail("a remote arrival in a kernel without clusters");
}
inline void tc_tma_load_2d_mc(unsigned, const tc_tmap*, unsigned, int, int, unsigned short) {
  fail("a multicast load in a kernel without clusters");
}

#define TC_PERSISTENT_HOST
#include "tc_hopper.cuh"  // tc_wgmma_ktile, tc_wgmma_store_acc (the primitives are the shims above)
#include "tc_persistent.cuh"
#ifndef TC_HOST_REL  // how the consumers release a stage (TC_REL_*, tilecore.cuda.stage_release, D49)
#define TC_HOST_REL TC_REL_THREAD
#endif

// -- one case ----------------------------------------------------------------------------------------------------
static int g_uniform_k = 0;  // stream-K cases: every tile this many k tiles (else 1 to 4, by the tile)
static int k_tiles_of(long long t) { return g_uniform_k ? g_uniform_k : 1 + (int)((t * 7) % 4); }

template <int BM, int BN, int BK, int STAGES, int NC, bool KMAJOR, int EPI, bool PINGPONG = false, typename TOUT = float,
          int SK = TC_SK_OFF>
static void run_case(int M, int N, int grid, int launches, int uniform_k = 0, long long slots = 0) {
  g_uniform_k = uniform_k;
  constexpr int MR = PINGPONG ? BM / 64 : BM / (64 * NC), NTHREADS = 128 * (NC + 1), ESIZE = 2, KSTEP = 16, ATOM = 64;
  constexpr int A_BYTES = BM * BK * ESIZE, STAGE = A_BYTES + BK * BN * ESIZE;
  static_assert(MR >= 1 && BM == 64 * (PINGPONG ? 1 : NC) * MR, "tile");
  G = Geometry{BM, BN, BK, STAGE, A_BYTES, ESIZE, KSTEP, KMAJOR};
  const int TM = (M + BM - 1) / BM, TN = (N + BN - 1) / BN;
  const long long tiles = (long long)TM * TN, ldc = TN * BN + 2;  // a row stride wider than N: a gap to stay unwritten
  g_c_size = (long long)TM * BM * ldc;
  std::vector<float> c(g_c_size);
  std::vector<std::atomic<int>> writes(g_c_size);
  g_c = c.data();
  g_writes = writes.data();
  g_ldc = ldc;
  const tc_tmap tma{0, BM}, tmb{1, KMAJOR ? BN : BK};
#ifdef TC_HOST_PADDED_CMAP
  const tc_tmap tmc{2, 64, (long long)TN * BN, (long long)TM * BM, (int)sizeof(TOUT)};
#else
  const tc_tmap tmc{2, 64, N, M, (int)sizeof(TOUT)};
#endif
  auto tile_of = [&](long long t) {
    const long long tm = t / TN, tn = t % TN;
    return tc_gemm_tile{tm * BM * ldc + tn * BN, tm * BM, 0, KMAJOR ? tn * BN : 0, KMAJOR ? 0 : tn * BN,
                        k_tiles_of(t), M - tm * BM, N - tn * BN};
  };
  gridDim.x = (unsigned)grid;
  // stream-K's workspace (hopper.streamk_workspace_bytes): flags (zero, as the runtime allocates them and the kernel
  // leaves them), then a partial tile a slot, poisoned before every launch (an earlier launch's partials)
  const long long flag_bytes = (slots * NC * 4 + 255) / 256 * 256, ws_floats = (flag_bytes + slots * BM * BN * 4) / 4;
  std::vector<float> wsv(SK ? ws_floats + 4 : 0);
  unsigned char* ws = SK ? reinterpret_cast<unsigned char*>(wsv.data()) : nullptr;
  for (int launch = 0; launch < launches; ++launch) {
    std::fill(c.begin(), c.end(), -777.25f);
    for (auto& w : writes) w.store(0);
    if (SK) std::fill(wsv.begin() + flag_bytes / 4, wsv.end(), -12345.5f);
    // stream-K: every block at once (an owner waits for later blocks' partials); else one after another
    std::vector<Block*> blocks;
    std::vector<std::thread> threads;
    for (int b = 0; b < grid; ++b) {
      Block* blk = new Block(NTHREADS);
      blocks.push_back(blk);
      for (int t = 0; t < NTHREADS; ++t)
        threads.emplace_back([=, &tile_of]() {
          B_ = blk;
          threadIdx.x = (unsigned)t;
          blockIdx.x = (unsigned)b;
          tc_wgmma_persistent<NTHREADS, BM, BN, BK, STAGES, NC, MR, KMAJOR, 0, BK, KMAJOR ? 0 : BK, KMAJOR ? BK : 0,
                              EPI, KSTEP, PINGPONG, MMA>(blk->smem, reinterpret_cast<TOUT*>(g_c), tiles, ldc, tile_of,
                                                         &tma, &tmb, (EPI & TC_EPI_TMA) ? &tmc : nullptr,
                                                         tc_mc<0, TC_HOST_REL, 0, SK>{nullptr, ws, slots});
          if (!groups.empty() || !open_group.empty()) fail("a thread left with WGMMA groups pending", t);
          if (!open_stores.empty()) fail("a thread left with TMA stores never committed", t);
          if (!store_groups.empty()) fail("a thread left with TMA stores in flight", t);
        });
      if (!SK) {
        for (auto& th : threads) th.join();
        threads.clear();
      }
    }
    for (auto& th : threads) th.join();
    for (Block* blk : blocks) delete blk;
    for (long long f = 0; SK && f < slots * NC; ++f)
      if (reinterpret_cast<unsigned*>(ws)[f] != 0) fail("stream-K: a flag left set after the launch", f);
    for (int tm = 0; tm < TM; ++tm)
      for (int r = 0; r < BM; ++r)
        for (int col = 0; col < ldc; ++col) {
          const long long at = (long long)(tm * BM + r) * ldc + col;
          const int tn = col / BN, row = tm * BM + r;
          const bool valid = row < M && col < N;
          if (!valid) {
            if (writes[at] != 0 || c[at] != -777.25f) fail("an element outside C's valid rows and columns written", row, col);
            continue;
          }
          if (writes[at] != 1) fail("a valid element not written exactly once", row, col);
          float want = 0.0f;
          const int kt = k_tiles_of((long long)tm * TN + tn);
          for (int k = 0; k < kt * BK; k += KSTEP) want += value(k, tm * BM + r / 64 * 64, tn * BN);
          want += place(r % 64, col - tn * BN);
          if (c[at] != want) fail("a wrong sum in C (row, col)", row, col);
        }
  }
  (void)ATOM;
}

// `persistent_host schedule MODE TILES BLOCKS K ...`: stream-K's schedule as the kernel walks it (tc_sk_tiles,
// tc_sk_walk), per (mode, tiles, blocks, k): a line "S <stream-K tiles>", then per block "B <block>" and its units
// "<tile> <kb> <ke>" (ke -1: the whole tile), for tests/test_cuda_streamk.py
static int schedule(int argc, char** argv) {
  for (int a = 2; a + 3 < argc; a += 4) {
    const int mode = std::atoi(argv[a]);
    const long long tiles = std::atoll(argv[a + 1]), blocks = std::atoll(argv[a + 2]), k = std::atoll(argv[a + 3]);
    const long long sk = tc_sk_tiles(mode, tiles, blocks, k, blocks);
    std::printf("S %lld\n", sk);
    gridDim.x = (unsigned)blocks;
    for (long long b = 0; b < blocks; ++b) {
      std::printf("B %lld", b);
      tc_sk_walk<true> walk(tiles, blocks, b, sk, k, mode == TC_SK_STAGGER);
      long long tile;
      int kb, ke;
      while (walk.next(tile, kb, ke)) std::printf(" %lld %d %d", tile, kb, ke);
      std::printf("\n");
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "schedule") == 0) return schedule(argc, argv);
#ifndef TC_HOST_SK_ONLY  // (only the stream-K cases, for the mutants of its fixup)
  // (TC_HOST_TMA_ONLY / TC_HOST_NO_TMA: only the cases with / without the TMA store epilogue, for the mutants of one)
#ifndef TC_HOST_TMA_ONLY
  // two consumer warpgroups, B k-major, 2 stages, ragged M and N, 9 tiles on 4 blocks (not a multiple)
  run_case<128, 16, 64, 2, 2, true, 0>(3 * 128 - 5, 3 * 16 - 3, 4, 2);
  // the same at 3 stages, whole tiles, every epilogue check proven away
  run_case<128, 16, 64, 3, 2, true, TC_EPI_ROWS | TC_EPI_COLS | TC_EPI_PAIRS>(2 * 128, 4 * 16, 3, 1);
  // one consumer warpgroup with two 64-row slices (MR 2), B N-major, 3 stages, 7 tiles on 2 blocks
  run_case<128, 64, 64, 3, 1, false, 0>(7 * 128 - 64, 64, 2, 1);
  // more blocks than tiles: the extra blocks run none
  run_case<128, 16, 64, 2, 2, true, 0>(128, 2 * 16, 3, 1);
  // ping-pong: each consumer warpgroup whole tiles in turn; 9 ragged tiles on 4 blocks (3, 2, 2, 2 a block)
  run_case<128, 16, 64, 2, 2, true, 0, true>(3 * 128 - 5, 3 * 16 - 3, 4, 2);
  // ping-pong, B N-major, 3 stages, 7 tiles on 2 blocks (4 and 3: the warpgroups' turns end unevenly)
  run_case<128, 64, 64, 3, 2, false, 0, true>(7 * 128 - 64, 64, 2, 1);
#endif
#ifndef TC_HOST_NO_TMA
  // the epilogue through shared memory and TMA stores (float C: 32 columns a box): two consumer warpgroups, ragged
  // M and N, 9 tiles on 4 blocks, two launches
  run_case<128, 32, 64, 2, 2, true, TC_EPI_TMA>(3 * 128 - 5, 3 * 32 - 3, 4, 2);
  // one consumer warpgroup with two 64-row slices (MR 2) of two boxes each, B N-major, 3 stages, 7 tiles on 2 blocks
  run_case<128, 64, 64, 3, 1, false, TC_EPI_TMA>(7 * 128 - 64, 64 - 8, 2, 1);
  // ping-pong: each warpgroup stages whole tiles in its own part of the buffer; 9 ragged tiles on 4 blocks
  run_case<128, 32, 64, 2, 2, true, TC_EPI_TMA, true>(3 * 128 - 5, 3 * 32 - 3, 4, 2);
  // 16-bit C (64 columns a box, stmatrix): two consumer warpgroups ragged; MR 2 with two boxes a slice; ping-pong
  run_case<128, 64, 64, 2, 2, true, TC_EPI_TMA, false, h16>(3 * 128 - 5, 3 * 64 - 3, 4, 2);
  run_case<128, 128, 64, 3, 1, false, TC_EPI_TMA, false, h16>(5 * 128 - 64, 128 - 8, 2, 1);
  run_case<128, 64, 64, 2, 2, true, TC_EPI_TMA, true, h16>(3 * 128 - 5, 2 * 64 - 3, 4, 1);
  // the C buffer of half the tile's columns, staged and stored in two halves: float C two boxes wide, ragged; 16-bit
  // C with MR 2; ping-pong
  run_case<128, 64, 64, 2, 2, true, TC_EPI_TMA | TC_EPI_TMA_HALF>(3 * 128 - 5, 3 * 64 - 3, 4, 2);
  run_case<128, 128, 64, 3, 1, false, TC_EPI_TMA | TC_EPI_TMA_HALF, false, h16>(5 * 128 - 64, 2 * 128 - 8, 2, 1);
  run_case<128, 64, 64, 2, 2, true, TC_EPI_TMA | TC_EPI_TMA_HALF, true>(3 * 128 - 5, 2 * 64 - 3, 4, 1);
#endif
#endif
#ifndef TC_HOST_NO_SK
  // stream-K (tilecore.cuda.stream_k, D53): every block at once. 9 ragged tiles of 6 k tiles on 4 blocks (2.25 waves:
  // the last and one whole wave in even k ranges, then one data-parallel wave), the TMA store epilogue, two launches
  // (the flags left at zero, the slots reused); the same with the direct stores and 3 stages; the tail only (one
  // tile of 8 k tiles on 4 blocks: its owner waits for three); one consumer warpgroup (MR 2) of 16-bit C; 7 tiles
  // of 5 k tiles on 3 blocks; 13 tiles of 1 k tile on 4 blocks (no stream-K: fewer than two k iterations a block)
  run_case<128, 32, 64, 2, 2, true, TC_EPI_TMA, false, float, TC_SK_WAVE>(3 * 128 - 5, 3 * 32 - 3, 4, 2, 6, 4);
  run_case<128, 16, 64, 3, 2, true, 0, false, float, TC_SK_WAVE>(3 * 128 - 5, 3 * 16 - 3, 4, 1, 6, 4);
  run_case<128, 64, 64, 2, 2, false, TC_EPI_TMA, false, float, TC_SK_TAIL>(3 * 128 - 5, 3 * 64 - 3, 4, 1, 8, 4);
  run_case<128, 64, 64, 3, 1, false, TC_EPI_TMA, false, h16, TC_SK_WAVE>(5 * 128 - 64, 128 - 8, 3, 1, 5, 3);
  run_case<128, 32, 64, 2, 2, true, TC_EPI_TMA, false, float, TC_SK_WAVE>(7 * 128, 32, 3, 2, 5, 4);
  run_case<128, 32, 64, 2, 2, true, TC_EPI_TMA, false, float, TC_SK_WAVE>(13 * 128, 32, 4, 1, 1, 4);
  // staggered (each block's range between its whole tiles): 13 tiles of 8 k tiles on 4 blocks (3 whole tiles a block,
  // then one tile in pieces of 2 k tiles, placed after 3, 2, 1, 0 whole tiles); 7 tiles of 10 on 3 blocks, 16-bit C
  run_case<128, 32, 64, 2, 2, true, TC_EPI_TMA, false, float, TC_SK_STAGGER>(13 * 128, 32, 4, 2, 8, 4);
  run_case<128, 64, 64, 3, 1, false, TC_EPI_TMA, false, h16, TC_SK_STAGGER>(7 * 128 - 64, 64 - 8, 3, 1, 10, 3);
  // more blocks than the workspace's slots: no stream-K (whole tiles)
  run_case<128, 32, 64, 2, 2, true, TC_EPI_TMA, false, float, TC_SK_WAVE>(9 * 128, 32, 4, 1, 6, 3);
#endif
  std::printf("ok\n");
  return 0;
}
