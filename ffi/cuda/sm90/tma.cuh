// Tensor memory accelerator (cp.async.bulk.tensor), mbarriers, named
// barriers and register reallocation (sm_90 / sm_90a), as thin wrappers.
// One thread issues a tile copy; its completion is the transaction count of
// an mbarrier, which consumers wait on by phase parity.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: nothing links libcuda)

#include <cstdint>

namespace jax_flash::cuda::sm90 {

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// --- mbarrier --------------------------------------------------------------

__device__ __forceinline__ void MbarrierInit(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes initialized barriers visible to the async proxy (TMA) and to the
// other threads (with the __syncthreads that follows).
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of transactions (the TMA copies
// issued next) for the current phase.
__device__ __forceinline__ void MbarrierArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void MbarrierArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Blocks until the phase of parity `parity` has completed. A fresh barrier
// is in phase 0, and waiting for parity 1 (the phase "before" it) returns at
// once: producers wait on empty barriers starting from parity 1.
__device__ __forceinline__ void MbarrierWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_AGAIN:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_AGAIN;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// --- TMA -------------------------------------------------------------------

__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Copies the box at coordinates (c0 innermost .. c3) of a 4-D tensor map
// into shared memory at `dst`, completing `bytes` of the mbarrier `bar`'s
// transactions. Elements outside the tensor arrive as zeros (and count).
__device__ __forceinline__ void TmaLoad4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0,
                                          int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Copies the box at `src` in shared memory to coordinates (c0 innermost ..
// c3) of a 4-D tensor map, as a bulk group of this thread (commit and wait
// with bulk_reduce.cuh's BulkCommit / BulkWaitRead); elements outside the
// tensor are not written.
__device__ __forceinline__ void TmaStore4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// Orders this thread's generic-proxy shared-memory accesses before later
// async-proxy ones (TMA, wgmma) that a barrier makes them precede.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// --- named barriers and registers ------------------------------------------

// bar.sync on barrier `id` (1..15; 0 is __syncthreads) among `threads`.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The same, for a barrier whose warps reach it from different instructions
// (the 256 backward's operand split: warpgroup 0's step and warpgroup 1's
// are different code). bar.sync and bar.arrive are barrier's .aligned
// forms, which require every thread taking part to execute the same
// instruction (PTX ISA); compute-sanitizer's synccheck reports the
// difference as "Divergent thread(s) in block".
__device__ __forceinline__ void NamedBarrierSyncAcrossRoles(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarrierArriveAcrossRoles(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The warpgroup's per-thread register count (every thread of the warpgroup
// executes it). Takes effect only in a kernel with a register cap at entry
// (__launch_bounds__(threads, 1)).
template <int kRegisters>
__device__ __forceinline__ void RegistersDecrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void RegistersIncrease() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace jax_flash::cuda::sm90
