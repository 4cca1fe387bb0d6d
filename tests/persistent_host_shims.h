// The CUDA built-ins and types tc_persistent.cuh needs on the host, shared by the harnesses that compile it as it
// ships (tests/persistent_host.cpp: one block; tests/mcast_host.cpp: the two blocks of a cluster), and their way of
// failing. Each harness then models the hardware (mbarriers, TMA, WGMMA) its cases need.
#pragma once
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

struct tc_tmap {
  int which;            // 0: A, 1: B, 2: C (TMA stores)
  int rows;             // the box's rows (of 128 bytes each)
  long long cols = 0;   // C: the tensor's columns (dims[0]) and rows (dims[1]), its element size
  long long nrows = 0;
  int esize = 4;
};
struct h16 {  // a 16-bit C element: an index into the values the harness's conversion has seen (tc_pack_c2<h16>)
  unsigned short id;
};
struct tc_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
static thread_local tc_dim3 threadIdx, blockIdx;
static tc_dim3 gridDim;
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define TC_EPI_ROWS 1
#define TC_EPI_COLS 2
#define TC_EPI_PAIRS 4

// the pipeline profile's built-ins (tc_persistent.cuh's PROF, D49): the SM's cycle counter and the global timer as
// the host's steady clock, the SM as 0, atomicAdd under a lock
inline long long tc_clock() {
  return (long long)std::chrono::steady_clock::now().time_since_epoch().count();
}
inline unsigned long long tc_globaltimer() { return (unsigned long long)tc_clock(); }
inline unsigned tc_smid() { return 0; }
static std::mutex g_atomic_mu;
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  std::lock_guard<std::mutex> g(g_atomic_mu);
  const unsigned long long old = *p;
  *p += v;
  return old;
}

[[noreturn]] static void fail(const char* what, long long a = 0, long long b = 0);

// stream-K's fixup (tc_persistent.cuh, tilecore.cuda.stream_k, D53): the partial tiles in host memory; the flags as
// atomics (release / acquire, as the PTX); a wait longer than 3 s is a deadlock. A thread other than the first of its
// warpgroup sleeps 300 us before each partial store, so a flag released before the warpgroup's stores shows (the
// owner reads the poison the harness left in the slot).
inline void tc_sk_st4(float* p, float a, float b, float c, float d) {
  if (reinterpret_cast<uintptr_t>(p) % 16) fail("a misaligned 16-byte partial store", 0, 0);
  if (threadIdx.x % 128 != 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
  p[0] = a, p[1] = b, p[2] = c, p[3] = d;
}
inline void tc_sk_ld4(const float* p, float& a, float& b, float& c, float& d) {
  if (reinterpret_cast<uintptr_t>(p) % 16) fail("a misaligned 16-byte partial load", 0, 0);
  a = p[0], b = p[1], c = p[2], d = p[3];
}
inline void tc_sk_flag_release(unsigned* f, unsigned v) { std::atomic_ref<unsigned>(*f).store(v, std::memory_order_release); }
inline void tc_sk_flag_wait(unsigned* f, unsigned v) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::atomic_ref<unsigned>(*f).load(std::memory_order_acquire) != v) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(3)) fail("deadlock: a stream-K flag never set", v, 0);
    std::this_thread::yield();
  }
}

[[noreturn]] static void fail(const char* what, long long a, long long b) {
  std::printf("FAIL: %s (%lld, %lld)\n", what, a, b);
  std::fflush(stdout);
  std::_Exit(1);
}

