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

}  // namespace jax_flash::cpu
