"""Run a generated MUSA kernel on the host, one block at a time, one std::thread per thread.

No MUSA device exists here; this checks what the stub check cannot: that the code tilecore-musa writes
computes the right numbers **at the hardware's warp width** (128 lanes on mp_22, 32 on mp_31, from the
arch, not from the profile the kernel was compiled with: code that assumes another width exchanges with
the wrong lanes here as on the GPU). The kernel source is the generated one; the MUSA built-ins are
host code, and the vendor instructions are emulated from their descriptions in MooreThreads/tilelang_musa
(written here as the fork's layout functions compose, not from tilecore_musa/units.py):

- ``__shfl_xor_sync(mask, v, lane_mask, width)``: every lane of the warp deposits its value, a warp
  barrier, each reads lane ``(lane & ~(width - 1)) | ((lane ^ lane_mask) & (width - 1))``; ``__shfl_sync(mask,
  v, src, width)`` reads lane ``(lane & ~(width - 1)) | (src & (width - 1))``;
- ``__musa_fmma_m32n32k16_mma`` (QY2, TN, one 128-lane warp; ``makeGemmQY2Fragment{A,B,C}``): lane ``l``,
  ``t = l % 32``, ``q = l / 32``: A register ``r`` is row ``16 (r / 2) + 8 (q / 2) + t / 4``, k ``8 (q % 2)
  + 2 (t % 4) + r % 2``; B register ``r`` is k ``8 (q / 2) + 2 (t % 4) + r % 2``, column ``16 (r / 2) +
  8 (q % 2) + t / 4``; C register ``r`` is row ``8 (r / 2) + 4 (q / 2) + t / 8``, column ``16 (r % 2) +
  8 (q % 2) + t % 8``; 16-bit operands packed two to a 32-bit register, the lower half first;
- TME loads (``tc_tme_load_<r>d``) copy the box at the coordinates (dimension 0 innermost), zero outside
  the tensor, and land only when their ASYNC barrier completes: the issuing thread must have added the
  box's bytes (``__musa_async_add_trans``) and arrived (``__musa_async_arrive``) as many times as the
  barrier was initialised for; ``__musa_async_wait(id, phase)`` blocks until that phase completed, and the
  data becomes visible only through that wait (a kernel that reads the tile without waiting reads stale
  data here); a barrier never initialised, never completed or over-filled aborts the run;
- ``tc_async_copy`` / ``tc_async_wait`` (``__musa_memcpy_g2s``): queued per thread, landed at the wait.

SQMMA is not emulated (its operand descriptor encoding is not known here): a kernel that reaches
``tc_sqmma_gemm`` aborts. ``__shared__`` arrays become function statics (one block runs at a time).
"""
from __future__ import annotations

import re
import shutil

import numpy as np

from cuda_host_emulator import HOST_ATOMICS, build_and_run, lane_exchange, vector_shim

SHIM = r"""
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <algorithm>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __shared__ static
#define __forceinline__ inline
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
typedef _Float16 __half;
typedef __bf16 __mt_bfloat16;
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half_rn(float f) { return (__half)f; }
inline float __bfloat162float(__mt_bfloat16 h) { return (float)h; }
inline __mt_bfloat16 __float2bfloat16_rn(float f) { return (__mt_bfloat16)f; }
template <typename To, typename From> inline To tc_bits(From x) { To t; std::memcpy(&t, &x, sizeof t); return t; }
inline float __int_as_float(int x) { return tc_bits<float>(x); }
inline float __uint_as_float(unsigned x) { return tc_bits<float>(x); }
inline unsigned __float_as_uint(float x) { return tc_bits<unsigned>(x); }
inline double __longlong_as_double(long long x) { return tc_bits<double>(x); }
inline long long __double_as_longlong(double x) { return tc_bits<long long>(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
struct tc_dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local tc_dim3 threadIdx, blockIdx;
static std::barrier<>* tc_block_barrier;
static void tc_die(const char* what) { std::fprintf(stderr, "emulator: %s\n", what); std::fflush(stderr); std::abort(); }
inline void __syncthreads() { tc_block_barrier->arrive_and_wait(); }
static int tc_any_flag;
inline int __syncthreads_or(int pred) {
  __syncthreads();
  if (threadIdx.x == 0) tc_any_flag = 0;
  __syncthreads();
  if (pred) __atomic_store_n(&tc_any_flag, 1, __ATOMIC_RELAXED);
  __syncthreads();
  int r = __atomic_load_n(&tc_any_flag, __ATOMIC_RELAXED);
  __syncthreads();
  return r;
}

/* ---- warps of WARP lanes (the hardware's width) ---- */
struct tc_warp {
  explicit tc_warp(int n) : bar(n), n(n) {}
  std::barrier<> bar;
  int n;
  unsigned long long x[128];
  float a[128][4], b[128][4];
};
thread_local tc_warp* tc_w;
thread_local int tc_lane;
""" + lane_exchange("WARP", "warp", "sizeof(T) <= 8") + r"""
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask, int width) {
  if (mask >= width) tc_die("lane exchange wider than the warp");
  return tc_exchange(v, width, tc_lane ^ mask);
}
template <typename T> inline T __shfl_sync(unsigned, T v, int src, int width) { return tc_exchange(v, width, src); }

""" + HOST_ATOMICS + r"""
/* QY2 32x32x16 MMA, one warp of 128 lanes (makeGemmQY2Fragment{A,B,C}, see the module docstring) */
inline void __musa_fmma_m32n32k16_mma(int* d, const int* a, const int* b, const int* c, int, int, int, int, int, int) {
  if (WARP != 128 || tc_w->n != 128) tc_die("the 32x32x16 MMA needs a whole warp of 128 lanes");
  const int l = tc_lane, t = l % 32, q = l / 32;
  __half ah[4], bh[4];
  std::memcpy(ah, a, sizeof ah);
  std::memcpy(bh, b, sizeof bh);
  for (int r = 0; r < 4; ++r) { tc_w->a[l][r] = (float)ah[r]; tc_w->b[l][r] = (float)bh[r]; }
  tc_w->bar.arrive_and_wait();
  static thread_local float A[32][16], B[16][32];
  for (int ll = 0; ll < 128; ++ll) {
    const int tt = ll % 32, qq = ll / 32;
    for (int r = 0; r < 4; ++r) {
      A[16 * (r / 2) + 8 * (qq / 2) + tt / 4][8 * (qq % 2) + 2 * (tt % 4) + r % 2] = tc_w->a[ll][r];
      B[8 * (qq / 2) + 2 * (tt % 4) + r % 2][16 * (r / 2) + 8 * (qq % 2) + tt / 4] = tc_w->b[ll][r];
    }
  }
  float out[8];
  for (int r = 0; r < 8; ++r) {
    const int i = 8 * (r / 2) + 4 * (q / 2) + t / 8, j = 16 * (r % 2) + 8 * (q % 2) + t % 8;
    double acc = tc_bits<float>(c[r]);
    for (int k = 0; k < 16; ++k) acc += (double)A[i][k] * (double)B[k][j];
    out[r] = (float)acc;
  }
  tc_w->bar.arrive_and_wait();
  for (int r = 0; r < 8; ++r) d[r] = tc_bits<int>(out[r]);
}

/* ---- PH1: TME on ASYNC barriers ---- */
struct MUtensorDescriptor { const unsigned char* base; int rank, elem; long long shape[5]; };  /* shape: dim 0 innermost */
struct tc_async_bar {
  std::mutex m;
  int inited = 0, expected = 0, arrived = 0, phase = 0;
  long long trans = 0, landed = 0;
  std::vector<std::pair<void*, std::vector<unsigned char>>> queued, ready;
};
static tc_async_bar tc_bars[64];
static int tc_bar_record = -1;
inline void __musa_async_bar_record(unsigned n) { tc_bar_record = (int)n; }
inline void __musa_async_init_arrival(unsigned id, unsigned warps, unsigned phase) {
  if ((int)id > tc_bar_record) tc_die("ASYNC barrier id above __musa_async_bar_record");
  tc_async_bar& b = tc_bars[id];
  std::lock_guard<std::mutex> g(b.m);
  b.inited = 1; b.expected = (int)warps; b.arrived = 0; b.phase = (int)phase; b.trans = b.landed = 0; b.queued.clear();
}
static void tc_bar_try_complete(tc_async_bar& b) {
  if (b.arrived == b.expected && b.landed == b.trans) {
    for (auto& q : b.queued) b.ready.push_back(std::move(q));  /* visible to the threads that wait */
    b.queued.clear();
    b.arrived = 0; b.trans = b.landed = 0; b.phase ^= 1;
  }
}
inline void __musa_async_add_trans(unsigned id, unsigned bytes) {
  tc_async_bar& b = tc_bars[id];
  std::lock_guard<std::mutex> g(b.m);
  if (!b.inited) tc_die("add_trans on an ASYNC barrier that was never initialised");
  b.trans += bytes;
}
inline unsigned __musa_async_arrive(unsigned id) {
  tc_async_bar& b = tc_bars[id];
  std::lock_guard<std::mutex> g(b.m);
  if (!b.inited) tc_die("arrive on an ASYNC barrier that was never initialised");
  if (++b.arrived > b.expected) tc_die("more arrivals than the ASYNC barrier was initialised for");
  const unsigned ph = (unsigned)b.phase;
  tc_bar_try_complete(b);
  return ph;
}
inline void __musa_async_wait(unsigned id, int phase) {
  tc_async_bar& b = tc_bars[id];
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> g(b.m);
      if (!b.inited) tc_die("wait on an ASYNC barrier that was never initialised");
      if (b.phase != phase) {
        for (auto& q : b.ready) std::memcpy(q.first, q.second.data(), q.second.size());
        b.ready.clear();
        return;
      }
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(20)) tc_die("an ASYNC barrier wait never completes");
    std::this_thread::yield();
  }
}
static void tc_tme_load(const MUtensorDescriptor& d, unsigned bar, void* smem, const int* crd, const int* dim, int rank) {
  if (rank != d.rank) tc_die("TME load rank differs from its descriptor");
  long long n = 1;
  for (int k = 0; k < rank; ++k) n *= dim[k];
  std::vector<unsigned char> box((size_t)(n * d.elem), 0);
  for (long long e = 0; e < n; ++e) {
    long long rest = e, off = 0, stride = 1;
    bool in = true;
    for (int k = 0; k < rank; ++k) {
      const long long x = crd[k] + rest % dim[k];
      rest /= dim[k];
      if (x < 0 || x >= d.shape[k]) in = false;
      off += x * stride;
      stride *= d.shape[k];
    }
    if (in) std::memcpy(&box[(size_t)(e * d.elem)], d.base + off * d.elem, d.elem);
  }
  tc_async_bar& b = tc_bars[bar];
  std::lock_guard<std::mutex> g(b.m);
  if (!b.inited) tc_die("TME load on an ASYNC barrier that was never initialised");
  b.landed += (long long)box.size();
  if (b.landed > b.trans) tc_die("a TME load brings more bytes than its barrier expects");
  b.queued.emplace_back(smem, std::move(box));
  tc_bar_try_complete(b);
}
inline void tc_tme_load_1d(const MUtensorDescriptor& d, unsigned bar, void* s, int c0, int d0) {
  int c[1] = {c0}, x[1] = {d0}; tc_tme_load(d, bar, s, c, x, 1);
}
inline void tc_tme_load_2d(const MUtensorDescriptor& d, unsigned bar, void* s, int c0, int c1, int d0, int d1) {
  int c[2] = {c0, c1}, x[2] = {d0, d1}; tc_tme_load(d, bar, s, c, x, 2);
}
inline void tc_tme_load_3d(const MUtensorDescriptor& d, unsigned bar, void* s, int c0, int c1, int c2, int d0, int d1,
                           int d2) {
  int c[3] = {c0, c1, c2}, x[3] = {d0, d1, d2}; tc_tme_load(d, bar, s, c, x, 3);
}
struct tc_copy_req { void* dst; unsigned char bytes[16]; int n; };
thread_local std::vector<tc_copy_req> tc_pending;
template <int N> inline void tc_async_copy(void* dst, const void* src, bool pred) {
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & (N - 1)) tc_die("async copy not aligned");
  tc_copy_req r{dst, {}, N};
  if (pred) std::memcpy(r.bytes, src, N);
  tc_pending.push_back(r);
}
inline void tc_async_wait() {
  for (const tc_copy_req& r : tc_pending) std::memcpy(r.dst, r.bytes, r.n);
  tc_pending.clear();
}
template <int... X, typename... A> inline void tc_sqmma_gemm(A...) { tc_die("SQMMA is not emulated"); }
"""

RUNNER = r"""
int main(int argc, char** argv) {
  const int gx = GRID_X, gy = GRID_Y, gz = GRID_Z, nthreads = THREADS;
LOAD_BUFFERS
DESCRIPTORS
  int status = 0;
  for (int bz = 0; bz < gz; ++bz)
    for (int by = 0; by < gy; ++by)
      for (int bx = 0; bx < gx; ++bx) {
        std::barrier<> block(nthreads);
        tc_block_barrier = &block;
        for (auto& b : tc_bars) { b.inited = 0; b.queued.clear(); b.ready.clear(); }
        std::vector<std::unique_ptr<tc_warp>> warps;
        for (int w = 0; w * WARP < nthreads; ++w) warps.push_back(std::make_unique<tc_warp>(std::min(WARP, nthreads - WARP * w)));
        std::vector<std::thread> ts;
        for (int t = 0; t < nthreads; ++t)
          ts.emplace_back([&, t] {
            threadIdx.x = t; blockIdx.x = bx; blockIdx.y = by; blockIdx.z = bz;
            tc_w = warps[t / WARP].get(); tc_lane = t % WARP;
            CALL;
            if (!tc_pending.empty()) tc_die("async copies never waited for");
          });
        for (auto& t : ts) t.join();
      }
STORE_BUFFERS
  if (status) std::fprintf(stderr, "device assertion %d\n", status);
  return status;
}
"""


def hardware_warp(arch: str) -> int:
    """The warp width of the MUSA generation (tilelang_musa common.h), whatever the profile says."""
    return 128 if arch == "mp_22" else 32


def compiler() -> str | None:
    return shutil.which("clang++-22") or shutil.which("clang++")


def host_source(source, warp: int | None = None) -> str:
    code = re.sub(r"/\* device-only: begin.*?device-only: end \*/\n", "", source.code, flags=re.S)
    code = re.sub(r"#include <musa_(fp16|bf16)\.h>\n", "", code)
    return f"#define WARP {warp or hardware_warp(source.meta['arch'])}\n" + SHIM + vector_shim("tc_die") + code


def run_on_host(kernel, arrays: list, warp: int | None = None) -> list:
    """Run the compiled tilecore-musa kernel on ``arrays`` (numpy, in parameter order; buffers only) and
    return them after the run; ``warp`` overrides the hardware's width (to show what a wrong one does)."""
    src = kernel.source
    grid = [eval(g, {"ints": [], "max": max, "min": min}) for g in src.meta["grid"]]  # noqa: S307 - our own text
    if src.meta.get("dynamic_shared_bytes"):
        raise ValueError("the host emulator runs static shared memory only")
    descs = []
    for k, d in enumerate(src.meta.get("tme_descriptors", [])):
        a = arrays[d["tensor"]]
        shape = ", ".join(str(s) for s in reversed(a.shape))
        descs.append(f"  MUtensorDescriptor tc_d{k}{{(const unsigned char*)ptrs[{d['tensor']}], {a.ndim}, "
                     f"{a.dtype.itemsize}, {{{shape}}}}};")
    args = [f"({_ctype(a.dtype)}*)ptrs[{k}]" for k, a in enumerate(arrays)] + [f"tc_d{k}" for k in range(len(descs))]
    call = "tc_kernel(" + ", ".join(args + ["&status"]) + ")"
    text = host_source(src, warp) + RUNNER.replace("GRID_X", str(grid[0])).replace("GRID_Y", str(grid[1])).replace(
        "GRID_Z", str(grid[2])).replace("THREADS", str(src.meta["threads"])).replace("CALL", call).replace(
        "DESCRIPTORS", "\n".join(descs))
    return build_and_run(text, arrays, [compiler(), "-x", "c++"], "tc-musa-emul-")


def _ctype(dt) -> str:
    return {"float16": "_Float16", "float32": "float", "float64": "double", "int32": "int"}[str(np.dtype(dt))]
