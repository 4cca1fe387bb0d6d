/* tilecore-cuda matrix stores (sm_90a, tilecore.matrix_stores, docs/decisions.md D51): four 8x8 matrices of 16-bit
 * elements from a warp's registers to shared memory; included only in kernels that have them.
 * device-only: begin */
/* lane l gives the address of row l % 8 of matrix l / 8 and holds in rK the pair at row l / 4, columns 2 (l % 4)
 * and + 1 of matrix K */
__device__ __forceinline__ void tc_stsm_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
/* a packed pair (either 16-bit float type's pair) as the 32-bit register stmatrix takes */
template <typename V> __device__ __forceinline__ unsigned tc_stsm_u32(const V& v) {
  return *reinterpret_cast<const unsigned*>(&v);
}
/* device-only: end */
