"""Run a generated CUDA kernel on the host, one block at a time, one std::thread per CUDA thread.

For machines without a GPU: it checks what the compiler cannot, that the tensor-core gemm's fragment
layouts (ldmatrix, mma.sync m16n8k16) and the cp.async copies compute the right numbers for every
transpose and ragged edge. The kernel source is the one the CUDA backend generated, unchanged; the
prelude's device-only helpers (inline PTX) are replaced by host emulations written from the PTX ISA's
description of each instruction:

- ``mma.sync.aligned.m16n8k16.row.col`` (f16/bf16 -> f32): every lane of a warp deposits its fragments,
  a warp barrier, every lane computes its four accumulators from the whole A (16x16) and B (16x8);
- ``ldmatrix`` (.x2/.x4, optionally .trans): lane ``l`` gives the row address of row ``l % 8`` of 8x8
  matrix ``l / 8``; each lane receives two 16-bit elements per matrix (row ``l / 4``, columns
  ``2 * (l % 4)`` and ``+ 1``; transposed with .trans); addresses must be 16-byte aligned;
- ``cp.async`` 16 bytes (``.cg``) or 4 / 8 bytes (``.ca``) with a source size: copy that many bytes, zero
  the rest; both addresses aligned to the copy's size. A copy joins the thread's open group,
  ``cp.async.commit_group`` closes it and ``cp.async.wait_group N`` lands every group but the newest N:
  reading a buffer before the wait that covers its copy reads stale data here too (a missing barrier may
  show as well: the threads run concurrently);
- ``__shfl_xor_sync`` (row reductions of fragments in registers): every lane deposits its value, a warp
  barrier, each lane reads the value of lane ``lane ^ mask`` (within aligned groups of ``width``);
  ``__shfl_sync`` (layout conversions' indexed shuffles) the same way, reading lane ``src`` modulo ``width`` of
  the thread's aligned group, as the hardware does.

- the made-up 64-lane matrix unit of tests/fake_matrix_backend.py (``tc_fakemu_16x16x8``), the same way;
- the fake backend's 64-wide register exchange (``tc_xor_exchange``): every lane of the group deposits its
  value, a group barrier, each reads its partner's. Lanes meet in groups of 64 threads (the last group
  smaller), so every thread of such a group must reach the exchange.

``__shared__`` arrays become function statics (one block runs at a time), ``__syncthreads()`` a
``std::barrier`` over the block. Only what the gemm tests need is shimmed (no atomics, printf, asserts).
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

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
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
struct tc_dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local tc_dim3 threadIdx, blockIdx;
static std::barrier<>* tc_block_barrier;
inline void __syncthreads() { tc_block_barrier->arrive_and_wait(); }
struct float2 { float x, y; };
inline float2 make_float2(float a, float b) { return {a, b}; }
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct __half { unsigned short bits; };
struct __nv_bfloat16 { unsigned short bits; };
#define __CUDA_BF16_TYPES_EXIST__ /* as cuda_bf16.h does: the prelude's bfloat16 helpers */
inline float __half2float(__half h) { _Float16 f; std::memcpy(&f, &h.bits, 2); return (float)f; }
inline __half __float2half_rn(float x) { _Float16 f = (_Float16)x; __half h; std::memcpy(&h.bits, &f, 2); return h; }
inline float tc_bf2f_bits(unsigned short b) { unsigned u = (unsigned)b << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline float __bfloat162float(__nv_bfloat16 h) { return tc_bf2f_bits(h.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  unsigned u; std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {(unsigned short)((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {(unsigned short)(u >> 16)};
}
inline float tc_h2f_bits(unsigned short b) { __half h{b}; return __half2float(h); }
struct __half2 { __half x, y; };
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
static void tc_fail(const char* what) { std::fprintf(stderr, "emulator: %s\n", what); std::abort(); }

/* ---- warps ---- */
struct tc_warp {
  std::barrier<> bar{32};
  const void* ptr[32];
  unsigned a[32][4], b[32][2];
  float d[32][4];
  unsigned long long x[32];
};
thread_local tc_warp* tc_w;
thread_local int tc_lane;

/* __shfl_xor_sync: every lane of the warp deposits its value, a warp barrier, each reads its partner's */
template <class V> inline V __shfl_xor_sync(unsigned, V v, int mask, int width = 32) {
  static_assert(sizeof(V) <= 8, "shuffle of a value wider than 8 bytes");
  std::memcpy(&tc_w->x[tc_lane], &v, sizeof(V));
  tc_w->bar.arrive_and_wait();
  const int partner = (tc_lane & ~(width - 1)) | ((tc_lane ^ mask) & (width - 1));
  V out;
  std::memcpy(&out, &tc_w->x[partner], sizeof(V));
  tc_w->bar.arrive_and_wait();
  return out;
}

/* __all_sync / __any_sync (warp votes, full mask): every lane deposits its predicate, a warp barrier, each reads all 32 */
inline int __all_sync(unsigned mask, int pred) {
  if (mask != 0xffffffffu) tc_fail("__all_sync with a partial mask");
  tc_w->x[tc_lane] = pred != 0;
  tc_w->bar.arrive_and_wait();
  int all = 1;
  for (int l = 0; l < 32; ++l) all &= (int)tc_w->x[l];
  tc_w->bar.arrive_and_wait();
  return all;
}

inline int __any_sync(unsigned mask, int pred) {
  if (mask != 0xffffffffu) tc_fail("__any_sync with a partial mask");
  tc_w->x[tc_lane] = pred != 0;
  tc_w->bar.arrive_and_wait();
  int any = 0;
  for (int l = 0; l < 32; ++l) any |= (int)tc_w->x[l];
  tc_w->bar.arrive_and_wait();
  return any;
}

/* __shfl_sync: every lane deposits, a warp barrier, each reads lane `src` (modulo width, as the hardware)
 * of its own width-aligned segment */
template <class V> inline V __shfl_sync(unsigned, V v, int src, int width = 32) {
  static_assert(sizeof(V) <= 8, "shuffle of a value wider than 8 bytes");
  if (width > 32 || (width & (width - 1))) tc_fail("shuffle width out of range");
  std::memcpy(&tc_w->x[tc_lane], &v, sizeof(V));
  tc_w->bar.arrive_and_wait();
  const int from = (tc_lane & ~(width - 1)) | (src & (width - 1));
  V out;
  std::memcpy(&out, &tc_w->x[from], sizeof(V));
  tc_w->bar.arrive_and_wait();
  return out;
}

inline void tc_ldsm(unsigned* r, const void* p, int nmat, bool trans) {
  if (tc_lane < 8 * nmat && (reinterpret_cast<uintptr_t>(p) & 15)) tc_fail("ldmatrix row address not 16-byte aligned");
  tc_w->ptr[tc_lane] = p;
  tc_w->bar.arrive_and_wait();
  const int l = tc_lane;
  for (int j = 0; j < nmat; ++j) {
    unsigned short lo, hi;
    if (!trans) {
      const unsigned short* row = (const unsigned short*)tc_w->ptr[8 * j + l / 4];
      lo = row[2 * (l % 4)]; hi = row[2 * (l % 4) + 1];
    } else {
      lo = ((const unsigned short*)tc_w->ptr[8 * j + 2 * (l % 4)])[l / 4];
      hi = ((const unsigned short*)tc_w->ptr[8 * j + 2 * (l % 4) + 1])[l / 4];
    }
    r[j] = (unsigned)lo | ((unsigned)hi << 16);
  }
  tc_w->bar.arrive_and_wait();
}
inline void tc_ldsm_x4(unsigned* r, const void* p) { tc_ldsm(r, p, 4, false); }
inline void tc_ldsm_x4_t(unsigned* r, const void* p) { tc_ldsm(r, p, 4, true); }
inline void tc_ldsm_x2(unsigned* r, const void* p) { tc_ldsm(r, p, 2, false); }
inline void tc_ldsm_x2_t(unsigned* r, const void* p) { tc_ldsm(r, p, 2, true); }

template <bool BF16> inline float tc_elem(unsigned reg, int half) {
  unsigned short b = (unsigned short)(half ? reg >> 16 : reg & 0xffffu);
  return BF16 ? tc_bf2f_bits(b) : tc_h2f_bits(b);
}
template <bool BF16> inline void tc_mma_16816(float* d, const unsigned* a, const unsigned* b) {
  const int l = tc_lane;
  for (int q = 0; q < 4; ++q) tc_w->a[l][q] = a[q];
  tc_w->b[l][0] = b[0]; tc_w->b[l][1] = b[1];
  tc_w->bar.arrive_and_wait();
  const int g = l >> 2, t = l & 3;
  for (int q = 0; q < 4; ++q) {
    const int row = g + 8 * (q >> 1), col = 2 * t + (q & 1);
    double acc = d[q];
    for (int k = 0; k < 16; ++k) {
      /* A (row, k): lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) + 2 * (k >= 8), half k & 1 */
      const float av = tc_elem<BF16>(tc_w->a[(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k & 1);
      /* B (k, col): lane col * 4 + (k % 8) / 2, register k >= 8, half k & 1 */
      const float bv = tc_elem<BF16>(tc_w->b[col * 4 + (k % 8) / 2][k >= 8], k & 1);
      acc += (double)av * (double)bv;
    }
    tc_w->d[l][q] = (float)acc;
  }
  tc_w->bar.arrive_and_wait();
  for (int q = 0; q < 4; ++q) d[q] = tc_w->d[l][q];
}

/* ---- groups of 64 threads: the made-up matrix unit of tests/fake_matrix_backend.py, wide shuffles ---- */
struct tc_group64 {
  explicit tc_group64(int n) : bar(n) {}
  std::barrier<> bar;
  unsigned short a[64][2], b[64][2];
  unsigned long long x[64];
};
thread_local tc_group64* tc_g64;
thread_local int tc_lane64;

/* fakemu 16x16x8, f16 -> f32 over 64 lanes: C (row, col) in lane 16 (row / 4) + col, register row % 4;
 * A (row, k) in lane row + 16 (k / 2), register k % 2; B (k, col) in lane 4 col + k % 4, register k / 4 */
inline void tc_fakemu_16x16x8(float* c, const __half* a, const __half* b) {
  const int l = tc_lane64;
  for (int q = 0; q < 2; ++q) { tc_g64->a[l][q] = a[q].bits; tc_g64->b[l][q] = b[q].bits; }
  tc_g64->bar.arrive_and_wait();
  float d[4];
  for (int q = 0; q < 4; ++q) {
    const int row = 4 * (l / 16) + q, col = l % 16;
    double acc = c[q];
    for (int k = 0; k < 8; ++k)
      acc += (double)tc_h2f_bits(tc_g64->a[row + 16 * (k / 2)][k % 2]) * (double)tc_h2f_bits(tc_g64->b[4 * col + k % 4][k / 4]);
    d[q] = (float)acc;
  }
  tc_g64->bar.arrive_and_wait();
  for (int q = 0; q < 4; ++q) c[q] = d[q];
}

/* register exchange: every lane of the aligned group of `width` (up to 64) deposits, reads lane ^ mask */
template <typename T> inline T tc_xor_exchange(T v, int mask, int width) {
  if (width > 64 || (width & (width - 1)) || mask >= width) tc_fail("shuffle width or mask out of range");
  std::memcpy(&tc_g64->x[tc_lane64], &v, sizeof(T));
  tc_g64->bar.arrive_and_wait();
  T out;
  std::memcpy(&out, &tc_g64->x[tc_lane64 ^ mask], sizeof(T));
  tc_g64->bar.arrive_and_wait();
  return out;
}
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
inline __half __ushort_as_half(unsigned short b) { return __half{b}; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return __nv_bfloat16{b}; }

/* cp.async: a copy is queued in this thread's open group and lands only when a wait_group retires its
 * group, so a schedule that reads a buffer before waiting for its copy reads stale data here as on a GPU */
struct tc_copy_req { void* dst; const void* src; int size, src_bytes; };
thread_local std::vector<tc_copy_req> tc_open_group;
thread_local std::vector<std::vector<tc_copy_req>> tc_groups;
inline void tc_cp_async_n(void* dst, const void* src, int size, int src_bytes) {
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & (size - 1)) tc_fail("cp.async address not aligned to its size");
  if (src_bytes < 0 || src_bytes > size) tc_fail("cp.async source size out of range");
  tc_open_group.push_back({dst, src, size, src_bytes});
}
VECTOR_SHIM_HERE
inline void tc_cp_async16(void* dst, const void* src, int src_bytes) { tc_cp_async_n(dst, src, 16, src_bytes); }
template <int N> inline void tc_cp_async_ca(void* dst, const void* src, int src_bytes) { tc_cp_async_n(dst, src, N, src_bytes); }
inline void tc_cp_async_commit() { tc_groups.push_back(std::move(tc_open_group)); tc_open_group.clear(); }
template <int N> inline void tc_cp_async_wait() {
  while (tc_groups.size() > (size_t)N) {
    for (const tc_copy_req& c : tc_groups.front()) {
      std::memcpy(c.dst, c.src, c.src_bytes);
      std::memset((char*)c.dst + c.src_bytes, 0, c.size - c.src_bytes);
    }
    tc_groups.erase(tc_groups.begin());
  }
}

/* ---- the register programs' helpers (regprog.py, mma.sync mode) ---- */
/* a 32-bit shared-window address: the offset from a 1024-byte-aligned anchor among the statics (the
 * programs align their base to 1024 bytes in this window, as on a GPU) */
alignas(1024) static char tc_smem_anchor[1024];
inline unsigned tc_smem_addr(const void* p) { return (unsigned)((const char*)p - tc_smem_anchor); }
inline void* tc_smem_ptr(unsigned a) { return tc_smem_anchor + (long long)(int)a; }
inline void tc_cp_async16_raw(unsigned dst, const void* src, int src_bytes) { tc_cp_async_n(tc_smem_ptr(dst), src, 16, src_bytes); }
inline void tc_ldsm_x4_raw(unsigned* r, unsigned a) { tc_ldsm(r, tc_smem_ptr(a), 4, false); }
inline void tc_ldsm_x4_t_raw(unsigned* r, unsigned a) { tc_ldsm(r, tc_smem_ptr(a), 4, true); }
inline unsigned tc_pack_h2(float a, float b) { return (unsigned)__float2half_rn(a).bits | ((unsigned)__float2half_rn(b).bits << 16); }
inline float tc_ex2_ftz(float x) { return exp2f(x); }  /* the caller checked x >= -126: exp2f's own path there */
inline float tc_div_rcp(float b) { return 1.0f / b; }  /* prelude/tc_div_row.cuh: div.rn's fast path, whose result */
inline bool tc_div_safe(float x) { const float a = std::fabs(x); return a >= 0x1p-40f && a <= 0x1p40f; }
inline float tc_div_fast(float a, float b, float) { return a / b; }  /* in the safe range is the IEEE quotient */
inline float tc_ex2_poly(float x) {  /* prelude/tc_ex2_poly.cuh, the same operations */
  const float xc = x != x ? x : std::fmax(x, -190.0f);
  volatile float magic = 12582912.0f;
  const float t = xc + magic, j = t - magic, f = xc - j;
  float p = 0x1.41fd68p-13f;
  p = std::fma(p, f, 0x1.5f3e78p-10f); p = std::fma(p, f, 0x1.3b2d4ap-7f); p = std::fma(p, f, 0x1.c6aee8p-5f);
  p = std::fma(p, f, 0x1.ebfbdcp-3f); p = std::fma(p, f, 0x1.62e430p-1f); p = std::fma(p, f, 1.0f);
  int tb; std::memcpy(&tb, &t, 4); const int sb = (int)((unsigned)tb << 23) + (191 << 23);
  float s; std::memcpy(&s, &sb, 4);
  return (p * s) * 0x1p-64f;
}
inline unsigned tc_pack_bf2(float a, float b) { return (unsigned)__float2bfloat16_rn(a).bits | ((unsigned)__float2bfloat16_rn(b).bits << 16); }
inline float tc_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
template <int N> inline void tc_reg_fence(float (&)[N]) {}
template <int N> inline void tc_reg_fence_u(unsigned (&)[N]) {}
template <typename T> inline void tc_store1(T* p, float v);
template <> inline void tc_store1<float>(float* p, float v) { *p = v; }
template <> inline void tc_store1<__half>(__half* p, float v) { *p = __float2half_rn(v); }
template <> inline void tc_store1<__nv_bfloat16>(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
template <typename T> inline void tc_store2(T* p, float a, float b) {
  if (reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T))) tc_fail("paired store not aligned to its size");
  tc_store1<T>(p, a); tc_store1<T>(p + 1, b);
}
"""

def vector_shim(fail: str) -> str:
    """C++ of the vector stores and loads of the SIMT C++ emitters (``tc_vecn``, ``tc_vst``, ``tc_vld``:
    tilecore.vectorize_stores) for the host emulators, whose failures go through ``fail``: the store and the load
    check that their address is aligned to the vector's size, as the hardware requires (a misaligned one faults
    on a GPU; on the host it would not)."""
    return ("template <typename T, int N> struct alignas(sizeof(T) * N) tc_vecn { T v[N]; };\n"
            "template <typename V, typename T> inline void tc_vst(T* p, const V& v) {\n"
            "  if (reinterpret_cast<uintptr_t>(p) % sizeof(V)) FAIL(\"vector store address not aligned to its size\");\n"
            "  std::memcpy((void*)p, &v, sizeof(V));\n"
            "}\n"
            "template <typename V, typename T> inline V tc_vld(const T* p) {\n"
            "  if (reinterpret_cast<uintptr_t>(p) % sizeof(V)) FAIL(\"vector load address not aligned to its size\");\n"
            "  V v; std::memcpy(&v, (const void*)p, sizeof(V)); return v;\n"
            "}\n").replace("FAIL", fail)


SHIM = SHIM.replace("VECTOR_SHIM_HERE", vector_shim("tc_fail"))

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
        std::vector<tc_warp> warps((nthreads + 31) / 32);
        std::vector<std::unique_ptr<tc_group64>> g64;
        for (int g = 0; g * 64 < nthreads; ++g) g64.push_back(std::make_unique<tc_group64>(std::min(64, nthreads - 64 * g)));
        std::vector<std::thread> ts;
        for (int t = 0; t < nthreads; ++t)
          ts.emplace_back([&, t] {
            threadIdx.x = t; blockIdx.x = bx; blockIdx.y = by; blockIdx.z = bz;
            tc_w = &warps[t / 32]; tc_lane = t % 32;
            tc_g64 = g64[t / 64].get(); tc_lane64 = t % 64;
            CALL;
          });
        for (auto& t : ts) t.join();
      }
STORE_BUFFERS
  return status;
}
"""


def host_source(source) -> str:
    """The generated kernel with the prelude's device-only parts swapped for the host emulation."""
    code = source.code
    head, sep, kernel = code.partition('extern "C" __global__')
    head = re.sub(r"/\* device-only: begin.*?/\* device-only: end \*/\n", "", head, flags=re.S)
    head = re.sub(r"#include <[^>]+>\n", "", head)
    # drop the atomics (host has no atomicCAS); keep the helpers before them and the collectives after
    head = re.sub(r"/\* device assertions:.*?(?=/\* -{20,})", "", head, flags=re.S)
    # D69: an atomic that returns the old value (atom.<order>.<scope>.global.add) and fences through the host's
    # __atomic builtins (one block runs at a time here: the orders hold trivially; the threads are real threads)
    head = re.sub(r"(__device__ __forceinline__ ([\w ]+) tc_atom_add_\w+\(([\w ]+)\* p, [\w ]+ v\)) \{\n.*?\n\}\n",
                  r"\1 { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }\n", head, flags=re.S)
    kernel = re.sub(r'asm volatile\("fence\.acq_rel\.(gpu|cta); \\n" ::: "memory"\);',
                    "__atomic_thread_fence(__ATOMIC_ACQ_REL);", kernel)
    return SHIM + head + sep + kernel


def run_on_host(kernel, arrays: list, tmp: Path | None = None, ints: dict | None = None, workspace=None) -> list:
    """Run compiled tilecore kernel ``kernel`` (a CUDA target) on ``arrays`` (numpy, in parameter order;
    they are updated in place and returned). ``ints``: the values of the kernel's shape
    symbols and integer scalars by name (dynamic shapes), read from the kernel's ``tc_i<k>`` parameters.
    ``workspace``: a uint8 array for a kernel that keeps a workspace (D69), returned last after the run."""
    src = kernel.source
    scalars = scalar_args(src.code, ints or {})
    grid = [eval(g, {"ints": scalars, "max": max, "min": min}) for g in src.meta["grid"]]  # noqa: S307 - our own text
    threads = src.meta["threads"]
    if src.meta.get("dynamic_shared_bytes"):
        raise ValueError("the host emulator runs static shared memory only")
    call = "tc_kernel(" + ", ".join(f"({_ctype(a.dtype)}*)ptrs[{k}]" for k, a in enumerate(arrays))
    call += "".join(f", {v}LL" for v in scalars)
    if workspace is not None:  # D69: the kernel's kept workspace (the caller keeps it across runs), after the integers
        if workspace.nbytes < int(src.meta["workspace"]["bytes"]):
            raise ValueError(f"the kernel's workspace takes {src.meta['workspace']['bytes']} bytes")
        call += f", (unsigned char*)ptrs[{len(arrays)}]"
        arrays = [*arrays, workspace]
    elif src.meta.get("workspace"):
        raise ValueError("the kernel keeps a workspace: pass workspace= (np.zeros(meta['workspace']['bytes'], np.uint8) "
                         "the first time, then the array returned last)")
    call += ", &status)"
    text = host_source(src) + RUNNER.replace("GRID_X", str(grid[0])).replace("GRID_Y", str(grid[1])).replace(
        "GRID_Z", str(grid[2])).replace("THREADS", str(threads)).replace("CALL", call)
    return build_and_run(text, arrays, ["g++"], "tc-emul-")


def scalar_args(code: str, values: dict) -> list:
    """The kernel's integer parameters ``tc_i0, tc_i1, ...`` in order, each the value ``values`` gives its name
    (the emitters declare ``const int <name> = (int)tc_i<k>;``)."""
    names = dict((int(k), n) for n, k in re.findall(r"const \w+ (\w+) = \(\w+\)tc_i(\d+);", code))
    missing = [names[k] for k in sorted(names) if names[k] not in values]
    if missing:
        raise ValueError(f"the kernel takes integer arguments {missing}: pass them in ints=")
    return [int(values[names[k]]) for k in sorted(names)]


#: the host runner's argument handling: argv holds (file, bytes) pairs, one per buffer, loaded 64-byte aligned
#: into ``ptrs`` (the runners' ``LOAD_BUFFERS`` placeholder)
LOAD_BUFFERS = """  std::vector<std::vector<unsigned char>> bufs;
  std::vector<void*> ptrs;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::vector<unsigned char> data(std::atol(argv[i + 1]) + 64);
    void* p = (void*)(((uintptr_t)data.data() + 63) & ~(uintptr_t)63);
    FILE* f = std::fopen(argv[i], "rb");
    if (f) { size_t n = std::fread(p, 1, std::atol(argv[i + 1]), f); (void)n; std::fclose(f); }
    bufs.push_back(std::move(data));
    ptrs.push_back(p);
  }"""


#: device atomics through the host's (GCC/clang) __atomic builtins, for the emulators of CUDA-like languages
def lane_exchange(group: str, noun: str, fits: str) -> str:
    """C++ of ``tc_exchange(v, width, src)`` for the emulators whose lockstep group is ``tc_w`` (fields ``x``,
    ``bar``, ``n``), whose lane is ``tc_lane`` and whose failures go through ``tc_die``: every lane deposits
    ``v``, the group meets, each reads lane ``src`` (modulo ``width``, as the hardware) of its own
    width-aligned segment, the group meets again. ``group`` is the constant holding the group's width,
    ``noun`` its name in the messages, ``fits`` the static check of the value's type ``T``; the xor and the
    indexed shuffles are spelled on top of it."""
    return (r"""template <typename T> inline T tc_exchange(T v, int width, int src) {
  static_assert(%(fits)s, "lane exchange of a value of this size");
  if (width > %(group)s || (width & (width - 1))) tc_die("lane exchange wider than the %(noun)s");
  std::memcpy(&tc_w->x[tc_lane], &v, sizeof(T));
  tc_w->bar.arrive_and_wait();
  const int from = (tc_lane & ~(width - 1)) | (src & (width - 1));
  if (from >= tc_w->n) tc_die("lane exchange with a lane the block does not have");
  T out;
  std::memcpy(&out, &tc_w->x[from], sizeof(T));
  tc_w->bar.arrive_and_wait();
  return out;
}
""" % {"group": group, "noun": noun, "fits": fits})


HOST_ATOMICS = r"""/* atomics through the host's (GCC/clang) __atomic builtins */
template <typename T> inline T atomicCAS(T* p, T expected, T desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;
}
template <typename T, typename F> inline T tc_atomic_rmw(T* p, T v, F f) {
  T old = *p;
  while (!__atomic_compare_exchange(p, &old, (T[]){f(old, v)}, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  return old;
}
template <typename T> inline T atomicAdd(T* p, T v) { return tc_atomic_rmw(p, v, [](T a, T b) { return (T)(a + b); }); }
template <typename T> inline T atomicMax(T* p, T v) { return tc_atomic_rmw(p, v, [](T a, T b) { return a > b ? a : b; }); }
template <typename T> inline T atomicMin(T* p, T v) { return tc_atomic_rmw(p, v, [](T a, T b) { return a < b ? a : b; }); }
"""


#: writes every buffer back to its file after the run (the runners' ``STORE_BUFFERS`` placeholder)
STORE_BUFFERS = """  for (int i = 1, k = 0; i + 1 < argc; i += 2, ++k) {
    FILE* f = std::fopen(argv[i], "wb");
    std::fwrite(ptrs[k], 1, std::atol(argv[i + 1]), f);
    std::fclose(f);
  }"""


def build_and_run(text: str, arrays: list, cxx: list, prefix: str) -> list:
    """Build the host program ``text`` (a runner whose ``LOAD_BUFFERS`` placeholder is filled here) with the
    C++ compiler command ``cxx``, run it on ``arrays`` (each written to a file, read back after the run) and
    return the arrays as the kernel left them."""
    text = text.replace("LOAD_BUFFERS", LOAD_BUFFERS).replace("STORE_BUFFERS", STORE_BUFFERS)
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        d = Path(d)
        (d / "k.cpp").write_text(text)
        proc = subprocess.run([*cxx, "-std=c++20", "-O1", "-w", "-pthread", "-o", str(d / "k"), str(d / "k.cpp")],
                              capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError("host build failed:\n" + proc.stderr[-4000:])
        argv = [str(d / "k")]
        for k, a in enumerate(arrays):
            p = d / f"b{k}.bin"
            np.ascontiguousarray(a).tofile(p)
            argv += [str(p), str(a.nbytes)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if proc.returncode:
            raise RuntimeError(f"host run failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return [np.fromfile(d / f"b{k}.bin", dtype=a.dtype).reshape(a.shape) for k, a in enumerate(arrays)]


def _ctype(dt) -> str:
    return {"float16": "__half", "float32": "float", "float64": "double", "int32": "int",
            "uint16": "__nv_bfloat16"}[str(dt)]
