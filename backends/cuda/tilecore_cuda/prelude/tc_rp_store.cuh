/* The register programs' output tile through shared memory and TMA stores (regprog.py / _tmastore.py,
 * tilecore.cuda.attention_tma_store, docs/decisions.md D45); included only in kernels that call them. */
/* four 8x8 matrices of 16-bit elements: lane l gives the address of row l % 8 of matrix l / 8 and holds, in rK,
 * the pair at row l / 4, columns 2 (l % 4) and + 1 of matrix K (an accumulator pair, rounded) */
__device__ __forceinline__ void tc_rp_stmatrix_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
/* named barrier `id` over one warpgroup (128 threads): its rows all written */
__device__ __forceinline__ void tc_rp_wg_sync(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }
/* this thread's shared-memory writes, visible to the async proxy (the TMA unit) */
__device__ __forceinline__ void tc_rp_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* a box of shared memory to the tensor map's tensor at (c0 innermost, ...); parts outside the tensor are not
 * written. Asynchronous: completes with the thread's bulk group */
__device__ __forceinline__ void tc_rp_tma_store_2d(const tc_tmap* map, unsigned src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map), "r"(src),
               "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void tc_rp_tma_store_3d(const tc_tmap* map, unsigned src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ __forceinline__ void tc_rp_tma_store_4d(const tc_tmap* map, unsigned src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void tc_rp_tma_store_5d(const tc_tmap* map, unsigned src, int c0, int c1, int c2, int c3,
                                                   int c4) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
               : "memory");
}
__device__ __forceinline__ void tc_rp_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* until the thread's bulk groups have read shared memory (the block may then exit: the writes complete) */
__device__ __forceinline__ void tc_rp_bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
