/* Named barriers (bar.sync / bar.arrive, sm_70+): barrier `id` (1..15; 0 is __syncthreads) completes when
 * `count` threads (a multiple of 32) have arrived; tc_named_sync arrives and waits, tc_named_arrive arrives
 * and goes on. The register programs' ping-pong passes the consumers' turns on the tensor cores this way. */
__device__ __forceinline__ void tc_named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void tc_named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
