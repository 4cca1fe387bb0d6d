/* tilecore-cuda TMA and mbarrier primitives (sm_90a): tensor maps, transaction barriers, bulk tile loads and stores.
 * Included after tc_cuda.cuh in kernels with bulk tile copies (tilecore.plan_pipelines' BulkCopy) and, before
 * tc_hopper.cuh, in kernels with Hopper pipelines or register programs. */
#pragma once

/* A CUtensorMap (cuda.h): 128 opaque bytes, built on the host (cuTensorMapEncodeTiled) and passed by
 * value as a __grid_constant__ kernel parameter. */
struct __align__(64) tc_tmap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ void tc_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void tc_mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tc_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* wait until the phase with this parity has completed */
__device__ __forceinline__ void tc_mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "TC_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra TC_WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
/* a 2-D box of the tensor map's tensor at (c0 innermost, c1) into shared memory; completes on `bar` */
__device__ __forceinline__ void tc_tma_load_2d(unsigned dst, const tc_tmap* map, unsigned bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tc_tma_load_3d(unsigned dst, const tc_tmap* map, unsigned bar, int c0, int c1,
                                               int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tc_tma_load_4d(unsigned dst, const tc_tmap* map, unsigned bar, int c0, int c1,
                                               int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tc_tma_load_5d(unsigned dst, const tc_tmap* map, unsigned bar, int c0, int c1,
                                               int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}
__device__ __forceinline__ void tc_tma_prefetch_map(const tc_tmap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

/* Bulk tile stores and their bulk groups: one set for every kernel that stores through TMA (the persistent GEMM's
 * epilogue, tc_persistent.cuh, D38; the core's bulk stores, tilecore.bulk_store, D46; the register programs' output
 * tile, _tmastore.py, D45; docs/decisions.md D50).
 * A 2-D box of shared memory at `src` (the tensor map's box and swizzle) to the tensor at (c0 innermost, c1); the
 * box's parts outside the tensor are not written. Asynchronous: completes with the thread's bulk group. */
__device__ __forceinline__ void tc_tma_store_2d(const tc_tmap* map, unsigned src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map), "r"(src),
               "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void tc_tma_store_3d(const tc_tmap* map, unsigned src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ __forceinline__ void tc_tma_store_4d(const tc_tmap* map, unsigned src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void tc_tma_store_5d(const tc_tmap* map, unsigned src, int c0, int c1, int c2, int c3,
                                                int c4) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
               : "memory");
}
/* the thread's bulk stores issued since the last commit, as one bulk group */
__device__ __forceinline__ void tc_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* until at most N of this thread's bulk groups still read shared memory (.read) / are still running */
template <int N> __device__ __forceinline__ void tc_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void tc_bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
/* this thread's ordinary shared-memory writes, to the async proxy (before the barrier the store's issuer meets) */
__device__ __forceinline__ void tc_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
