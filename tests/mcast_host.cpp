// Host harness for the persistent Hopper GEMM in clusters of two blocks with TMA multicast
// (backends/cuda/tilecore_cuda/prelude/tc_persistent.cuh with tc_mc<1> / tc_mc<2>, tilecore.cuda.cluster_multicast,
// docs/decisions.md D44; tests/test_cuda_mcast.py).
//
// The header is compiled as it ships (or mutated by the test) with TC_PERSISTENT_HOST, every CUDA built-in it uses
// shimmed, as tests/persistent_host.cpp does for one block, but here the two blocks of a cluster run AT THE SAME TIME
// (one std::thread per CUDA thread of both), each with its own shared memory, mbarriers, tags and pending reads;
// the clusters of the grid run one after another. mbarriers keep the PTX rules: an arrival count and a transaction
// count per phase (the count may go below zero before the phase's expect_tx arrives: a partner's multicast may land
// first), the phase completing when both reach zero; a phase completing with more bytes landed than announced
// fails. A TMA load (plain or multicast) writes, into every destination block of its CTA mask, a tag per 128-byte
// row of its box (which tensor, its column, its row) at the same offset, and completes its bytes on the barrier at
// the same offset of each; it fails on a rank outside the cluster, on a block that has exited, on an address that is
// no (initialised) barrier, and on a stage a WGMMA of that block still reads. A remote arrival
// (tc_mbar_arrive_remote) likewise. The cluster barrier (tc_mc_cluster_sync) is a std::barrier over both blocks'
// threads; each thread must meet it exactly twice, and its remote arrivals must come between its two meetings (after
// the partner's init, before the partner may leave) and its multicasts after the first: the order the barriers
// give, checked whatever the timing. Rank 1 initialises its barriers 2 ms late (a partner that does
// not wait for the cluster barrier after init lands on uninitialised barriers) and its consumers sleep 1 ms before
// each tile's last WGMMA wait (a block that leaves without the exit barrier is gone when its partner's last release
// arrives): the same mistakes shown by their effect where the timing lets them. A WGMMA is asynchronous as on the GPU (per thread; the lanes of a warp leave wgmma.wait_group together, as
// .sync.aligned makes them); when a group is waited for, every row of its A and B reads is
// checked against the tags (one tensor, one k, consecutive rows), so a half box missing, stale or at the wrong
// offset shows, and it adds to the accumulators a value of the k, the rows and the columns (and a term of each
// element's place at a tile's first k), so C holds the exact expected sum only if every stage was the right one.
//
// Checks: C's valid elements each written once per launch with the exact expected sum, nothing outside them (a slot
// past the grid's tiles runs its partner's tile and must store nothing); no wait longer than 3 s (a deadlock: a
// missing remote release, a wrong CTA mask, too many bytes expected); every barrier back at the start of a phase when
// its block exits (an arrival count that does not match the arrivals drifts a phase per fill, whatever the timing).
// Cases: A shared ("1x2") and B shared ("2x1"), both B layouts, one and two consumer warpgroups, 2 and 3 stages,
// ping-pong, the direct and the TMA-store epilogue, odd tile counts in the paired dimension, more and fewer clusters
// than pairs, pairs of 1 to 4 k tiles.
// Prints "ok" or the first failure, and exits 0 or 1.
#include "persistent_host_shims.h"

// -- the running cluster ---------------------------------------------------------------------------------
struct Bar {
  unsigned count = 0, pending = 0, phase = 0;
  long long tx = 0;
};
struct Tag {
  int which = -1, c0 = 0, row = 0;
};
struct Geometry {
  int BM, BN, BK, STAGE, A_BYTES, ESIZE, KSTEP, STAGES;
  bool kmajor;
};
static Geometry G;
struct Store {
  unsigned addr;
  bool retired = false;
};
static std::mutex g_mu;  // every block's state below
static std::condition_variable g_cv;
struct Block {
  std::map<unsigned, Bar> bars;
  std::map<int, std::unique_ptr<std::barrier<>>> named;
  std::vector<Store> stores;
  std::vector<unsigned char> cstate = std::vector<unsigned char>(256 * 1024);
  std::map<unsigned, Tag> tags;  // by 128-byte row address
  std::map<int, int> reading;    // stage -> WGMMA reads pending
  std::atomic<int> running{0};   // threads still in the kernel
  std::atomic<bool> exited{false};
  alignas(1024) unsigned char smem[256 * 1024];
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  struct Lane {
    unsigned addr, r[4];
  };
  std::vector<Lane> lanes;
  explicit Block(int n) : running(n), lanes(n) {
    for (int w = 0; w < n / 32; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
  }
};
struct Cluster {
  Block* blocks[2];
  std::barrier<> sync;
  explicit Cluster(int threads) : sync(threads) {}
};
static thread_local Block* B_;
static thread_local Cluster* CL_;
static thread_local int RANK;
static thread_local int cluster_syncs;

inline void __syncthreads() { fail("__syncthreads in a cluster kernel (the cluster barrier orders both blocks)"); }
inline unsigned tc_smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - B_->smem); }
inline unsigned tc_cluster_ctarank() { return (unsigned)RANK; }
inline void tc_mc_cluster_sync() {
  ++cluster_syncs;
  CL_->sync.arrive_and_wait();
}

static void complete_if_done(Bar& b, unsigned bar) {
  if (b.pending == 0 && b.tx < 0) fail("more bytes landed than the barrier was told", bar, b.tx);
  if (b.pending == 0 && b.tx == 0) {
    ++b.phase;
    b.pending = b.count;
    g_cv.notify_all();
  }
}
inline void tc_mbar_init(unsigned bar, unsigned count) {
  if (RANK == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::lock_guard<std::mutex> g(g_mu);
  B_->bars[bar] = Bar{count, count, 0, 0};
}
inline void tc_mbar_init_fence() {}
static Bar& bar_of(Block* b, unsigned bar, const char* what) {
  if (b->exited) fail(what, bar, 1);
  auto it = b->bars.find(bar);
  if (it == b->bars.end()) fail(what, bar, 0);
  return it->second;
}
static void arrive_locked(Block* b, unsigned bar) {
  Bar& x = bar_of(b, bar, "arrival on an address that is no barrier (or of a block that exited)");
  if (x.pending == 0) fail("arrival on a barrier with no arrivals left in its phase", bar);
  --x.pending;
  complete_if_done(x, bar);
}
inline void tc_mbar_arrive(unsigned bar) {
  std::lock_guard<std::mutex> g(g_mu);
  arrive_locked(B_, bar);
}
template <bool CLUSTER_SCOPE = false> inline void tc_mbar_arrive_remote(unsigned bar, unsigned rank) {
  if (rank > 1) fail("a remote arrival on a rank outside the cluster", rank);
  // ordered by the cluster barriers, whatever the timing: after the one behind the barriers' init (the partner's
  // barrier exists) and before the one before exit (the partner has not left)
  if (cluster_syncs != 1) fail("a remote arrival not between the two cluster barriers", cluster_syncs);
  std::lock_guard<std::mutex> g(g_mu);
  arrive_locked(CL_->blocks[rank], bar);
}
inline void tc_mbar_expect_tx(unsigned bar, unsigned bytes) {
  std::lock_guard<std::mutex> g(g_mu);
  bar_of(B_, bar, "expect_tx on an address that is no barrier").tx += bytes;
  arrive_locked(B_, bar);
}
inline void tc_mbar_wait(unsigned bar, unsigned parity) {
  std::unique_lock<std::mutex> g(g_mu);
  Bar& x = bar_of(B_, bar, "wait on an address that is no barrier");
  if (!g_cv.wait_for(g, std::chrono::seconds(3), [&] { return (x.phase & 1u) != parity; }))
    fail("deadlock: a barrier's phase never completed", bar, parity);
}
inline void tc_tma_prefetch_map(const tc_tmap*) {}
static void land(Block* b, unsigned dst, const tc_tmap* map, unsigned bar, int c0, int c1) {  // under g_mu
  if (b->exited) fail("a TMA load into a block that exited", dst);
  const int stage = (int)(dst / G.STAGE);
  if (stage >= G.STAGES) fail("a TMA load outside the stages", dst);
  if (b->reading[stage] > 0) fail("a stage overwritten while a WGMMA still reads it", dst, stage);
  for (int r = 0; r < map->rows; ++r) b->tags[dst + 128 * r] = Tag{map->which, c0, c1 + r};
  Bar& x = bar_of(b, bar, "TMA completing on an address that is no barrier (not yet initialised?)");
  x.tx -= (long long)map->rows * 128;
  complete_if_done(x, bar);
}
inline void tc_tma_load_2d(unsigned dst, const tc_tmap* map, unsigned bar, int c0, int c1) {
  std::lock_guard<std::mutex> g(g_mu);
  land(B_, dst, map, bar, c0, c1);
}
inline void tc_tma_load_2d_mc(unsigned dst, const tc_tmap* map, unsigned bar, int c0, int c1, unsigned short mask) {
  if (mask == 0 || mask > 3) fail("a multicast to ranks outside the cluster", mask);
  if (cluster_syncs < 1) fail("a multicast before the cluster barrier behind the barriers' init", cluster_syncs);
  std::lock_guard<std::mutex> g(g_mu);
  for (int r = 0; r < 2; ++r)
    if (mask & (1 << r)) land(CL_->blocks[r], dst, map, bar, c0, c1);
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
  unsigned a, b;
};
static thread_local std::vector<Op> open_group;
static thread_local std::deque<std::vector<Op>> groups;

struct MMA {
  template <int N> static void run(float (&d)[N], unsigned long long da, unsigned long long db) {
    std::lock_guard<std::mutex> g(g_mu);
    if ((unsigned)da / G.STAGE != (unsigned)db / G.STAGE) fail("A and B of one WGMMA from different stages", da, db);
    ++B_->reading[(int)(da / G.STAGE)];
    open_group.push_back(Op{d, N, (unsigned)da, (unsigned)db});
  }
};
inline void tc_wgmma_commit() {
  groups.push_back(open_group);
  open_group.clear();
}
static float value(int k, int row, int n0) {
  return (float)(1 + k / G.KSTEP + 64 * ((row / 64) % 16) + 1024 * ((n0 / 8) % 16));
}
static float place(int r, int col) { return (float)(((r * 5 + col * 3) % 32) * (1 << 19)); }
static Tag row_tag(unsigned addr) {
  auto it = B_->tags.find(addr);
  if (it == B_->tags.end()) fail("a WGMMA read a row no TMA load wrote", addr);
  return it->second;
}
static void perform(const Op& op) {
  std::lock_guard<std::mutex> g(g_mu);
  // A: 64 rows of one box, from the descriptor's row on
  const unsigned arow = op.a - op.a % 128;
  const Tag ta = row_tag(arow);
  for (int r = 0; r < 64; ++r) {
    const Tag t = row_tag(arow + 128 * r);
    if (t.which != 0 || t.c0 != ta.c0 || t.row != ta.row + r) fail("a WGMMA's A rows are not one box's", arow, r);
  }
  const int k = ta.c0 + (int)(op.a % 128) / G.ESIZE, row = ta.row;
  int kb, n0;
  const unsigned brow = op.b - op.b % 128;
  const Tag tb = row_tag(brow);
  if (G.kmajor) {  // BN rows (n) of one box
    for (int r = 0; r < G.BN; ++r) {
      const Tag t = row_tag(brow + 128 * r);
      if (t.which != 1 || t.c0 != tb.c0 || t.row != tb.row + r) fail("a WGMMA's B rows are not one box's", brow, r);
    }
    kb = tb.c0 + (int)(op.b % 128) / G.ESIZE;
    n0 = tb.row;
  } else {  // KSTEP rows (k) of each of the BN / 64 boxes, BK rows apart
    for (int a = 0; a < G.BN / 64; ++a)
      for (int r = 0; r < G.KSTEP; ++r) {
        const Tag t = row_tag(brow + a * G.BK * 128 + 128 * r);
        if (t.which != 1 || t.c0 != tb.c0 + 64 * a || t.row != tb.row + r)
          fail("a WGMMA's B rows are not its boxes'", brow, a * 1000 + r);
      }
    kb = tb.row;
    n0 = tb.c0;
  }
  if (k != kb) fail("A and B of one WGMMA from different k", k, kb);
  const float v = value(k, row, n0);
  for (int j = 0; j < op.n; ++j) op.acc[j] += v;
  if (k == 0) {
    const int l = (int)(threadIdx.x % 32), w = (int)(threadIdx.x % 128 / 32);
    for (int j = 0; j < op.n; ++j)
      op.acc[j] += place(w * 16 + l / 4 + 8 * ((j / 2) % 2), 8 * (j / 4) + 2 * (l % 4) + j % 2);
  }
  --B_->reading[(int)(op.a / G.STAGE)];
}
template <int N> inline void tc_wgmma_wait() {
  if (N == 0 && RANK == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // rank 1 lags a tile's end
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

// -- the TMA store epilogue (TC_EPI_TMA), as tests/persistent_host.cpp shims it --------------------------------------
static thread_local std::vector<std::pair<unsigned, unsigned>> unfenced;
static thread_local std::vector<int> open_stores;
static thread_local std::deque<std::vector<int>> store_groups;

inline void tc_fence_proxy_async() {
  std::lock_guard<std::mutex> g(g_mu);
  for (auto [a, n] : unfenced)
    for (unsigned i = 0; i < n; ++i) B_->cstate[a + i] &= (unsigned char)~2u;
  unfenced.clear();
}
inline void tc_consumer_sync(int id, int count) {
  std::barrier<>* b;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto& slot = B_->named[id];
    if (!slot) slot = std::make_unique<std::barrier<>>(count);
    b = slot.get();
  }
  b->arrive_and_wait();
}
static void shared_write(unsigned a, const void* src, unsigned n) {
  std::lock_guard<std::mutex> g(g_mu);
  for (const Store& s : B_->stores)
    if (!s.retired && a + n > s.addr && a < s.addr + 8192) fail("C buffer rewritten while a TMA store still reads it", a);
  std::memcpy(B_->smem + a, src, n);
  for (unsigned i = 0; i < n; ++i) B_->cstate[a + i] = 3;
  unfenced.push_back({a, n});
}
inline void tc_st_shared_v2(unsigned a, float x, float y) {
  const float v[2] = {x, y};
  shared_write(a, v, 8);
}
inline void tc_stmatrix_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
  const int t = (int)threadIdx.x, w = t / 32, l = t % 32;
  B_->lanes[t] = Block::Lane{addr, {r0, r1, r2, r3}};
  B_->warps[w]->arrive_and_wait();
  unsigned row[4];
  for (int q = 0; q < 4; ++q) row[q] = B_->lanes[w * 32 + 4 * (l % 8) + q].r[l / 8];
  shared_write(addr, row, 16);
  B_->warps[w]->arrive_and_wait();
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
  std::lock_guard<std::mutex> g(g_mu);
  if (map == nullptr || map->which != 2) fail("a TMA store through a map that is not C's");
  for (unsigned i = 0; i < 8192; ++i) {
    if (!(B_->cstate[src + i] & 1)) fail("a TMA store of C-buffer bytes not written for this tile", src, i);
    if (B_->cstate[src + i] & 2) fail("a TMA store of C-buffer bytes written without fence.proxy.async", src, i);
  }
  const int per = 16 / map->esize;
  for (int r = 0; r < 64; ++r)
    for (int q = 0; q < 8; ++q)
      for (int e = 0; e < per; ++e) {
        const long long row = c1 + r, col = c0 + q * per + e;
        if (row < 0 || col < 0 || row >= map->nrows || col >= map->cols) continue;
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
  for (unsigned i = 0; i < 8192; ++i) B_->cstate[src + i] &= (unsigned char)~1u;
  B_->stores.push_back(Store{src});
  open_stores.push_back((int)B_->stores.size() - 1);
}
inline void tc_bulk_commit() {
  store_groups.push_back(open_stores);
  open_stores.clear();
}
static void retire(int n) {
  std::lock_guard<std::mutex> g(g_mu);
  while ((int)store_groups.size() > n) {
    for (int i : store_groups.front()) B_->stores[i].retired = true;
    store_groups.pop_front();
  }
}
template <int N> inline void tc_bulk_wait_read() { retire(N); }
template <int N> inline void tc_bulk_wait() { retire(N); }

#define TC_PERSISTENT_HOST
#include "tc_hopper.cuh"  // tc_wgmma_ktile, tc_wgmma_store_acc (the primitives are the shims above)
#include "tc_persistent.cuh"
#ifndef TC_HOST_REL  // how the consumers release a stage (TC_REL_*, tilecore.cuda.stage_release, D49): as shipped
#define TC_HOST_REL TC_REL_WARP
#endif
#ifndef TC_HOST_PROF  // 1: the pipeline profile on (D49), its counts checked after each cluster
#define TC_HOST_PROF 0
#endif

// -- one case: SHARE 1 (A, pairs side by side in N, "1x2") or 2 (B, in M, "2x1") ----------------------------------
static int k_tiles_of_pair(long long p) { return 1 + (int)((p * 7) % 4); }

template <int SHARE, int BM, int BN, int BK, int STAGES, int NC, bool KMAJOR, int EPI, bool PINGPONG = false,
          typename TOUT = float>
static void run_case(int M, int N, int clusters) {
  constexpr int MR = PINGPONG ? BM / 64 : BM / (64 * NC), NTHREADS = 128 * (NC + 1), ESIZE = 2, KSTEP = 16;
  constexpr int A_BYTES = BM * BK * ESIZE, STAGE = A_BYTES + BK * BN * ESIZE;
  G = Geometry{BM, BN, BK, STAGE, A_BYTES, ESIZE, KSTEP, STAGES, KMAJOR};
  const int TM = (M + BM - 1) / BM, TN = (N + BN - 1) / BN;
  const int PM = SHARE == 2 ? (TM + 1) / 2 : TM, PN = SHARE == 1 ? (TN + 1) / 2 : TN;  // the grid of pairs
  const long long slots = 2LL * PM * PN, ldc = TN * BN + 2;
  g_c_size = (long long)TM * BM * ldc;
  std::vector<float> c(g_c_size, -777.25f);
  std::vector<std::atomic<int>> writes(g_c_size);
  g_c = c.data();
  g_writes = writes.data();
  g_ldc = ldc;
  const int b_rows = KMAJOR ? BN : BK;
  const tc_tmap tma{0, SHARE == 1 ? BM / 2 : BM}, tmb{1, SHARE == 2 ? b_rows / 2 : b_rows};
  const tc_tmap tmc{2, 64, N, M, (int)sizeof(TOUT)};
  auto tile_at = [&](long long t, int& tm, int& tn, bool& dup) {  // as codegen.multicast_gemm's tile function
    const long long p = t / 2, r = t % 2, px = p % PN, py = p / PN;
    tm = (int)py;
    tn = (int)px;
    if (SHARE == 1) tn = (int)(2 * px + r); else tm = (int)(2 * py + r);
    dup = SHARE == 1 ? tn >= TN : tm >= TM;
    if (dup) (SHARE == 1 ? tn : tm) -= 1;
  };
  auto tile_of = [&](long long t) {
    int tm, tn;
    bool dup;
    tile_at(t, tm, tn, dup);
    return tc_gemm_tile{(long long)tm * BM * ldc + tn * BN, (long long)tm * BM, 0, KMAJOR ? (long long)tn * BN : 0,
                        KMAJOR ? 0 : (long long)tn * BN, k_tiles_of_pair(t / 2), dup ? 0 : M - (long long)tm * BM,
                        N - (long long)tn * BN};
  };
  gridDim.x = (unsigned)(2 * clusters);
  std::vector<unsigned long long> prof(2 * clusters * TC_PROF_WORDS);  // the profile's words (TC_HOST_PROF)
  unsigned long long* const words = prof.data();
  for (int cl = 0; cl < clusters; ++cl) {
    Cluster cluster(2 * NTHREADS);
    Block* blk[2] = {new Block(NTHREADS), new Block(NTHREADS)};
    cluster.blocks[0] = blk[0];
    cluster.blocks[1] = blk[1];
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      for (int t = 0; t < NTHREADS; ++t)
        threads.emplace_back([=, &tile_of, &cluster]() {
          threadIdx.x = (unsigned)t;
          blockIdx.x = (unsigned)(2 * cl + r);
          B_ = blk[r];
          CL_ = &cluster;
          RANK = r;
          cluster_syncs = 0;
          tc_wgmma_persistent<NTHREADS, BM, BN, BK, STAGES, NC, MR, KMAJOR, 0, BK, KMAJOR ? 0 : BK, KMAJOR ? BK : 0,
                              EPI, KSTEP, PINGPONG, MMA>(blk[r]->smem, reinterpret_cast<TOUT*>(g_c), slots, ldc,
                                                         tile_of, &tma, &tmb, (EPI & TC_EPI_TMA) ? &tmc : nullptr,
                                                         tc_mc<SHARE, TC_HOST_REL, TC_HOST_PROF>{words});
          if (!groups.empty() || !open_group.empty()) fail("a thread left with WGMMA groups pending", t);
          if (!open_stores.empty() || !store_groups.empty()) fail("a thread left with TMA stores in flight", t);
          if (cluster_syncs != 2) fail("a thread met the cluster barrier other than twice", t, cluster_syncs);
          std::lock_guard<std::mutex> g(g_mu);
          if (--blk[r]->running == 0) blk[r]->exited = true;  // the block has left: its shared memory is gone
        });
    for (auto& th : threads) th.join();
    for (Block* b : blk)  // every arrival and byte a phase expects came, and no more: no barrier left mid-phase
      for (const auto& [addr, x] : b->bars)
        if (x.pending != x.count || x.tx != 0) fail("a barrier left mid-phase when its block exited", addr, x.pending);
    delete blk[0];
    delete blk[1];
  }
  if (TC_HOST_PROF)  // each block's profile: its k steps (producer and consumer), its rank, waits within the totals
    for (int b = 0; b < 2 * clusters; ++b) {
      const unsigned long long* w = prof.data() + b * TC_PROF_WORDS;
      unsigned long long steps = 0;
      for (long long s = b; s < slots; s += 2 * clusters) steps += k_tiles_of_pair(s / 2);
      if (w[4] != steps || w[8] != steps) fail("the profile's k steps of a block (producer, consumer)", w[4], w[8]);
      if (w[13] != (unsigned long long)(b % 2)) fail("the profile's cluster rank of a block", b, w[13]);
      if (w[0] == 0 || w[1] < w[0] || (steps && w[9] < w[0])) fail("the profile's start and end times of a block", b);
      if (w[3] > w[2] || w[6] > w[5] || w[7] > w[5]) fail("the profile's waits longer than the loops", b);
    }
  for (int tm = 0; tm < TM; ++tm)
    for (int r = 0; r < BM; ++r)
      for (int col = 0; col < ldc; ++col) {
        const long long at = (long long)(tm * BM + r) * ldc + col;
        const int tn = col / BN, row = tm * BM + r;
        if (!(row < M && col < N)) {
          if (writes[at] != 0 || c[at] != -777.25f) fail("an element outside C's valid rows and columns written", row, col);
          continue;
        }
        if (writes[at] != 1) fail("a valid element not written exactly once", row, col);
        const long long pair = SHARE == 1 ? (long long)tm * PN + tn / 2 : (long long)(tm / 2) * PN + tn;
        float want = 0.0f;
        for (int k = 0; k < k_tiles_of_pair(pair) * BK; k += KSTEP) want += value(k, tm * BM + r / 64 * 64, tn * BN);
        want += place(r % 64, col - tn * BN);
        if (c[at] != want) fail("a wrong sum in C (row, col)", row, col);
      }
}

int main() {
  // A shared, B k-major, two consumer warpgroups, 2 stages, ragged M and N, 3 tiles in N (odd): 3 x 2 pairs on 2
  // clusters
  run_case<1, 128, 16, 64, 2, 2, true, 0>(3 * 128 - 5, 3 * 16 - 3, 2);
  // B shared, B N-major (64 columns a box), 3 stages, 3 tiles in M (odd), every check proven (the duplicate slot
  // must skip its stores by itself), 2 x 1 pairs on 1 cluster
  run_case<2, 128, 64, 64, 3, 2, false, TC_EPI_ROWS | TC_EPI_COLS | TC_EPI_PAIRS>(3 * 128, 64, 1);
  // B shared, B k-major, one consumer warpgroup with two 64-row slices, 3 stages, more clusters than pairs
#ifndef TC_HOST_FAST
  run_case<2, 128, 32, 64, 3, 1, true, 0>(2 * 128 - 64, 2 * 32 - 8, 3);
  // ping-pong (each consumer warpgroup whole tiles in turn), A shared, 5 tiles in N
  run_case<1, 128, 16, 64, 2, 2, true, 0, true>(2 * 128 - 5, 5 * 16 - 3, 2);
  // the epilogue through shared memory and TMA stores, 16-bit C, B shared, 3 tiles in M
  run_case<2, 128, 64, 64, 2, 2, true, TC_EPI_TMA, false, h16>(3 * 128 - 5, 2 * 64 - 3, 1);
#endif
  std::printf("ok\n");
  return 0;
}
