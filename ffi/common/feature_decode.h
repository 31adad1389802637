// Decodes the optional feature operands and attributes (bias, mask, lengths,
// segment ids, window, soft cap, dropout) into AttentionParams::features,
// checking shapes and dtypes the Python layer already validated.
#pragma once

#include <string>

#include "common/ffi_decode.h"
#include "common/params.h"

namespace jax_flash {

// Bits of the `features` attribute: which optional operands are real (the
// others are placeholders, so every call has the same operand list).
enum FeatureBits : int32_t {
  kHasBias = 1,
  kHasMask = 2,
  kHasQSeqlens = 4,
  kHasKvSeqlens = 8,
  kHasSegments = 16,
  kDropoutShared = 32,  // one dropout mask for every batch entry and head
  kHasSegmentRanges = 64,  // block summaries of the segment ids (with kHasSegments)
  kHasPositionOffsets = 128,  // query positions shifted against the keys, per batch entry
  kHasMaskBlocks = 256,  // the block summary of a per-query mask (with kHasMask)
  kHasSinks = 512,  // attention sinks, [q's batch dims but the last..., num_heads] (forward)
};

// The optional operands and attributes, as the FFI delivers them.
struct FeatureOperands {
  const ffi::AnyBuffer& bias;
  const ffi::AnyBuffer& mask;
  const ffi::AnyBuffer& q_seqlens;
  const ffi::AnyBuffer& kv_seqlens;
  const ffi::AnyBuffer& q_segment_ids;
  const ffi::AnyBuffer& kv_segment_ids;
  const ffi::AnyBuffer& q_segment_ranges;   // [batch, ceil(seqlen_q / kSegmentBlock), 2]
  const ffi::AnyBuffer& kv_segment_ranges;  // [batch, ceil(seqlen_k / kSegmentBlock), 2]
  const ffi::AnyBuffer& dropout_seed;
  const ffi::AnyBuffer& position_offsets;  // [batch] int32
  const ffi::AnyBuffer& mask_blocks;  // uint8 [mask's lead and heads, ceil(T / 64), ceil(S / 64)]
  const ffi::AnyBuffer& sinks;        // the accumulator's float [q's batch dims but the last..., heads]
  int32_t features;
  int64_t window_left, window_right;
  double softcap, dropout_rate;
};

// Strides of an operand shaped [lead..., heads', rows', cols'] (each dim 1 or
// the full size) broadcast against q's [lead..., seqlen_q, heads, ...].
inline ffi::Error BroadcastOperand(const char* name, const ffi::AnyBuffer& buf,
                                   ffi::AnyBuffer::Dimensions q_dims, const AttentionShape& s,
                                   BroadcastStrides* st, int64_t* rows, int64_t* cols) {
  auto d = buf.dimensions();
  const size_t r = q_dims.size();
  if (d.size() != r) {
    return ffi::Error::InvalidArgument(std::string("jax_flash: ") + name + " has rank " +
                                       std::to_string(d.size()) + ", expected " + std::to_string(r));
  }
  const int64_t full[3] = {s.num_heads, s.seqlen_q, s.seqlen_k};
  int64_t stride = 1;
  int64_t strides[8] = {};
  for (size_t i = r; i-- > 0;) {
    const int64_t want = i + 3 >= r ? full[i + 3 - r] : q_dims[i];
    if (d[i] != 1 && d[i] != want) {
      return ffi::Error::InvalidArgument(std::string("jax_flash: ") + name + " shape " +
                                         DimsToString(d) + " does not broadcast");
    }
    strides[i] = d[i] == 1 ? 0 : stride;
    stride *= d[i];
  }
  for (size_t i = 0; i + 3 < r; ++i) st->batch[i] = strides[i];
  st->head = strides[r - 3];
  st->row = strides[r - 2];
  st->col = strides[r - 1];
  *rows = d[r - 2];
  *cols = d[r - 1];
  return ffi::Error::Success();
}

inline int64_t ElementCount(const ffi::AnyBuffer& b) { return int64_t(b.element_count()); }

// A per-query mask's block summary (kHasMaskBlocks): uint8, the mask's rank,
// its leading and head dims, then ceil(seqlen_q / kMaskBlock) x
// ceil(seqlen_k / kMaskBlock) entries; the mask must be per query and per
// key (rows seqlen_q, cols seqlen_k). Strides as the mask's broadcast (0
// along its size-1 dims).
inline ffi::Error DecodeMaskBlocks(const ffi::AnyBuffer& mask, const ffi::AnyBuffer& blocks,
                                   const AttentionShape& s, AttentionFeatures* f) {
  auto md = mask.dimensions();
  auto d = blocks.dimensions();
  const size_t r = md.size();
  const int64_t rows = (s.seqlen_q + kMaskBlock - 1) / kMaskBlock, cols = (s.seqlen_k + kMaskBlock - 1) / kMaskBlock;
  bool ok = blocks.element_type() == ffi::DataType::U8 && d.size() == r && r >= 3 && md[r - 2] == s.seqlen_q &&
            md[r - 1] == s.seqlen_k;
  for (size_t i = 0; ok && i + 2 < r; ++i) ok = d[i] == md[i];
  if (!ok || d[r - 2] != rows || d[r - 1] != cols)
    return ffi::Error::InvalidArgument("jax_flash: mask_blocks " + DimsToString(d) +
                                       " must be uint8, the mask's dims with ceil(T / 64) x ceil(S / 64) entries, "
                                       "for a mask " + DimsToString(md) + " of T x S pairs");
  BroadcastStrides& st = f->mask_blocks_stride;
  st.col = 1;
  st.row = cols;
  int64_t stride = rows * cols;
  st.head = md[r - 3] == 1 ? 0 : stride;
  stride *= d[r - 3];
  for (size_t i = r - 3; i-- > 0;) {
    st.batch[i] = md[i] == 1 ? 0 : stride;
    stride *= d[i];
  }
  f->mask_blocks = static_cast<const uint8_t*>(blocks.untyped_data());
  f->mask_block_rows = int32_t(rows);
  f->mask_block_cols = int32_t(cols);
  return ffi::Error::Success();
}

inline ffi::Error DecodeFeatures(const ffi::AnyBuffer& q, const FeatureOperands& o,
                                 AttentionParams* p, int64_t* bias_rows = nullptr,
                                 int64_t* bias_cols = nullptr) {
  AttentionFeatures& f = p->features;
  const AttentionShape& s = p->shape;
  auto qd = q.dimensions();
  f.num_batch_dims = int(qd.size()) - 3;
  if (f.num_batch_dims > kMaxBatchDims) {
    return ffi::Error::InvalidArgument("jax_flash: at most " + std::to_string(kMaxBatchDims) +
                                       " leading batch dims (nested vmap)");
  }
  for (int i = 0; i < f.num_batch_dims; ++i) f.batch_dims[i] = qd[i];
  const ffi::DataType acc =
      q.element_type() == ffi::DataType::F64 ? ffi::DataType::F64 : ffi::DataType::F32;
  int64_t rows = 1, cols = 1;
  if (o.features & kHasBias) {
    const ffi::DataType bt = o.bias.element_type();
    if (bt == acc) {
      f.bias_type = BiasType::kAccum;
    } else if (bt == q.element_type() && bt == ffi::DataType::F16) {
      f.bias_type = BiasType::kFloat16;
    } else if (bt == q.element_type() && bt == ffi::DataType::BF16) {
      f.bias_type = BiasType::kBFloat16;
    } else {
      return ffi::Error::InvalidArgument(
          "jax_flash: bias must be float32 (float64 for float64 inputs) or the query's 16-bit dtype");
    }
    if (auto e = BroadcastOperand("bias", o.bias, qd, s, &f.bias_stride, &rows, &cols); e.failure())
      return e;
    f.bias = o.bias.untyped_data();
  }
  if (bias_rows) *bias_rows = rows;
  if (bias_cols) *bias_cols = cols;
  if (o.features & kHasMask) {
    if (o.mask.element_type() != ffi::DataType::PRED)
      return ffi::Error::InvalidArgument("jax_flash: mask must be bool");
    int64_t mr, mc;
    if (auto e = BroadcastOperand("mask", o.mask, qd, s, &f.mask_stride, &mr, &mc); e.failure())
      return e;
    f.mask = static_cast<const uint8_t*>(o.mask.untyped_data());
    if (o.features & kHasMaskBlocks)
      if (auto e = DecodeMaskBlocks(o.mask, o.mask_blocks, s, &f); e.failure()) return e;
  }
  auto int32_operand = [&](const char* name, const ffi::AnyBuffer& b, int64_t count,
                           const int32_t** out) -> ffi::Error {
    if (b.element_type() != ffi::DataType::S32 || ElementCount(b) != count)
      return ffi::Error::InvalidArgument(std::string("jax_flash: ") + name + " must be int32 with " +
                                         std::to_string(count) + " elements");
    *out = static_cast<const int32_t*>(b.untyped_data());
    return ffi::Error::Success();
  };
  if (o.features & kHasQSeqlens)
    if (auto e = int32_operand("query_seq_lengths", o.q_seqlens, s.batch, &f.q_seqlens); e.failure())
      return e;
  if (o.features & kHasKvSeqlens)
    if (auto e = int32_operand("key_value_seq_lengths", o.kv_seqlens, s.batch, &f.kv_seqlens);
        e.failure())
      return e;
  if (o.features & kHasSegments) {
    if (auto e = int32_operand("q_segment_ids", o.q_segment_ids, s.batch * s.seqlen_q,
                               &f.q_segment_ids);
        e.failure())
      return e;
    if (auto e = int32_operand("kv_segment_ids", o.kv_segment_ids, s.batch * s.seqlen_k,
                               &f.kv_segment_ids);
        e.failure())
      return e;
    // The ids' block summaries (without them ids are checked per element).
    const int64_t q_blocks = (s.seqlen_q + kSegmentBlock - 1) / kSegmentBlock;
    const int64_t kv_blocks = (s.seqlen_k + kSegmentBlock - 1) / kSegmentBlock;
    if (o.features & kHasSegmentRanges) {
      if (auto e = int32_operand("q_segment_ranges", o.q_segment_ranges, s.batch * q_blocks * 2,
                                 &f.q_segment_ranges);
          e.failure())
        return e;
      if (auto e = int32_operand("kv_segment_ranges", o.kv_segment_ranges, s.batch * kv_blocks * 2,
                                 &f.kv_segment_ranges);
          e.failure())
        return e;
    }
  }
  if (o.features & kHasPositionOffsets)
    if (auto e = int32_operand("position_offsets", o.position_offsets, s.batch, &f.position_offsets);
        e.failure())
      return e;
  if (o.features & kHasSinks) {
    // [batch dims of q but the last (B)..., num_heads]: [N] unbatched, [V, N]
    // under vmap (broadcast_all), one row per B flat batch entries.
    auto d = o.sinks.dimensions();
    bool ok = o.sinks.element_type() == acc && int(d.size()) == f.num_batch_dims &&
              d[d.size() - 1] == s.num_heads;
    for (int i = 0; ok && i + 1 < f.num_batch_dims; ++i) ok = d[i] == qd[i];
    if (!ok)
      return ffi::Error::InvalidArgument("jax_flash: sinks " + DimsToString(d) +
                                         " must be the accumulator's float type (float32; float64 for float64 "
                                         "inputs) shaped [query's batch dims but the last..., heads] for query " +
                                         DimsToString(qd));
    f.sinks = o.sinks.untyped_data();
    f.sinks_group = qd[f.num_batch_dims - 1];
  }
  f.window_left = o.window_left;
  f.window_right = o.window_right;
  if (o.softcap < 0) return ffi::Error::InvalidArgument("jax_flash: logits_soft_cap must be > 0");
  f.softcap = o.softcap;
  if (o.dropout_rate < 0 || o.dropout_rate >= 1)
    return ffi::Error::InvalidArgument("jax_flash: dropout_rate must be in [0, 1)");
  f.dropout_rate = o.dropout_rate;
  if (o.dropout_rate > 0) {
    const int64_t n = ElementCount(o.dropout_seed);
    if (o.dropout_seed.element_type() != ffi::DataType::U32 || n < 2 || n % 2 != 0 ||
        s.batch % (n / 2) != 0)
      return ffi::Error::InvalidArgument("jax_flash: dropout seed must be uint32 [..., 2]");
    f.dropout_seed = static_cast<const uint32_t*>(o.dropout_seed.untyped_data());
    f.seed_count = n / 2;
    f.dropout_shared = (o.features & kDropoutShared) != 0;
  }
  return ffi::Error::Success();
}

// True when the call uses any optional feature (the CUDA kernels take none yet).
inline bool UsesFeatures(const AttentionFeatures& f) { return f.Any(); }

}  // namespace jax_flash
