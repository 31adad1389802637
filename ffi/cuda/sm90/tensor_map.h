// Host side of TMA: CUtensorMap for a BTNH tensor, encoded through the
// driver entry point that the CUDA runtime hands out (the extension links
// cudart statically and must not link libcuda).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <cstdint>
#include <string>

#include "common/params.h"

namespace jax_flash::cuda::sm90 {

// cuTensorMapEncodeTiled from the driver, looked up once (null if missing).
inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A 4-D map over [batch, seq, heads, head_dim] (dims innermost first: head
// dim, seq, heads, batch), boxes of [box_rows][64] elements with the 128-byte
// swizzle; reads outside the tensor (the sequence tail, head-dim padding)
// fill zeros. `what` names the operand in errors.
inline std::string EncodeBtnhMap(CUtensorMap* map, CUtensorMapDataType type, const void* base,
                                 int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                 const Strides& stride, int box_rows, const char* what) {
  auto encode = TensorMapEncoder();
  if (encode == nullptr) return "jax_flash: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)";
  constexpr int64_t kBytes = 2;  // 16-bit elements
  // A size-1 dim's stride is never used, but TMA still wants a multiple of
  // 16 (vmap or a slice may hand over anything there).
  auto stride_of = [&](int64_t size, int64_t elements, int64_t fallback) {
    const int64_t bytes = elements * kBytes;
    return size == 1 && (bytes <= 0 || bytes % 16 != 0) ? fallback : bytes;
  };
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(seq), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {
      cuuint64_t(stride_of(seq, stride.row, 16)),
      cuuint64_t(stride_of(heads, stride.head, 16)),
      cuuint64_t(stride_of(batch, stride.batch, 16)),
  };
  for (cuuint64_t st : strides)
    if (st % 16 != 0 || st >= (cuuint64_t(1) << 40))
      return std::string("jax_flash: the sm90 forward needs ") + what +
             "'s strides in bytes to be multiples of 16 below 2^40";
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(map, type, 4, const_cast<void*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return std::string("jax_flash: encoding the sm90 forward's tensor map of ") + what +
           " failed (CUresult " + std::to_string(int(r)) + ")";
  return {};
}

}  // namespace jax_flash::cuda::sm90
