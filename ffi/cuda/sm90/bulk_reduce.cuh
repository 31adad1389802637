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

}  // namespace jax_flash::cuda::sm90
