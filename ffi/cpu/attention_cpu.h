// CPU forward/backward: blocked online softmax (FlashAttention-2 algorithm)
// with O(T) extra memory, multithreaded over (batch, head, block) tasks.
#pragma once

#include "common/params.h"

namespace jax_flash::cpu {

// Element is float, double, Float16 or BFloat16 (cpu/element.h).
template <typename Element>
void AttentionForward(const AttentionParams& p);

// Writes dq, dk, dv and delta = rowsum(dout * out).
template <typename Element>
void AttentionBackward(const AttentionParams& p);

// Dense shape of a bias as given (after padding to the query's rank).
struct BiasShape {
  int64_t num_elements = 0;
  int64_t rows = 1;  // 1 (broadcast over queries) or seqlen_q
  int64_t cols = 1;  // 1 (broadcast over keys) or seqlen_k
};

// Writes the bias gradient (in the bias's own shape and element type,
// p.features.bias_type, summed in the accumulation type over the dims it
// broadcasts along) and delta.
template <typename Element>
void AttentionBiasGradient(const AttentionParams& p, const BiasShape& bias_shape, void* dbias);

}  // namespace jax_flash::cpu
