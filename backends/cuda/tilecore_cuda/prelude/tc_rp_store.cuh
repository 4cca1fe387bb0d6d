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
/* (its TMA stores, bulk groups and proxy fence are tc_tma.cuh's: tc_tma_store_Nd, tc_bulk_commit,
 * tc_bulk_wait_read<0>, tc_fence_proxy_async; D50) */
