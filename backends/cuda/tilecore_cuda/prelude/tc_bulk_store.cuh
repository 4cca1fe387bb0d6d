/* tilecore-cuda bulk tile stores (sm_90a, tilecore.bulk_store, docs/decisions.md D46): a shared tile to a box of a
 * global tensor by TMA, in bulk groups of the issuing thread.
 * device-only: begin */
/* one box (the tensor map's box and swizzle) from shared memory at `src` to the tensor at {c0, c1}; elements outside
 * the tensor are not written. Asynchronous: completes with the thread's bulk group (tc_bs_commit) */
__device__ __forceinline__ void tc_bs_store_2d(const void* map, unsigned src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map), "r"(src),
               "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void tc_bs_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* until at most N of this thread's bulk groups still read shared memory (.read) / are still running */
template <int N> __device__ __forceinline__ void tc_bs_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void tc_bs_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
/* this thread's ordinary shared-memory writes, to the async proxy (before the barrier the store's issuer meets) */
__device__ __forceinline__ void tc_bs_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* device-only: end */
