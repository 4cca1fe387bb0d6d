/* tilecore-cuda: bulk tile copies shared by a block group (tilecore.group_multicast, docs/decisions.md D80). The
 * general path's loop in thread-block clusters: each block loads its part of a box's panels and multicasts it to
 * every block of the cluster (the same shared offset; each block's mbarrier at the same offset completes the bytes),
 * and a consumer releases a stage in every block of the cluster. */
__device__ __forceinline__ unsigned tc_group_rank() {
  unsigned r;
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));  /* not volatile: computed once, hoisted out of loops */
  return r;
}
__device__ __forceinline__ void tc_tma_load_group_2d(unsigned dst, const tc_tmap* map, unsigned bar, unsigned short mask,
                                                     int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst), "l"(map), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void tc_tma_load_group_3d(unsigned dst, const tc_tmap* map, unsigned bar, unsigned short mask,
                                                     int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst), "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(mask)
      : "memory");
}
/* every thread of the warp has arrived on its own block's `bar` (the caller's tc_mbar_arrive); one lane arrives for
 * the warp's 32 threads on the same barrier of the cluster's block `peer` (release at cluster scope: the warp's reads
 * of the stage, ordered by __syncwarp, before the peer's producer refills it) */
__device__ __forceinline__ void tc_mbar_arrive_peer_warp(unsigned bar, unsigned peer) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) {
    asm volatile(
        "{\n .reg .b32 tc_pb;\n mapa.shared::cluster.u32 tc_pb, %0, %1;\n"
        " mbarrier.arrive.shared::cluster.b64 _, [tc_pb], 32;\n}\n" ::"r"(bar), "r"(peer)
        : "memory");
  }
}
