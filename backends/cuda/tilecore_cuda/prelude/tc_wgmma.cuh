/* ---- wgmma as a registered matrix unit (MatrixOp / MatrixSync from tilecore.passes.matrix; sm_90a) ----
 * Included only in kernels that issue one (the instructions do not exist below sm_90a). Operands the
 * instruction reads from shared memory are described by a matrix descriptor: the tile's start address,
 * the leading and stride byte offsets (LBO: between panels of an MN-major operand; SBO: between groups of
 * 8 rows) and the swizzle (1: 128-byte, 2: 64-byte, 3: 32-byte panels, tilecore.layout.SharedLayout with
 * panels=True). PTX ISA, "Matrix Descriptor Format" (wgmma). */
__device__ __forceinline__ unsigned long long tc_wg_desc(unsigned addr, unsigned lbo, unsigned sbo, unsigned mode) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
         ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32) | ((unsigned long long)mode << 62);
}
/* the threads' generic-proxy shared-memory writes (stores, cp.async) become visible to the async proxy the
 * instruction reads through; then wgmma.fence orders the accumulator and A registers */
__device__ __forceinline__ void tc_wg_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void tc_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void tc_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void tc_wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* keep the compiler from moving accumulator reads and writes across the asynchronous instructions */
template <int N> __device__ __forceinline__ void tc_wg_fence_regs(float* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
