"""Run a generated HIP kernel on the host, one block at a time, one std::thread per lane.

For machines without an AMD GPU: it checks what the compiler cannot, that the MFMA / WMMA fragment
layouts, the lane exchanges of row reductions and the global->LDS copies compute the right numbers at the
hardware's wave width. The kernel source is the one tilecore-hip generated, unchanged; the prelude's
``device-only`` parts (clang AMDGPU builtins, the ocml math prelude) are replaced by host emulations written
from the ISA's description of each instruction, not from tilecore_hip/units.py:

- lanes form waves of ``WAVE`` threads, the hardware's width for the architecture (64 on gfx9 CDNA, 32 on
  gfx11 RDNA3), whatever the kernel was told: a kernel that assumes another width exchanges with the wrong
  lanes here as on the GPU;
- ``ds_bpermute`` (``tc_shfl_xor``): every lane of the wave deposits its value, a wave barrier, each reads
  the value of lane ``(lane & ~(width - 1)) | ((lane ^ mask) & (width - 1))``; ``tc_shfl_idx`` (the indexed
  exchange of prelude/tc_hip_shuffle.h) reads lane ``(lane & ~(width - 1)) | (src & (width - 1))``;
- ``v_mfma_f32_16x16x{16,32}`` (CDNA3 ISA, "Dependent and independent matrix layouts"): lane ``l`` supplies
  ``A[l % 16][kpl * (l / 16) + e]`` and ``B[kpl * (l / 16) + e][l % 16]`` (``kpl`` = K / 4 elements per
  lane), and receives ``D[4 (l / 16) + r][l % 16]`` in register ``r``;
- ``v_wmma_f32_16x16x16_f16_w32`` (RDNA3 ISA, WMMA operand layout, wave 32): lane ``l`` supplies row
  ``l % 16`` of A and column ``l % 16`` of B (all 16 k; lanes ``l`` and ``l + 16`` must agree, else the
  emulator aborts) and receives ``D[2 r + l / 16][l % 16]`` in register ``r``;
- ``global_load_lds`` (``tc_async_copy``): the copy is queued and lands only at ``s_waitcnt vmcnt(0)``
  (``tc_async_wait``), so a schedule that reads LDS before its wait reads stale data here too.

``__shared__`` arrays become function statics (one block runs at a time), ``__syncthreads()`` a
``std::barrier`` over the block. Built with clang++ (it has ``_Float16`` and ``__bf16`` on x86).
"""
from __future__ import annotations

import re
import shutil

from cuda_host_emulator import HOST_ATOMICS, build_and_run, lane_exchange, vector_shim, scalar_args  # the shared build / run / read-back, atomics

SHIM = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <algorithm>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __shared__ static
#define __forceinline__ inline
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define tc_block_size(n)
#ifndef INFINITY
#define INFINITY __builtin_inff()
#endif
#ifndef NAN
#define NAN __builtin_nanf("")
#endif
struct tc_dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local tc_dim3 tc_tid, tc_bid;
static std::barrier<>* tc_block_barrier;
#define tc_thread_x() ((int)tc_tid.x)
#define tc_block_x() ((long long)tc_bid.x)
#define tc_block_y() ((long long)tc_bid.y)
#define tc_block_z() ((long long)tc_bid.z)
static void tc_die(const char* what) { std::fprintf(stderr, "emulator: %s\n", what); std::abort(); }
inline void tc_barrier() { tc_block_barrier->arrive_and_wait(); }
static int tc_any_flag;
inline int tc_barrier_or(int pred) {
  tc_barrier();
  if (tc_tid.x == 0) tc_any_flag = 0;
  tc_barrier();
  if (pred) __atomic_store_n(&tc_any_flag, 1, __ATOMIC_RELAXED);
  tc_barrier();
  int r = __atomic_load_n(&tc_any_flag, __ATOMIC_RELAXED);
  tc_barrier();
  return r;
}

/* ---- waves ---- */
struct tc_wave {
  explicit tc_wave(int n) : bar(n), n(n) {}
  std::barrier<> bar;
  int n;
  unsigned long long x[64];
  float a[64][16], b[64][16], d[64][8];
  void* dst[64];
};
thread_local tc_wave* tc_w;
thread_local int tc_lane;
inline int tc_lane_id() { return tc_lane; }

""" + lane_exchange("WAVE", "wave", "sizeof(T) == 4 || sizeof(T) == 8") + r"""
template <typename T> inline T tc_shfl_xor(T v, int mask, int width) {
  if (mask >= width) tc_die("lane exchange wider than the wave");
  return tc_exchange(v, width, tc_lane ^ mask);
}
template <typename T> inline T tc_shfl_idx(T v, int src, int width) { return tc_exchange(v, width, src); }

""" + HOST_ATOMICS + r"""
/* global_load_lds: queued per thread, landed by s_waitcnt vmcnt(0) */
struct tc_copy_req { void* dst; unsigned char bytes[16]; int n; };
thread_local std::vector<tc_copy_req> tc_pending;
template <int N> inline void tc_async_copy(void* dst, const void* src, bool pred) {
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & (N - 1)) tc_die("async copy not aligned to its size");
  tc_copy_req r{dst, {}, N};
  if (pred) std::memcpy(r.bytes, src, N);
  tc_pending.push_back(r);
}
inline void tc_async_wait() {
  for (const tc_copy_req& r : tc_pending) std::memcpy(r.dst, r.bytes, r.n);
  tc_pending.clear();
}

/* MFMA 16x16xK (wave 64): lane l gives A[l%16][KPL*(l/16)+e], B[KPL*(l/16)+e][l%16]; gets D[4(l/16)+r][l%16] */
template <int K, typename T> inline void tc_mfma_emu(float* c, const T* a, const T* b) {
  constexpr int KPL = K / 4;
  if (tc_w->n != 64) tc_die("MFMA needs a whole wave of 64 lanes");
  const int l = tc_lane;
  for (int e = 0; e < KPL; ++e) { tc_w->a[l][e] = (float)a[e]; tc_w->b[l][e] = (float)b[e]; }
  tc_w->bar.arrive_and_wait();
  float d[4];
  for (int r = 0; r < 4; ++r) {
    const int i = 4 * (l / 16) + r, j = l % 16;
    double acc = c[r];
    for (int k = 0; k < K; ++k)
      acc += (double)tc_w->a[i + 16 * (k / KPL)][k % KPL] * (double)tc_w->b[j + 16 * (k / KPL)][k % KPL];
    d[r] = (float)acc;
  }
  tc_w->bar.arrive_and_wait();
  for (int r = 0; r < 4; ++r) c[r] = d[r];
}
inline void tc_mfma_16x16x16(float* c, const _Float16* a, const _Float16* b) { tc_mfma_emu<16>(c, a, b); }
inline void tc_mfma_16x16x16(float* c, const __bf16* a, const __bf16* b) { tc_mfma_emu<16>(c, a, b); }
inline void tc_mfma_16x16x32(float* c, const _Float16* a, const _Float16* b) { tc_mfma_emu<32>(c, a, b); }
inline void tc_mfma_16x16x32(float* c, const __bf16* a, const __bf16* b) { tc_mfma_emu<32>(c, a, b); }

/* WMMA 16x16x16 (wave 32): lane l gives row l%16 of A and column l%16 of B; gets D[2r + l/16][l%16] */
template <typename T> inline void tc_wmma_emu(float* c, const T* a, const T* b) {
  if (tc_w->n != 32) tc_die("WMMA w32 needs a whole wave of 32 lanes");
  const int l = tc_lane;
  for (int e = 0; e < 16; ++e) { tc_w->a[l][e] = (float)a[e]; tc_w->b[l][e] = (float)b[e]; }
  tc_w->bar.arrive_and_wait();
  for (int e = 0; e < 16; ++e)
    if (tc_w->a[l % 16][e] != tc_w->a[l % 16 + 16][e] || tc_w->b[l % 16][e] != tc_w->b[l % 16 + 16][e])
      tc_die("WMMA operands differ between the two half-waves");
  float d[8];
  for (int r = 0; r < 8; ++r) {
    const int i = 2 * r + l / 16, j = l % 16;
    double acc = c[r];
    for (int k = 0; k < 16; ++k) acc += (double)tc_w->a[i][k] * (double)tc_w->b[j][k];
    d[r] = (float)acc;
  }
  tc_w->bar.arrive_and_wait();
  for (int r = 0; r < 8; ++r) c[r] = d[r];
}
inline void tc_wmma_16x16x16(float* c, const _Float16* a, const _Float16* b) { tc_wmma_emu(c, a, b); }
inline void tc_wmma_16x16x16(float* c, const __bf16* a, const __bf16* b) { tc_wmma_emu(c, a, b); }
"""

RUNNER = r"""
int main(int argc, char** argv) {
  const int gx = GRID_X, gy = GRID_Y, gz = GRID_Z, nthreads = THREADS;
LOAD_BUFFERS
  int status = 0;
  for (int bz = 0; bz < gz; ++bz)
    for (int by = 0; by < gy; ++by)
      for (int bx = 0; bx < gx; ++bx) {
        std::barrier<> block(nthreads);
        tc_block_barrier = &block;
        std::vector<std::unique_ptr<tc_wave>> waves;
        for (int w = 0; w * WAVE < nthreads; ++w) waves.push_back(std::make_unique<tc_wave>(std::min(WAVE, nthreads - WAVE * w)));
        std::vector<std::thread> ts;
        for (int t = 0; t < nthreads; ++t)
          ts.emplace_back([&, t] {
            tc_tid.x = t; tc_bid.x = bx; tc_bid.y = by; tc_bid.z = bz;
            tc_w = waves[t / WAVE].get(); tc_lane = t % WAVE;
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

#: the hardware's wave width per architecture family (ISA reference guides), independent of the profile
def hardware_wave(arch: str) -> int:
    return 32 if arch.startswith("gfx1") else 64


def host_source(source) -> str:
    """The generated kernel with the prelude's device-only parts swapped for the host emulation."""
    code = source.code
    code = re.sub(r"/\* -*\s*device-only: begin.*?device-only: end \*/\n", "", code, flags=re.S)
    wave = hardware_wave(source.meta["arch"])
    return f"#define WAVE {wave}\n" + SHIM + vector_shim("tc_die") + code


def compiler() -> str | None:
    return shutil.which("clang++-22") or shutil.which("clang++")


def run_on_host(kernel, arrays: list, ints: dict | None = None) -> list:
    """Run compiled tilecore kernel ``kernel`` (a hip target) on ``arrays`` (numpy, in parameter order);
    returns the arrays after the run. ``ints``: the values of the kernel's shape
    symbols and integer scalars by name (dynamic shapes), read from the kernel's ``tc_i<k>`` parameters."""
    src = kernel.source
    scalars = scalar_args(src.code, ints or {})
    grid = [eval(g, {"ints": scalars, "max": max, "min": min}) for g in src.meta["grid"]]  # noqa: S307 - our own text
    if src.meta.get("dynamic_shared_bytes"):
        raise ValueError("the host emulator runs static LDS only")
    call = "tc_kernel(" + ", ".join(f"({_ctype(a.dtype)}*)ptrs[{k}]" for k, a in enumerate(arrays))
    call += "".join(f", {v}LL" for v in scalars) + ", &status)"
    text = host_source(src) + RUNNER.replace("GRID_X", str(grid[0])).replace("GRID_Y", str(grid[1])).replace(
        "GRID_Z", str(grid[2])).replace("THREADS", str(src.meta["threads"])).replace("CALL", call)
    return build_and_run(text, arrays, [compiler(), "-x", "c++"], "tc-hip-emul-")


def _ctype(dt) -> str:
    return {"float16": "_Float16", "float32": "float", "float64": "double", "int32": "int"}[str(dt)]
