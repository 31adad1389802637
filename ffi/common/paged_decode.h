// Turns the FFI buffers of a paged-attention call into PagedParams, checking
// what Python already validated (jax_flash/paged.py): a mismatch here is an
// ffi::Error, never an out-of-bounds read. Block ids and lengths are values,
// not shapes, so they are clamped by PagedParams instead.
#pragma once

#include <string>

#include "common/ffi_decode.h"
#include "common/paged_params.h"

namespace jax_flash {

inline ffi::Error BuildPagedParams(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k_cache,
                                   const ffi::AnyBuffer& v_cache,
                                   const ffi::AnyBuffer& block_tables,
                                   const ffi::AnyBuffer& seq_lengths, const ffi::AnyBuffer& out,
                                   const ffi::AnyBuffer& lse, double scale, double softcap,
                                   int64_t window_left, PagedParams* p) {
  auto qd = q.dimensions(), kd = k_cache.dimensions(), vd = v_cache.dimensions();
  auto td = block_tables.dimensions(), ld = seq_lengths.dimensions();
  const size_t r = qd.size();
  auto error = [&](const std::string& what) {
    return ffi::Error::InvalidArgument(
        "jax_flash paged attention: " + what + " (query " + DimsToString(qd) + ", key_cache " +
        DimsToString(kd) + ", value_cache " + DimsToString(vd) + ", block_tables " +
        DimsToString(td) + ", key_value_seq_lengths " + DimsToString(ld) + ")");
  };
  if (r < 4 || kd.size() != r || vd.size() != r || td.size() != r - 2 || ld.size() != r - 3)
    return error("ranks must be [..., B, Tq, N, H], [..., blocks, block_size, K, H] x 2, "
                 "[..., B, max_blocks], [..., B]");
  PagedShape& s = p->shape;
  s.outer = 1;
  for (size_t i = 0; i + 4 < r; ++i) {
    if (kd[i] != qd[i] || vd[i] != qd[i] || td[i] != qd[i] || ld[i] != qd[i])
      return error("leading (vmapped) dims differ");
    s.outer *= qd[i];
  }
  s.batch = qd[r - 4];
  s.seqlen_q = qd[r - 3];
  s.num_heads = qd[r - 2];
  s.head_dim = qd[r - 1];
  s.num_blocks = kd[r - 4];
  s.block_size = kd[r - 3];
  s.num_heads_k = kd[r - 2];
  s.max_blocks = td[r - 3];
  for (size_t i = r - 4; i < r; ++i)
    if (vd[i] != kd[i]) return error("value_cache must have key_cache's shape");
  if (kd[r - 1] != s.head_dim) return error("cache head dim differs from the query's");
  if (td[r - 4] != s.batch || ld[r - 4] != s.batch) return error("batch sizes differ");
  if (s.num_heads_k <= 0 || s.num_heads % s.num_heads_k != 0)
    return error("key heads must divide query heads");
  if (s.seqlen_q <= 0 || s.head_dim <= 0 || s.num_blocks <= 0 || s.block_size <= 0 ||
      s.max_blocks <= 0)
    return error("empty query, head dim, pool, block or table");
  if (k_cache.element_type() != q.element_type() || v_cache.element_type() != q.element_type())
    return error("caches must have the query's dtype");
  if (block_tables.element_type() != ffi::DataType::S32 ||
      seq_lengths.element_type() != ffi::DataType::S32)
    return error("block_tables and key_value_seq_lengths must be int32");
  if (auto e = ExpectSameShape("out", out, qd); e.failure()) return e;
  if (out.element_type() != q.element_type())
    return ffi::Error::InvalidArgument("jax_flash paged attention: out dtype != query dtype");
  const ffi::DataType stats =
      q.element_type() == ffi::DataType::F64 ? ffi::DataType::F64 : ffi::DataType::F32;
  auto sd = lse.dimensions();
  const bool lse_ok = lse.element_type() == stats && sd.size() == r - 1 &&
                      int64_t(lse.element_count()) ==
                          s.outer * s.batch * s.num_heads * s.seqlen_q &&
                      sd[r - 3] == s.num_heads && sd[r - 2] == s.seqlen_q;
  if (!lse_ok)
    return ffi::Error::InvalidArgument(
        "jax_flash paged attention: lse must be [..., B, N, Tq] float32 (float64 for float64), "
        "got " + DimsToString(sd));
  if (!(softcap >= 0)) return error("logits_soft_cap must be > 0");
  p->q = q.untyped_data();
  p->k_cache = k_cache.untyped_data();
  p->v_cache = v_cache.untyped_data();
  p->block_tables = static_cast<const int32_t*>(block_tables.untyped_data());
  p->seq_lengths = static_cast<const int32_t*>(seq_lengths.untyped_data());
  p->out = out.untyped_data();
  p->lse = lse.untyped_data();
  p->scale = scale;
  p->softcap = softcap;
  p->window_left = window_left < 0 ? -1 : window_left;
  return ffi::Error::Success();
}

}  // namespace jax_flash
