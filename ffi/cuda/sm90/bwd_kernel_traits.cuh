// Tile sizes, warpgroup roles and the shared-memory map of the Hopper
// backward (bwd_kernel.cuh), per padded head dim, in this one place.
#pragma once

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
enum class BwdSchedule {
  kSerial,
  kEarlyS,
  kLeanDq,
  kLeanDqEarlyDp,
  kDqFirst,
  kLeanDqUniform,
  kDqFirstUniform,
  kDqFirstUniformDiag,
  kDqFirstUniformDiagCounters
};
constexpr bool BwdStepCounters(BwdSchedule s) { return s == BwdSchedule::kDqFirstUniformDiagCounters; }
constexpr bool BwdDiagonalMasks(BwdSchedule s) {
  return s == BwdSchedule::kDqFirstUniformDiag || BwdStepCounters(s);
}
constexpr bool BwdDqFirst(BwdSchedule s) {
  return s == BwdSchedule::kDqFirst || s == BwdSchedule::kDqFirstUniform || BwdDiagonalMasks(s);
}
constexpr bool BwdUniformDescriptors(BwdSchedule s) {
  return s == BwdSchedule::kLeanDqUniform || s == BwdSchedule::kDqFirstUniform || BwdDiagonalMasks(s);
}

template <int kHeadDim_>
struct BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;  // 64 or 128 (256: not yet, see below)
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
  static constexpr int kBlockM = 64;
  // Q/dO ring depth: the copies of step m + 1 run under step m's products.
  static constexpr int kStages = 2;
  static constexpr BwdSchedule kDefaultSchedule = BwdSchedule::kLeanDq;

  // dQ = dS K [kBlockM x kHeadDim] per step. At 128 the two consumer
  // warpgroups split its columns (64 each, one 128-byte chunk of K: a wgmma
  // N of 64 over all 128 keys, reading both warpgroups' dS^T, which costs a
  // 256-thread barrier per step). At 64 a column split would give N = 32,
  // half a swizzled row of K, which the MN-major descriptors do not
  // describe; there each warpgroup instead computes the whole dQ from its
  // own 64 keys (N = 64, no barrier between warpgroups) and both add into
  // the accumulator (twice the reduction traffic of the split, which is
  // the smaller one at 64).
  static constexpr bool kDqSplitColumns = kHeadDim == 128;
  static constexpr int kDqKeys = kDqSplitColumns ? kBlockN : 64;  // k of one warpgroup's dQ product
  static constexpr int kDqCols = 64;                              // N of one warpgroup's dQ product

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
  // dS^T of one step: [kBlockN keys][kBlockM queries] 16-bit, one 128-byte
  // swizzled chunk (kBlockM = 64), the A operand (MN-major) of dQ = dS K.
  // Two buffers: a warpgroup may write step m + 1's while the other still
  // reads step m's (bwd_kernel.cuh).
  static_assert(kBlockM == 64, "dS^T is one 128-byte column chunk");
  static constexpr int kDsBytes = kBlockN * 128;
  // Each consumer warpgroup's float32 dQ share [kBlockM][kDqCols], staged
  // in the accumulator's blocked order (sm80/dq_accum.cuh) for one bulk
  // reduce-add per 8-row group.
  static constexpr int kDqStageBytes = kBlockM * kDqCols * 4;
  // lse (log2 units) and delta of a step's kBlockM queries.
  static constexpr int kStatBytes = 2 * kBlockM * 4;

  // Shared memory: K, V, the Q stages, the dO stages, the two dS^T buffers,
  // the dQ staging per consumer warpgroup, the lse/delta stages, then the
  // mbarriers. The base is rounded up to 1024 bytes inside the kernel, hence
  // the extra 1024 requested.
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKvTileBytes;
  static constexpr int kQOffset = kVOffset + kKvTileBytes;
  static constexpr int kDoOffset = kQOffset + kStages * kQTileBytes;
  static constexpr int kDsOffset = kDoOffset + kStages * kQTileBytes;
  static constexpr int kDqStageOffset = kDsOffset + 2 * kDsBytes;
  static constexpr int kStatOffset = kDqStageOffset + kConsumerWarpgroups * kDqStageBytes;
  static constexpr int kBarrierOffset = kStatOffset + kStages * kStatBytes;
  // kv_full, then per stage q_full, do_full, empty.
  static constexpr int kBarriers = 1 + 3 * kStages;
  static constexpr int kSmemBytes = kBarrierOffset + 8 * kBarriers + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "over sm_90's 227 KiB per block");
};

}  // namespace jax_flash::cuda::sm90
