// Bulk (non-tensor) asynchronous reduce-add from shared to global memory
// (cp.reduce.async.bulk, sm_90): the copy engine adds a contiguous run of
// float32 from shared memory into global memory, as one request per run
// instead of a red.global per element pair. Completion is tracked per
// issuing thread in bulk groups.
#pragma once

#include <cstdint>

namespace jax_flash::cuda::sm90 {

// global[0 .. bytes / 4) += shared[0 .. bytes / 4) (float32), atomically per
// element with other adders. `src` (shared address), `dst` and `bytes` must
// be multiples of 16.
__device__ __forceinline__ void BulkReduceAddF32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(src), "r"(bytes)
               : "memory");
}
// Closes the group of this thread's bulk operations issued since the last commit.
__device__ __forceinline__ void BulkCommit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most kPending of this thread's groups still read shared memory
// (their source may then be overwritten; the global writes may still run).
template <int kPending>
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Until at most kPending of this thread's groups are still running at all.
template <int kPending>
__device__ __forceinline__ void BulkWait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The deterministic backward's ordering of the reduce-adds into one
// accumulator block (bwd_kernel.cuh, DqOrder): an int32 counter in global
// memory per block, raised by each adder once its adds are complete; an
// adder issues its own only after the counter reached the arrivals of
// every adder before it.
//
// Spins (one thread) until *counter >= target: acquire loads at gpu scope,
// then a proxy fence, so that the bulk reduce-adds this thread issues next
// (async proxy) are ordered after the earlier adders' adds, which the
// counter's value published.
__device__ __forceinline__ void CounterWaitAtLeast(const int* counter, int target) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen < target);
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// One acquire load of *counter: whether it has reached `target` (then,
// as after CounterWaitAtLeast, CounterProxyFence before the adds).
__device__ __forceinline__ bool CounterReached(const int* counter, int target) {
  int seen;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  return seen >= target;
}
__device__ __forceinline__ void CounterProxyFence() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
// By the thread that issued the adds, after BulkWait<0>() (its groups
// complete, not only read): a proxy fence (the async proxy's writes before
// the generic release), then *counter += 1 with release semantics.
__device__ __forceinline__ void CounterArriveAfterBulk(int* counter) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

}  // namespace jax_flash::cuda::sm90
