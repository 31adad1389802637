// FlashAttention forward for Hopper (sm_90a), float16/bfloat16, causal, and
// in its feature variants (kFeatures, feature_mask.cuh) lengths, windows,
// position offsets, segment ids and the soft cap, or those and a bias
// (kMasksBias: BiasRows), a boolean mask (kMasksBoolean: MaskArrayRows,
// key padding trimmed by the producer) or dropout (kMasksDropout:
// dropout.cuh); the soft cap or dropout alone also on the plain kernel's
// loop, tiles and masks (kPlainSoftcap, kPlainDropout): FlashAttention-3's
// design in our own code.
//
// A persistent grid (one block per SM) walks tiles of (kBlockM query rows,
// head, batch) in tile_scheduler.cuh's order; each block has a producer and
// C = 2 consumer warpgroups (kBlockM = 128), or C = 3 at head dim 64
// (kBlockM = 192; kernel_traits.cuh's kConsumersAt64):
//
//   warpgroup 0 (producer, 40 registers at 64/128, 24 at 256, 32 with
//     C = 3; traits): one thread issues TMA copies
//     (pipeline.cuh): for each key block i of the tile (last to first)
//     into ring stage s (counted across the block's tiles):
//       wait k_empty[s]; K tile -> k_full[s];
//       (after the first K) wait q_empty; Q tile -> q_full;
//       wait v_empty[s]; V tile -> v_full[s]
//     (a tile without key blocks: wait q_empty, arrive q_full, no copy)
//   warpgroups 1 .. C (consumers, 232 / 240 registers; 160 with C = 3),
//     64 query rows each:
//     wait q_full; for each key block: wait k_full[s], S = Q K^T (wgmma,
//     smem x smem), arrive k_empty[s]; mask, online softmax in registers,
//     P to 16 bits (the A fragments); wait v_full[s], O += P V (wgmma,
//     registers x smem), arrive v_empty[s]; arrive q_empty after the last S,
//     so the next tile's Q loads early; then the epilogue (epilogue.cuh:
//     through a staging of its own, at 256 straight from the registers),
//     under which the next tile's first K/V stages load.
//
// Schedules of the consumer loop (Schedule, kernel_traits.cuh):
//   kSerial:   S_i, softmax_i, PV_i, one product in flight at a time.
//   kOverlap:  S_{i+1} and PV_i issued together; the softmax of S_{i+1}
//              runs while PV_i is still on the tensor cores (O's rescale
//              waits for the next issue, P's conversion for PV_i's end).
//   kPingPong: kOverlap, and the consumer warpgroups take turns to issue
//              their products, in a cycle 0 -> 1 (-> 2) -> 0 (named barriers
//              kTurnBarrier + w, kernel_traits.cuh), so that one
//              warpgroup's softmax runs under the others' products.
// Key blocks run last to first so the ones needing masks (the causal
// diagonal, the seqlen_k tail) come first and the rest skip mask arithmetic.
// A tile's key blocks are [lo, hi) (KeyBlocks): [0, its causal or seqlen_k
// end) in the plain kernel; in the feature variants the mask policy's range
// (computed by the producer warp, handed to the consumers in shared memory
// with Q: KeyBlocksSlot), and each block decides per warp whether it needs
// the element masks (FeatureRows::Block, ApplyFeatures), in one loop body
// (their positions vary: window edges, document boundaries).
#pragma once

#include <cuda.h>
#include <math_constants.h>

#include <cstdint>
#include <type_traits>

#include "common/params.h"
#include "cuda/sm90/bulk_reduce.cuh"
#include "cuda/sm90/dropout.cuh"
#include "cuda/sm90/epilogue.cuh"
#include "cuda/sm90/feature_mask.cuh"
#include "cuda/sm90/kernel_traits.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/softmax.cuh"
#include "cuda/sm90/tile_scheduler.cuh"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace jax_flash::cuda::sm90 {

// Named barrier ids (FwdTraits::kEpilogueBarrier, kTurnBarrier): 0 is
// __syncthreads; 1 .. C each consumer warpgroup's epilogue (128 threads);
// C + 1 .. 2C the ping-pong turns of consumer warpgroups 0 .. C - 1 (256
// threads each: ConsumeTile's turns).

// The plain kernel's key blocks of a tile of query rows [m0, m0 + kBlockM)
// (128 or 192 rows: two or three consumer warpgroups): the blocks with a key
// visible to some row of the tile (below seqlen_k and, causal, at most its
// last row m0 + kBlockM - 1); rows past seqlen_q count too (the last tile's
// are computed, not stored). Host-callable, as FirstMaskedKeyBlock, for
// tests/cpp/sm90_tile_scheduler_test.cu (against brute force).
template <typename Tr>
__host__ __device__ __forceinline__ KeyBlocks PlainKeyBlocks(const ForwardArgs& a, int m0) {
  const int kv_end = a.is_causal ? min(a.seqlen_k, m0 + Tr::kBlockM) : a.seqlen_k;
  return {0, (kv_end + Tr::kBlockN - 1) / Tr::kBlockN};
}

// The first key block that needs masks for rows from r0 (a consumer
// warpgroup's 64): block n is fully visible to every row >= r0 when its last
// key (n + 1) kBlockN - 1 is below seqlen_k and, causal, at most r0, i.e.
// n < limit / kBlockN. Exact for the rows [r0, r0 + 64) (row r0 misses key
// r0 + 1 of block limit / kBlockN, or that block crosses seqlen_k); an r0
// below the rows' first is safe (more blocks masked).
template <int kBlockN>
__host__ __device__ __forceinline__ int FirstMaskedKeyBlock(int seqlen_k, bool causal, int r0) {
  const int limit = causal ? min(seqlen_k, r0 + 1) : seqlen_k;
  return limit / kBlockN;
}

// One consumer warpgroup's whole tile: 64 query rows from m0 + 64 * warpgroup.
// `pipe`: the ring position of the tile's first key block, `tile_iter`: the
// block's count of earlier tiles (pipeline.cuh). The head and batch are
// decoded from `tile` again for the epilogue, their only user: kept live
// through the loop they made the 256 kernel spill.
// Key blocks keys.hi - 1 down to keys.lo. Mask-policy variants: `params`, `h`
// and `b` for the mask policy's per-block questions, `rows` this thread's
// FeatureRows (the plain kernel and kPlain* ignore them, kPlainDropout
// takes b and h for its Philox counters); their Q is already waited
// for (the wait that published `keys`, KeyBlocksSlot).
template <typename Element, typename Tr, Schedule kSchedule, Features kFeatures>
__device__ __forceinline__ void ConsumeTile(const ForwardArgs& a, const AttentionParams& params,
                                            const TileScheduler& scheduler, Barriers<Tr> bars, uint32_t smem,
                                            int warpgroup, int tile, int m0, int h, int b, KeyBlocks keys,
                                            int pipe, int tile_iter, const FeatureRows& rows,
                                            const CUtensorMap& o_map) {
  constexpr int kHeadDim = Tr::kHeadDim, kBlockN = Tr::kBlockN;
  // The mask policy's machinery (feature_mask.cuh); the plain kernel and its
  // kPlain* transforms take the plain kernel's masks and loops instead.
  constexpr bool kPolicy = UsesMaskPolicy(kFeatures);
  constexpr bool kBias = AddsBias(kFeatures);
  using BiasT = std::conditional_t<ReadsBias16(kFeatures), Element, float>;
  // kMasksBoolean, and kMasksSoftcap beside the soft cap, read a boolean
  // mask (ReadsMaskArray: MaskArrayRows, as below, when the call has one).
  constexpr bool kMaskArray = ReadsMaskArray(kFeatures);
  constexpr bool kDropout = AppliesDropout(kFeatures);
  // kPlainSoftcap: the tanh on every block (cap), before the plain masks of
  // the blocks that need them; the policy's variants apply it in
  // ApplyFeatures with their masks.
  constexpr bool kPlainSoftcap = kFeatures == Features::kPlainSoftcap;
  // kMasksDropout takes a key-only boolean mask (key padding) beside
  // dropout, when the call has one (UnsupportedFeatures' MaskBeside::kKeyOnly):
  // MaskArrayRows' key bytes, as below.
  constexpr bool kKeyMaskBeside = TakesKeyMaskBeside(kFeatures);
  const int n_hi = keys.hi, n_blocks = keys.hi - keys.lo;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, t = lane % 4;
  const int row0 = warp * 16 + lane / 4;  // this thread's rows in the warpgroup: row0, row0 + 8
  const int wg_m0 = m0 + 64 * warpgroup;
  const uint32_t q_rows = smem + Tr::kQOffset + warpgroup * 64 * 128;

  float o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.0f;
  // (kMasksSoftcap, kSoftcap: their logits reach the softmax as tanh(s scale / cap),
  // the factor cap / scale in the scale instead: ApplyFeatures.)
  OnlineSoftmax<kBlockN, kHeadDim> softmax(
      AppliesSoftcap(kFeatures)
          ? SoftcapSoftmaxScale(a.scale_log2, SoftcapFactors{a.softcap_scale, a.softcap_unscale})
          : a.scale_log2);

  // Plain kernel (and its kPlain* transforms): key blocks from first_masked
  // on need masks; block i of the
  // loop is key block n_hi - 1 - i. Mask-policy variants: every block goes
  // through ApplyFeatures (is_masked: the softmax's masked path for all).
  // FirstMaskedKeyBlock of rows from r0: two consumers
  // take r0 = m0 for both (the same answer as their own first rows: m0 is a
  // multiple of 128). Three: each its own first row (m0 = 192 k is not):
  // a causal tile's diagonal spans two key blocks (the scheduler test's
  // count), both masked for the first warpgroup, and for the others one or
  // both by m0 % 128 (at m0 = 192 the second's rows from 256 see all of key
  // block 1; at m0 = 384 the third's from 512 all of block 3); a block that a
  // warpgroup's rows cannot see at all (above its diagonal) still runs,
  // masked to -inf, since every consumer visits all of the tile's blocks
  // (the empties and the turns count them).
  const int first_masked =
      FirstMaskedKeyBlock<kBlockN>(a.seqlen_k, a.is_causal, Tr::kConsumerWarpgroups == 2 ? m0 : wg_m0);
  // The feature variants' masks of block i come from prepare(i), called
  // before its S is issued (BlockMask), from the tile's FeatureRows (ten
  // int32, taken from the policy once per tile) and the block's key-id
  // summaries, whose loads prepare(i - 1) issued (after the last block:
  // block 0's, harmless; none for a tile without blocks, whose position
  // would be negative); the plain kernel's need nothing.
  auto is_masked = [&](int i) { return kPolicy || n_hi - 1 - i >= first_masked; };
  // The batch row's key-id summaries (KeyBlockSummaries' row, once per
  // tile: rebuilt per block, its 64-bit offset cost ~20 instructions there).
  const int32_t* kv_ranges = nullptr;
  int kv_entries = 0;
  if constexpr (kPolicy) {
    const SegmentRanges ranges = MaskPolicy::KeySegmentRanges(params, b);
    kv_ranges = ranges.ranges, kv_entries = int(ranges.blocks);
  }
  auto key_summaries = [&](int n0) {
    SummaryEntries e{};
    if constexpr (kPolicy)  // (mask-policy variants only: at most 128 keys per block)
      if (kv_ranges) e = LoadSummaryEntries<kBlockN>(SegmentRanges{kv_ranges, kv_entries}, n0);
    return e;
  };
  // kMasksBias(16): this thread's bias rows for the tile (one broadcast
  // offset per tile); load_bias(i) puts block i's values, times 1 / scale
  // (softcap_unscale in these variants), into S's accumulators.
  // kMasksBiasTiles: the same values from the warpgroup's bias tile in
  // shared memory (bias_tiles.cuh), which the producer copied, in the
  // phase of the block's count (one tile per warpgroup).
  constexpr bool kBiasTiles = kFeatures == Features::kMasksBiasTiles;
  BiasRows<BiasT> bias{};
  if constexpr (kBias && !kBiasTiles) bias = BiasRows<BiasT>::For(params, b, h, wg_m0 + row0);
  auto load_bias = [&](float (&s)[kBlockN / 2], int i) {
    if constexpr (kBiasTiles) {
      BiasTiles<Tr>{smem}.template Load<BiasT>(s, warpgroup, warp, lane, uint32_t(pipe + i) & 1u, a.softcap_unscale);
    } else if constexpr (kBias) {
      bias.template Load<kBlockN>(s, (n_hi - 1 - i) * kBlockN, t, a.softcap_unscale);
    }
  };
  // kMasksBoolean: this thread's mask rows for the tile (one broadcast
  // offset per tile), and a key-only mask's bytes of the next block, read
  // a block ahead like the key-id summaries.
  // kKeyMaskBeside: only the key-only row's address (null without a mask;
  // MaskArrayRows' other state made kMasksDropout spill at 128).
  // A per-query mask with its block summary (AttentionFeatures::mask_blocks):
  // the warpgroup's summary row, and the next block's entries, read a block
  // ahead (blocks it hides whole or shows whole read no bytes).
  MaskArrayRows mask_rows{};
  const uint8_t* beside_keys = nullptr;
  MaskArrayRows::KeyBytes next_key_bytes{};
  const uint8_t* summary_row = nullptr;
  MaskBlockEntries next_entries{};
  // (kMasksSoftcap's calls may have no mask: params.features.mask tells,
  // read from the parameters where needed.)
  // (if constexpr: LoadKeys and MaskBlockEntries exist at kBlockN 128 and 64 only.)
  if constexpr (kMaskArray) if (params.features.mask) {
    mask_rows = MaskArrayRows::For(params, b, h, wg_m0 + row0);
    if (mask_rows.keys && n_blocks > 0) next_key_bytes = mask_rows.LoadKeys<kBlockN>((n_hi - 1) * kBlockN, lane);
    const AttentionFeatures& f = params.features;
    if (!mask_rows.keys && f.mask_blocks) {
      const MaskBlocks blocks = SliceMaskBlocks(f, b, h);
      summary_row = blocks.entries + min(wg_m0 / int(kMaskBlock), blocks.rows - 1) * blocks.cols;
      if (n_blocks > 0) next_entries = MaskBlockEntries::Load<kBlockN>(summary_row, blocks.cols, (n_hi - 1) * kBlockN);
    }
  }
  if constexpr (kKeyMaskBeside) {
    const AttentionFeatures& f = params.features;
    if (f.mask) beside_keys = f.mask + BroadcastOffset32(f, f.mask_stride, b, h);
    if (beside_keys && n_blocks > 0)
      next_key_bytes = MaskArrayRows::LoadKeys<kBlockN>(beside_keys, a.seqlen_k, (n_hi - 1) * kBlockN, lane);
  }
  SummaryEntries next_keys{};
  if constexpr (kPolicy)
    if (n_blocks > 0) next_keys = key_summaries((n_hi - 1) * kBlockN);
  // kMasksDropout, kPlainDropout (dropout.cuh): the tile's Philox keys and counter words;
  // block i's P dropped after its row sums, under the previous PV (drop); O
  // scaled by 1 / (1 - rate) once, before the epilogue.
  FragmentDropout dropout{};
  if constexpr (kDropout) dropout = FragmentDropout::For(params, b, h);
  auto drop = [&](float (&s)[kBlockN / 2], int i) {
    if constexpr (kDropout) dropout.ForwardDrop<kBlockN>(s, wg_m0 + row0, (n_hi - 1 - i) * kBlockN, t);
  };
  auto prepare = [&](int i) {
    BlockMask m{};
    if constexpr (kPolicy) {
      const int n0 = (n_hi - 1 - i) * kBlockN;
      const SummaryEntries keys = next_keys;
      next_keys = key_summaries(max(n0 - kBlockN, 0));
      m = rows.Block<kBlockN>(params, b, n0, t, keys);
      if constexpr (kMaskArray) if (params.features.mask) {
        if (mask_rows.keys) {  // (the same for the whole warp: ballots)
          const MaskArrayRows::KeyBytes bytes = next_key_bytes;
          next_key_bytes = mask_rows.LoadKeys<kBlockN>(max(n0 - kBlockN, 0), lane);
          MaskArrayRows::ApplyKeys<kBlockN>(m, bytes, t);
        } else {
          const uint32_t summary = next_entries.Bits();
          next_entries = MaskBlockEntries::Load<kBlockN>(summary_row, params.features.mask_block_cols,
                                                         max(n0 - kBlockN, 0));
          if (!(summary & kMaskBlockSome)) {
            m = {{0u, 0u}, true};  // hidden whole
          } else if (!(summary & kMaskBlockAll)) {
            mask_rows.ApplyRows<kBlockN>(m, n0, t);
          }  // (visible whole: the structural answer stands)
        }
      }
      if constexpr (kKeyMaskBeside) {
        if (beside_keys) {
          const MaskArrayRows::KeyBytes bytes = next_key_bytes;
          next_key_bytes = MaskArrayRows::LoadKeys<kBlockN>(beside_keys, a.seqlen_k, max(n0 - kBlockN, 0), lane);
          MaskArrayRows::ApplyKeys<kBlockN>(m, bytes, t);
        }
      }
    }
    return m;
  };
  auto mask = [&](float (&s)[kBlockN / 2], int i, const BlockMask& block_mask) {
    const int n0 = (n_hi - 1 - i) * kBlockN;
    if constexpr (kPolicy) {
      ApplyFeatures<Element, kBlockN, AppliesSoftcap(kFeatures)>(
          s, SoftcapFactors{a.softcap_scale, a.softcap_unscale}, block_mask);
    } else {
      MaskLogits<kBlockN>(s, 64 * warpgroup + row0, t, min(kBlockN, a.seqlen_k - n0), m0 - n0, a.is_causal);
    }
  };
  // kPlainSoftcap: tanh(s scale / cap) on every block, before its masks
  // (ApplyFeatures without any: the policy's variants do both there).
  auto cap = [&](float (&s)[kBlockN / 2]) {
    if constexpr (kPlainSoftcap)
      ApplyFeatures<Element, kBlockN, true>(s, SoftcapFactors{a.softcap_scale, a.softcap_unscale}, BlockMask{});
  };

  // S = Q K^T [64 rows][kBlockN] for block i, issued and committed (raw
  // logits; kMasksBias: added to the bias that load_bias(i) put in s).
  auto issue_qk = [&](float (&s)[kBlockN / 2], int i) {
    const int stage = (pipe + i) % Tr::kStages;
    MbarrierWait(bars.k_full(stage), ((pipe + i) / Tr::kStages) & 1);
    // (One descriptor per operand plus each step's constant offset: the
    // feature variants rebuilt both from their addresses at every step, ~24
    // uniform instructions a block, PERF v31.)
    const UniformDescriptor q_desc(q_rows, 16, 1024), k_desc(KTile<Tr>(smem, stage), 16, 1024);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk)
      WgmmaSS<Element, kBlockN>(s, q_desc.At(KMajorOffset(Tr::kQChunkBytes, kk)),
                                k_desc.At(KMajorOffset(Tr::kKvChunkBytes, kk)), kBias || kk > 0 ? 1 : 0);
    WgmmaCommit();
  };
  // O += P V for block i, issued and committed (V MN-major: VDescriptor).
  auto issue_pv = [&](uint32_t (&p)[kBlockN / 16][4], int i) {
    const int stage = (pipe + i) % Tr::kStages;
    MbarrierWait(bars.v_full(stage), ((pipe + i) / Tr::kStages) & 1);
    const UniformDescriptor v_desc(VTile<Tr>(smem, stage), Tr::kKvChunkBytes, 1024);
    FenceRegisters(o);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) WgmmaRS<Element, kHeadDim>(o, p[kk], v_desc.At(MnMajorOffset(kk)), 1);
    WgmmaCommit();
  };
  // Q's last reader is the tile's last S (the epilogue writes O through a
  // staging of its own, or at 256 straight from the registers: StoreOutput).
  auto release_q = [&]() {
    if (lane == 0) MbarrierArrive(bars.q_empty());
  };
  auto release_k = [&](int i) {
    if (lane == 0) MbarrierArrive(bars.k_empty((pipe + i) % Tr::kStages));
    if (i == n_blocks - 1) release_q();
  };
  auto release_v = [&](int i) {
    if (lane == 0) MbarrierArrive(bars.v_empty((pipe + i) % Tr::kStages));
  };
  // After a wait: the results are in registers, and the A fragments free.
  auto settle = [&](float (&s)[kBlockN / 2], uint32_t (&p)[kBlockN / 16][4]) {
    FenceRegisters(s);
    FenceRegisters(o);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) FenceRegisters(p[kk]);
  };

  // Ping-pong turns: warpgroup w waits on barrier kTurnBarrier + w before
  // issuing a step's products (S_i with PV_{i-1}, i = 1 .. n_blocks - 1; the
  // tile's first S and last PV go without turns, as in FlashAttention-3)
  // and then opens the next one's, (w + 1) % C: the turns go round 0, 1,
  // (2,) 0, ... Barrier kTurnBarrier + w thus joins two warpgroups, w (128
  // threads in bar.sync) and w - 1 mod C (128 in bar.arrive): 256 threads
  // with two or three consumers alike. The last warpgroup (C - 1) opens
  // warpgroup 0's first turn and skips opening one after its last, so within
  // each tile every barrier sees n_blocks - 1 arrivals of 128 threads and as
  // many waits (all consumers visit the same n_blocks), and the barriers
  // are idle between tiles. An arrival never overtakes the previous one's
  // wait: warpgroup w - 1 arrives on w's barrier again only after its own
  // next turn, which needs the whole cycle, hence w's wait, in between.
  constexpr int kConsumers = Tr::kConsumerWarpgroups;
  constexpr bool kTurns = kSchedule == Schedule::kPingPong;
  auto begin_turn = [&]() {
    if constexpr (kTurns) NamedBarrierSync(Tr::kTurnBarrier + warpgroup, 256);
  };
  auto end_turn = [&](bool last) {
    if constexpr (kTurns) {
      if constexpr (kConsumers == 2) {
        if (!(last && warpgroup == 1)) NamedBarrierArrive(Tr::kTurnBarrier + (1 - warpgroup), 256);
      } else {
        if (!(last && warpgroup == kConsumers - 1))
          NamedBarrierArrive(Tr::kTurnBarrier + (warpgroup == kConsumers - 1 ? 0 : warpgroup + 1), 256);
      }
    }
  };
  if constexpr (kTurns)
    if (warpgroup == kConsumers - 1 && n_blocks > 1) NamedBarrierArrive(Tr::kTurnBarrier, 256);

  if constexpr (!kPolicy) MbarrierWait(bars.q_full(), tile_iter & 1);
  if (n_blocks == 0) release_q();

  if constexpr (kSchedule == Schedule::kSerial) {
    auto process_block = [&](int i, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      float s[kBlockN / 2];
      uint32_t p[kBlockN / 16][4];
      const auto block_mask = prepare(i);
      load_bias(s, i);
      issue_qk(s, i);
      WgmmaWait<0>();
      FenceRegisters(s);
      release_k(i);
      cap(s);
      if constexpr (kMasked) mask(s, i, block_mask);
      float alpha[2];
      if (softmax.UpdateMax(s, alpha)) softmax.Rescale(o, alpha);
      softmax.template Exponentiate<kMasked>(s);
      drop(s, i);
      softmax.template ToFragments<Element>(s, p);
      issue_pv(p, i);
      WgmmaWait<0>();
      settle(s, p);
      release_v(i);
    };
    int i = 0;
    for (; i < n_blocks && is_masked(i); ++i) process_block(i, std::true_type{});
    if constexpr (!kPolicy)
      for (; i < n_blocks; ++i) process_block(i, std::false_type{});
  } else if (n_blocks > 0) {
    float s[kBlockN / 2];
    uint32_t p[kBlockN / 16][4];
    // O's pending rescale: block i's statistics change the row maxima while
    // PV_{i-1} still accumulates into O, so O is rescaled just before PV_i
    // is issued (under S_{i+1}, which does not touch O).
    float alpha[2] = {1.0f, 1.0f};
    uint32_t rescale = 0;
    // Block 0: S alone (nothing to overlap with yet); O is still zero.
    const auto first_mask = prepare(0);
    load_bias(s, 0);
    issue_qk(s, 0);
    WgmmaWait<0>();
    FenceRegisters(s);
    release_k(0);
    cap(s);
    if (is_masked(0)) {
      mask(s, 0, first_mask);
      softmax.UpdateMax(s, alpha);
      softmax.template Exponentiate<true>(s);
    } else {
      softmax.UpdateMax(s, alpha);
      softmax.template Exponentiate<false>(s);
    }
    drop(s, 0);
    softmax.template ToFragments<Element>(s, p);
    // Block i >= 1: S_i issued first, then PV_{i-1}; S_i completes first
    // (groups retire in order) and its whole softmax runs under PV_{i-1};
    // only P_i's conversion into the A fragments (which PV_{i-1} reads)
    // waits for it (FlashAttention-3's intra-warpgroup overlap).
    auto step = [&](int i, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      const auto block_mask = prepare(i);
      // (Before the turn: a wait for the bias loads holds no other warpgroup up.)
      load_bias(s, i);
      begin_turn();
      issue_qk(s, i);
      if (rescale) softmax.Rescale(o, alpha);
      issue_pv(p, i - 1);
      end_turn(i == n_blocks - 1);
      WgmmaWait<1>();
      FenceRegisters(s);
      release_k(i);
      cap(s);
      if constexpr (kMasked) mask(s, i, block_mask);
      rescale = softmax.UpdateMax(s, alpha);
      softmax.template Exponentiate<kMasked>(s);
      drop(s, i);
      // Pins the softmax before the wait. The register fences keep the
      // compiler from sinking it to its uses after the wait; ptxas would
      // still hoist the wait above the exponentials (it cannot know how
      // long the wait blocks), so a warp-uniform branch on their sums ends
      // the basic block there: ptxas does not schedule across it. (Taken
      // only for NaN sums, and then harmless.)
      FenceRegisters(s);
      FenceRegisters(alpha);
      asm volatile("" : "+r"(rescale)::"memory");
      if (__any_sync(0xffffffffu, !(softmax.row_sum[0] + softmax.row_sum[1] >= 0.0f)))
        asm volatile("nanosleep.u32 0;\n" ::: "memory");
      WgmmaWait<0>();
      settle(s, p);
      release_v(i - 1);
      softmax.template ToFragments<Element>(s, p);
    };
    int i = 1;
    for (; i < n_blocks && is_masked(i); ++i) step(i, std::true_type{});
    if constexpr (!kPolicy)
      for (; i < n_blocks; ++i) step(i, std::false_type{});
    if (rescale) softmax.Rescale(o, alpha);
    issue_pv(p, n_blocks - 1);
    WgmmaWait<0>();
    settle(s, p);
    release_v(n_blocks - 1);
  }

  if constexpr (kDropout) {
    const float keep_scale[2] = {dropout.keep_scale, dropout.keep_scale};
    softmax.Rescale(o, keep_scale);
  }
  const uint32_t staging = smem + Tr::kStagingOffset + warpgroup * 64 * 128;
  TileCoord coord{0, h, b};
  if constexpr (!kPolicy) {
    asm volatile("" : "+r"(tile));  // an opaque value: decoded here, not carried from the top
    coord = scheduler.Decode(tile);
  }
  StoreOutput<Element, Tr>(a, softmax, o, staging, &o_map, Tr::kEpilogueBarrier + warpgroup, row0, wg_m0, coord.h,
                           coord.b, SinkLog2<float>(params.features, coord.b, coord.h, a.num_heads));
}

// The block's shared memory (ForwardKernel's launch): the traits' map, and
// past it kMasksBiasTiles's bias tiles.
template <typename Tr, Features kFeatures>
constexpr int ForwardKernelSmemBytes() {
  if constexpr (kFeatures == Features::kMasksBiasTiles) return BiasTiles<Tr>::kSmemBytes;
  return Tr::kSmemBytes;
}

// bias_map: kMasksBiasTiles's bias (launch.cuh; the last parameter, so that
// the others' offsets, hence every other variant's code, stay as they were;
// unused and unset elsewhere).
template <typename Element, int kHeadDim, int kBlockN, Schedule kSchedule, Features kFeatures = Features::kNone,
          int kConsumers = 2>
__global__ void __launch_bounds__(FwdTraits<kHeadDim, kBlockN, kConsumers>::kThreads, 1)
    ForwardKernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                  const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                  const ForwardArgs a,
                  const TileScheduler scheduler, const __grid_constant__ AttentionParams p,
                  const __grid_constant__ CUtensorMap bias_map) {
  using Tr = FwdTraits<kHeadDim, kBlockN, kConsumers>;
  constexpr bool kPolicy = UsesMaskPolicy(kFeatures);
  constexpr bool kBiasTiles = kFeatures == Features::kMasksBiasTiles;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Swizzled tiles need 1024-byte aligned atoms (kSmemBytes includes the slack).
  const uint32_t smem = (SmemAddress(smem_raw) + 1023u) & ~1023u;
  const Barriers<Tr> bars{smem + Tr::kBarrierOffset};

  if (threadIdx.x == 0) {
    if constexpr (kBiasTiles) BiasTiles<Tr>{smem}.Init();  // (before bars.Init's fence)
    bars.Init();
  }
  __syncthreads();

  // Both roles walk the same tiles and count the same key blocks, so their
  // barrier phases agree without any other exchange: the same rounds
  // (Next, skipping the -1 of a section's last round without a tile),
  // the same Decode and the same key blocks: PlainKeyBlocks in each role,
  // or in the feature variants FeatureKeyBlocks in the producer warp (warp
  // votes), which hands them to the consumers (KeyBlocksSlot). keys_of(m0,
  // h, b, tile_iter): the role's key blocks of the tile.
  auto for_each_tile = [&](auto&& keys_of, auto&& body) {
    const int tiles = int(scheduler.Tiles());
    int pipe = 0, tile_iter = 0;  // key blocks and tiles so far
    for (TileCursor cursor;;) {
      const int tile = scheduler.Next(cursor, blockIdx.x, gridDim.x);
      if (tile >= tiles) break;  // past the end
      if (tile < 0) continue;    // no tile this round (a section's last round)
      const TileCoord c = scheduler.template Decode<AddsBias(kFeatures)>(tile);
      const int m0 = c.m_block * Tr::kBlockM;
      const KeyBlocks keys = keys_of(m0, c.h, c.b, tile_iter);
      body(tile, m0, c.h, c.b, keys, pipe, tile_iter, 0);
      pipe += keys.hi - keys.lo;
      ++tile_iter;
    }
  };
  // The feature variants' dynamic schedule (p.tile_counter set, the
  // package's calls): the same tiles in the same order (Decode's: heaviest
  // first, sections), but taken one at a time as blocks come free instead
  // of dealt in rounds. Their cost is the visible key blocks, which with
  // segment ids the host does not know: packed documents make it periodic
  // in the query block (each document's diagonal), and dealt in rounds the
  // busiest block of a 4-documents-per-row call had 1.6x the mean work
  // (Nsight Compute: SM active cycles 62% of the elapsed ones; the same
  // tiles as one document of 1024 rows per batch row: 92%). Block x takes
  // tile x first, then gridDim.x + the counter's next value; the producer's
  // lane 0 takes each one a tile ahead of its use (its latency under a
  // tile's copies) and publishes it in the slot of the tile before it, so
  // the consumers know a tile before they wait for its Q.
  auto for_each_taken_tile = [&](auto&& take, auto&& keys_of, auto&& body) {
    const int tiles = int(scheduler.Tiles());
    int pipe = 0, tile_iter = 0;
    for (int tile = blockIdx.x; tile < tiles;) {
      const TileCoord c = scheduler.template Decode<AddsBias(kFeatures)>(tile);
      const int m0 = c.m_block * Tr::kBlockM;
      int next_tile = 0;
      const KeyBlocks keys = keys_of(m0, c.h, c.b, tile_iter, &next_tile);
      body(tile, m0, c.h, c.b, keys, pipe, tile_iter, next_tile);
      pipe += keys.hi - keys.lo;
      ++tile_iter;
      tile = take(next_tile);
    }
  };
  // (The plain kernel has no slot to publish the next tile in: static only.)
  bool taken = false;
  if constexpr (kPolicy) taken = p.tile_counter != nullptr;

  // setmaxnreg needs each warpgroup's role as one branch of a single if/else.
  if (threadIdx.x < 128) {
    RegistersDecrease<Tr::kProducerRegisters>();
    // One thread issues the copies; the feature variants run the whole warp
    // through the loop for FeatureKeyBlocks' votes.
    if (kPolicy ? threadIdx.x < 32 : threadIdx.x == 0) {
      if (threadIdx.x == 0) {
        PrefetchTensorMaps(&q_map, &k_map, &v_map), PrefetchTensorMap(&o_map);
        if constexpr (kBiasTiles) PrefetchTensorMap(&bias_map);
      }
      const int64_t bias_batch_stride = kBiasTiles ? BiasFlatBatchStride(p.features) : 0;
      auto keys_of = [&](int m0, int h, int b, int) {
        if constexpr (kPolicy) {
          return FeatureKeyBlocks<Tr::kBlockM, Tr::kBlockN, ReadsMaskArray(kFeatures) || TakesKeyMaskBeside(kFeatures),
                                  ReadsMaskArray(kFeatures)>(p, m0, b, h);
        } else {
          return PlainKeyBlocks<Tr>(a, m0);
        }
      };
      auto produce = [&](int, int m0, int h, int b, KeyBlocks keys, int pipe, int tile_iter, int next_tile) {
        if (threadIdx.x == 0) {
          // kMasksBiasTiles: the bias's head and batch row (0 where it is
          // broadcast: BiasTilesCoordinate).
          const int bias_h = kBiasTiles ? BiasTilesCoordinate(p.features.bias_stride.head, h) : 0;
          const int bias_b = kBiasTiles ? BiasTilesCoordinate(bias_batch_stride, b) : 0;
          ProduceTile<Tr, kPolicy, kBiasTiles>(&q_map, &k_map, &v_map, bars, smem, m0, h, a.group.Div(h), b, keys,
                                               pipe, tile_iter, next_tile, &bias_map, bias_h, bias_b);
        }
      };
      if (taken) {
        // Lane 0's counter values, one tile ahead: `ahead` is the tile after
        // `next` (in flight while this tile is produced), broadcast when
        // `next` becomes the current tile. Values past the last tile are
        // harmless (every block stops at its first).
        const int tiles = int(scheduler.Tiles());
        auto counter_take = [&] { return int(gridDim.x) + atomicAdd(p.tile_counter, 1); };
        int ahead = threadIdx.x == 0 && int(blockIdx.x) < tiles ? counter_take() : tiles;
        int next = __shfl_sync(0xffffffffu, ahead, 0);
        for_each_taken_tile(
            [&](int) {
              const int tile = next;
              next = __shfl_sync(0xffffffffu, ahead, 0);
              return tile;
            },
            [&](int m0, int h, int b, int tile_iter, int* next_tile) {
              if (threadIdx.x == 0 && next < tiles) ahead = counter_take();
              *next_tile = next;
              return keys_of(m0, h, b, tile_iter);
            },
            produce);
      } else {
        for_each_tile(keys_of, produce);
      }
    }
  } else {
    RegistersIncrease<Tr::kConsumerRegisters>();
    // The consumer warpgroup (0 .. C - 1), broadcast from lane 0 after the
    // setmaxnreg (CUTLASS's canonical_warp_group_idx): ptxas then knows it
    // is warp-uniform, so what derives from it (the warpgroup's Q rows,
    // hence its wgmma descriptors) lives in uniform registers instead of
    // loop-invariant general ones, which made the feature variants at 256
    // spill inside the key-block loop. (Taken before the setmaxnreg, it was
    // spilled across it.)
    const int warpgroup = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0) - 1;
    // Feature variants: this thread's FeatureRows, whose loads are issued
    // before the wait for Q that publishes the tile's key blocks (and, taken
    // tiles, the block's next tile).
    FeatureRows rows{};
    auto keys_of = [&](int m0, int, int b, int tile_iter, int* next_tile = nullptr) {
      if constexpr (kPolicy) {
        const int tid = threadIdx.x % 128, warp_i0 = m0 + 64 * warpgroup + 16 * (tid / 32);
        rows = FeatureRows::For<Tr::kBlockN>(p, b, warp_i0, warp_i0 + tid % 32 / 4);
        MbarrierWait(bars.q_full(), tile_iter & 1);
        const uint32_t slot = KeyBlocksSlot<Tr>(smem, tile_iter);
        if (next_tile) *next_tile = LoadNextTile(slot);
        return LoadKeyBlocks(slot);
      } else {
        return PlainKeyBlocks<Tr>(a, m0);
      }
    };
    auto consume = [&](int tile, int m0, int h, int b, KeyBlocks keys, int pipe, int tile_iter, int) {
      ConsumeTile<Element, Tr, kSchedule, kFeatures>(a, p, scheduler, bars, smem, warpgroup, tile, m0, h, b, keys,
                                                     pipe, tile_iter, rows, o_map);
    };
    if (taken) {
      for_each_taken_tile([](int next_tile) { return next_tile; }, keys_of, consume);
    } else {
      for_each_tile(keys_of, consume);
    }
    // The last tile's output stores read the staging until they are done:
    // the block's shared memory must outlive them.
    if constexpr (Tr::kSeparateStaging)
      if (threadIdx.x % 128 == 0) BulkWaitRead<0>();
  }
}

}  // namespace jax_flash::cuda::sm90
