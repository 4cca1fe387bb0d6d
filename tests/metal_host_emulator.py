"""Run generated MSL on the host: the kernel compiled as C++ against an executing stand-in of the Metal
standard library, one std::thread per Metal thread, one threadgroup at a time.

No Metal device exists off macOS; this is a test of the generated code, not an execution mode. The kernel
text is the one the Metal backend generated; only kernel-scope ``threadgroup`` declarations become
function statics (one threadgroup runs at a time). The library parts are written from the MSL
specification's description of each function:

- ``threadgroup_barrier``: a ``std::barrier`` over the threadgroup;
- SIMD-group functions over simdgroups of 32 threads (thread ``t`` is lane ``t % 32`` of simdgroup
  ``t / 32``): ``simd_shuffle_xor`` (every lane deposits its value, a simdgroup barrier, each reads lane
  ``lane ^ mask``), ``simd_shuffle`` (reads the lane it names), ``simd_sum`` / ``simd_max`` / ``simd_min`` / ``simd_any`` over the lanes in order;
- ``simdgroup_matrix<T, 8, 8>``: every thread holds the whole 8x8 tile (its placement is opaque, so any
  placement is a faithful emulation of the values); ``simdgroup_load`` / ``simdgroup_store`` with
  ``elements_per_row`` and ``transpose_matrix``, ``simdgroup_multiply_accumulate(d, a, b, c)`` as
  ``d = a b + c`` in float;
- atomics: relaxed read-modify-writes under one lock.
"""
from __future__ import annotations

import re
import shutil

import numpy as np

from cuda_host_emulator import build_and_run

SHIM = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#define device
#define constant
#define threadgroup
#ifndef INFINITY
#define INFINITY __builtin_huge_valf()
#endif
#ifndef NAN
#define NAN __builtin_nanf("")
#endif
namespace metal {
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;
typedef __bf16 bfloat;
struct ulong2 { ulong x = 0, y = 0; ulong2(ulong a = 0) : x(a), y(a) {} ulong2(ulong a, ulong b) : x(a), y(b) {} };
struct uint3 { uint x, y, z; };
#define thread
#define TC_MATH(NS)                                                                                 \
  namespace NS {                                                                                   \
  inline float exp(float x) { return std::exp(x); } inline float exp2(float x) { return std::exp2(x); } \
  inline float exp10(float x) { return std::pow(10.0f, x); } inline float log(float x) { return std::log(x); } \
  inline float log2(float x) { return std::log2(x); } inline float log10(float x) { return std::log10(x); } \
  inline float sqrt(float x) { return std::sqrt(x); } inline float rsqrt(float x) { return 1.0f / std::sqrt(x); } \
  inline float tanh(float x) { return std::tanh(x); } inline float sin(float x) { return std::sin(x); } \
  inline float cos(float x) { return std::cos(x); } inline float tan(float x) { return std::tan(x); } \
  inline float pow(float x, float y) { return std::pow(x, y); } inline float divide(float x, float y) { return x / y; } \
  }
TC_MATH(precise)
TC_MATH(fast)
using std::floor; using std::ceil; using std::rint; using std::trunc; using std::fabs; using std::fma;
template <typename T, typename U> T as_type(U x) { T r; static_assert(sizeof(T) == sizeof(U)); std::memcpy(&r, &x, sizeof r); return r; }

enum class mem_flags : int { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }
static std::barrier<>* tc_tg_barrier;
inline void threadgroup_barrier(mem_flags) { tc_tg_barrier->arrive_and_wait(); }

/* simdgroups of 32 lanes */
struct tc_simdgroup {
  std::barrier<> bar;
  int lanes;
  alignas(16) unsigned char slot[32][16];
  explicit tc_simdgroup(int n) : bar(n), lanes(n) {}
};
thread_local tc_simdgroup* tc_sg;
thread_local int tc_lane;
template <typename T> void tc_deposit(T v) { std::memcpy(tc_sg->slot[tc_lane], &v, sizeof(T)); tc_sg->bar.arrive_and_wait(); }
template <typename T> T tc_read(int lane) { T r; std::memcpy(&r, tc_sg->slot[lane], sizeof(T)); return r; }
template <typename T> T simd_shuffle_xor(T v, ushort mask) {
  tc_deposit(v);
  int from = tc_lane ^ mask;
  if (from >= tc_sg->lanes) { std::fprintf(stderr, "emulator: shuffle from an inactive lane\n"); std::abort(); }
  T r = tc_read<T>(from);
  tc_sg->bar.arrive_and_wait();
  return r;
}
template <typename T> T simd_shuffle(T v, ushort lane) {
  tc_deposit(v);
  if (lane >= tc_sg->lanes) { std::fprintf(stderr, "emulator: shuffle from an inactive lane\n"); std::abort(); }
  T r = tc_read<T>(lane);
  tc_sg->bar.arrive_and_wait();
  return r;
}
template <typename T, typename F> T tc_simd_fold(T v, F f) {
  tc_deposit(v);
  T r = tc_read<T>(0);
  for (int l = 1; l < tc_sg->lanes; ++l) r = f(r, tc_read<T>(l));
  tc_sg->bar.arrive_and_wait();
  return r;
}
template <typename T> T simd_sum(T v) { return tc_simd_fold(v, [](T a, T b) { return a + b; }); }
template <typename T> T simd_max(T v) { return tc_simd_fold(v, [](T a, T b) { return std::fmax(a, b); }); }
template <typename T> T simd_min(T v) { return tc_simd_fold(v, [](T a, T b) { return std::fmin(a, b); }); }
inline bool simd_any(bool v) { return tc_simd_fold((int)v, [](int a, int b) { return a | b; }) != 0; }

/* simdgroup matrices: every lane holds the whole tile (the placement is opaque) */
template <typename T, int Cols, int Rows> struct simdgroup_matrix { T e[Rows][Cols]; };
template <typename T, int Cols, int Rows = Cols> simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T v) {
  simdgroup_matrix<T, Cols, Rows> m;
  for (int r = 0; r < Rows; ++r) for (int c = 0; c < Cols; ++c) m.e[r][c] = v;
  return m;
}
template <typename T, int Cols, int Rows>
void simdgroup_load(simdgroup_matrix<T, Cols, Rows>& d, const T* src, ulong epr = Cols, ulong2 origin = 0, bool tr = false) {
  src += origin.y * epr + origin.x;
  for (int r = 0; r < Rows; ++r) for (int c = 0; c < Cols; ++c) d.e[r][c] = tr ? src[c * epr + r] : src[r * epr + c];
}
template <typename T, int Cols, int Rows>
void simdgroup_store(simdgroup_matrix<T, Cols, Rows> a, T* dst, ulong epr = Cols, ulong2 origin = 0, bool tr = false) {
  dst += origin.y * epr + origin.x;
  tc_sg->bar.arrive_and_wait();  /* every lane has its tile before any writes (a store may overwrite an operand) */
  if (tc_lane == 0)
    for (int r = 0; r < Rows; ++r) for (int c = 0; c < Cols; ++c) (tr ? dst[c * epr + r] : dst[r * epr + c]) = a.e[r][c];
  tc_sg->bar.arrive_and_wait();
}
template <typename TD, typename TA, typename TB, typename TC, int M, int N, int K>
void simdgroup_multiply_accumulate(simdgroup_matrix<TD, N, M>& d, const simdgroup_matrix<TA, K, M>& a,
                                   const simdgroup_matrix<TB, N, K>& b, const simdgroup_matrix<TC, N, M>& c) {
  simdgroup_matrix<TD, N, M> out;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float acc = (float)c.e[i][j];
      for (int k = 0; k < K; ++k) acc += (float)a.e[i][k] * (float)b.e[k][j];
      out.e[i][j] = (TD)acc;
    }
  d = out;
}

/* atomics: relaxed read-modify-writes under one lock */
enum memory_order { memory_order_relaxed };
template <typename T> struct _atomic { T value; };
typedef _atomic<int> atomic_int;
typedef _atomic<uint> atomic_uint;
typedef _atomic<float> atomic_float;
static std::mutex tc_atomic_lock;
template <typename T> T atomic_load_explicit(volatile _atomic<T>* p, memory_order) {
  std::lock_guard<std::mutex> g(tc_atomic_lock); return ((_atomic<T>*)p)->value;
}
#define TC_RMW(NAME, EXPR)                                                                          \
  template <typename T> T NAME(volatile _atomic<T>* p, T v, memory_order) {                        \
    std::lock_guard<std::mutex> g(tc_atomic_lock);                                                 \
    T& x = ((_atomic<T>*)p)->value; T old = x; x = EXPR; return old;                               \
  }
TC_RMW(atomic_fetch_add_explicit, old + v)
TC_RMW(atomic_fetch_max_explicit, std::max(old, v))
TC_RMW(atomic_fetch_min_explicit, std::min(old, v))
template <typename T> bool atomic_compare_exchange_weak_explicit(volatile _atomic<T>* p, T* expected, T desired,
                                                                 memory_order, memory_order) {
  std::lock_guard<std::mutex> g(tc_atomic_lock);
  T& x = ((_atomic<T>*)p)->value;
  if (std::memcmp(&x, expected, sizeof(T)) == 0) { x = desired; return true; }
  *expected = x;
  return false;
}
}  // namespace metal
"""

RUNNER = r"""
#undef thread
int main(int argc, char** argv) {
  const int gx = GRID_X, gy = GRID_Y, gz = GRID_Z, nthreads = THREADS;
LOAD_BUFFERS
  static int status[18] = {0};
  for (int bz = 0; bz < gz; ++bz)
    for (int by = 0; by < gy; ++by)
      for (int bx = 0; bx < gx; ++bx) {
        std::barrier<> tg(nthreads);
        tc_tg_barrier = &tg;
        std::vector<std::unique_ptr<tc_simdgroup>> sgs;
        for (int g = 0; g * 32 < nthreads; ++g) sgs.push_back(std::make_unique<tc_simdgroup>(std::min(32, nthreads - 32 * g)));
        std::vector<std::thread> ts;
        for (int t = 0; t < nthreads; ++t)
          ts.emplace_back([&, t] {
            tc_sg = sgs[t / 32].get(); tc_lane = t % 32;
            CALL;
          });
        for (auto& t : ts) t.join();
      }
STORE_BUFFERS
  if (status[0]) std::fprintf(stderr, "device assertion %d\n", status[0]);
  return status[0];
}
"""

_TG_DECL = re.compile(r"^(\s+)threadgroup (\w+ \w+(?:\[\d+\])?;)", re.M)
_CTYPES = {"float16": "half", "bfloat16": "bfloat", "float32": "float", "bool": "uchar", "int8": "char",
           "uint8": "uchar", "int16": "short", "uint16": "ushort", "int32": "int", "uint32": "uint", "int64": "long",
           "uint64": "ulong"}


def compiler() -> str | None:
    return shutil.which("clang++-22") or shutil.which("clang++")


def host_source(code: str) -> str:
    """The generated MSL as host C++: the shim instead of <metal_stdlib>, threadgroup variables static."""
    code = code.replace("#include <metal_stdlib>\n", "")
    return SHIM + _TG_DECL.sub(r"\1static \2", code)


def run_on_host(kernel, arrays: list, ints: tuple = (), floats: tuple = (), mutate=None) -> list:
    """Run compiled tilecore kernel ``kernel`` (a metal target) on ``arrays`` (numpy, the tensor parameters
    in order; ``ints`` and ``floats`` the ABI scalars); returns the arrays after the run. ``mutate``
    (text -> text) edits the MSL first (the tests' planted bugs)."""
    if compiler() is None:
        raise RuntimeError("no clang++ here for the host emulation: apt-get install clang-22 (scripts/setup.sh does)")
    src = kernel.source
    env = {"ints": list(ints), "max": max, "min": min}
    grid = [eval(g, env) for g in src.meta["grid"]]  # noqa: S307 - our own text
    # the kernel's own element types (a bfloat16 tensor travels as its uint16 bits)
    args = [f"({_CTYPES[b['dtype']]}*)ptrs[{k}]" for k, b in enumerate(src.meta["buffers"])]
    args += [f"tc_int{k}" for k in range(len(ints))] + [f"tc_flt{k}" for k in range(len(floats))]
    decls = " ".join([f"static long tc_int{k} = {int(v)}L;" for k, v in enumerate(ints)]
                     + [f"static float tc_flt{k} = {float(v)!r}f;" for k, v in enumerate(floats)])
    call = f"{decls} tc_kernel({', '.join(args + ['status', 'uint3{(uint)bx, (uint)by, (uint)bz}', '(uint)t'])})"
    code = mutate(src.code) if mutate else src.code
    text = host_source(code) + RUNNER.replace("GRID_X", str(grid[0])).replace("GRID_Y", str(grid[1])).replace(
        "GRID_Z", str(grid[2])).replace("THREADS", str(src.meta["threads"])).replace("CALL", call)
    return build_and_run(text, [np.ascontiguousarray(a) for a in arrays], [compiler(), "-x", "c++"], "tc-metal-emul-")
