// FlashAttention backward for Hopper (sm_90a), float16/bfloat16, plain and
// causal, GQA, and in its feature variants (Features, kernel_traits.cuh)
// lengths, windows, position offsets, segment ids, the soft cap, an
// additive bias and dropout (kMasksDropout, and kPlainDropout on the plain
// steps: dropout.cuh's keep bits, made two steps ahead under dK by the two
// warps of a pair, half each, through KeepExchange; dS = P (Z dP - delta),
// dV from the kept P, scaled at its store):
// FlashAttention-3's structure (warp specialization, TMA ring,
// wgmma, S^T = K Q^T so that P^T and dS^T come out as the A operands of dV
// and dK) in our own code. Runs between sm80's DeltaAndClearKernel (delta =
// rowsum(dO * O), the float32 dQ accumulator zeroed) and DqConvertKernel
// (dQ = scale * accumulator in the input dtype); bwd_launch.cuh.
//
// One block per tile (128 keys, key head, batch), three warpgroups:
//
//   warpgroup 0 (producer, 24 registers):
//     thread 0: K, V of the tile once -> kv_full; then for each step (query
//       head g of the key head's group, query block m that sees the tile;
//       causal: m from the diagonal down), into stage s = step % 2:
//       wait empty[s]; Q -> q_full[s]; dO -> do_full[s]
//     warp 1: per step, wait empty[s]; lse (log2 units) and delta of the 64
//       queries into shared memory; each lane arrives on do_full[s]
//   warpgroups 1, 2 (consumers, 240 registers), 64 keys each; per step:
//     S^T = K Q^T (wgmma, smem x smem); [kEarlyS: the previous step's dQ
//     share sent here, under S^T]; dP^T = V dO^T; P^T = exp2(S^T scale
//     log2(e) - lse2) while dP^T runs, dS^T = P^T (dP^T - delta), both to
//     16-bit A fragments; dV += P^T dO, dK += dS^T Q (wgmma, registers x
//     smem, in registers over all steps); dS^T to shared memory (named
//     barrier); dQ_share = dS K (wgmma, smem x smem, both operands MN-major);
//     wait; arrive empty[s]; [kSerial: dQ_share sent here]. Sending: the
//     share through shared memory into the float32 accumulator by bulk
//     reduce-adds (below). [Candidates kLeanDq / kLeanDqEarlyDp: kEarlyS
//     with a constant-offset send for full steps (SendDqFull), the latter
//     placed after dP^T's issue; bwd_kernel_traits.cuh.] [Session 17's
//     candidates, kDqFirst and those built on it: after the dS^T stores,
//     dV issued; barrier; dQ_share, then dK issued; wait for dV and dQ;
//     dQ_share sent under dK; wait; arrive empty[s] (nothing in flight
//     between steps). Uniform-descriptor, diagonal-mask and counter
//     variants: bwd_kernel_traits.cuh.]
//   Epilogue: dK * scale and dV straight from registers to global memory in
//   the input dtype (once per tile).
//
// Why dQ goes through shared memory and cp.reduce.async.bulk rather than
// red.global.add.f32 from registers: the accumulator's blocked layout
// (sm80/dq_accum.cuh) makes each 8-row group of a warpgroup's 64-column
// share one contiguous run (8 rows x 64 columns: 2 KiB), so the share is 8
// bulk requests (2 per warp) instead of 2048 float2 reds (16 per thread),
// the issue slots and registers of the consumers stay free (the copy engine
// runs it while the next step's products run), and the existing sm80
// accumulator clear and conversion serve unchanged. The non-tensor bulk
// form needs no tensor map over the blocked layout (whose last partial
// group is row-major); cp.reduce.async.bulk.tensor would.
//
// Feature variants (kMasks, kMasksSoftcap; feature_mask.cuh): a tile's steps
// are the query blocks that may see its keys (FeatureQueryBlocks: the mask
// policy's query range, trimmed by the segment-id summaries), so no step is
// empty of pairs by those bounds; per step and warp, the visibility bits of
// the thread's pairs are computed while S^T runs (FeatureStepMask:
// ~0u, no element work, where the warp's keys x the step's queries need no
// check) and applied as selects. kMasksSoftcap recomputes the forward's
// probabilities (the same raw-unit formula and tanh) and multiplies dS by
// the tanh's derivative, as sm80's backward (LogitFeatures::ChainSoftcap).
// kMasksBias / kMasksBias16 (dispatched since session 20; dQ-first
// schedules) add a float32 / 16-bit bias as the
// forward does: bias / scale in S^T's accumulators before S^T = K Q^T adds
// q.k (BiasColumns, feature_mask.cuh; loaded a step ahead, under the
// previous step's dK), so P is the forward's and dS is the plain one (the
// bias gradient is the separate dbias pass's).
// The bias gradient alone (BiasGradientKernel, the bias variants' dbias
// pass, dispatched since session 20): the same producer, tiles and steps; per step
// the consumers run S^T (with the bias) and dP^T, P^T and dS^T, and write
// dS^T into the bias gradient from registers (StoreBiasGradient: float32
// atomic adds for a broadcast bias, stores of the bias's type for a full
// one); no dV, dK, dQ, no named barrier, no dS^T tile, no epilogue. The
// next step's bias is loaded under S^T and dP^T (no dK to hide it under).
// A tile with no step copies nothing and waits on no barrier: its consumers
// write dK = dV = 0 (its keys are seen by no query).
//
// Barrier phases: step i uses stage i % 2 in parity (i / 2) & 1 on q_full,
// do_full and empty; producers wait on empty from parity 1 (a fresh barrier
// counts its previous phase as done, pipeline.cuh). kv_full is used once
// (parity 0). Named barriers: kDsBarrier (both consumer warpgroups: every
// dS^T of a step written, at 128, and at 64 with 128-query steps) and
// kStageBarrier + warpgroup (one warpgroup: its dS^T written, at 64). The
// dQ staging needs only warp syncs (each warp stages and sends its own
// rows). The dropout variants' keep-bit exchange (KeepExchange) rides on
// the same per-step barrier, plus one of the same kind before the first
// step (the first two steps' bits), reached by every consumer thread of a
// tile with steps.
//
// 128-query steps (the Rows128 schedules, head dim 64: the plain default
// there; with features a check-program candidate, bwd_kernel_traits.cuh):
// the feature variants' steps are FeatureQueryBlocks<128, 128>'s and each
// thread's visibility bits a 64-bit word (FeatureStepMask<128>); the rest
// as below. S^T and dP^T are [64 keys x 128 queries]
// per warpgroup (N = 128), dV and dK take 8 k16 steps of 16 queries, dS^T
// is two 64-query chunks, and warpgroup w's dQ product is the step's
// queries 64 w .. + 63 over all 128 keys (dS^T chunk w x the whole K), so
// each dQ row is reduced once. The protocol is the 128 head dim's, with
// the same barriers in the same order: every consumer warp runs the same
// steps (both derive them from BwdSteps), reaches kDsBarrier exactly once
// per step (256 threads: only the two consumer warpgroups, never the
// producer, which waits on mbarriers only) and arrives on empty[s] once
// per step after its last read of stage s; no consumer waits on anything
// the other consumer signals except kDsBarrier, which both reach
// unconditionally, so no cycle of waits exists. The dS^T double buffer
// holds as at 128: a warpgroup writing step i + 1's buffer (that of step
// i - 1) has passed step i's kDsBarrier, which the other warpgroup reached
// only after its step i - 1 dQ product had completed (wgmma wait before
// step i).
#pragma once

#include <cuda.h>
#include <math_constants.h>

#include <cstdint>
#include <type_traits>

#include "common/params.h"
#include "cuda/row_stats.cuh"
#include "cuda/sm90/bias_tiles.cuh"
#include "cuda/sm90/bulk_reduce.cuh"
#include "cuda/sm90/bwd_kernel_traits.cuh"
#include "cuda/sm90/dropout.cuh"
#include "cuda/sm90/feature_mask.cuh"  // Features, FeatureQueryBlocks, FeatureStepMask
#include "cuda/sm90/pipeline.cuh"  // LoadTile, KMajorDescriptor, PrefetchTensorMap
#include "cuda/sm90/softmax.cuh"   // OnlineSoftmax::ToFragments
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace jax_flash::cuda::sm90 {

// What the kernel reads besides the tensor maps.
struct BackwardArgs {
  void* dk;  // [B, Tk, K, H] strided like k
  void* dv;  // [B, Tk, K, H] strided like k
  const float* lse;    // [B, N, Tq], natural log
  const float* delta;  // [B, N, Tq]
  float* dq_accum;     // [B, N, Tq, H] floats in sm80's blocked layout (dq_accum.cuh)
  Strides k_stride;
  int batch, seqlen_q, seqlen_k, num_heads, num_heads_k, group, head_dim;
  int key_blocks;    // ceil(seqlen_k / kBlockN)
  float scale_log2;  // scale * log2(e), scale > 0
  float scale;
  bool is_causal;
  // The soft cap on raw q.k (kMasksSoftcap; SoftcapFactors): x ->
  // softcap_unscale * tanh(softcap_scale * x). Last, so that the plain
  // kernel's argument offsets stay as they were.
  float softcap_scale, softcap_unscale;
  // Causal calls: (batch, key head) pairs per section of the tile order
  // (BwdTile); 0: one section of every pair (the order before session 20).
  // The launch sizes it (BackwardCausalSection, bwd_launch.cuh) or the
  // caller forces it; the bias-gradient pass keeps 0 (BiasGradientTileIndex
  // permutes that order).
  int causal_section;
  // The deterministic variant's causal calls (session 21): dQ's adds into
  // each query block, and each pair's tiles in BwdTile's order, in
  // descending key block order (DqOrder); false elsewhere.
  bool keys_descending;
  // kMasksDropout: FragmentDropout's threshold_high and keep_scale
  // (dropout.cuh), constants of the launch, so that the loop holds no
  // register for them.
  uint32_t dropout_threshold_high;
  float dropout_keep_scale;
};

constexpr int kDsBarrier = 1;
constexpr int kStageBarrier = 2;  // + consumer warpgroup

// The dynamic shared memory of a backward variant: the traits', and the
// dropout variants' keep-bit exchange or kMasksBiasTiles's tile past it.
template <typename Tr, Features kFeatures>
constexpr int BackwardVariantSmemBytes() {
  // (Not instantiated otherwise; at 256 the query halves make their own bits.)
  if constexpr (AppliesDropout(kFeatures) && Tr::kHeadDim <= 128) return KeepExchange<Tr>::kSmemBytes;
  else if constexpr (kFeatures == Features::kMasksBiasTiles) return BwdBiasTile<Tr>::kSmemBytes;
  else return Tr::kSmemBytes;
}

// The tile of block `tile`. Causal: key blocks outermost from the first
// (it sees every query block: the heaviest tiles launch first, the light
// ones fill the end), over sections of a.causal_section consecutive
// (batch, key head) pairs, flat as b * num_heads_k + hk, one section after
// the other (the forward's L2-aware sections, tile_scheduler.cuh: the ~132
// blocks in flight then read the Q, dO and dQ rows of one section's heads,
// which stay in L2; with one section of all pairs they belong to ~132
// heads and each block re-reads its rows from HBM: at B = 4, N = 32, H = 64,
// T = 4096, 72% of HBM's bandwidth and a 30% L2 hit rate under ncu, against
// 5% and 94% non-causal, session 20). The last section may hold fewer
// pairs. Otherwise a head's key blocks are consecutive, so blocks running
// together share its Q, dO and dQ rows in L2. Computed once per block (the
// grid is one block per tile): plain divisions.
// kSectionsAlways (the deterministic variant, DeterministicBackwardKernel):
// the sectioned order for non-causal calls too, where a.causal_section
// asks for it, so that a head's consecutive key blocks, whose dQ adds into
// a query block run one after the other (DqOrder), start a section's pairs
// apart rather than side by side. Every order here has key block n of a
// (batch, key head) pair at a higher tile index than n - 1, or, with
// a.keys_descending (kSectionsAlways only), at a lower one than n - 1 (each
// section's key blocks then run from the last, light first): DqOrder's
// waits are on lower indices only.
struct BwdTile {
  int n_block, hk, b;
  // (__host__ too: tests/cpp/sm90_bwd_tile_test.cu checks the orders on the host.)
  template <bool kSectionsAlways = false>
  __host__ __device__ BwdTile(const BackwardArgs& a, int tile, std::bool_constant<kSectionsAlways> = {}) {
    int rest;
    const int pairs = a.num_heads_k * a.batch;
    if ((kSectionsAlways || a.is_causal) && a.causal_section > 0 && a.causal_section < pairs) {
      const int first = tile / (a.causal_section * a.key_blocks) * a.causal_section;  // the section's first pair
      const int count = a.causal_section < pairs - first ? a.causal_section : pairs - first;
      const int local = tile - first * a.key_blocks;
      n_block = local / count;
      rest = first + local % count;
    } else if (a.is_causal) {
      n_block = tile / pairs;
      rest = tile % pairs;
    } else {
      n_block = tile % a.key_blocks;
      rest = tile / a.key_blocks;
    }
    hk = rest % a.num_heads_k;
    b = rest / a.num_heads_k;
    if (kSectionsAlways && a.keys_descending) n_block = a.key_blocks - 1 - n_block;
  }
};

template <typename Tr>
struct BwdBarriers {
  uint32_t base;
  __device__ uint32_t kv_full() const { return base; }
  __device__ uint32_t q_full(int s) const { return base + 8 * (1 + s); }
  __device__ uint32_t do_full(int s) const { return base + 8 * (1 + Tr::kStages + s); }
  // Stage s free again: every consumer thread is past its step's products
  // and its loads of the stage's row statistics (one arrival per thread:
  // each releases its own plain loads to the producer warp that overwrites
  // them. With one arrival per warp after a __syncwarp, which ptxas
  // reduces to a NOP in converged code, compute-sanitizer's racecheck
  // reported those loads against the next stores, session 19).
  __device__ uint32_t empty(int s) const { return base + 8 * (1 + 2 * Tr::kStages + s); }

  // By one thread, before the __syncthreads that publishes them. do_full
  // takes the TMA thread's arrival (with dO's bytes) and one per lane of the
  // warp that stages lse and delta, and, where `step_classes` (the
  // mask-policy variants), one per lane of the warp that classes the
  // consumer warps' steps (StageStepClasses).
  __device__ void Init(bool step_classes = false) const {
    MbarrierInit(kv_full(), 1);
    for (int s = 0; s < Tr::kStages; ++s) {
      MbarrierInit(q_full(s), 1);
      MbarrierInit(do_full(s), 1 + 32 + (step_classes ? 32 : 0));
      MbarrierInit(empty(s), 32 * Tr::kConsumerWarps);
    }
    FenceBarrierInit();
  }
};

// The steps of a tile: query heads of the key head's group outermost, then
// the query blocks that see the tile's keys (causal: those whose last query
// reaches the first key, n0 = kBlockN * n_block).
template <typename Tr>
struct BwdSteps {
  int m_first, m_count, count;
  __device__ BwdSteps(const BackwardArgs& a, int n_block) {
    const int m_blocks = (a.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM;
    m_first = a.is_causal ? min(n_block * Tr::kBlockN / Tr::kBlockM, m_blocks) : 0;
    m_count = m_blocks - m_first;
    count = m_count * a.group;
  }
  // Feature variants: query blocks [blocks.lo, blocks.hi) (FeatureQueryBlocks).
  __device__ BwdSteps(KeyBlocks blocks, int group)
      : m_first(blocks.lo), m_count(blocks.hi - blocks.lo), count((blocks.hi - blocks.lo) * group) {}
  // Tile `tile`'s steps: the mask-policy variants' (kPolicy) from
  // FeatureQueryBlocks, which is warp-collective: every warp calls this,
  // before the roles split, so that every role derives the same steps and
  // their phases agree.
  template <bool kPolicy>
  __device__ static BwdSteps ForTile(const BackwardArgs& a, const AttentionParams& p, const BwdTile& tile) {
    if constexpr (kPolicy)
      return BwdSteps(FeatureQueryBlocks<Tr::kBlockM, Tr::kBlockN>(p, tile.n_block * Tr::kBlockN, tile.hk * a.group,
                                                                   tile.b, a.group),
                      a.group);
    else
      return BwdSteps(a, tile.n_block);
  }
  __device__ int m0(int i) const { return (m_first + i % m_count) * Tr::kBlockM; }
  __device__ int head(int i, int hk, int group) const { return hk * group + i / m_count; }
};

// MN-major descriptor (wgmma.cuh) of a tile's rows from `rows` on, k16 step
// kk (16 rows of 128 bytes); `chunk_bytes`: its 64-column chunks' stride.
__device__ __forceinline__ uint64_t MnMajorDescriptor(uint32_t rows, int chunk_bytes, int kk) {
  return SmemDescriptor(rows + kk * 16 * 128, chunk_bytes, 1024);
}

// acc [64 keys][kN queries] (+)= X Y^T over the head dim, issued (not
// committed): X the 64 rows of a K or V tile from `keys`, Y kN rows of a Q
// or dO stage from `rows`, both K-major (column chunks kKvChunkBytes /
// kQChunkBytes apart). S^T = K Q^T and dP^T = V dO^T in every backward
// kernel. The first k16 step overwrites acc unless kAccumulate (a bias
// already in it); kUniform: the descriptors as one base plus constant
// offsets (BwdUniformDescriptors), else one SmemDescriptor per step.
template <typename Tr, typename Element, int kN, bool kAccumulate = false, bool kUniform = true>
__device__ __forceinline__ void KeysTimesRowsT(float (&acc)[kN / 2], uint32_t keys, uint32_t rows) {
  if constexpr (kUniform) {
    const UniformDescriptor x(keys, 16, 1024), y(rows, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < Tr::kHeadDim / 16; ++kk)
      WgmmaSS<Element, kN>(acc, x.At(KMajorOffset(Tr::kKvChunkBytes, kk)), y.At(KMajorOffset(Tr::kQChunkBytes, kk)),
                           kAccumulate || kk > 0 ? 1 : 0);
  } else {
#pragma unroll
    for (int kk = 0; kk < Tr::kHeadDim / 16; ++kk)
      WgmmaSS<Element, kN>(acc, KMajorDescriptor<Tr>(keys, Tr::kKvChunkBytes, kk),
                           KMajorDescriptor<Tr>(rows, Tr::kQChunkBytes, kk), kAccumulate || kk > 0 ? 1 : 0);
  }
}

// The uniform-descriptor schedules (BwdUniformDescriptors): a product's
// descriptors as one base per operand plus constant byte offsets
// (wgmma.cuh's UniformDescriptor, KMajorOffset, MnMajorOffset).

// Thread 0 of the producer: the tile's K and V, then Q and dO per step.
// kBiasTiles (kMasksBiasTiles): then the step's bias tile (BwdBiasTile, from
// `bias_map` at batch row `bias_b`, at the step's head where
// `bias_per_head`, else 0), whose wait (every consumer's read of the step
// before's tile, at the start of step i - 1) comes about when the stage's
// (the end of step i - 2), so the pair issues together a step ahead.
template <typename Tr, bool kBiasTiles = false>
__device__ __forceinline__ void ProduceBackwardTile(const CUtensorMap* q_map, const CUtensorMap* k_map,
                                                    const CUtensorMap* v_map, const CUtensorMap* do_map,
                                                    const BackwardArgs& a, BwdBarriers<Tr> bars, uint32_t smem,
                                                    const BwdTile& tile, const BwdSteps<Tr>& steps,
                                                    const CUtensorMap* bias_map = nullptr, int bias_b = 0,
                                                    bool bias_per_head = false) {
  PrefetchTensorMap(q_map);
  PrefetchTensorMap(k_map);
  PrefetchTensorMap(v_map);
  PrefetchTensorMap(do_map);
  const int n0 = tile.n_block * Tr::kBlockN;
  MbarrierArriveExpectTx(bars.kv_full(), 2 * Tr::kKvTileBytes);
  LoadTile<Tr>(smem + Tr::kKOffset, Tr::kKvChunkBytes, k_map, bars.kv_full(), n0, tile.hk, tile.b);
  LoadTile<Tr>(smem + Tr::kVOffset, Tr::kKvChunkBytes, v_map, bars.kv_full(), n0, tile.hk, tile.b);
  for (int i = 0; i < steps.count; ++i) {
    const int s = i % Tr::kStages;
    const uint32_t parity = (i / Tr::kStages) & 1;
    const int m0 = steps.m0(i), h = steps.head(i, tile.hk, a.group);
    MbarrierWait(bars.empty(s), parity ^ 1);
    MbarrierArriveExpectTx(bars.q_full(s), Tr::kQTileBytes);
    LoadTile<Tr>(smem + Tr::kQOffset + s * Tr::kQTileBytes, Tr::kQChunkBytes, q_map, bars.q_full(s), m0, h,
                 tile.b);
    MbarrierArriveExpectTx(bars.do_full(s), Tr::kQTileBytes);
    LoadTile<Tr>(smem + Tr::kDoOffset + s * Tr::kQTileBytes, Tr::kQChunkBytes, do_map, bars.do_full(s), m0, h,
                 tile.b);
    if constexpr (kBiasTiles) BwdBiasTile<Tr>{smem}.Issue(bias_map, n0, m0, bias_per_head ? h : 0, bias_b, i & 1);
  }
}

// kMasksBias(16): the tile's bias rows of step i (keys n0 .. + kBlockN
// below seqlen_k, `key_bytes` of them; queries clamped as BiasColumns
// clamps them) into L2, by the producer warp that stages the row
// statistics, one lane per row, each 128-byte line of the row and its
// last byte. The consumers' own loads of a step go out only under the
// previous step's dK product (BiasColumns: where their registers allow),
// too short a time for a read from memory; this warp runs one to two
// steps ahead of them (the Q/dO ring), so those loads find the lines in
// L2. `keys`: the tile's first key of (b, head 0, query 0).
template <typename Tr, typename BiasT>
__device__ __forceinline__ void PrefetchBiasRows(const AttentionParams& p, const BiasT* keys, int key_bytes, int h,
                                                 int m0, int lane) {
  const int q_last = int(p.shape.seqlen_q) - 1;
#pragma unroll
  for (int r = lane; r < Tr::kBlockM; r += 32) {
    const char* row = reinterpret_cast<const char*>(keys + int64_t(h) * p.features.bias_stride.head +
                                                    int64_t(min(m0 + r, q_last)) * p.features.bias_stride.row);
#pragma unroll
    for (int offset = 0; offset < Tr::kBlockN * int(sizeof(BiasT)); offset += 128)
      if (offset < key_bytes) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + offset));
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + key_bytes - 1));
  }
}

// Warp 1 of the producer: per step, lse in log2 units (+inf past seqlen_q,
// so that those queries' P is 0; Log2Lse: also for rows that saw no key)
// and delta (0 past seqlen_q) of the step's queries, [lse2 x 64][delta x 64].
// kMasksBias(16): then the bias rows of the next step into L2
// (PrefetchBiasRows).
template <typename Tr, Features kFeatures = Features::kNone, typename Element = void>
__device__ __forceinline__ void StageRowStats(const BackwardArgs& a, const AttentionParams& p, BwdBarriers<Tr> bars,
                                              uint32_t smem, const BwdTile& tile, const BwdSteps<Tr>& steps,
                                              int lane) {
  // (kMasksBiasTiles: the producer copies the tiles; nothing to prefetch.)
  constexpr bool kBias = kFeatures == Features::kMasksBias || kFeatures == Features::kMasksBias16;
  using BiasT = std::conditional_t<kFeatures == Features::kMasksBias16, Element, float>;
  [[maybe_unused]] const BiasT* bias_keys = nullptr;
  [[maybe_unused]] int bias_key_bytes = 0;
  if constexpr (kBias) {
    const int n0 = tile.n_block * Tr::kBlockN;
    bias_keys = BiasColumns<BiasT>::For(p, tile.b, n0).keys;
    bias_key_bytes = min(Tr::kBlockN, a.seqlen_k - n0) * int(sizeof(BiasT));
  }
  for (int i = 0; i < steps.count; ++i) {
    const int s = i % Tr::kStages;
    const uint32_t parity = (i / Tr::kStages) & 1;
    const int m0 = steps.m0(i), h = steps.head(i, tile.hk, a.group);
    const int64_t row0 = (int64_t(tile.b) * a.num_heads + h) * a.seqlen_q;
    MbarrierWait(bars.empty(s), parity ^ 1);
    const uint32_t stats = smem + Tr::kStatOffset + s * Tr::kStatBytes;
#pragma unroll
    for (int r = lane; r < Tr::kBlockM; r += 32) {
      const int q = m0 + r;
      const float lse2 = q < a.seqlen_q ? Log2Lse(a.lse[row0 + q]) : CUDART_INF_F;
      const float delta = q < a.seqlen_q ? a.delta[row0 + q] : 0.0f;
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(stats + 4 * r), "f"(lse2) : "memory");
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(stats + 4 * (Tr::kBlockM + r)), "f"(delta) : "memory");
    }
    MbarrierArrive(bars.do_full(s));  // release: the stores above are visible to the waiters
    if constexpr (kBias) {
      const int next = min(i + 1, steps.count - 1);
      PrefetchBiasRows<Tr>(p, bias_keys, bias_key_bytes, steps.head(next, tile.hk, a.group), steps.m0(next), lane);
    }
  }
}

// Warp 3 of the producer, in the mask-policy variants: per step, each
// consumer warp's StepClass (FeatureStepClass; lane w for consumer warp w,
// one byte each in the stage's kStepClassBytes), published with the
// stage's do_full, so that a consumer warp whose step needs no element
// check skips FeatureStepMask. Made before the wait for the stage (its
// reads then overlap it). A warp of its own: made by warp 1 beside lse and
// delta, at the producer's 24 registers, warp 1's step loop grew from 183
// instructions and 4 local accesses to 1442 and 135 (session 38), on every
// step's path to do_full.
template <typename Tr, Features kFeatures>
__device__ __forceinline__ void StageStepClasses(const BackwardArgs& a, const AttentionParams& p,
                                                 BwdBarriers<Tr> bars, uint32_t smem, const BwdTile& tile,
                                                 const BwdSteps<Tr>& steps, int lane) {
  static_assert(Tr::kConsumerWarps <= 32, "one lane per consumer warp's class");
  // Consumer warp `lane`'s keys: warpgroup lane / 4's 64 from n0, its 16.
  const int warp_j0 = tile.n_block * Tr::kBlockN + 64 * (lane / 4) + 16 * (lane % 4);
  for (int i = 0; i < steps.count; ++i) {
    const int s = i % Tr::kStages;
    const uint32_t parity = (i / Tr::kStages) & 1;
    uint32_t step_class = kStepCheck;
    if (lane < Tr::kConsumerWarps)
      step_class = FeatureStepClass<Tr::kBlockM, ReadsDenseStepMask(kFeatures, Tr::kHeadDim)>(
          p, tile.b, steps.head(i, tile.hk, a.group), steps.m0(i), warp_j0);
    MbarrierWait(bars.empty(s), parity ^ 1);
    if (lane < Tr::kConsumerWarps)
      asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(smem + Tr::kStepClassOffset + s * Tr::kStepClassBytes + lane),
                   "r"(step_class)
                   : "memory");
    MbarrierArrive(bars.do_full(s));  // release: the class bytes are visible to the waiters
  }
}

// The bulk reduce-adds of one warp's rows of its warpgroup's dQ share
// (rows 16 warp .. + 15 of the share's queries m0 .., those below seqlen_q;
// columns col0 .. col0 + cols), staged at `stage` as StageDq leaves them.
// Full 8-row groups are one run each in the accumulator's blocked layout, a
// partial last group's rows (row-major there) one run per row. By one lane.
template <typename Tr>
__device__ __forceinline__ void ReduceDqRows(const BackwardArgs& a, uint32_t stage, int b, int h, int m0, int warp,
                                             int col0, int cols) {
  const int d = a.head_dim, rows = min(Tr::kDqRows, a.seqlen_q - m0);
  float* const head_rows = a.dq_accum + ((int64_t(b) * a.num_heads + h) * a.seqlen_q + m0) * d;
#pragma unroll
  for (int r0 = 16 * warp; r0 < 16 * warp + 16; r0 += 8) {
    if (r0 >= rows) break;
    const uint32_t src = stage + uint32_t(r0 * cols * 4);
    if (r0 + 8 <= rows) {
      BulkReduceAddF32(head_rows + int64_t(r0) * d + col0 * 8, src, uint32_t(8 * cols * 4));
    } else {
      for (int r = r0; r < rows; ++r)
        BulkReduceAddF32(head_rows + int64_t(r) * d + col0, src + uint32_t((r - r0) * cols * 4), uint32_t(cols * 4));
    }
  }
  BulkCommit();
}

// dQ share accumulator (m64n64: row 16 warp + g + 8hh, column 8j + 2t + e)
// into the staging in the order ReduceDqRows sends: per 8-row group
// (cols * 8 floats), full groups as 8 x 8 blocks (block c / 8, row-major
// inside: a warp's float2 stores of one (j, hh) fill 64 consecutive floats,
// conflict-free), a partial group row-major. Columns from `cols` on (past
// head_dim) are not staged.
template <typename Tr>
__device__ __forceinline__ void StageDq(const BackwardArgs& a, const float (&dq)[Tr::kDqCols / 2], uint32_t stage,
                                        int m0, int cols, int warp, int g, int t) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int group = 2 * warp + hh;
    const bool full = m0 + 8 * group + 8 <= a.seqlen_q;
#pragma unroll
    for (int j = 0; j < Tr::kDqCols / 8; ++j) {
      const int c = 8 * j + 2 * t;
      if (c >= cols) continue;
      const int offset = group * 8 * cols + (full ? j * 64 + g * 8 + 2 * t : g * cols + c);
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(stage + 4 * offset), "f"(dq[4 * j + 2 * hh]),
                   "f"(dq[4 * j + 2 * hh + 1])
                   : "memory");
    }
  }
}

// Where the deterministic variant raises DqOrder's counters and first
// reads them (DeterministicBackwardKernel's candidates; the check program
// times each): kUnderS, a block's counter raised in the S^T window of the
// step after the send that saw its adds complete (the template default);
// kAtSend, raised at that send, right after the wait (the package's since
// session 21, the faster at 7 of 8 timed shapes); kUnderSReadAhead, kUnderS
// with the step's own counter read once in the same window (DqOrder::ready).
// kHelperWarp (session 31's candidate): the consumers only stage their
// shares; warp 2 of the producer warpgroup, idle otherwise, waits on the
// counters, issues the reduce-adds, waits for them and raises the counters
// (HelpDqSends), so that no spin, acquire or release fence is left on the
// consumers' path (v25's profile: ~20% of their stall samples).
enum class DqHandoff { kUnderS, kAtSend, kUnderSReadAhead, kHelperWarp };

// Hooks around a warp's dQ send (SendDqFull, ConsumeBackwardTile's send_dq;
// lane 0's, except AfterStaging, every lane's after its stores and proxy
// fence). DqUnordered, the plain kernels': the staging is free once the
// previous step's reduces have read it; the reduce goes out at once.
struct DqUnordered {
  static constexpr bool kIssuesReduce = true;
  __device__ __forceinline__ void BeforeStaging() const { BulkWaitRead<0>(); }
  __device__ __forceinline__ void AfterStaging() const {}
  __device__ __forceinline__ void BeforeReduce() const {}
};

// DqOrder, the deterministic variant's (DeterministicBackwardKernel): the
// adds into each (batch, query head, query block) in ascending key block
// order, through one int32 counter per block (`counters`, zeroed before
// the call: [B, N, ceil(Tq / kBlockM)]). Every consumer warp that visits
// the block raises it once after its adds there are complete, so key
// block n's warps wait for kConsumerWarps * n (`target`): the arrivals of
// key blocks 0 .. n - 1, every one of which visits each query block that
// n visits (causal: m_first grows with n). (Descending, the causal
// deterministic calls' since session 21, a.keys_descending: the arrivals
// of n + 1 .. the block's last visitor, ConsumeBackwardTile's dq_earlier;
// the same argument with the order reversed.) No warp of block n arrives
// before it has seen that count, nor one of a later key block before it
// has seen more, so the count reaches the target exactly when the earlier
// key blocks are done; each warp then needs no barrier with the others
// (the warps' rows / columns of a block are disjoint, so only the order of
// the tiles matters, never that of the warps).
// BeforeStaging (step i's send, under its dK product): step i - 1's
// reduces complete (wait_group 0 where the plain kernel waits for their
// reads only; issued a whole step earlier, so it rarely waits), which also
// frees the staging. Their block's counter is raised later, by Arrive in
// step i + 1 after its S^T and dP^T are issued (ConsumeBackwardTile), where
// the warp waits for S^T anyway: the release's gpu-scope fence (a MEMBAR
// of an L2 round trip or more) then hides under S^T instead of adding to
// the send's chain under dK (staging, this wait, the reduce). The signal
// goes out ~1.1 steps after the adds' issue; the next key block's tile,
// a section's pairs of tiles behind (BwdTile), needs it only then.
// (DqHandoff::kAtSend, the package's: the counter raised right there
// instead, `complete` its index: the fence then on the chain under dK, but
// no outstanding reduce at it, while under S^T this step's reduces are in
// flight, should the fence wait for those too.)
// BeforeReduce: after the staging, right before the reduce, the wait for
// this step's block (`current`), as late as it can be; `ready`
// (DqHandoff::kUnderSReadAhead): an acquire load in the step's S^T window
// already saw the target, so that the send's chain under dK loses that
// L2 round trip.
struct DqOrder {
  static constexpr bool kIssuesReduce = true;
  int* counters;
  int current, target, complete;
  bool ready;
  __device__ __forceinline__ void BeforeStaging() const {
    BulkWait<0>();
    Arrive(counters, complete);
  }
  __device__ __forceinline__ void AfterStaging() const {}
  __device__ __forceinline__ void BeforeReduce() const {
    if (ready) CounterProxyFence();
    else CounterWaitAtLeast(counters + current, target);
  }
  // Block `index`'s counter raised (its adds complete: BeforeStaging, or
  // BulkWait<0> after the loop); -1: none.
  static __device__ __forceinline__ void Arrive(int* counters, int index) {
    if (index >= 0) CounterArriveAfterBulk(counters + index);
  }
};

// DqHandoff::kHelperWarp's consumer side: the warp's staging is free once
// the helper lane serving it has seen the previous step's reduces read it
// (`free`, parity of the step before), and the staged share goes to that
// lane by `full` (32 arrivals, each lane's after its own stores and proxy
// fence); the helper issues the reduce (HelpDqSends).
struct DqToHelper {
  static constexpr bool kIssuesReduce = false;
  uint32_t full, free, parity;
  __device__ __forceinline__ void BeforeStaging() const { MbarrierWait(free, parity ^ 1); }
  // Every lane, after its own stores and proxy fence (32 arrivals per
  // phase, as BwdBarriers::empty's: no reliance on __syncwarp to order the
  // other lanes' stores before lane 0's release).
  __device__ __forceinline__ void AfterStaging() const { MbarrierArrive(full); }
  __device__ __forceinline__ void BeforeReduce() const {}
};

// The helper's barriers (DqHandoff::kHelperWarp): per consumer warp w a
// staging-full mbarrier (the warp's 32 lanes arrive) and a staging-free
// one (the serving helper lane arrives), past the kernel's own
// (BwdTraits::kHelperBarrierOffset).
template <typename Tr>
struct DqHelperBarriers {
  uint32_t base;
  __device__ uint32_t full(int w) const { return base + 8 * w; }
  __device__ uint32_t free(int w) const { return base + 8 * (Tr::kConsumerWarps + w); }
  __device__ void Init() const {
    for (int w = 0; w < Tr::kConsumerWarps; ++w) MbarrierInit(full(w), 32), MbarrierInit(free(w), 1);
    FenceBarrierInit();
  }
};

// kLeanDq's send of a full share (all its kDqRows queries below seqlen_q,
// head_dim == kHeadDim, so dq_cols == 64): the same staging order and the
// same accumulator runs as StageDq + ReduceDqRows take there, with every
// offset a constant. Each warp's 16 rows are groups 2 warp and 2 warp + 1:
// staged at floats 1024 warp .., 512 per group, thread (g, t) at g 8 + 2t
// in each 8 x 8 block j (j 64) of group hh (hh 512); in the accumulator
// the warp's two groups are contiguous at kHeadDim 64 (one 4 KiB run: one
// bulk reduce-add) and kHeadDim floats apart at 128 (the column split: two
// 2 KiB runs). The general path spends ~13 instructions per store on its
// bounds test and address (SASS) and carries the row-tail loops; this one
// issues 16 st.shared.v2 off one base and one or two reduces.
// `order` (lane 0's hooks around the staging and the reduce): DqUnordered,
// the plain kernels', or DqOrder (the deterministic variant).
template <typename Tr, typename Order = DqUnordered>
__device__ __forceinline__ void SendDqFull(const BackwardArgs& a, const float (&dq)[Tr::kDqCols / 2], uint32_t stage,
                                           int b, int h, int m0, int warp, int lane, int col0,
                                           const Order& order = {}) {
  static_assert(Tr::kDqCols == 64 && Tr::kDqRows == 64, "two 8-row groups of 64 columns per warp");
  constexpr int kGroupFloats = 8 * Tr::kDqCols;
  const int g = lane / 4, t = lane % 4;
  if (lane == 0) order.BeforeStaging();  // the previous step's reduces have read the staging
  __syncwarp();
  const uint32_t base = stage + 4 * (warp * 2 * kGroupFloats + g * 8 + 2 * t);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int j = 0; j < Tr::kDqCols / 8; ++j)
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(base + 4 * (hh * kGroupFloats + j * 64)),
                   "f"(dq[4 * j + 2 * hh]), "f"(dq[4 * j + 2 * hh + 1])
                   : "memory");
  FenceProxyAsync();
  order.AfterStaging();
  __syncwarp();
  if (lane == 0) {
    float* const rows =
        a.dq_accum + ((int64_t(b) * a.num_heads + h) * a.seqlen_q + m0 + 16 * warp) * Tr::kHeadDim + col0 * 8;
    const uint32_t src = stage + 4 * warp * 2 * kGroupFloats;
    order.BeforeReduce();
    if constexpr (Order::kIssuesReduce) {
      if constexpr (Tr::kDqCols == Tr::kHeadDim) {
        BulkReduceAddF32(rows, src, 2 * kGroupFloats * 4);
      } else {
        BulkReduceAddF32(rows, src, kGroupFloats * 4);
        BulkReduceAddF32(rows + 8 * Tr::kHeadDim, src + kGroupFloats * 4, kGroupFloats * 4);
      }
      BulkCommit();
    }
  }
}

// The epilogue's dK and dV go through shared memory: each consumer
// warpgroup stages its 64 rows as 16-bit pairs in its own rows of the K or
// V tile (free once the products reading them are complete), in the
// tile's TMA layout (64-column chunks of kBlockN rows x 128 bytes, a
// row's 16-byte piece j at j ^ (row % 8): a warp's pair stores, lanes g on
// 8 rows, hit 32 banks), then stores 16-byte pieces, a row's consecutive
// pieces by consecutive threads. Stored straight from the fragments (4-byte
// pairs, 8 rows x 16 bytes per warp store, 64 stores a thread at 128) the
// epilogue was 14% of the T = 1024 causal backward's stall samples
// (session 37's profile), most of them the store queue's (lg).
// The staging address of row `row` (of the warpgroup's 64 from row 64
// `warpgroup` of the tile at `tile`), 16-byte piece `c`.
// The 256 kernel's warpgroups share the tile's 64 rows and hold column
// halves instead: there `warpgroup` is 0 and warpgroup w's pieces are
// 16 w .. 16 w + 15 (its two 64-column chunks).
// (Host-callable for tests/cpp/sm90_bwd_tile_test.cu.)
template <typename Tr>
__host__ __device__ __forceinline__ uint32_t KeyRowPiece(uint32_t tile, int warpgroup, int row, int c) {
  return tile + uint32_t((c / 8) * Tr::kKvChunkBytes + (64 * warpgroup + row) * 128 + 16 * ((c % 8) ^ (row % 8)));
}

// This thread's dK (times scale) or dV pairs (rows row0, row0 + 8 of the
// warpgroup's 64; columns 8j + 2t, + 1 of the accumulator's kColumns, from
// piece piece0) into the staging (KeyRowPiece).
template <typename Element, typename Tr, int kColumns = Tr::kHeadDim>
__device__ __forceinline__ void StageKeyGradient(uint32_t tile, int warpgroup, const float (&acc)[kColumns / 2],
                                                 float scale, int row0, int t, int piece0 = 0) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int j = 0; j < kColumns / 8; ++j)
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(KeyRowPiece<Tr>(tile, warpgroup, row0 + 8 * hh, piece0 + j) + 4 * t),
                   "r"(PackPair<Element>(acc[4 * j + 2 * hh] * scale, acc[4 * j + 2 * hh + 1] * scale))
                   : "memory");
}

// The warpgroup's 64 staged rows (keys key0 .., those below seqlen_k;
// kColumns columns from piece piece0) to dK or dV in global memory, 16
// bytes a store (head_dim is a multiple of 8; the launch checks 16-byte
// strides); `tid`: the thread in the warpgroup. After a warpgroup barrier
// over the staging stores.
template <typename Element, typename Tr, int kColumns = Tr::kHeadDim>
__device__ __forceinline__ void StoreStagedKeyRows(const BackwardArgs& a, void* base, uint32_t tile, int warpgroup,
                                                   int key0, int b, int hk, int tid, int piece0 = 0) {
  constexpr int kPieces = kColumns / 8;  // 16-byte pieces per row
  Element* rows = static_cast<Element*>(base) + int64_t(b) * a.k_stride.batch + int64_t(hk) * a.k_stride.head;
#pragma unroll
  for (int k = 0; k < 64 * kPieces / 128; ++k) {
    const int q = tid + 128 * k, row = q / kPieces, c = piece0 + q % kPieces;
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(KeyRowPiece<Tr>(tile, warpgroup, row, c))
                 : "memory");
    if (key0 + row < a.seqlen_k && 8 * c < a.head_dim)
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(rows + int64_t(key0 + row) * a.k_stride.row + 8 * c),
                   "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                   : "memory");
  }
}

// This thread's dS^T pairs (the A fragments of dK += dS^T Q) into the
// [kBlockN keys][kBlockM queries] tile at `ds_tile`, rows = keys 64
// warpgroup + row0 + 8hh, in TMA's swizzled order (row r's 16-byte chunk j
// at j ^ (r % 8)): the MN-major A operand of dQ = dS K. kBlockM = 128: 8-query
// block j in 64-query chunk j / 8 (kDsChunkBytes apart), at j % 8 inside it
// (j is a constant of the unrolled loop: at 64 both fold away).
template <typename Tr>
__device__ __forceinline__ void StoreDsTranspose(uint32_t ds_tile, const uint32_t (&ds_frag)[Tr::kBlockM / 16][4],
                                                 int warpgroup, int row0, int t) {
  // 128-query steps: the swizzle phase r % 8 is g (64 warpgroup + 16 warp
  // + 8 hh is a multiple of 8), read from %laneid here so that nothing of
  // it is held across the step loop (the diagonal-mask candidate's two
  // copies of the step left no register for the two phases: ptxas spilled
  // them, two LDL per step).
  [[maybe_unused]] uint32_t lane_phase = 0;
  if constexpr (Tr::kDqSplitRows) {
    asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane_phase));
    lane_phase /= 4;
  }
#pragma unroll
  for (int j = 0; j < Tr::kBlockM / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = 64 * warpgroup + row0 + 8 * hh;
      const uint32_t phase = Tr::kDqSplitRows ? lane_phase : uint32_t(r % 8);
      const uint32_t addr = ds_tile + (j / 8) * Tr::kDsChunkBytes + r * 128 + (((j % 8) ^ phase) * 16) + 4 * t;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(ds_frag[j / 2][(j % 2) * 2 + hh]) : "memory");
    }
}

// dq = dS K for one warpgroup's share (issued and committed): A = dS
// (queries x keys) from the dS^T tile rows at `ds_rows`, B = K (keys x head
// dim) rows / column chunk at `k_cols`, both MN-major (BwdTraits: the column
// split at 128, the key split at 64, the row split at 64 with 128-query
// steps). M = 64 queries: one 64-query chunk of dS^T, so the leading byte
// offset (kDsChunkBytes, the chunks' stride) is never used.
template <typename Element, typename Tr>
__device__ __forceinline__ void IssueDqProduct(float (&dq)[Tr::kDqCols / 2], uint32_t ds_rows, uint32_t k_cols) {
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < Tr::kDqKeys / 16; ++kk)
    WgmmaSSMn<Element, Tr::kDqCols>(dq, MnMajorDescriptor(ds_rows, Tr::kDsChunkBytes, kk),
                                    MnMajorDescriptor(k_cols, Tr::kKvChunkBytes, kk), kk > 0 ? 1 : 0);
  WgmmaCommit();
}

// IssueDqProduct with UniformDescriptor (the uniform-descriptor schedules).
template <typename Element, typename Tr>
__device__ __forceinline__ void IssueDqProductUniform(float (&dq)[Tr::kDqCols / 2], uint32_t ds_rows,
                                                      uint32_t k_cols) {
  const UniformDescriptor ds_desc(ds_rows, Tr::kDsChunkBytes, 1024), k_desc(k_cols, Tr::kKvChunkBytes, 1024);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < Tr::kDqKeys / 16; ++kk)
    WgmmaSSMn<Element, Tr::kDqCols>(dq, ds_desc.At(MnMajorOffset(kk)), k_desc.At(MnMajorOffset(kk)), kk > 0 ? 1 : 0);
  WgmmaCommit();
}

// The addresses of a warpgroup's dQ product operands (IssueDqProduct):
// column split, all of dS^T and K's column chunk w; row split, dS^T's
// query chunk w and all of K; key split, dS^T's and K's rows of keys 64 w ..
template <typename Tr>
__device__ __forceinline__ uint32_t DqDsRows(uint32_t ds_tile, int warpgroup) {
  if constexpr (Tr::kDqSplitRows) return ds_tile + warpgroup * Tr::kDsChunkBytes;
  return ds_tile + (Tr::kDqSplitColumns ? 0 : warpgroup * 64 * 128);
}
template <typename Tr>
__device__ __forceinline__ uint32_t DqKCols(uint32_t k_tile, int warpgroup) {
  if constexpr (Tr::kDqSplitRows) return k_tile;
  return k_tile + (Tr::kDqSplitColumns ? warpgroup * Tr::kKvChunkBytes : warpgroup * 64 * 128);
}

// The bias gradient of one step's pairs of this thread (kBiasGradient):
// dS^T = P^T (dP^T - delta) in S^T's accumulator layout, ds[4j + 2hh + e]
// for the thread's key (BiasColumns::For's) + 8hh, query m0 + 8j + 2t + e,
// written where the bias of (b, h) has the pair, at the bias's own strides (the bias gradient has its
// shape): float32 atomic adds into p.features.dbias where the bias is
// broadcast (zeroed first; a zero adds nothing and is skipped, as sm80's
// AddDbias), a plain store of the bias's type into dbias_direct where each
// element has one writer ([B, N, T, S]). dS, not scale dS: the bias is added
// to the scaled logit (sm80's dbias-only mode writes the same d(logit)).
// Pairs past seqlen_q or seqlen_k are not written (their bias does not
// exist). A warp's store covers 8 consecutive keys of 4 queries' rows (32
// bytes per row for the float32 reds, 16 for a 16-bit store). Row offsets in
// 32 bits, as BiasColumns::Load's (BiasRowsFit). `columns`: the tile's
// BiasColumns, whose pointer holds the batch's offset (BroadcastOffset's
// divisions once per tile, not per step).
template <typename Tr, typename BiasT>
__device__ __forceinline__ void StoreBiasGradient(const AttentionParams& p, const float (&ds)[Tr::kBlockM / 2],
                                                  const BiasColumns<BiasT>& columns, int h, int m0, int t) {
  const AttentionFeatures& f = p.features;
  const uint32_t row_stride = uint32_t(f.bias_stride.row);
  const int q_last = int(p.shape.seqlen_q) - 1, q0 = m0 + 2 * t, rows_left = q_last - q0;
  const bool(&key_in)[2] = columns.key_in;
  // The thread's first pair (batch, head h, query q0, key): its query
  // clamped so that the pointer stays inside.
  const int64_t first = (columns.keys - static_cast<const BiasT*>(f.bias)) + int64_t(h) * f.bias_stride.head +
                        int64_t(min(q0, q_last)) * f.bias_stride.row;
  if (f.dbias && row_stride == 0) {
    // A bias without a query dim ([.., 1, S]: a key bias): every query of
    // the thread's key row adds into one element. Summed over the thread's
    // queries, then over the 4 lanes of its key (t), one red per key and
    // warp row instead of 64 onto the same address.
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < Tr::kBlockM / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) sum += 8 * j + e <= rows_left ? ds[4 * j + 2 * hh + e] : 0.0f;
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (t == 0 && key_in[hh] && sum != 0.0f) atomicAdd(f.dbias + first + 8 * hh, sum);
    }
  } else if (f.dbias) {
    float* const sums = f.dbias + first;
#pragma unroll
    for (int j = 0; j < Tr::kBlockM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float x = ds[4 * j + 2 * hh + e];
          if (8 * j + e <= rows_left && key_in[hh] && x != 0.0f)
            atomicAdd(sums + uint32_t(8 * j + e) * row_stride + 8 * hh, x);
        }
  } else {
    BiasT* const out = static_cast<BiasT*>(f.dbias_direct) + first;
#pragma unroll
    for (int j = 0; j < Tr::kBlockM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float x = ds[4 * j + 2 * hh + e];
          if (8 * j + e <= rows_left && key_in[hh]) {
            if constexpr (std::is_same_v<BiasT, float>) out[uint32_t(8 * j + e) * row_stride + 8 * hh] = x;
            else out[uint32_t(8 * j + e) * row_stride + 8 * hh] = FromFloat<BiasT>(x);
          }
        }
  }
}

// A copy of `x` the compiler cannot see through: addresses derived from it
// at their use are recomputed there instead of hoisted out of the step
// loop, where their descriptors (64-bit, one per k step) took the registers
// that ptxas then spilled (kEarlyS at 128).
__device__ __forceinline__ uint32_t Opaque(uint32_t x) {
  asm volatile("" : "+r"(x));
  return x;
}

// One consumer warpgroup's whole tile: keys n0 + 64 warpgroup .. + 63.
// kEarlyS (BwdSchedule::kEarlyS): step i's dQ share is staged and sent
// after step i + 1's S^T is issued, so that the tensor cores run S^T under
// the staging; kSerial: each step's share right after its product.
// kLeanDq, kLeanDqEarlyDp (bwd_kernel_traits.cuh): kEarlyS with SendDqFull
// for full steps, the latter sending after dP^T's issue.
// Session 17's candidates (bwd_kernel_traits.cuh): kDqFirst's order (dV,
// barrier, dQ, dK; the send under dK), uniform descriptors, masks on the
// steps that need them only; all with the lean send.
// Feature variants: `p` for the mask policy's per-step questions (the plain
// kernel ignores it).
// kBiasGradient (BiasGradientKernel; the bias variants only): the bias
// gradient alone, S^T, dP^T, P^T and dS^T per step, dS^T into the bias
// gradient (StoreBiasGradient); no dV, dK or dQ.
// kDeterministic (DeterministicBackwardKernel; the plain dQ-first
// schedules with a dQ split, so that each accumulator element takes one add
// per tile): each send ordered by DqOrder over `dq_counters`; the counters
// raised and read where kHandoff says (DqHandoff).
template <typename Element, typename Tr, BwdSchedule kSchedule, Features kFeatures, bool kBiasGradient = false,
          bool kDeterministic = false, DqHandoff kHandoff = DqHandoff::kUnderS>
__device__ __forceinline__ void ConsumeBackwardTile(const BackwardArgs& a, const AttentionParams& p,
                                                    BwdBarriers<Tr> bars, uint32_t smem, int warpgroup_index,
                                                    const BwdTile& tile, const BwdSteps<Tr>& steps,
                                                    int* dq_counters = nullptr) {
  constexpr int kHeadDim = Tr::kHeadDim, kBlockM = Tr::kBlockM;
  constexpr bool kAnyFeature = kFeatures != Features::kNone;
  // The mask policy's per-step visibility (FeatureStepMask) and query
  // blocks; the plain kernel and its kPlain* transforms (the soft cap or
  // dropout alone) take the plain kernel's steps, diagonal-only masks and
  // counters instead.
  constexpr bool kPolicy = UsesMaskPolicy(kFeatures);
  constexpr bool kSoftcap = AppliesSoftcap(kFeatures);
  constexpr bool kBias = AddsBias(kFeatures);
  // kMasksBiasTiles: the step's bias from the shared-memory tile
  // (BwdBiasTile), not BiasColumns' loads a step ahead.
  constexpr bool kBiasTiles = kFeatures == Features::kMasksBiasTiles;
  constexpr bool kDropout = AppliesDropout(kFeatures);
  using BiasT = std::conditional_t<ReadsBias16(kFeatures), Element, float>;
  constexpr bool kDqFirst = BwdDqFirst(kSchedule);
  // The bias's loads for step i + 1 go out under step i's dK product, where
  // nothing else is in flight between steps (kDqFirst's order).
  static_assert(!kBias || kDqFirst, "the bias variants run the dQ-first schedules only");
  // Likewise the dropout variants' keep bits for step i + 2.
  static_assert(!kDropout || kDqFirst, "the dropout variant runs the dQ-first schedules only");
  static_assert(!kBiasGradient || kBias, "the bias gradient is the bias variants' pass");
  constexpr bool kUniform = BwdUniformDescriptors(kSchedule);
  constexpr bool kDiagonalMasks = BwdDiagonalMasks(kSchedule) && !kPolicy;
  constexpr bool kCounters = BwdStepCounters(kSchedule);
  static_assert(!kCounters || BwdDqFirst(kSchedule), "the counters are the current step's (no send of step i - 1)");
  constexpr bool kEarlyS = kSchedule != BwdSchedule::kSerial && !kDqFirst;
  constexpr bool kLeanDq = kSchedule == BwdSchedule::kLeanDq || kSchedule == BwdSchedule::kLeanDqEarlyDp ||
                           kSchedule == BwdSchedule::kLeanDqUniform || kSchedule == BwdSchedule::kLeanDqRows128 ||
                           kDqFirst;
  // Feature variants: row hh of the thread's S^T pairs is bits
  // kVisibleRowBits hh + 2j + e of FeatureStepMask's word (16 at 64 queries
  // per step, 32 of a 64-bit word at 128).
  [[maybe_unused]] constexpr int kVisibleRowBits = kBlockM / 4;
  // kDeterministic: one add per accumulator element and tile (the column
  // or row split; the key split adds both warpgroups' shares into every
  // element), sent inside the step (dQ-first: dq_previous is then the
  // step before's), no features.
  static_assert(!kDeterministic || (Tr::kDqReadsBothDs && kDqFirst && !kAnyFeature && !kBiasGradient),
                "the deterministic variant runs the plain dQ-first schedules with a dQ split");
  static_assert(!kDeterministic || Tr::kBlockN % kBlockM == 0, "dq_earlier's last visitor: m0 / kBlockN");
  constexpr bool kArriveAtSend = kHandoff == DqHandoff::kAtSend;
  constexpr bool kReadAhead = kHandoff == DqHandoff::kUnderSReadAhead;
  // kHelperWarp: the consumers stage and hand over; the counters are the
  // helper's (HelpDqSends).
  constexpr bool kHelper = kDeterministic && kHandoff == DqHandoff::kHelperWarp;
  constexpr bool kConsumerCounters = kDeterministic && !kHelper;
  constexpr bool kSendAfterDp = kSchedule == BwdSchedule::kLeanDqEarlyDp;
  // At 128 dQ's 32 floats beside dK, dV (128), S^T and dP^T (64) in flight
  // leave too few registers: ptxas serializes the wgmma (C7512) and spills.
  static_assert(!kSendAfterDp || kHeadDim == 64, "kLeanDqEarlyDp is a head dim 64 schedule");
  // The uniform schedules: the index through a shuffle from lane 0, which
  // ptxas knows to be warp-uniform, so that the addresses and descriptors
  // derived from it (and from the uniform shared base) live in uniform
  // registers. (threadIdx.x / 128 is uniform per warp too, but ptxas cannot
  // tell.)
  const int warpgroup = kUniform ? __shfl_sync(0xffffffffu, warpgroup_index, 0) : warpgroup_index;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = warp * 16 + g;  // this thread's keys in the warpgroup: row0, row0 + 8
  const int wg_n0 = tile.n_block * Tr::kBlockN + 64 * warpgroup;
  // dQ share: columns dq_col0 .. + dq_cols of dS K over keys dq_keys ..
  const int dq_col0 = Tr::kDqSplitColumns ? Tr::kDqCols * warpgroup : 0;
  // and rows dq_row0 .. + kDqRows of the step's queries (the row split).
  const int dq_row0 = Tr::kDqSplitRows ? Tr::kDqRows * warpgroup : 0;
  const int dq_cols = min(Tr::kDqCols, a.head_dim - dq_col0);  // <= 0: nothing (head dims up to 64 at 128)

  float dk[kHeadDim / 2], dv[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) dk[i] = dv[i] = 0.0f;

  // kMasksBias(16): this thread's bias columns (BiasColumns: the batch's
  // offset once per tile) and the raw values of the next step's pairs,
  // loaded a step ahead (load_bias, under the previous step's dK).
  [[maybe_unused]] BiasColumns<BiasT> bias{};
  [[maybe_unused]] uint32_t bias_raw[kBlockM / 2];
  // (kMasksBiasTiles: only the dbias pass's, whose stores address the
  // gradient through it, StoreBiasGradient.)
  if constexpr (kBias && (!kBiasTiles || kBiasGradient)) bias = BiasColumns<BiasT>::For(p, tile.b, wg_n0 + row0);
  // kMasksDropout, kPlainDropout (dropout.cuh): the batch row's Philox
  // keys, once per tile, and each step's keep bits (FeatureStepMask's
  // layout), made two steps ahead under dK's product, where S^T, dP^T and
  // their fragments are dead (inside the step, beside them in flight, the
  // bits made ptxas spill at 64, 15 local accesses per step), half of them
  // by each warp of a pair (BackwardKeepHalves), both halves through the
  // shared-memory exchange (KeepExchange; nothing held across steps).
  // Only the Philox keys (uniform registers) are held across the loop: the
  // rest of FragmentDropout is rebuilt per step from the kernel's arguments
  // (a whole FragmentDropout held beside the next step's bits was the words
  // ptxas spilled at 64, 18 local accesses per step).
  static_assert(!kDropout || kBlockM == 64, "the keep-bit exchange: 64-query steps (32 bits)");
  [[maybe_unused]] FragmentDropout dropout{};
  if constexpr (kDropout) dropout = FragmentDropout::For(p, tile.b, 0);
  // Step i's halves into buffer `buffer`: this lane's own into its slot's
  // first word, its partner's (warp ^ 1) into the partner slot's second.
  [[maybe_unused]] auto keep_bits = [&](int i, int buffer) {
    if constexpr (kDropout) {
      FragmentDropout step_dropout = dropout;
      step_dropout.threshold_high = a.dropout_threshold_high;
      step_dropout.batch = p.features.dropout_shared ? 0u : uint32_t(tile.b);
      step_dropout.head = p.features.dropout_shared ? 0u : uint32_t(steps.head(i, tile.hk, a.group));
      const FragmentDropout::KeepHalves halves = step_dropout.BackwardKeepHalves(wg_n0 + row0, steps.m0(i), t);
      const int pair_warp = 4 * warpgroup + warp;
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(KeepExchange<Tr>::Slot(smem, buffer, pair_warp, lane)),
                   "r"(halves.own));
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(KeepExchange<Tr>::Slot(smem, buffer, pair_warp ^ 1, lane) + 4),
                   "r"(halves.other));
    }
  };
  // Step i's keep bits (buffer i % 2), once both halves are in.
  [[maybe_unused]] auto read_keep = [&](int i) {
    uint32_t own = ~0u, other = ~0u;
    if constexpr (kDropout)
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                   : "=r"(own), "=r"(other)
                   : "r"(KeepExchange<Tr>::Slot(smem, i & 1, 4 * warpgroup + warp, lane)));
    return StepMaskBits<kBlockM>(own | other);
  };
  [[maybe_unused]] auto load_bias = [&](int i) {
    if constexpr (kBias && !kBiasTiles)
      bias.template Load<kBlockM>(bias_raw, p, steps.head(i, tile.hk, a.group), steps.m0(i), t);
  };

  // S^T = K Q^T [64 keys][64 queries] of step i, raw, issued and committed.
  // kMasksBias(16): added to the step's bias times 1 / scale
  // (softcap_unscale in these variants, as the forward's), put into st
  // here from bias_raw: q.k + bias / scale, the forward's logits (BiasColumns).
  float st[kBlockM / 2];
  auto issue_s = [&](int i) {
    const int s = i % Tr::kStages;
    const uint32_t base = Opaque(smem);
    const uint32_t q_tile = base + Tr::kQOffset + s * Tr::kQTileBytes;
    const uint32_t k_rows = base + Tr::kKOffset + warpgroup * 64 * 128;
    if constexpr (kBiasTiles) {
      BwdBiasTile<Tr>{base}.template Load<BiasT>(st, warpgroup, warp, lane, uint32_t(i) & 1u, a.softcap_unscale);
    } else if constexpr (kBias) {
      BiasColumns<BiasT>::template ToLogits<kBlockM>(st, bias_raw, a.softcap_unscale);
    }
    MbarrierWait(bars.q_full(s), (i / Tr::kStages) & 1);
    WgmmaFence();
    KeysTimesRowsT<Tr, Element, kBlockM, kBias, kUniform>(st, k_rows, q_tile);
    WgmmaCommit();
  };

  // The dQ share of step i (in dq, its product done) through the staging
  // into the accumulator. Each warp stages and sends its own 16 rows (2
  // groups), so only warp syncs order the staging: free again once the lane
  // that sent the previous step's reduces has seen them read; the lanes'
  // stores before its copy (async proxy). With dq_cols <= 0 nothing is
  // staged or sent.
  float dq[Tr::kDqCols / 2];
  // Step i's first query and head: BwdSteps' division, or (kCounters) the
  // loop's counters, which hold step i's while it runs (below).
  [[maybe_unused]] int step_m0 = 0, step_h = 0;
  auto m0_of = [&](int i) {
    if constexpr (kCounters) return step_m0;
    else return steps.m0(i);
  };
  auto head_of = [&](int i) {
    if constexpr (kCounters) return step_h;
    else return steps.head(i, tile.hk, a.group);
  };
  // kDeterministic (DqOrder), counter indices kept across steps (-1: none):
  // dq_previous, the last sent step's block; dq_complete, the block whose
  // adds the last send's BeforeStaging saw complete, raised in the next
  // step's S^T window.
  // kReadAhead: between step i's S^T window and its send, dq_complete
  // (raised there, -1) holds -2 where lane 0 saw step i's target in that
  // window (DqOrder::ready; a word of its own was one ptxas spilled at 128).
  [[maybe_unused]] int dq_previous = -1, dq_complete = -1;
  // Step i's counter ([B, N, query blocks]). (The query block count rebuilt
  // per use from an opaque length: shared with BwdSteps' it was held across
  // the loop, the word ptxas spilled there at 64, an LDL per step.)
  [[maybe_unused]] auto counter_index = [&](int i) {
    const int m_blocks = (int(Opaque(uint32_t(a.seqlen_q))) + kBlockM - 1) / kBlockM;
    return (tile.b * a.num_heads + head_of(i)) * m_blocks + m0_of(i) / kBlockM;
  };
  // kDeterministic: the key blocks whose adds into step i's query block
  // come before this tile's (DqOrder's target over kConsumerWarps): 0 ..
  // n - 1, every one of which visits each query block n visits (causal:
  // m_first grows with n); descending (a.keys_descending), n + 1 .. the last
  // key block that visits it (causal: m_first <= the block, n' <= m0 /
  // kBlockN, kBlockN a multiple of kBlockM).
  [[maybe_unused]] auto dq_earlier = [&](int i) {
    if (!a.keys_descending) return tile.n_block;
    const int last = a.is_causal ? min(a.key_blocks - 1, m0_of(i) / Tr::kBlockN) : a.key_blocks - 1;
    return last - tile.n_block;
  };
  auto send_dq = [&](int i) {
    // The share's first query (m0 of the step at 64 queries per step).
    const int m0 = m0_of(i) + dq_row0;
    // kDeterministic: the step's order (DqOrder), or kHelperWarp's
    // handover to the lane of the helper warp that serves this warp.
    std::conditional_t<kHelper, DqToHelper, std::conditional_t<kDeterministic, DqOrder, DqUnordered>> order{};
    if constexpr (kHelper) {
      const DqHelperBarriers<Tr> helper{Opaque(smem) + Tr::kHelperBarrierOffset};
      order = DqToHelper{helper.full(4 * warpgroup + warp), helper.free(4 * warpgroup + warp), uint32_t(i & 1)};
    } else if constexpr (kDeterministic) {
      order = DqOrder{dq_counters, counter_index(i), Tr::kConsumerWarps * dq_earlier(i),
                      kArriveAtSend ? dq_previous : -1, kReadAhead && dq_complete == -2};
      if constexpr (!kArriveAtSend) dq_complete = dq_previous;
      dq_previous = order.current;
    }
    // kLeanDq: full shares (a warp-uniform test) take the constant-offset send.
    if constexpr (kLeanDq) {
      if (m0 + Tr::kDqRows <= a.seqlen_q && a.head_dim == kHeadDim) {
        SendDqFull<Tr>(a, dq, Opaque(smem) + Tr::kDqStageOffset + warpgroup * Tr::kDqStageBytes, tile.b,
                       head_of(i), m0, warp, lane, dq_col0, order);
        return;
      }
    }
    if (lane == 0) order.BeforeStaging();
    __syncwarp();
    const uint32_t dq_stage = Opaque(smem) + Tr::kDqStageOffset + warpgroup * Tr::kDqStageBytes;
    StageDq<Tr>(a, dq, dq_stage, m0, dq_cols, warp, g, t);
    FenceProxyAsync();
    order.AfterStaging();  // kHelper: every lane's arrival on `full`
    __syncwarp();
    // kDiagonalMasks: the test rebuilt per send from an opaque lane, so
    // that ptxas does not hold it as a predicate across the loop, whose two
    // step copies left it none and spilled it (one LDL per step at 128).
    const int reduce_lane = kDiagonalMasks ? int(Opaque(uint32_t(lane))) : lane;
    if constexpr (kHelper) {
      // Nothing: the helper sends (or not: dq_cols) and counts.
    } else if constexpr (kDeterministic) {
      // Every warp waits (and arrives, DqOrder), whether or not it has rows
      // or columns to add: the counts per key block stay kConsumerWarps.
      if (reduce_lane == 0) {
        order.BeforeReduce();
        if (dq_cols > 0) ReduceDqRows<Tr>(a, dq_stage, tile.b, head_of(i), m0, warp, dq_col0, dq_cols);
      }
    } else {
      if (reduce_lane == 0 && dq_cols > 0)
        ReduceDqRows<Tr>(a, dq_stage, tile.b, head_of(i), m0, warp, dq_col0, dq_cols);
    }
  };

  // kMasksBias(16): the first step's bias, under the K/V copy.
  if constexpr (kBias)
    if (steps.count > 0) load_bias(0);
  // kMasksDropout, kPlainDropout: the first two steps' keep bits (the
  // first's again for a tile of one step), published to the partner warps
  // by a barrier of the same warps as every step's dS^T barrier.
  if constexpr (kDropout)
    if (steps.count > 0) {
      keep_bits(0, 0);
      keep_bits(min(1, steps.count - 1), 1);
      if constexpr (Tr::kDqReadsBothDs) NamedBarrierSync(kDsBarrier, 256);
      else if (warpgroup == 0) NamedBarrierSync(kStageBarrier, 128);
      else NamedBarrierSync(kStageBarrier + 1, 128);
    }
  // A mask-policy variant's tile without steps: no K/V copy was issued.
  if (!kPolicy || steps.count > 0) MbarrierWait(bars.kv_full(), 0);
  // Step i up to its dQ product (done, in dq). kSendPrevious (kEarlyS, all
  // steps but the first): step i - 1's dQ share is sent right after step
  // i's S^T is issued, so that S^T runs under it. (Issuing S^T at the end
  // of step i - 1 instead kept it in flight across the loop's back edge,
  // where ptxas serialized every wgmma, C7514.) kDqFirst: step i whole,
  // its share sent inside it (under dK's product). `masked` (a
  // std::bool_constant): the plain kernel's per-element masks; false only
  // for kDiagonalMasks' steps that need none (needs_masks below).
  auto step = [&](int i, auto send_previous, auto masked) {
    constexpr bool kSendPrevious = decltype(send_previous)::value;
    [[maybe_unused]] constexpr bool kMasked = decltype(masked)::value;
    const int s = i % Tr::kStages;
    const uint32_t parity = (i / Tr::kStages) & 1;
    const int m0 = m0_of(i);
    issue_s(i);
    if constexpr (kSendPrevious && !kSendAfterDp) send_dq(i - 1);
    MbarrierWait(bars.do_full(s), parity);
    // Feature variants: the step's visibility bits, while S^T runs. The
    // warp's StepClass first (producer warp 3's, StageStepClasses,
    // published with do_full): hidden or visible whole, no policy to run; else
    // FeatureStepMask, whose reads (lengths, offsets, id summaries, ids)
    // hide under the product instead of holding back its issue; b and h
    // opaque, so that the policy is rebuilt from the parameters here rather
    // than held across the loop.
    // 128-query steps: the warp's first key opaque too, so that its key
    // summary entries (warp_j0 / 64) are rebuilt per step: hoisted, they were
    // the two words f16's kMasksSoftcap spilled (2 LDL per step).
    [[maybe_unused]] StepMaskBits<kBlockM> visible = ~StepMaskBits<kBlockM>(0);
    if constexpr (kPolicy) {
      uint32_t step_class;
      asm volatile("ld.shared.u8 %0, [%1];\n"
                   : "=r"(step_class)
                   : "r"(Opaque(smem) + Tr::kStepClassOffset + s * Tr::kStepClassBytes + 4 * warpgroup + warp)
                   : "memory");
      if (step_class == kStepHidden) {
        visible = 0;
      } else if (step_class != kStepVisible) {
        const int warp_j0 = wg_n0 + 16 * warp;
        visible = FeatureStepMask<kBlockM, ReadsDenseStepMask(kFeatures, kHeadDim)>(
            p, int(Opaque(uint32_t(tile.b))), int(Opaque(uint32_t(head_of(i)))), m0,
            Tr::kDqSplitRows ? int(Opaque(uint32_t(warp_j0))) : warp_j0, wg_n0 + row0, t);
      }
    }
    // dP^T = V dO^T [64 keys][64 queries], raw.
    float dpt[kBlockM / 2];
    const uint32_t base = Opaque(smem);
    const uint32_t q_tile = base + Tr::kQOffset + s * Tr::kQTileBytes;
    const uint32_t do_tile = base + Tr::kDoOffset + s * Tr::kQTileBytes;
    const uint32_t v_rows = base + Tr::kVOffset + warpgroup * 64 * 128;
    WgmmaFence();
    KeysTimesRowsT<Tr, Element, kBlockM, false, kUniform>(dpt, v_rows, do_tile);
    WgmmaCommit();
    // kBiasGradient: the next step's bias (the last step's again on the last
    // step, as below) under S^T and dP^T: without dK, dV and dQ its 32
    // words have registers to spare, and no later product would cover them.
    if constexpr (kBiasGradient) load_bias(min(i + 1, steps.count - 1));
    // kDeterministic: the counter of the block whose adds the previous
    // step's send saw complete, raised while S^T and dP^T run (DqOrder).
    if constexpr (kConsumerCounters && !kArriveAtSend) {
      if (lane == 0) DqOrder::Arrive(dq_counters, dq_complete);
      dq_complete = -1;
      // kReadAhead: this step's counter read once here (DqOrder::ready).
      if constexpr (kReadAhead)
        if (lane == 0 && CounterReached(dq_counters + counter_index(i), Tr::kConsumerWarps * dq_earlier(i)))
          dq_complete = -2;
    }
    // kLeanDqEarlyDp: step i - 1's share sent with both S^T and dP^T in flight.
    if constexpr (kSendPrevious && kSendAfterDp) send_dq(i - 1);
    // kMasksDropout, kPlainDropout: the step's keep bits, made two steps
    // ago under dK by this warp and its partner.
    [[maybe_unused]] const StepMaskBits<kBlockM> keep = read_keep(i);

    // P^T while dP^T is still on the tensor cores. Column c of the thread's
    // accumulators is query m0 + 8j + 2t + e; its lse2 and delta pairs come
    // from the stage's row statistics.
    const uint32_t stats = smem + Tr::kStatOffset + s * Tr::kStatBytes;
    WgmmaWait<1>();
    FenceRegisters(st);
    // Masks: keys past seqlen_k (TMA's zero rows would give P = 2^-lse2) and,
    // causal, keys after the query: key <= q + diagonal (a select per
    // element; a branch around them, even a warp-uniform one, made ptxas
    // serialize every wgmma of the kernel, C7520, as dP^T is in flight here).
    // Feature variants: the selects of `visible` instead (lengths, causal,
    // window, offsets and ids alike); kSoftcap: here only the soft cap's
    // tanh, kept in st for dS (no extra registers), P after dP^T below.
    // query - key offset, block-relative
    [[maybe_unused]] const int diagonal = a.is_causal ? m0 - wg_n0 : INT32_MAX / 2;
    [[maybe_unused]] const int key_limit = a.seqlen_k - wg_n0;
    if constexpr (kSoftcap) {
      SoftcapTanh<Element>(st, a.softcap_scale);
    } else {
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) {
        float2 lse2;
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(lse2.x), "=f"(lse2.y)
                     : "r"(stats + 4 * (8 * j + 2 * t))
                     : "memory");
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = st[4 * j + 2 * hh + e];
            if constexpr (kPolicy) {
              x = visible >> (kVisibleRowBits * hh + 2 * j + e) & 1u ? x : -CUDART_INF_F;
            } else if constexpr (kMasked) {
              const int key = row0 + 8 * hh, q = 8 * j + 2 * t + e;
              x = key < key_limit && key <= q + diagonal ? x : -CUDART_INF_F;
            }
            x = FastExp2(fmaf(x, a.scale_log2, -(e ? lse2.y : lse2.x)));
          }
      }
    }
    WgmmaWait<0>();
    FenceRegisters(dpt);
#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j) {
      float2 delta;
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                   : "=f"(delta.x), "=f"(delta.y)
                   : "r"(stats + 4 * (kBlockM + 8 * j + 2 * t))
                   : "memory");
      if constexpr (kSoftcap) {
        // P = exp2(capped logit * scale log2(e) - lse2) of the forward's
        // formula (capped = tanh * cap / scale); hidden pairs 0 by a select
        // (no -inf through the tanh's derivative). dS = P (dP - delta)
        // (1 - tanh^2): the soft cap's chain rule, as sm80's.
        float2 lse2;
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(lse2.x), "=f"(lse2.y)
                     : "r"(stats + 4 * (8 * j + 2 * t))
                     : "memory");
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int k = 4 * j + 2 * hh + e;
            const float th = st[k];
            const float prob = FastExp2(fmaf(th * a.softcap_unscale, a.scale_log2, -(e ? lse2.y : lse2.x)));
            bool seen = true;
            if constexpr (kPolicy) {
              seen = visible >> (kVisibleRowBits * hh + 2 * j + e) & 1u;
            } else if constexpr (kMasked) {  // kPlainSoftcap: the plain kernel's masks
              const int key = row0 + 8 * hh, q = 8 * j + 2 * t + e;
              seen = key < key_limit && key <= q + diagonal;
            }
            st[k] = seen ? prob : 0.0f;
            dpt[k] = st[k] * (dpt[k] - (e ? delta.y : delta.x)) * (1.0f - th * th);
          }
      } else if constexpr (kDropout) {
        // Z = keep / (1 - rate): dS = P (Z dP - delta), and dV's P^T is
        // keep ? P : 0 (dV scaled by 1 / (1 - rate) at its store).
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int k = 4 * j + 2 * hh + e;
            const bool kept = keep >> (kVisibleRowBits * hh + 2 * j + e) & 1u;
            dpt[k] = st[k] * fmaf(dpt[k], kept ? a.dropout_keep_scale : 0.0f, -(e ? delta.y : delta.x));
            st[k] = kept ? st[k] : 0.0f;
          }
      } else {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          dpt[4 * j + 2 * hh] = st[4 * j + 2 * hh] * (dpt[4 * j + 2 * hh] - delta.x);
          dpt[4 * j + 2 * hh + 1] = st[4 * j + 2 * hh + 1] * (dpt[4 * j + 2 * hh + 1] - delta.y);
        }
      }
    }
    if constexpr (kBiasGradient) {
      // Q, dO and the row statistics of stage s are read: released before
      // the stores, which read registers only.
      MbarrierArrive(bars.empty(s));  // every thread (BwdBarriers::empty)
      StoreBiasGradient<Tr, BiasT>(p, dpt, bias, steps.head(i, tile.hk, a.group), m0, t);
      return;
    }
    uint32_t p_frag[kBlockM / 16][4], ds_frag[kBlockM / 16][4];
    OnlineSoftmax<kBlockM, kHeadDim>::template ToFragments<Element>(st, p_frag);
    OnlineSoftmax<kBlockM, kHeadDim>::template ToFragments<Element>(dpt, ds_frag);
    // dS^T to shared memory before the products below take ds_frag as their
    // A operand: the PTX rules leave reading an in-flight wgmma's A
    // registers undefined (FlashAttention-3 also stores first).
    const uint32_t ds_buf = (i % 2) * Tr::kDsBytes;
    StoreDsTranspose<Tr>(smem + Tr::kDsOffset + ds_buf, ds_frag, warpgroup, row0, t);

    // dV += P^T dO, dK += dS^T Q (the step's queries are the k of both; dO
    // and Q [queries][head dim] are MN-major B operands).
    auto issue_dv = [&] {
      if constexpr (kUniform) {
        const UniformDescriptor do_desc(do_tile, Tr::kQChunkBytes, 1024);
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
          WgmmaRS<Element, kHeadDim>(dv, p_frag[kk], do_desc.At(MnMajorOffset(kk)), 1);
      } else {
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
          WgmmaRS<Element, kHeadDim>(dv, p_frag[kk], MnMajorDescriptor(do_tile, Tr::kQChunkBytes, kk), 1);
      }
    };
    auto issue_dk = [&] {
      if constexpr (kUniform) {
        const UniformDescriptor q_desc(q_tile, Tr::kQChunkBytes, 1024);
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
          WgmmaRS<Element, kHeadDim>(dk, ds_frag[kk], q_desc.At(MnMajorOffset(kk)), 1);
      } else {
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
          WgmmaRS<Element, kHeadDim>(dk, ds_frag[kk], MnMajorDescriptor(q_tile, Tr::kQChunkBytes, kk), 1);
      }
    };
    // The stores before the tensor cores' reads (async proxy), and, at 128,
    // the other warpgroup's too. Double buffering: a warpgroup writing step
    // i + 1's dS^T has passed step i's barrier, which the other reached
    // only after its step i - 1 dQ product (same buffer) completed (kDqFirst
    // too: its wait<1> below completes the dQ product before the step ends).
    auto ds_barrier = [&] {
      FenceProxyAsync();
      if constexpr (Tr::kDqReadsBothDs) NamedBarrierSync(kDsBarrier, 256);
      // (Literal ids per warpgroup: a computed one makes ptxas reserve all 16.)
      else if (warpgroup == 0) NamedBarrierSync(kStageBarrier, 128);
      else NamedBarrierSync(kStageBarrier + 1, 128);
    };
    // dQ share = dS K: A = dS (queries x keys) from dS^T in shared memory,
    // B = K (keys x head dim), both MN-major.
    auto issue_dq = [&] {
      const uint32_t dq_base = Opaque(smem);
      if constexpr (kUniform)
        IssueDqProductUniform<Element, Tr>(dq, DqDsRows<Tr>(dq_base + Tr::kDsOffset, warpgroup) + ds_buf,
                                           DqKCols<Tr>(dq_base + Tr::kKOffset, warpgroup));
      else
        IssueDqProduct<Element, Tr>(dq, DqDsRows<Tr>(dq_base + Tr::kDsOffset, warpgroup) + ds_buf,
                                    DqKCols<Tr>(dq_base + Tr::kKOffset, warpgroup));
    };
    if constexpr (kDqFirst) {
      // Three commit groups, in the order they are needed: dV (issued
      // before the barrier, so that it runs while this warpgroup waits for
      // the other's dS^T), dQ, dK. wgmma groups complete in commit order,
      // so wait<1> is dV and dQ done with dK still running: the share is
      // staged and sent under dK's product (FlashAttention-3's order), and
      // the next step's S^T and dP^T go out back to back. The dQ product's
      // own wgmma.fence (IssueDqProduct) orders dk's and ds_frag's last
      // writes before dK's wgmma too. No new barrier: the named barrier and
      // the stage arrival are kLeanDq's, in the same order per step.
      FenceRegisters(dv);
      FenceRegisters(dk);
      WgmmaFence();
      issue_dv();
      WgmmaCommit();
      ds_barrier();
      issue_dq();
      issue_dk();
      WgmmaCommit();
      WgmmaWait<1>();
      FenceRegisters(dq);
      FenceRegisters(dv);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) FenceRegisters(p_frag[kk]);
      // Reads no stage: Q and dO stay held only for dK's B operand.
      send_dq(i);
      // kMasksBias(16): the next step's bias (the last step's again on the
      // last step: no branch, every read in the bias), its latency under
      // the rest of dK and the step's end. After the send, whose staging
      // frees dQ's 32 registers for the raw words (issued before it, the
      // words beside dQ, dK, dV and dS^T's fragments made ptxas spill).
      // (The count rebuilt from m_count, as step_count below.)
      if constexpr (kBias) load_bias(min(i + 1, int(Opaque(uint32_t(steps.m_count))) * a.group - 1));
      // kMasksDropout, kPlainDropout: step i + 2's keep bits into its
      // buffer (past the last step: the last step's again, into a buffer
      // no step reads: no branch), likewise under dK.
      if constexpr (kDropout) keep_bits(min(i + 2, int(Opaque(uint32_t(steps.m_count))) * a.group - 1), i & 1);
      WgmmaWait<0>();
      FenceRegisters(dk);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) FenceRegisters(ds_frag[kk]);
      MbarrierArrive(bars.empty(s));  // every thread (BwdBarriers::empty)
      return;
    }

    FenceRegisters(dv);
    FenceRegisters(dk);
    WgmmaFence();
    if constexpr (kUniform) {
      issue_dv();
      issue_dk();
    } else {
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
        WgmmaRS<Element, kHeadDim>(dv, p_frag[kk], MnMajorDescriptor(do_tile, Tr::kQChunkBytes, kk), 1);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
        WgmmaRS<Element, kHeadDim>(dk, ds_frag[kk], MnMajorDescriptor(q_tile, Tr::kQChunkBytes, kk), 1);
    }
    WgmmaCommit();

    if constexpr (kUniform) {
      ds_barrier();
      issue_dq();
    } else {
      FenceProxyAsync();
      if constexpr (Tr::kDqReadsBothDs) NamedBarrierSync(kDsBarrier, 256);
      // (Literal ids per warpgroup: a computed one makes ptxas reserve all 16.)
      else if (warpgroup == 0) NamedBarrierSync(kStageBarrier, 128);
      else NamedBarrierSync(kStageBarrier + 1, 128);
      const uint32_t dq_base = Opaque(smem);
      IssueDqProduct<Element, Tr>(dq, DqDsRows<Tr>(dq_base + Tr::kDsOffset, warpgroup) + ds_buf,
                                  DqKCols<Tr>(dq_base + Tr::kKOffset, warpgroup));
    }
    WgmmaWait<0>();
    FenceRegisters(dq);
    FenceRegisters(dv);
    FenceRegisters(dk);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) FenceRegisters(p_frag[kk]), FenceRegisters(ds_frag[kk]);
    // Q, dO and the row statistics of stage s are read (the statistics by
    // plain loads): each thread releases the stage (BwdBarriers::empty).
    MbarrierArrive(bars.empty(s));
  };
  // kDiagonalMasks: whether step i's keys x queries need the per-element
  // masks in either warpgroup (block-uniform, so that both take the same
  // copy of the step and each of its named barriers is one instruction for
  // all 256 threads: reached from two copies, compute-sanitizer's synccheck
  // reported "divergent threads in block", session 19): causal where a key
  // may follow a query (key - query up to 127 - (m0 - n0) inside the block,
  // so m0 - n0 < 127; at 64-query steps the first warpgroup then also masks
  // the one step m0 = n0 + 64 that it alone would not), any where the
  // block's keys pass seqlen_k (TMA's zero rows would give P = 2^-lse2).
  // Queries past seqlen_q need none (lse2 = +inf gives P = 0).
  [[maybe_unused]] auto needs_masks = [&](int i) {
    const int n0 = tile.n_block * Tr::kBlockN;
    return (a.is_causal && m0_of(i) - n0 < Tr::kBlockN - 1) || n0 + Tr::kBlockN > a.seqlen_k;
  };
  // kCounters: step i's query block (m_first + m) and head (h), advanced
  // as BwdSteps::m0 / head count them (query blocks innermost).
  [[maybe_unused]] int counter_m = 0, counter_h = tile.hk * a.group;
  if constexpr (kDqFirst) {
    // 128-query steps: the count rebuilt per test from m_count (live anyway,
    // for m0) and the group (a kernel parameter: a constant-bank operand),
    // opaque so that it is not hoisted; held across the loop it was the
    // word ptxas spilled there (an LDL per step).
    auto step_count = [&] {
      // (kReadAhead at 128 too: its read in the S^T window, at the
      // registers' peak, made ptxas spill the held count, an LDL per step.)
      if constexpr (Tr::kDqSplitRows || kReadAhead) return int(Opaque(uint32_t(steps.m_count))) * a.group;
      else return steps.count;
    };
    // No wgmma is in flight between steps here, so the branch between the
    // two copies of the step is free of ptxas's serialization (C7520).
    for (int i = 0; i < step_count(); ++i) {
      if constexpr (kCounters) {
        step_m0 = (steps.m_first + counter_m) * kBlockM;
        step_h = counter_h;
      }
      if constexpr (kDiagonalMasks) {
        if (needs_masks(i)) step(i, std::false_type{}, std::true_type{});
        else step(i, std::false_type{}, std::false_type{});
      } else {
        step(i, std::false_type{}, std::true_type{});
      }
      if constexpr (kCounters) {
        if (++counter_m == steps.m_count) counter_m = 0, ++counter_h;
      }
    }
  } else if constexpr (kEarlyS) {
    if (steps.count > 0) {
      step(0, std::false_type{}, std::true_type{});
      for (int i = 1; i < steps.count; ++i) step(i, std::true_type{}, std::true_type{});
      send_dq(steps.count - 1);
    }
  } else {
    for (int i = 0; i < steps.count; ++i) {
      step(i, std::false_type{}, std::true_type{});
      send_dq(i);
    }
  }
  if constexpr (kBiasGradient) return;  // no dQ reduces, no dK, dV
  if constexpr (kHelper) {
    // Nothing: the helper warp's reads of the staging keep the block alive.
  } else if constexpr (kDeterministic) {
    // The last two steps' blocks: the one seen complete by the last send,
    // then the last step's own, once its reduces are complete.
    if (lane == 0) {
      DqOrder::Arrive(dq_counters, dq_complete);
      BulkWait<0>();
      DqOrder::Arrive(dq_counters, dq_previous);
    }
  } else {
    // The block's shared memory stays until the last reduce has read its
    // staging (the adds themselves complete on their own, before the grid
    // does, as a TMA store's after CUTLASS's epilogue wait).
    if (lane == 0) BulkWaitRead<0>();
  }

  // dK, dV through shared memory (KeyRowPiece). This warpgroup's K and V
  // rows are free once its own last products have completed (the step's
  // wait) and, where a warpgroup's dQ product reads the other's keys
  // (kDqReadsBothDs), once the other's has: the barrier both reach.
  if constexpr (Tr::kDqReadsBothDs) NamedBarrierSync(kDsBarrier, 256);
  const uint32_t k_tile = Opaque(smem) + Tr::kKOffset, v_tile = Opaque(smem) + Tr::kVOffset;
  StageKeyGradient<Element, Tr>(k_tile, warpgroup, dk, a.scale, row0, t);
  StageKeyGradient<Element, Tr>(v_tile, warpgroup, dv, kDropout ? a.dropout_keep_scale : 1.0f, row0, t);
  if (warpgroup == 0) NamedBarrierSync(kStageBarrier, 128);
  else NamedBarrierSync(kStageBarrier + 1, 128);
  StoreStagedKeyRows<Element, Tr>(a, a.dk, k_tile, warpgroup, wg_n0, tile.b, tile.hk, tid);
  StoreStagedKeyRows<Element, Tr>(a, a.dv, v_tile, warpgroup, wg_n0, tile.b, tile.hk, tid);
}

// DqHandoff::kHelperWarp's helper: warp 2 of the producer warpgroup, lane
// w serving consumer warp w (warpgroup w / 4, warp w % 4), steps in the
// consumers' order. Per step, each serving lane on its own (no warp
// collective): waits for the step's query block's counter (DqOrder's
// target: the earlier key blocks' arrivals; acquire, proxy fence) and for
// its warp's staged share (DqToHelper's `full`), issues the warp's
// reduce-adds (ReduceDqRows, none where the warp has no columns), frees
// the staging once they have read it, waits for them to complete and
// raises the counter by 1 (CounterArriveAfterBulk: the issuing thread's
// own release, as DqOrder's per warp; 8 lanes, kConsumerWarps per step).
template <typename Tr>
__device__ __forceinline__ void HelpDqSends(const BackwardArgs& a, uint32_t smem, const BwdTile& tile,
                                            const BwdSteps<Tr>& steps, int* dq_counters, int lane) {
  if (lane >= Tr::kConsumerWarps) return;  // lane w serves consumer warp w
  const DqHelperBarriers<Tr> helper{smem + Tr::kHelperBarrierOffset};
  const int warpgroup = lane / 4, warp = lane % 4;
  const int dq_col0 = Tr::kDqSplitColumns ? Tr::kDqCols * warpgroup : 0;
  const int dq_row0 = Tr::kDqSplitRows ? Tr::kDqRows * warpgroup : 0;
  const int dq_cols = min(Tr::kDqCols, a.head_dim - dq_col0);
  const uint32_t stage = smem + Tr::kDqStageOffset + warpgroup * Tr::kDqStageBytes;
  const int m_blocks = (a.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM;
  for (int i = 0; i < steps.count; ++i) {
    const int m0 = steps.m0(i), h = steps.head(i, tile.hk, a.group);
    int* const counter = dq_counters + (tile.b * a.num_heads + h) * m_blocks + m0 / Tr::kBlockM;
    // ConsumeBackwardTile's dq_earlier.
    const int last = a.is_causal ? min(a.key_blocks - 1, m0 / Tr::kBlockN) : a.key_blocks - 1;
    const int earlier = a.keys_descending ? last - tile.n_block : tile.n_block;
    // Each serving lane on its own: the counter (acquire, proxy fence),
    // then its warp's share, its adds, their reads (staging free), their
    // completion, and its own arrival (+1, release: CounterArriveAfterBulk,
    // the other handoffs' per-thread pattern; 8 lanes, +8 per step).
    CounterWaitAtLeast(counter, Tr::kConsumerWarps * earlier);
    MbarrierWait(helper.full(lane), i & 1);
    const int share_m0 = m0 + dq_row0;
    if (share_m0 + Tr::kDqRows <= a.seqlen_q && a.head_dim == Tr::kHeadDim) {
      // A full share: SendDqFull's runs (its staging order is
      // ReduceDqRows' for full groups), from one base.
      constexpr uint32_t kGroupBytes = 8 * Tr::kDqCols * 4;
      float* const rows = a.dq_accum + ((int64_t(tile.b) * a.num_heads + h) * a.seqlen_q + share_m0 + 16 * warp) *
                                           Tr::kHeadDim + dq_col0 * 8;
      const uint32_t src = stage + warp * 2 * kGroupBytes;
      if constexpr (Tr::kDqCols == Tr::kHeadDim) {
        BulkReduceAddF32(rows, src, 2 * kGroupBytes);
      } else {
        BulkReduceAddF32(rows, src, kGroupBytes);
        BulkReduceAddF32(rows + 8 * Tr::kHeadDim, src + kGroupBytes, kGroupBytes);
      }
      BulkCommit();
    } else if (dq_cols > 0) {
      ReduceDqRows<Tr>(a, stage, tile.b, h, share_m0, warp, dq_col0, dq_cols);
    }
    BulkWaitRead<0>();
    MbarrierArrive(helper.free(lane));
    BulkWait<0>();
    CounterArriveAfterBulk(counter);
  }
}

// The bias-gradient pass's tile order: BwdTile's, but where the bias is
// broadcast along the batch (its batch strides all 0), the batch entries
// of one (key block, key head) consecutive, so that the blocks summing into
// the same float32 bias-gradient elements (and reading the same bias rows)
// run together and find those lines in L2 (BwdTile's order runs each batch
// entry's whole sweep apart). Returns the BwdTile index of block `block`.
__device__ __forceinline__ int BiasGradientTileIndex(const BackwardArgs& a, const AttentionParams& p, int block) {
  const AttentionFeatures& f = p.features;
  bool batch_broadcast = true;
  for (int d = 0; d < f.num_batch_dims; ++d) batch_broadcast &= f.bias_stride.batch[d] == 0;
  if (!batch_broadcast || a.batch == 1) return block;
  const int b = block % a.batch, rest = block / a.batch;
  if (a.is_causal) {
    // BwdTile's causal order: key blocks outermost, then batch, key head.
    const int n_block = rest / a.num_heads_k, hk = rest % a.num_heads_k;
    return n_block * (a.num_heads_k * a.batch) + b * a.num_heads_k + hk;
  }
  // Otherwise key blocks innermost, then key head, batch.
  const int n_block = rest % a.key_blocks, hk = rest / a.key_blocks;
  return n_block + a.key_blocks * (hk + a.num_heads_k * b);
}

// One block's tile (BwdTile): the roles of BackwardKernel and
// BiasGradientKernel, told apart by kBiasGradient (ConsumeBackwardTile).
// kDeterministic, kHandoff: DeterministicBackwardKernel's (`dq_counters`, DqOrder).
template <typename Element, int kHeadDim, BwdSchedule kSchedule, Features kFeatures, bool kBiasGradient,
          bool kDeterministic = false, DqHandoff kHandoff = DqHandoff::kUnderS>
__device__ __forceinline__ void RunBackwardBlock(const CUtensorMap* q_map, const CUtensorMap* k_map,
                                                 const CUtensorMap* v_map, const CUtensorMap* do_map,
                                                 const BackwardArgs& a, const AttentionParams& p,
                                                 int* dq_counters = nullptr, const CUtensorMap* bias_map = nullptr) {
  using Tr = BwdTraitsFor<kHeadDim, kSchedule>;
  constexpr bool kPolicy = UsesMaskPolicy(kFeatures);
  constexpr bool kBiasTiles = kFeatures == Features::kMasksBiasTiles;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Swizzled tiles need 1024-byte aligned atoms (kSmemBytes includes the slack).
  const uint32_t smem = (SmemAddress(smem_raw) + 1023u) & ~1023u;
  const BwdBarriers<Tr> bars{smem + Tr::kBarrierOffset};
  constexpr bool kHelper = kDeterministic && kHandoff == DqHandoff::kHelperWarp;
  if (threadIdx.x == 0) {
    if constexpr (kBiasTiles) BwdBiasTile<Tr>{smem}.Init();  // (before bars.Init's fence)
    bars.Init(kPolicy);
    if constexpr (kHelper) DqHelperBarriers<Tr>{smem + Tr::kHelperBarrierOffset}.Init();
  }
  __syncthreads();

  // Every role derives the same tile and steps, so their phases agree.
  const BwdTile tile(a, kBiasGradient ? BiasGradientTileIndex(a, p, int(blockIdx.x)) : int(blockIdx.x),
                     std::bool_constant<kDeterministic>{});
  const BwdSteps<Tr> steps = BwdSteps<Tr>::template ForTile<kPolicy>(a, p, tile);
  // setmaxnreg needs each warpgroup's role as one branch of a single if/else.
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    RegistersDecrease<Tr::kProducerRegisters>();
    // A mask-policy variant's tile without steps copies nothing (its consumers
    // then wait on nothing and write zeros).
    if (threadIdx.x == 0) {
      if constexpr (kBiasTiles) {
        // The bias's batch row and head (0 where it is broadcast: BiasTilesCoordinate).
        PrefetchTensorMap(bias_map);
        if (steps.count > 0)
          ProduceBackwardTile<Tr, true>(q_map, k_map, v_map, do_map, a, bars, smem, tile, steps, bias_map,
                                        BiasTilesCoordinate(BiasFlatBatchStride(p.features), tile.b),
                                        p.features.bias_stride.head != 0);
      } else if (!kPolicy || steps.count > 0) {
        ProduceBackwardTile<Tr>(q_map, k_map, v_map, do_map, a, bars, smem, tile, steps);
      }
    } else if (threadIdx.x / 32 == 1) {
      StageRowStats<Tr, kFeatures, Element>(a, p, bars, smem, tile, steps, threadIdx.x % 32);
    } else if (kHelper && threadIdx.x / 32 == 2) {
      HelpDqSends<Tr>(a, smem, tile, steps, dq_counters, threadIdx.x % 32);
    } else if (threadIdx.x / 32 == 3) {
      if constexpr (kPolicy) StageStepClasses<Tr, kFeatures>(a, p, bars, smem, tile, steps, threadIdx.x % 32);
    }
  } else {
    RegistersIncrease<Tr::kConsumerRegisters>();
    ConsumeBackwardTile<Element, Tr, kSchedule, kFeatures, kBiasGradient, kDeterministic, kHandoff>(
        a, p, bars, smem, warpgroup - 1, tile, steps, dq_counters);
  }
}

// grid: key_blocks * num_heads_k * batch blocks, one tile each (BwdTile).
// `p`: the call's parameters, read by the feature variants' mask policy
// only (last, so that the plain kernel's argument offsets stay as they
// were); `bias_map`: kMasksBiasTiles's bias (bwd_launch.cuh; after p for
// the same reason; unset and unread elsewhere).
template <typename Element, int kHeadDim, BwdSchedule kSchedule, Features kFeatures = Features::kNone>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1)
    BackwardKernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                   const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                   const BackwardArgs a, const __grid_constant__ AttentionParams p,
                   const __grid_constant__ CUtensorMap bias_map) {
  RunBackwardBlock<Element, kHeadDim, kSchedule, kFeatures, false>(&q_map, &k_map, &v_map, &do_map, a, p, nullptr,
                                                                   &bias_map);
}

// The deterministic variant (bwd_launch.cuh's LaunchBackwardDeterministic;
// the check program only, not dispatched): BackwardKernel's plain kernel
// with every dQ add into a query block in ascending key block order
// (DqOrder over `dq_counters`, int32 [B, N, ceil(Tq / kBlockM)] zeroed
// before the call), so that dQ is the same bit for bit run to run, and,
// where a.causal_section asks for it, the sectioned tile order for
// non-causal calls too (BwdTile). Its own kernel, so that BackwardKernel's
// instantiations keep their names and code; the counters a parameter of
// their own after p, so that BackwardArgs, and with it p's offset in the
// parameters of every other kernel, stays as it is. kHandoff: where the
// counters are raised and read (DqHandoff; the default and three candidates).
template <typename Element, int kHeadDim, BwdSchedule kSchedule, DqHandoff kHandoff = DqHandoff::kUnderS>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1)
    DeterministicBackwardKernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                                const BackwardArgs a, const __grid_constant__ AttentionParams p, int* dq_counters) {
  RunBackwardBlock<Element, kHeadDim, kSchedule, Features::kNone, false, true, kHandoff>(
      &q_map, &k_map, &v_map, &do_map, a, p, dq_counters);
}

// The bias gradient alone (the dbias pass, bwd_launch.cuh's
// LaunchBiasGradientScheduled): the bias variants' tiles and steps, the
// same producer (K, V once; Q, dO, lse, delta and the bias rows per step),
// the consumers' S^T and dP^T products only (two of the backward's five)
// and dS^T into the bias gradient (StoreBiasGradient); the dS^T tile and
// dQ staging of the shared memory go unused. Grid as BackwardKernel's.
// kMasksBiasTiles (head dim 128): the bias read from BwdBiasTile's tile
// (`bias_map`), as the backward's; unset and unread elsewhere.
template <typename Element, int kHeadDim, BwdSchedule kSchedule, Features kFeatures>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1)
    BiasGradientKernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                       const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                       const BackwardArgs a, const __grid_constant__ AttentionParams p,
                       const __grid_constant__ CUtensorMap bias_map) {
  static_assert(AddsBias(kFeatures), "the bias gradient of the bias variants");
  RunBackwardBlock<Element, kHeadDim, kSchedule, kFeatures, true>(&q_map, &k_map, &v_map, &do_map, a, p, nullptr,
                                                                  &bias_map);
}

}  // namespace jax_flash::cuda::sm90
