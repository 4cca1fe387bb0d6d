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

[[noreturn]] static void fail(const char* what, long long a = 0, long long b = 0) {
  std::printf("FAIL: %s (%lld, %lld)\n", what, a, b);
  std::fflush(stdout);
  std::_Exit(1);
}

