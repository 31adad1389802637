// Shapes, pointers and the clamping rules of one paged-attention call
// (jax_flash.paged_attention), shared by every platform's handler. All
// tensors are contiguous; `outer` folds the leading dims that vmap adds.
//   query, out      [outer, batch, seqlen_q, num_heads, head_dim]
//   key/value cache [outer, num_blocks, block_size, num_heads_k, head_dim]
//   block_tables    [outer, batch, max_blocks] int32
//   seq_lengths     [outer, batch] int32 (keys of each sequence, new tokens included)
//   lse             [outer, batch, num_heads, seqlen_q] (float32; float64 for float64)
// Query t of sequence b sits at position len - seqlen_q + t and sees the
// keys at positions j with max(0, pos - window_left) <= j <= pos.
#pragma once

#include <cstdint>

#include "common/params.h"

namespace jax_flash {

struct PagedShape {
  int64_t outer = 1;  // product of the leading (vmapped) dims
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t num_heads = 0;    // query heads (N)
  int64_t num_heads_k = 0;  // key/value heads (K); N % K == 0
  int64_t head_dim = 0;
  int64_t num_blocks = 0;  // blocks in the pool
  int64_t block_size = 0;  // positions per block
  int64_t max_blocks = 0;  // entries per block table row
  JAX_FLASH_HOST_DEVICE int64_t group() const { return num_heads / num_heads_k; }
  // The longest sequence a table row can describe.
  JAX_FLASH_HOST_DEVICE int64_t max_seqlen() const { return max_blocks * block_size; }
  // The call as attention over outer * batch sequences of up to max_seqlen()
  // keys (what its error messages name).
  AttentionShape AsAttention() const {
    return AttentionShape{outer * batch, seqlen_q, max_seqlen(), num_heads, num_heads_k, head_dim};
  }
};

struct PagedParams {
  PagedShape shape;
  const void* q = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* seq_lengths = nullptr;
  void* out = nullptr;
  void* lse = nullptr;  // natural-log logsumexp of the scaled, capped, visible logits

  double scale = 1.0;
  double softcap = 0.0;         // > 0: logits = c * tanh(logits / c)
  int64_t window_left = -1;     // >= 0: keys older than pos - window_left are hidden

  // Sequence `seq` = outer index * batch + b. Tables and lengths come from
  // the device and cannot be checked at trace time, so they are clamped
  // rather than trusted: a length into [0, max_seqlen()], a block id into
  // [0, num_blocks). Nothing is ever read outside the pool.
  JAX_FLASH_HOST_DEVICE int64_t SeqLength(int64_t seq) const {
    const int64_t len = seq_lengths[seq];
    return len < 0 ? 0 : (len > shape.max_seqlen() ? shape.max_seqlen() : len);
  }
  JAX_FLASH_HOST_DEVICE int64_t BlockId(int64_t seq, int64_t logical_block) const {
    const int64_t id = block_tables[seq * shape.max_blocks + logical_block];
    return id < 0 ? 0 : (id >= shape.num_blocks ? shape.num_blocks - 1 : id);
  }
  // Element offset of (position j, key head hk) of sequence `seq` in a cache.
  JAX_FLASH_HOST_DEVICE int64_t CacheOffset(int64_t seq, int64_t j, int64_t hk) const {
    const int64_t o = seq / shape.batch;
    const int64_t block = o * shape.num_blocks + BlockId(seq, j / shape.block_size);
    return ((block * shape.block_size + j % shape.block_size) * shape.num_heads_k + hk) *
           shape.head_dim;
  }
  // Element offset of query / out row (t, h) of sequence `seq`.
  JAX_FLASH_HOST_DEVICE int64_t QueryOffset(int64_t seq, int64_t t, int64_t h) const {
    return ((seq * shape.seqlen_q + t) * shape.num_heads + h) * shape.head_dim;
  }
  JAX_FLASH_HOST_DEVICE int64_t LseIndex(int64_t seq, int64_t h, int64_t t) const {
    return (seq * shape.num_heads + h) * shape.seqlen_q + t;
  }
};

}  // namespace jax_flash
