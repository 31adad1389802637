// Tile sizes, warpgroup roles and the shared-memory map of the Hopper
// backward (bwd_kernel.cuh), per padded head dim, in this one place.
#pragma once

#include <type_traits>
#include <cstdint>

namespace jax_flash::cuda::sm90 {

// How a consumer warpgroup orders a step's products (bwd_kernel.cuh):
//   kSerial: S^T, dP^T, dV / dK, dQ, then the dQ staging, step after step.
//   kEarlyS: the next step's S^T issued before this step's dQ staging, so
//            the tensor cores run it under the staging (the check program
//            times all of them).
//   kLeanDq: kEarlyS, but a step whose 64 queries are all below seqlen_q at
//            an unpadded head dim (every step but a tail) stages its dQ
//            share with constant offsets and sends it as one bulk
//            reduce-add per contiguous run (bwd_kernel.cuh, SendDqFull):
//            kEarlyS's general staging, with a bounds test per store and
//            ReduceDqRows' row-tail paths, is ~320 of a consumer warp's
//            ~950-1130 executed instructions per step (estimated from the
//            SASS), all of them between S^T's issue and dP^T's, on the
//            step's critical path; the lean send is ~75-95. The default:
//            on the H200 (session 17, B=4 T=4096, bf16) 1.05x / 1.08x
//            kEarlyS at 128 (non-causal / causal), 1.16x / 1.03x at 64.
//   kLeanDqEarlyDp: kLeanDq with the send after dP^T's issue too, so that
//            both S^T and dP^T run under it (dQ's 32 floats stay live
//            across dP^T's issue: 32 more registers at the peak).
// tests/cuda/sm90_bwd_check.cu times them all. kLeanDqEarlyDp measured
// 1.01x kLeanDq at 64 non-causal and 0.94x causal: not taken.
//
// Session 17's candidates (the check program only; appended, so that the
// values above, which are in the kernels' mangled names, stay as they are):
//   kDqFirst: dV's product issued before the dS^T barrier, then dQ's, then
//            dK's (three commit groups); a wait for dV and dQ leaves dK on
//            the tensor cores while the dQ share is staged and sent (the
//            lean send), so the next step's S^T and dP^T are issued back to
//            back with nothing between them (FlashAttention-3's order).
//            Nothing is in flight across a step boundary.
//   kLeanDqUniform: kLeanDq with the warpgroup index broadcast by a shuffle
//            (ptxas then knows it warp-uniform and keeps the descriptors in
//            uniform registers) and each product's descriptors as one base
//            per operand plus constant offsets in the low word
//            (UniformDescriptor, bwd_kernel.cuh): kLeanDq rebuilds every
//            descriptor from a vector register (~8 instructions and 2 R2UR
//            per wgmma, 32 wgmma per step at 128).
//   kDqFirstUniform: both.
//   kDqFirstUniformDiag: both, and the plain kernel's per-element masks
//            (causal and the key tail) only on the steps whose keys x
//            queries need them (a warpgroup-uniform test per step choosing
//            one of two copies of the step; ~96 instructions per step
//            saved elsewhere).
//   kDqFirstUniformDiagCounters: that, with the step's query block and
//            head carried as counters across steps instead of BwdSteps'
//            i % m_count and i / m_count (a signed division, ~20
//            instructions and a MUFU.RCP, per step).
//   kLeanDqRows128, kDqFirstUniformRows128,
//   kDqFirstUniformDiagCountersRows128 (head dim 64 only): kLeanDq,
//            kDqFirstUniform and kDqFirstUniformDiagCounters over 128-query
//            steps, dQ split between the
//            consumer warpgroups by query rows (BwdTraits<64, 128> below:
//            FlashAttention-3's 128 x 128 tile at 64). The 64-query steps
//            make every product at 64 an N = 64 one and each warpgroup
//            reduce the whole 64 x 64 dQ from its own 64 keys (twice the
//            reduce bytes per FLOP of a split); here S^T and dP^T are
//            N = 128, dQ is reduced once, and a step's fixed costs (the
//            barriers, waits, the send's issue) are spread over twice the
//            FLOPs.
// Session 37's (appended likewise):
//   kDqFirstUniformCounters, kDqFirstUniformCountersRows128:
//            kDqFirstUniform(Rows128) with the step counters of
//            kDqFirstUniformDiagCounters(Rows128) (the feature variants,
//            whose masks are the mask policy's, not the diagonal's).
enum class BwdSchedule {
  kSerial,
  kEarlyS,
  kLeanDq,
  kLeanDqEarlyDp,
  kDqFirst,
  kLeanDqUniform,
  kDqFirstUniform,
  kDqFirstUniformDiag,
  kDqFirstUniformDiagCounters,
  kLeanDqRows128,
  kDqFirstUniformRows128,
  kDqFirstUniformDiagCountersRows128,
  kDqFirstUniformCounters,
  kDqFirstUniformCountersRows128
};
constexpr bool BwdRows128(BwdSchedule s) {
  return s == BwdSchedule::kLeanDqRows128 || s == BwdSchedule::kDqFirstUniformRows128 ||
         s == BwdSchedule::kDqFirstUniformDiagCountersRows128 || s == BwdSchedule::kDqFirstUniformCountersRows128;
}
constexpr bool BwdStepCounters(BwdSchedule s) {
  return s == BwdSchedule::kDqFirstUniformDiagCounters || s == BwdSchedule::kDqFirstUniformDiagCountersRows128 ||
         s == BwdSchedule::kDqFirstUniformCounters || s == BwdSchedule::kDqFirstUniformCountersRows128;
}
constexpr bool BwdDiagonalMasks(BwdSchedule s) {
  return s == BwdSchedule::kDqFirstUniformDiag || BwdStepCounters(s);
}
constexpr bool BwdDqFirst(BwdSchedule s) {
  return s == BwdSchedule::kDqFirst || s == BwdSchedule::kDqFirstUniform || BwdStepCounters(s) ||
         BwdDiagonalMasks(s) || s == BwdSchedule::kDqFirstUniformRows128;
}
constexpr bool BwdUniformDescriptors(BwdSchedule s) {
  return s == BwdSchedule::kLeanDqUniform || s == BwdSchedule::kDqFirstUniform || BwdStepCounters(s) ||
         BwdDiagonalMasks(s) || s == BwdSchedule::kDqFirstUniformRows128;
}

// The package's schedules. Plain kernels: at 128 kDqFirstUniformDiagCounters,
// at 64 kDqFirstUniformDiagCountersRows128. On the H200 (session 18,
// sm90_bwd_check --plain, B=4 T=S=4096, bf16, each timed right after
// kLeanDq): at 128 499 / 434 TFLOP/s (non-causal / causal; kLeanDq 455 /
// 397, 1.10x / 1.13x; kDqFirstUniformDiag was 1% faster non-causal but
// 0.99x causal), at 64 474 / 329 (kLeanDq 360 / 262, 1.31x / 1.27x; sm80's
// fused backward ~312 / ~284). The feature variants: kDqFirstUniform at
// 128, kDqFirstUniformRows128 at 64 (the plain defaults' step order and
// descriptors without their diagonal-only masks and counters, which with
// features every step's FeatureStepMask replaces). On the H200 (session 19,
// sm90_bwd_check --features, B=4 T=S=4096 bf16, each timed beside kLeanDq,
// TFLOP/s over visible pairs): at 128 packed causal 265 (kLeanDq 238,
// 1.16x), window (512, 0) 254 (1.18x), soft cap 446 (1.21x); at 64 over
// 128-query steps 231 (1.26x), 230 (1.27x), 380 (1.36x), against sm80's
// 119 / 106 / 119 (64-query steps at 64: 1.04-1.13x).
constexpr BwdSchedule DefaultBwdSchedule(int head_dim) {
  return head_dim <= 64 ? BwdSchedule::kDqFirstUniformDiagCountersRows128 : BwdSchedule::kDqFirstUniformDiagCounters;
}
// Since session 37 the feature variants take the step counters too
// (kDqFirstUniformCounters, kDqFirstUniformCountersRows128: the plain
// defaults' counters, not their diagonal-only masks): with the step class
// (FeatureStepClass) deciding a step's masks, the division by the query
// block count was ~25-30 of a visible step's ~580 (128) / ~830 (64)
// instructions (SASS: the cheapest path through kMasks's step).
constexpr BwdSchedule FeatureBwdSchedule(int head_dim) {
  return head_dim <= 64 ? BwdSchedule::kDqFirstUniformCountersRows128 : BwdSchedule::kDqFirstUniformCounters;
}
// The dropout variant's: 64-query steps at every head dim. Over 128-query
// steps at 64 its keep bits (64 per thread, made a step ahead) beside S^T
// and dP^T in flight (64 floats each) left ptxas ~10 words short: 21 local
// accesses per step, in the loop. With the step counters since session 37
// (the cheapest path through a step 1027 -> 1007 instructions at 128,
// 976 -> 955 at 64, where its loop's local accesses went 10 -> 6).
constexpr BwdSchedule DropoutBwdSchedule(int) { return BwdSchedule::kDqFirstUniformCounters; }
// kPlainSoftcap's and kPlainDropout's (the plain kernel's steps with the
// soft cap or dropout alone): at 128 the plain default (diagonal-only
// masks, step counters); at 64, dropout on 64-query steps (as above), the
// soft cap on the feature variants' 128-query steps with the plain masks
// on every step (ptxas: the plain default's counters beside the tanh's
// values spilled 12 local accesses per step there; these schedules none).
constexpr BwdSchedule PlainTransformBwdSchedule(int head_dim, bool dropout) {
  return dropout || head_dim > 64 ? BwdSchedule::kDqFirstUniformDiagCounters : BwdSchedule::kDqFirstUniformRows128;
}

// kBlockM_: queries per step, 64 (the feature variants, the plain kernel at
// 128) or 128 at head dim 64 (the Rows128 schedules, the plain default
// there; BwdTraitsFor picks it from the schedule).
template <int kHeadDim_, int kBlockM_ = 64>
struct BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;  // 64 or 128 (256: Bwd256Traits)
  static_assert(kHeadDim == 64 || kHeadDim == 128,
                "the sm90 backward covers head dims 64 and 128; at 256 dK and dV alone take 256 "
                "registers per consumer thread (FlashAttention-3 splits them differently there)");

  // Warpgroup 0 produces (thread 0 issues the TMA copies, warp 1 stages lse
  // and delta), warpgroups 1 and 2 consume, each owning 64 keys (one wgmma
  // M) of the block: dK and dV of its keys stay in its registers over all
  // query blocks.
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  static constexpr int kBlockN = 64 * kConsumerWarpgroups;  // keys per tile
  // Queries per step. Per consumer thread: dK and dV kHeadDim / 2 floats
  // each, S^T and dP^T kBlockM / 2 each, dQ's share kBlockM / 2: at 128,
  // 64 + 64 + 32 + 32 (+ 32 for dQ, after S^T and dP^T are 16-bit
  // fragments of 16 each) of the 240 registers. FlashAttention-3's choice at
  // 128 as well (64 x 128).
  //
  // kBlockM = 128 (head dim 64 only; the Rows128 schedules), per consumer
  // thread: dK, dV 32 floats each; S^T and dP^T [64 keys x 128 queries] 64
  // each (192 with dK, dV while dP^T runs and S^T turns into P^T); then P^T
  // and dS^T as 16-bit A fragments, 8 k16 steps x 4 registers = 32 each
  // (S^T's and dP^T's floats dead), and dQ's share [64 query rows x 64
  // columns] 32 floats: 32 + 32 + 32 + 32 + 32 = 160 while dV, dK and dQ
  // run. The peak (~192 + addresses and the lse / delta pairs) is below the
  // 240; at head dim 128 S^T and dP^T alone would leave 240 - 128 = 112
  // for 128 floats of dK, dV: not offered.
  static constexpr int kBlockM = kBlockM_;
  static_assert(kBlockM == 64 || (kBlockM == 128 && kHeadDim == 64), "128-query steps at head dim 64 only");
  // Q/dO ring depth: the copies of step m + 1 run under step m's products.
  static constexpr int kStages = 2;

  // dQ = dS K [kBlockM x kHeadDim] per step. At 128 the two consumer
  // warpgroups split its columns (64 each, one 128-byte chunk of K: a wgmma
  // N of 64 over all 128 keys, reading both warpgroups' dS^T, which costs a
  // 256-thread barrier per step). At 64 a column split would give N = 32,
  // half a swizzled row of K, which the MN-major descriptors do not
  // describe; there each warpgroup instead computes the whole dQ from its
  // own 64 keys (N = 64, no barrier between warpgroups) and both add into
  // the accumulator (twice the reduction traffic of the split, which is
  // the smaller one at 64).
  //
  // kBlockM = 128 (at 64): the warpgroups split dQ's rows instead,
  // warpgroup w the step's queries 64 w .. 64 w + 63 over all 128 keys
  // (M = 64 queries from dS^T's query chunk w, N = 64 = the head dim, K =
  // 128 keys: both warpgroups' dS^T, hence the 256-thread barrier of the
  // column split). Each query row of dQ is reduced once (the key split
  // reduces every row twice), in the same 8-row runs of 64 columns.
  static constexpr bool kDqSplitColumns = kHeadDim == 128;
  static constexpr bool kDqSplitRows = kBlockM == 128;
  // Whether a warpgroup's dQ product reads the other's dS^T (kDsBarrier).
  static constexpr bool kDqReadsBothDs = kDqSplitColumns || kDqSplitRows;
  static constexpr int kDqKeys = kDqReadsBothDs ? kBlockN : 64;  // k of one warpgroup's dQ product
  static constexpr int kDqRows = 64;                             // M of one warpgroup's dQ product
  static constexpr int kDqCols = 64;                             // N of one warpgroup's dQ product

  // setmaxnreg as the forward (kernel_traits.cuh): 128 x 24 + 256 x 240 =
  // 64512 of the SM's 65536. The consumers need the 240 (kEarlyS at 128
  // spilled descriptors at 232); the producer's two roles then spill a few
  // words there (ptxas: 28 bytes at 128, 20 at 64, in thread 0's and warp
  // 1's step loops: local accesses off the consumers' path).
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;

  // Tiles as TMA's 128-byte swizzle writes them (wgmma.cuh): column chunks
  // of 64 16-bit elements, [rows][128 B] each, 1024-byte atoms of 8 rows.
  static constexpr int kChunkCols = 64;
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kKvChunkBytes = kBlockN * 128;  // one column chunk of K or V
  static constexpr int kQChunkBytes = kBlockM * 128;   // one column chunk of Q or dO
  static constexpr int kKvTileBytes = kKvChunkBytes * kChunks;
  static constexpr int kQTileBytes = kQChunkBytes * kChunks;
  // dS^T of one step: [kBlockN keys][kBlockM queries] 16-bit, as 128-byte
  // swizzled chunks of 64 queries (one at kBlockM = 64, two at 128, 16 KiB
  // each), the A operand (MN-major) of dQ = dS K: at 128 warpgroup w's dQ
  // rows are chunk w, exactly one wgmma M. Two buffers: a warpgroup may
  // write step m + 1's while the other still reads step m's (bwd_kernel.cuh).
  static constexpr int kDsChunkBytes = kBlockN * 128;
  static constexpr int kDsBytes = kDsChunkBytes * (kBlockM / 64);
  // Each consumer warpgroup's float32 dQ share [kDqRows][kDqCols], staged
  // in the accumulator's blocked order (sm80/dq_accum.cuh) for one bulk
  // reduce-add per 8-row group.
  static constexpr int kDqStageBytes = kDqRows * kDqCols * 4;
  // lse (log2 units) and delta of a step's kBlockM queries.
  static constexpr int kStatBytes = 2 * kBlockM * 4;
  // The mask-policy variants' StepClass of a step, a byte per consumer warp.
  static constexpr int kStepClassBytes = 16;

  // Shared memory: K, V, the Q stages, the dO stages, the two dS^T buffers,
  // the dQ staging per consumer warpgroup, the lse/delta stages, the step
  // classes' stages, then the mbarriers. The base is rounded up to 1024 bytes inside the kernel, hence
  // the extra 1024 requested. Bytes at 128 x 128 (kBlockM x kBlockN), head
  // dim 64: K, V 16 KiB each, Q, dO 2 x 16 KiB each (128 rows of 128
  // bytes), dS^T 2 x 32 KiB (both warpgroups' keys x 128 queries), dQ
  // staging 2 x 16 KiB, lse / delta 2 x 1 KiB, step classes 2 x 16 bytes: 194 KiB + 32, + 184 bytes of
  // mbarriers (56 + the helper's 128) + 1024 of alignment slack = 199,896
  // (one block per SM, as at 64 x 128).
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKvTileBytes;
  static constexpr int kQOffset = kVOffset + kKvTileBytes;
  static constexpr int kDoOffset = kQOffset + kStages * kQTileBytes;
  static constexpr int kDsOffset = kDoOffset + kStages * kQTileBytes;
  static constexpr int kDqStageOffset = kDsOffset + 2 * kDsBytes;
  static constexpr int kStatOffset = kDqStageOffset + kConsumerWarpgroups * kDqStageBytes;
  static constexpr int kStepClassOffset = kStatOffset + kStages * kStatBytes;
  static constexpr int kBarrierOffset = kStepClassOffset + kStages * kStepClassBytes;
  // kv_full, then per stage q_full, do_full, empty.
  static constexpr int kBarriers = 1 + 3 * kStages;
  // DqHandoff::kHelperWarp's (DqHelperBarriers): a staging-full and a
  // staging-free mbarrier per consumer warp (128 bytes, whichever kernel).
  static constexpr int kHelperBarrierOffset = kBarrierOffset + 8 * kBarriers;
  static constexpr int kSmemBytes = kHelperBarrierOffset + 8 * 2 * kConsumerWarps + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "over sm_90's 227 KiB per block");
};

// Head dim 256 (bwd256_kernel.cuh; plain calls and kMasks, no schedules): a block
// owns 64 keys, both consumer warpgroups share them and split the head dim
// instead, warpgroup w holding dK and dV of columns 128 w .. 128 w + 127
// (64 + 64 floats a thread, persistent over the steps). Per step of 64
// queries, warpgroup w computes S^T and dP^T for its half of the queries
// (32 w ..: m64n32 over the 256 columns, 16 floats each), writes P^T and
// dS^T of its half as 16 bits into shared memory, and after a 256-thread
// barrier both run dV += P^T dO, dK += dS^T Q and dQ = dS K over the whole
// step for their columns (m64n128, A from shared memory), dQ's 64 floats
// added into the accumulator by red.global.add.v2.f32 from the registers:
// no shared memory is left for a float32 staging. The member names are
// BwdTraits' where the producer (ProduceBackwardTile, StageRowStats), the
// barriers and the tile order read them.
struct Bwd256Traits {
  static constexpr int kHeadDim = 256;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  static constexpr int kBlockN = 64;  // keys per tile: one wgmma M, shared by both consumer warpgroups
  static constexpr int kBlockM = 64;  // queries per step
  static constexpr int kStages = 2;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;

  static constexpr int kChunkCols = 64;
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kKvChunkBytes = kBlockN * 128;
  static constexpr int kQChunkBytes = kBlockM * 128;
  static constexpr int kKvTileBytes = kKvChunkBytes * kChunks;  // 32 KiB
  static constexpr int kQTileBytes = kQChunkBytes * kChunks;    // 32 KiB
  // Each warpgroup's columns of dK, dV, dQ: two 64-column chunks.
  static constexpr int kColumns = kHeadDim / kConsumerWarpgroups;
  // Queries of a warpgroup's S^T and dP^T: half the step's.
  static constexpr int kHalfQueries = kBlockM / kConsumerWarpgroups;
  // P^T and dS^T of a step: [64 keys][64 queries] 16-bit each, one 128-byte
  // swizzled row per key (8 KiB), A operands of dV, dK (K-major) and of dQ
  // (dS^T read MN-major); two buffers, so that a warpgroup writes step
  // i + 1's while the other still reads step i's (bwd256_kernel.cuh).
  static constexpr int kPTileBytes = kBlockN * 128;
  static constexpr int kPdsBytes = 2 * kPTileBytes;  // P^T, then dS^T
  static constexpr int kStatBytes = 2 * kBlockM * 4;

  // K, V 32 KiB each, Q and dO 2 stages x 32 KiB each, P^T / dS^T 2 x 16
  // KiB, lse / delta 2 x 512 bytes, 7 mbarriers (kv_full, then per stage
  // q_full, do_full, empty), 1024 bytes of alignment slack: 231,480 bytes
  // of the 232,448 (227 KiB).
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKvTileBytes;
  static constexpr int kQOffset = kVOffset + kKvTileBytes;
  static constexpr int kDoOffset = kQOffset + kStages * kQTileBytes;
  static constexpr int kPdsOffset = kDoOffset + kStages * kQTileBytes;
  static constexpr int kStatOffset = kPdsOffset + 2 * kPdsBytes;
  static constexpr int kBarrierOffset = kStatOffset + kStages * kStatBytes;
  static constexpr int kBarriers = 1 + 3 * kStages;
  static constexpr int kSmemBytes = kBarrierOffset + 8 * kBarriers + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "over sm_90's 227 KiB per block");
  static_assert(kPdsOffset % 1024 == 0, "P^T and dS^T are 1024-byte aligned swizzled tiles");
};

// The traits a schedule runs with: 128-query steps for the Rows128
// schedules, 64 otherwise; at head dim 256 Bwd256Traits (one kernel, no
// schedules).
template <int kHeadDim, BwdSchedule kSchedule>
using BwdTraitsFor =
    std::conditional_t<kHeadDim == 256, Bwd256Traits, BwdTraits<kHeadDim, BwdRows128(kSchedule) ? 128 : 64>>;

// The dropout variants' keep-bit exchange between the warps of a pair
// (FragmentDropout::BackwardKeepHalves: warps 2v and 2v + 1 share their
// Philox calls, each making half of them), past the traits' shared memory:
// per buffer (step parity) and consumer thread two words, its own half
// and its partner's contribution, the latter written by the partner.
// Written under step i's dK for step i + 2, read at step i + 2's P^T:
// step i + 1's dS^T barrier (every step's, both partners) lies between
// the write and the read, and step i + 2's between that read and the
// buffer's next write (at step i + 2's dK).
template <typename Tr>
struct KeepExchange {
  static constexpr int kOffset = (Tr::kBarrierOffset + 8 * Tr::kBarriers + 15) / 16 * 16;
  static constexpr int kBytes = 2 * 128 * Tr::kConsumerWarpgroups * 8;
  static constexpr int kSmemBytes = kOffset + kBytes + 1024;  // (+ the base's 1024-byte alignment, as Tr's)
  static_assert(kSmemBytes <= 227 * 1024, "over sm_90's 227 KiB per block");
  // Thread `lane` of consumer warp `warp` (0 .. 4 C - 1): its two words in buffer `buffer`.
  __device__ __forceinline__ static uint32_t Slot(uint32_t smem, int buffer, int warp, int lane) {
    return smem + kOffset + ((buffer * 4 * Tr::kConsumerWarpgroups + warp) * 32 + lane) * 8;
  }
};

}  // namespace jax_flash::cuda::sm90
