// CPU forward of paged attention: queries over a KV cache stored as a pool of
// fixed-size blocks, walked through each sequence's block table.
#pragma once

#include "common/paged_params.h"

namespace jax_flash::cpu {

// Element is float, double, Float16 or BFloat16 (cpu/element.h). Writes out and lse.
template <typename Element>
void PagedAttentionForward(const PagedParams& p);

}  // namespace jax_flash::cpu
