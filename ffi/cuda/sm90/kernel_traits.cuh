// Tile sizes, warpgroup roles and the shared-memory map of the Hopper
// forward, per padded head dim, in this one place.
#pragma once

namespace jax_flash::cuda::sm90 {

// How the consumer warpgroups order their products and softmax (fwd_kernel.cuh).
enum class Schedule { kSerial, kOverlap, kPingPong };

// Which attention features a kernel variant serves (feature_mask.cuh), each
// variant its own instantiation so that the plain kernel carries none of
// their code: kMasks takes lengths, windows, position offsets and segment
// ids (the shared MaskPolicy); kMasksSoftcap those and the soft cap;
// kMasksBias (the forward's, and the backward's through BiasColumns) the masks and an additive float32 bias
// (BiasRows, feature_mask.cuh); kMasksBias16 the same with a bias of the
// inputs' 16-bit type (half the bias bytes: 1.28x kMasksBias's speed on
// the H200, session 19); kMasksBoolean (forward) the masks and the boolean
// mask array (MaskArrayRows, feature_mask.cuh); kMasksDropout the masks and
// dropout (dropout.cuh). kMasksSoftcap's forward also takes any boolean
// mask beside the soft cap (ReadsMaskArray: kMasksBoolean's MaskArrayRows
// and block summary), its backward a key-only one; kMasksDropout a
// key-only one (key padding, [B|1, N|1, 1, S]; TakesKeyMaskBeside; the
// backward's kMasks any). A bias with the soft cap, dropout with the soft
// cap or a bias, and a per-query boolean mask with dropout (or with the
// soft cap, backward), stay on the sm80 kernels.
// kSoftcap (the forward only): kMasksSoftcap without the boolean mask's
// paths, for the calls that have none (its loop was 2.1x kMasks's code,
// 2644 against 1240 instructions at 128, the hot instructions spread over
// ~106 KB; PERF.md v31). Appended, so that the values above, which are in
// the kernels' mangled names, stay as they are.
// kPlainSoftcap, kPlainDropout: the plain kernel (causal and the seqlen_k
// tail its only masks, per element on the blocks that need them, static
// tiles) with the soft cap or dropout, for the calls that have no other
// feature (a causal language model's): the mask policy's variants pay,
// even without masks, its per-block (backward: per-step) questions and
// early-outs, the backward's per-element selects of the step's visibility
// bits, the producer's per-tile votes (and kMasksDropout 3 spills in its
// forward loop at 128): ~5-10% of the dropout's issued instructions.
// kMasksBiasTiles (the forward at 64 and 128, the backward at 128):
// kMasksBias16 with the bias copied by TMA into shared memory a key block
// (backward: a step) ahead (bias_tiles.cuh), where the bias's layout allows
// it (BiasTilesServe); kMasksBias16 serves the rest.
enum class Features {
  kNone, kMasks, kMasksSoftcap, kMasksBias, kMasksBias16, kMasksBoolean, kMasksDropout, kSoftcap,
  kPlainSoftcap, kPlainDropout, kMasksBiasTiles
};

// The variants that add a bias to the logits, and those whose bias has the
// inputs' 16-bit type (the others' is float32).
constexpr bool AddsBias(Features f) {
  return f == Features::kMasksBias || f == Features::kMasksBias16 || f == Features::kMasksBiasTiles;
}
constexpr bool ReadsBias16(Features f) { return f == Features::kMasksBias16 || f == Features::kMasksBiasTiles; }

// The variants that soft-cap the logits.
constexpr bool AppliesSoftcap(Features f) {
  return f == Features::kMasksSoftcap || f == Features::kSoftcap || f == Features::kPlainSoftcap;
}

// The variants that drop pairs (dropout.cuh).
constexpr bool AppliesDropout(Features f) { return f == Features::kMasksDropout || f == Features::kPlainDropout; }

// The variants that run the mask policy (feature_mask.cuh: lengths,
// windows, offsets, segment ids, and their per-block key ranges, taken
// tiles and per-element visibility); the plain kernel and the kPlain*
// transforms run the plain kernel's loop, tiles and masks instead.
constexpr bool UsesMaskPolicy(Features f) {
  return f != Features::kNone && f != Features::kPlainSoftcap && f != Features::kPlainDropout;
}

// The forward variants that read a boolean mask as kMasksBoolean does
// (fwd_kernel.cuh's MaskArrayRows, key-only or per query, with a per-query
// mask's block summary; UnsupportedFeatures' MaskBeside::kAny beside their
// own features).
constexpr bool ReadsMaskArray(Features f) { return f == Features::kMasksBoolean || f == Features::kMasksSoftcap; }

// The forward variants that read only a key-only boolean mask's bytes beside
// their own features, when the call has one (fwd_kernel.cuh's key word
// alone, whose MaskArrayRows state made kMasksDropout spill at 128;
// UnsupportedFeatures' MaskBeside::kKeyOnly).
constexpr bool TakesKeyMaskBeside(Features f) { return f == Features::kMasksDropout; }

// The backward variants that read a per-query boolean mask's bytes per pair
// (feature_mask.cuh's FeatureStepMask, DenseStepMask) beside their own
// features; the others read key-only masks only (UnsupportedFeatures
// refuses a per-query one). kMasksSoftcap at head dim 64: its consumers
// then spilled 10 local accesses per step (sm90_locals.py; at 128 one, as
// kMasks's).
constexpr bool ReadsDenseStepMask(Features f, int head_dim) {
  return f != Features::kMasksSoftcap || head_dim > 64;
}

// Consumer warpgroups of the plain forward at head dim 64 (FwdTraits<64>'s
// default, hence ForwardSmemBytes): 3 (192-row tiles, FlashAttention-3's
// choice at 64, where the softmax is large next to each wgmma and a third
// warpgroup's softmax hides under the other two's products) or 2 (128-row
// tiles). On the H200 (session 18, sm90_fwd_check --h64, B=4 T=S=4096
// N=32, ping-pong, bf16) 3 ran 513 / 461 TFLOP/s against 2's 462 / 428
// (non-causal / causal, 1.08-1.12x; B=16 T=1024 non-causal 1.08x) but
// 276 against 291 at B=16 T=1024 causal (0.95x: a short causal row has
// few 192-row tiles and each pays its diagonal's masked blocks), so
// LaunchForward<64> keeps 2 for causal calls of up to 1024 queries
// (launch.cuh). -DJAX_FLASH_SM90_CONSUMERS_AT_64=2 builds 2 everywhere for
// an A/B without editing. The feature variants stay at 2 (launch.cuh says
// why).
#ifndef JAX_FLASH_SM90_CONSUMERS_AT_64
#define JAX_FLASH_SM90_CONSUMERS_AT_64 3
#endif
constexpr int kConsumersAt64 = JAX_FLASH_SM90_CONSUMERS_AT_64;
static_assert(kConsumersAt64 == 2 || kConsumersAt64 == 3);

// The head dim's default count of consumer warpgroups: 2 at 128 and 256
// (their registers: 240 per consumer thread; a third would leave 160).
constexpr int DefaultConsumers(int head_dim) { return head_dim == 64 ? kConsumersAt64 : 2; }

// kBlockN_ = 0: the head dim's default key block (below); a candidate width
// (176 at 128, FlashAttention-3's non-causal choice there) is instantiated
// by the check program only, until its timings say which to dispatch.
// kConsumers_ = 0: DefaultConsumers; 3 only at 64 with 128 keys.
template <int kHeadDim_, int kBlockN_ = 0, int kConsumers_ = 0>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;  // 64, 128 or 256
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256);

  // Warpgroup 0 produces (one thread issues every TMA copy), warpgroups 1
  // .. kConsumerWarpgroups consume, each owning 64 query rows (one wgmma M)
  // of the block.
  static constexpr int kConsumerWarpgroups = kConsumers_ > 0 ? kConsumers_ : DefaultConsumers(kHeadDim);
  static_assert(kConsumerWarpgroups == 2 || (kConsumerWarpgroups == 3 && kHeadDim == 64),
                "three consumers only at 64: O of 128 or 256 columns does not fit 160 registers");
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  static constexpr int kBlockM = 64 * kConsumerWarpgroups;
  // Keys per block. Per consumer thread: O is kHeadDim / 2 floats, S
  // kBlockN / 2 and P kBlockN / 4 registers. 128 keys at 64 and 128 (at
  // 128: 64 + 64 + 32 of the 240 registers); at 256 O alone is 128, and 80
  // keys (40 + 20) keep the whole thread within 240 (FlashAttention-3's
  // choice too; ptxas: highest register R237 at 256, no spills).
  static constexpr int kBlockN = kBlockN_ > 0 ? kBlockN_ : kHeadDim == 256 ? 80 : 128;
  static_assert(kConsumerWarpgroups == 2 || kBlockN == 128, "three consumers: S 64 + P 32 + O 32 of 160");
  static_assert(kBlockN % 16 == 0, "P V steps over 16 keys");
  static_assert(kBlockN <= 256, "one TMA box of keys");
  // K/V ring depth: two stages let the copy of block n - 1 run under block
  // n's products; at 256 two are all that fit (Q 64 KiB + 2 x (40 + 40) KiB
  // = 224 of the 227 KiB). 64 has room for a third.
  static constexpr int kStages = kHeadDim == 64 && kBlockN <= 128 ? 3 : 2;

  // FlashAttention-3's choice for 16-bit inputs: ping-pong up to 128; at 256
  // each warpgroup's products are long enough to cover the other's softmax
  // without turns. To be confirmed by the timings of sm90_fwd_check.
  static constexpr Schedule kDefaultSchedule = kHeadDim <= 128 ? Schedule::kPingPong : Schedule::kOverlap;

  // setmaxnreg (multiples of 8 in [24, 256]) against the launch's
  // allocation, 65536 / kThreads rounded down to 8 per thread (168 with two
  // consumers, 128 with three). Two: 128 x 24 + 256 x 240 = 64512 (the
  // producer gives 144 each away, the consumers take 72 each). With 128 keys
  // at 64 and 128 the consumers need at most 208 (ptxas: highest register
  // R207 in every schedule and variant), so they take 232 and the producer
  // keeps 40 (128 x 40 + 256 x 232 = 64512): its tile loop (the scheduler,
  // the feature variants' key-block range, a warp-collective vote) spilled in
  // 24. At 256, and with 176 keys, the consumers need the 240. Three (64
  // only): 128 x 32 + 384 x 160 = 65536 (the producer gives 96 away, the
  // consumers take 32 each), as in FlashAttention-3; per consumer thread S
  // 64 + P 32 + O 32 registers; the producer's 32 (not 40: the file is full)
  // is above the 24 that spilled.
  static constexpr bool kRoomyProducer = kConsumerWarpgroups == 2 && kHeadDim <= 128 && kBlockN <= 128;
  static constexpr int kProducerRegisters = kConsumerWarpgroups == 3 ? 32 : kRoomyProducer ? 40 : 24;
  static constexpr int kConsumerRegisters = kConsumerWarpgroups == 3 ? 160 : kRoomyProducer ? 232 : 240;
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static_assert(kProducerRegisters % 8 == 0 && kConsumerRegisters % 8 == 0, "setmaxnreg: multiples of 8");
  static_assert(128 * kProducerRegisters + 128 * kConsumerWarpgroups * kConsumerRegisters <=
                    kLaunchRegisters * kThreads,
                "the block's registers at launch");
  static_assert(kProducerRegisters <= kLaunchRegisters && kConsumerRegisters >= kLaunchRegisters,
                "the producer gives registers away, the consumers take them");

  // Every tile is stored as TMA's 128-byte swizzle writes it: column chunks
  // of 64 elements (128 bytes per row), each [rows][128 B], 1024-byte atoms
  // of 8 rows (wgmma.cuh).
  static constexpr int kChunkCols = 64;
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kQChunkBytes = kBlockM * 128;   // one column chunk of Q
  static constexpr int kKvChunkBytes = kBlockN * 128;  // one column chunk of K or V
  static_assert(kKvChunkBytes % 1024 == 0, "chunks must start on 1024-byte atoms");
  static constexpr int kQBytes = kQChunkBytes * kChunks;
  static constexpr int kKvTileBytes = kKvChunkBytes * kChunks;

  // Output staging of its own (the Q tile's shape) where shared memory
  // allows (64 with two or three consumers, 128 with 128 keys). Elsewhere
  // (256; 128 with 176 keys) the epilogue stores O straight from the
  // registers (epilogue.cuh). Either way Q is free once a tile's last S =
  // Q K^T is done, and the next tile's Q loads under the last P V and the
  // epilogue.
  static constexpr int kRingBytes = 2 * kStages * kKvTileBytes;
  static constexpr bool kSeparateStaging = 2 * kQBytes + kRingBytes + 8 * (2 + 4 * kStages) + 1024 <= 227 * 1024;

  // Shared memory: Q, the K stages, the V stages, the output staging (if
  // separate), the mbarriers, then the key-block slots. The base is rounded up to 1024 bytes
  // inside the kernel, hence the extra 1024 requested.
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKvTileBytes;
  static constexpr int kStagingOffset = kVOffset + kStages * kKvTileBytes;  // (kSeparateStaging only)
  static constexpr int kBarrierOffset = kVOffset + kStages * kKvTileBytes + (kSeparateStaging ? kQBytes : 0);
  // q_full, q_empty, then per stage k_full, v_full, k_empty, v_empty.
  static constexpr int kBarriers = 2 + 4 * kStages;
  // Feature variants: the producer hands each tile's key blocks (KeyBlocks,
  // two int32) and the block's next tile (one int32, padded to 8 bytes) to
  // the consumers here, in a slot of 16 bytes per Q phase (pipeline.cuh).
  static constexpr int kKeyBlocksOffset = kBarrierOffset + 8 * kBarriers;
  static constexpr int kSmemBytes = kKeyBlocksOffset + 2 * 16 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "over sm_90's 227 KiB per block");

  // Named barrier ids (bar.sync; 16 per block, 0 is __syncthreads): each
  // consumer warpgroup w's epilogue kEpilogueBarrier + w (fwd_kernel.cuh),
  // then its ping-pong turn kTurnBarrier + w. With two consumers 1, 2 and 3,
  // 4, as before the third existed.
  static constexpr int kEpilogueBarrier = 1;
  static constexpr int kTurnBarrier = kEpilogueBarrier + kConsumerWarpgroups;
  static_assert(kTurnBarrier + kConsumerWarpgroups <= 16, "16 named barriers");
};

}  // namespace jax_flash::cuda::sm90
