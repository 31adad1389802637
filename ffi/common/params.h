// Shapes, strides and pointers of one attention call, shared by the CPU and
// CUDA paths. Every tensor is BTNH ([batch, seq, heads, head_dim]) as in
// jax.nn.dot_product_attention; leading dims beyond the four (from vmap) are
// folded into `batch`. Strides are in elements so kernels never assume a
// layout beyond "head_dim is contiguous".
#pragma once

#include <cstdint>

// Members used by both host and device code.
#ifdef __CUDACC__
#define JAX_FLASH_HOST_DEVICE __host__ __device__
#else
#define JAX_FLASH_HOST_DEVICE
#endif

namespace jax_flash {

struct Strides {
  int64_t batch = 0;  // between consecutive batch entries
  int64_t row = 0;    // between consecutive sequence positions
  int64_t head = 0;   // between consecutive heads
};

// Strides of a contiguous [batch, seq, heads, head_dim] tensor.
inline Strides ContiguousBtnh(int64_t seq, int64_t heads, int64_t head_dim) {
  return Strides{seq * heads * head_dim, heads * head_dim, head_dim};
}

struct AttentionShape {
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t num_heads = 0;    // query heads (N)
  int64_t num_heads_k = 0;  // key/value heads (K); N % K == 0 (GQA/MQA)
  int64_t head_dim = 0;
  JAX_FLASH_HOST_DEVICE int64_t group() const { return num_heads / num_heads_k; }
};

// Positions per entry of the segment-id block summaries. Every kernel
// family's query and key blocks are multiples of it (CPU 64, sm80 64-128);
// a block that is not still gets a correct (wider) summary.
constexpr int64_t kSegmentBlock = 64;

// Positions per side of a boolean mask's block summary entry (MaskBlocks in
// mask_policy.h): kMaskBlock queries x kMaskBlock keys.
constexpr int64_t kMaskBlock = 64;

// Optional attention features (issue: bias, masks, lengths, segments, window,
// soft cap, dropout). A null pointer or a negative window side means "off".
constexpr int kMaxBatchDims = 4;  // leading dims of q (vmap adds some)

// Element strides of an operand broadcast against [batch..., heads, seq_q,
// seq_k] (bias, mask): 0 along a broadcast (size-1) dim.
struct BroadcastStrides {
  int64_t batch[kMaxBatchDims] = {};
  int64_t head = 0, row = 0, col = 0;
};

// The bias's element type: the accumulation type (float32, float64 for
// float64 inputs), or the 16-bit input dtype it was given in (only when it is
// the query's: attention.py up-casts any other). Kernels read it through a
// runtime switch rather than a template parameter, so a bias adds no
// instantiations; the value is added in the accumulation type either way.
enum class BiasType : int32_t { kAccum = 0, kFloat16 = 1, kBFloat16 = 2 };

struct AttentionFeatures {
  // Leading (batch) dims of q, so a flat batch index can be split into the
  // multi-index that broadcast strides need.
  int num_batch_dims = 1;
  int64_t batch_dims[kMaxBatchDims] = {1, 1, 1, 1};

  const void* bias = nullptr;  // of bias_type
  BiasType bias_type = BiasType::kAccum;
  BroadcastStrides bias_stride;
  // CUDA bias-gradient pass, one of the two (cuda/logit_features.cuh AddDbias):
  // float32 sums in the bias's shape, added by atomics (a broadcast bias;
  // zeroed first), or the dbias output itself, of bias_type, stored per
  // element (a bias of the full shape: one writer per element).
  float* dbias = nullptr;
  void* dbias_direct = nullptr;
  const uint8_t* mask = nullptr;  // bool, true = attend
  BroadcastStrides mask_stride;
  // A per-query mask's block summary (MaskBlocks in mask_policy.h), or null:
  // uint8 [lead|1..., heads|1, ceil(seqlen_q / kMaskBlock), ceil(seqlen_k /
  // kMaskBlock)], broadcast like the mask (mask_blocks_stride.row is the
  // entries per row, col 1); entry bit 0 (kMaskBlockSome) where some pair of
  // its kMaskBlock x kMaskBlock is visible, bit 1 (kMaskBlockAll) where every
  // one is. From one pass over the mask per call (_kernel_call.py), on the
  // GPU only.
  const uint8_t* mask_blocks = nullptr;
  BroadcastStrides mask_blocks_stride;
  int32_t mask_block_rows = 0, mask_block_cols = 0;
  // Attention sinks (gpt-oss), or null: one logit per query head in every
  // row's softmax denominator, with no value, in the accumulator's type
  // (float32; float64 for float64 inputs); [outer..., num_heads], one row
  // per sinks_group flat batch entries (vmap's broadcast_all gives the
  // operand the batch dims of q but the last). Forward epilogues only
  // (row_end.h): the backward takes the sink-inclusive out and lse. Not in
  // Any(): a sink changes no kernel choice.
  const void* sinks = nullptr;
  int64_t sinks_group = 1;
  const int32_t* q_seqlens = nullptr;       // [batch]
  const int32_t* kv_seqlens = nullptr;      // [batch]
  const int32_t* q_segment_ids = nullptr;   // [batch, seqlen_q]
  const int32_t* kv_segment_ids = nullptr;  // [batch, seqlen_k]
  // Block summaries of the ids (SegmentRanges in mask_policy.h): [batch,
  // ceil(seqlen / kSegmentBlock), 2] = (min, max) id of each kSegmentBlock
  // positions, from one small pass over the ids per call (attention.py); null
  // when not given (every block then checks ids per element).
  const int32_t* q_segment_ranges = nullptr;
  const int32_t* kv_segment_ranges = nullptr;
  int64_t window_left = -1, window_right = -1;  // key j visible iff i - left <= j <= i + right
  // [batch]: query row i sits at key position i + offset for causal and the
  // window (a shard of a ring, new tokens over a cache); null: offset 0
  // (top-left aligned, as jax.nn.dot_product_attention).
  const int32_t* position_offsets = nullptr;
  double softcap = 0.0;                         // > 0: logits = c * tanh(logits / c)
  double dropout_rate = 0.0;
  const uint32_t* dropout_seed = nullptr;  // [seed_count, 2]
  bool dropout_shared = false;  // the same mask for every batch entry and head
  int64_t seed_count = 1;

  // Whether anything beyond scale/causal is on (the CUDA dispatch and kernels
  // branch on it; feature_decode.h's UsesFeatures is the same question).
  JAX_FLASH_HOST_DEVICE bool Any() const {
    return bias || mask || q_seqlens || kv_seqlens || q_segment_ids || position_offsets ||
           window_left >= 0 || window_right >= 0 || softcap > 0 || dropout_rate > 0;
  }

  // Whether the features are the logit transforms alone (the soft cap,
  // dropout): nothing that hides pairs (lengths, segment ids, windows,
  // position offsets, a boolean mask) and no bias. The sm90 kernels run
  // those on the plain kernels' loops (kPlainSoftcap, kPlainDropout).
  JAX_FLASH_HOST_DEVICE bool OnlyTransforms() const {
    return !(bias || mask || q_seqlens || kv_seqlens || q_segment_ids || position_offsets || window_left >= 0 ||
             window_right >= 0);
  }

  // Offset of a broadcast operand for flat batch b and head h.
  JAX_FLASH_HOST_DEVICE int64_t BroadcastOffset(const BroadcastStrides& st, int64_t b,
                                                int64_t h) const {
    int64_t off = h * st.head;
    for (int d = num_batch_dims - 1; d >= 0; --d) {
      off += (b % batch_dims[d]) * st.batch[d];
      b /= batch_dims[d];
    }
    return off;
  }
};

// Pointers are untyped: the element type is a template parameter of the
// kernels, chosen once by the dispatch after the FFI handler. Pointers a pass
// does not use stay null. lse and delta are [batch, heads, seqlen_q] in the
// accumulation type: float32, or float64 for float64 inputs (CPU only).
struct AttentionParams {
  AttentionShape shape;
  Strides q_stride;  // shared by q, out, dout, dq (query-shaped tensors)
  Strides k_stride;  // shared by k, v, dk, dv (key-shaped tensors)

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  void* lse = nullptr;  // natural-log logsumexp of the scaled, masked logits

  // Backward only.
  const void* dout = nullptr;
  void* delta = nullptr;  // rowsum(dout * out), written by the backward
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  // CUDA fused backward: float32 dQ accumulator [batch, heads, seqlen_q,
  // head_dim] that key blocks add into atomically (scratch, zeroed first).
  float* dq_accum = nullptr;
  // CUDA sm90 forward, feature variants: an int32 zeroed on the stream
  // before the launch, from which the persistent grid takes its tiles after
  // each block's first (handlers.cu puts it in the decode scratch, which
  // those calls leave unused); null: the static schedule.
  int* tile_counter = nullptr;
  // Bitwise-reproducible gradients: no floating-point atomics (the CPU
  // backward always is; the CUDA one then runs a separate dQ pass).
  bool deterministic = false;

  AttentionFeatures features;

  double scale = 1.0;      // multiplies q.k before the softmax (double: exact for float64)
  bool is_causal = false;  // top-left aligned: query i sees keys j <= i

  // lse/delta index of (batch b, head h, query row i).
  JAX_FLASH_HOST_DEVICE int64_t row_stat_index(int64_t b, int64_t h, int64_t i) const {
    return (b * shape.num_heads + h) * shape.seqlen_q + i;
  }
};

// log2(e): kernels fold it into the scale and use exp2.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr double kLog2eF64 = 1.4426950408889634;
constexpr double kLn2F64 = 0.6931471805599453;

}  // namespace jax_flash
