// Tile sizes of the mma.sync (sm_80+) kernels, chosen per padded head dim in
// this one place. Each warp owns kMTiles 16-row MMA tiles of the query block;
// the block sweeps key blocks of kBlockN rows.
#pragma once

namespace jax_flash::cuda::sm80 {

// kFeatures_: the variant for calls with attention features: masks (causal,
// window, lengths, segment ids, a mask array, position offsets); with
// kTransforms_ it also serves a bias, dropout and the soft cap, element by
// element, which at 128 take the registers of a second m-tile. Without it,
// at 128: kDropout_ adds dropout and the soft cap, kSoftcap_ the soft cap
// alone, each a variant of its own (the masks-only one ran packed documents
// and windows ~10% slower with the soft cap's code in it; docs/perf_history.md, v17).
template <int kHeadDim_, bool kFeatures_ = false, bool kTransforms_ = kFeatures_, bool kDropout_ = kTransforms_,
          bool kSoftcap_ = kTransforms_ || kDropout_>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;  // 64, 128 or 256
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256);
  // Two m-tiles per warp reuse every K/V fragment loaded from shared memory
  // twice (halving shared-memory traffic per MMA); at 256 the output
  // accumulators alone would then take 256 registers, so one m-tile.
  // The variant with attention features (masks, bias, soft cap, dropout per
  // element) keeps one m-tile: its per-element code needs the registers.
  // 4 warps per block at every head dim: two blocks share an SM (registers
  // and shared memory allow two), and their barriers are independent, so one
  // block's softmax runs beside the other's MMAs. (At 256 one block of 8
  // warps had all warps of the SM in the same phase.)
  static constexpr bool kFeatures = kFeatures_;
  static constexpr bool kTransforms = kFeatures_ && kTransforms_;
  static constexpr bool kDropout = kFeatures_ && (kTransforms_ || kDropout_);
  static constexpr bool kSoftcap = kFeatures_ && (kTransforms_ || kDropout_ || kSoftcap_);
  static constexpr int kWarps = 4;
  // Key-split warp pairs (the plain kernel at 256): with one m-tile per warp
  // every K / V fragment read from shared memory fed one MMA, and the
  // ldmatrix traffic bounded the kernel (ncu at B=4 T=4096: L1 data-pipe
  // wavefronts 82%, tensor pipe 53%). Instead the two warps of a pair share
  // 32 query rows (two m-tiles, so each fragment feeds two MMAs) and halve
  // the rest: S over 32 of the block's 64 keys each, O over 128 of the 256
  // columns each (128 accumulator registers, as with one m-tile). The
  // partners trade their row maxima and P halves through shared memory; the
  // reads per MMA drop by ~28%.
  static constexpr bool kPairSplit = kHeadDim == 256 && !kFeatures;
  static constexpr int kSplit = kPairSplit ? 2 : 1;  // warps per query row group
  // The feature variants keep one m-tile per warp for register room, except
  // at 64, where two fit (as in the plain kernel: half the K/V fragment reads
  // per MMA), and at 128 without the transforms (two m-tiles: 128-row blocks
  // as in the plain kernel; with one, calls with lengths, windows or
  // segments ran at 0.6-0.7x of the plain kernel's speed per visible pair).
  static constexpr int kMTiles = kPairSplit || !(kHeadDim == 256 || (kTransforms && kHeadDim > 64)) ? 2 : 1;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kWarps / kSplit * kMTiles * 16;  // 128, 64 with one m-tile or pairs
  // Keys per block: 64 (S, 32 floats per m-tile, plus O fit in 255
  // registers; per key block the QK^T B fragments feed twice as many MMAs as
  // with 32 and the fixed per-block work is halved).
  static constexpr int kBlockN = 64;
  // At 256 two stages of 64-key K and V tiles would take 160 KiB beside Q
  // (one block per SM); instead one K and one V tile, each copied under the
  // other's product (FlashAttention-2's schedule: two barriers per block),
  // keep Q, K and V at 96 KiB and two blocks per H200 SM (an A100's 164 KiB
  // per SM fits one).
  static constexpr bool kSplitKv = kHeadDim == 256;
  static_assert(!kPairSplit || kSplitKv, "the pairs trade row maxima at the split K/V barrier");
  static constexpr int kNTiles = kBlockN / 8 / kSplit;   // n8 tiles of a warp's S per m-tile
  static constexpr int kDTiles = kHeadDim / 8 / kSplit;  // n8 tiles of a warp's O per m-tile
  // n-tiles of a row whose mask bytes or segment ids are read at once
  // (VisibleBits): all of them, except in the masks-only variant with two
  // m-tiles at 128, whose registers hold a quarter of them (all at once: 224
  // B of spills, 59 LDL in the main loop; a quarter: 16 B, 3).
  static constexpr int kMaskReadChunk = kFeatures && !kTransforms && kHeadDim == 128 ? 2 : kNTiles;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  // QK^T k steps unrolled: fully (no spills since the swizzle left the k
  // loop), except 4 of 8 at 128 with two m-tiles, where 64 keys leave no
  // room for more.
  static constexpr int kQkUnroll = kHeadDim == 128 && kMTiles == 2 ? 4 : kHeadDim / 16;
  // Q, then two stages of K and V tiles (one of each with kSplitKv), 16-bit;
  // with pairs, then the block's P [kBlockM][kBlockN] (16-bit rows padded to
  // kPRowBytes, PaddedRows) and each half's row statistics [2][kBlockM] (float).
  static constexpr int kPairOffset = (kBlockM + (kSplitKv ? 2 : 4) * kBlockN) * kHeadDim * 2;
  static constexpr int kPRowBytes = kBlockN * 2 + 16;
  static constexpr int kPairBytes = kPairSplit ? kBlockM * kPRowBytes + 2 * kBlockM * 4 : 0;
  static constexpr int kSmemBytes = kPairOffset + kPairBytes;
};

}  // namespace jax_flash::cuda::sm80

namespace jax_flash::cuda::sm80 {

// Backward kernels, 8 warps each.
//
// dK/dV pass (fused with dQ by default): a block owns kBlockRows keys and
// sweeps query blocks of kBlockCols. Warps form key groups of 32 keys (two
// 16-row m-tiles, so every fragment read from shared memory feeds two MMAs);
// the kQSplit warps of a group split the group's S^T / dP^T by queries and
// its dK / dV accumulators by head-dim columns, trading their P^T and dS^T
// slices through shared memory. (One warp per 16 keys holding all columns
// needs no exchange, but reads 35% more shared memory per MMA, which bounds
// this kernel; at 256 it also had to compute S^T and dP^T twice.)
//
// Deterministic dQ pass: 8 warps x 16 queries sweeping key blocks of 64; no
// 256 variant (deterministic=True at 256 runs the generic kernels).
template <int kHeadDim_>
struct BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256);
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  // Queries per step of the dK/dV pass: 128 at 64 (S^T and dP^T slices of
  // 32 keys x 64 queries per warp fit beside the smaller dK/dV, and each
  // K/V fragment read feeds twice as many MMAs), else 64.
  static constexpr int kBlockCols = kHeadDim == 64 ? 128 : 64;
  static constexpr int kTileBytes = kHeadDim * 2;  // one row of a 16-bit tile

  // dK/dV pass. dK and dV of 32 keys x kDkvCols columns take 2 x 64 float
  // registers per thread at every head dim but 64 (where they take 32).
  static constexpr int kQSplit = kHeadDim == 256 ? 4 : 2;  // warps per key group
  static constexpr int kKeyGroups = kWarps / kQSplit;
  static constexpr int kKeyMTiles = 2;
  static constexpr int kBlockRows = kKeyGroups * kKeyMTiles * 16;  // keys per block: 128, 64 at 256
  static constexpr int kQCols = kBlockCols / kQSplit;  // queries of S^T per warp
  static constexpr int kSNTiles = kQCols / 8;
  static constexpr int kDkvCols = kHeadDim / kQSplit;  // dK/dV columns per warp
  // S^T and dP^T k steps unrolled by 4 (each issues 4 ldmatrix for 8 MMAs;
  // the next step's loads go under this one's MMAs): 0 spills in the plain
  // kernels at every head dim.
  static constexpr int kQkUnroll = 4;
  // P^T's exp2s issued before the dP^T product, to run under its MMAs: the
  // two [32 keys][kQCols] fragments are then live across a whole product,
  // which at 64 (64-query slices) spills 192 B; there P^T follows dP^T.
  static constexpr bool kExpBeforeDp = kQCols <= 32;
  // Per pipeline stage: Q and dO [kBlockCols][kHeadDim], then lse2 and delta
  // for kBlockCols rows. Two stages: the next step's tiles load while this
  // one computes (one block per SM at 255 registers leaves nothing else to
  // hide the copy behind).
  static constexpr int kStages = 2;
  static constexpr int kStageBytes = 2 * kBlockCols * kTileBytes;
  static constexpr int kRowStatsOffset = 2 * kBlockRows * kTileBytes + kStages * kStageBytes;
  // The step's P^T and dS^T, [kBlockRows keys][kBlockCols queries], 16-bit:
  // the slices each warp computed, for its group partners (dV, dK) and, for
  // dS^T, every warp (dQ = dS K).
  static constexpr int kPtOffset = kRowStatsOffset + kStages * 2 * kBlockCols * 4;
  static constexpr int kPtBytes = kBlockRows * kBlockCols * 2;
  static constexpr int kDsOffset = kPtOffset + kPtBytes;
  static constexpr int kDkvSmemBytes = kDsOffset + kPtBytes;
  // On Hopper (227 KiB per block) the fused pass keeps a second dS^T tile, so
  // a step's dQ product can run in the next step (after its first barrier)
  // and the mid-step barrier only has to gather a key group; an A100 (163
  // KiB) cannot fit it at 128.
  static constexpr int kDs2Offset = kDkvSmemBytes;
  static constexpr int kFusedSm90SmemBytes = kDs2Offset + kPtBytes;
  // dQ = dS K over the block's keys: [kBlockCols][kHeadDim] split over the 8
  // warps as kDqQParts slices of 32 queries (two m-tiles) x kDqDParts column
  // slices.
  static constexpr int kDqQParts = kBlockCols / 32;
  static constexpr int kDqDParts = kWarps / kDqQParts;
  static constexpr int kDqColsPerWarp = kHeadDim / kDqDParts;
  // dQ product by groups of 8-column tiles, atomics after each group
  // (AccumulateDq), at 256: pairs gave backward +4-6% there, except causal
  // T=1024 (0.92x), and 0.97-1.01x at 64 and 128 (docs/perf_history.md, v10). dS's
  // fragments of all kBlockRows / 16 k steps stay in registers (32 at 256,
  // where the feature variant's 12 B of spills went with it). 0: k steps
  // outermost, all columns summed before the atomics.
  static constexpr int kDqGroupTiles = kHeadDim == 256 ? 2 : 0;
  // Hopper's deferred dQ product (a step's dQ in the next step): warps
  // kWarps / 2 .. run it at the end of the step instead of its start. A
  // scheduler's two warps (w and w + 4) then work in different phases, so
  // one's exp2 / dS work, ldmatrix waits and atomics go under the other's
  // MMAs instead of both idling the tensor pipe together. Key groups never
  // straddle the halves (kQSplit divides kWarps / 2). At 256: backward
  // +6-12% at T >= 4096 (docs/perf_history.md, v11); at 64 / 128, with the step's
  // address work cut, +4-12% from T = 4096 on (v12; alone it lost 0-5%
  // there). 0 spills since the loop recomputes the previous step's
  // position instead of holding it (DkvKernel).
  static constexpr bool kDqPhaseShift = true;
  static_assert((kWarps / 2) % kQSplit == 0);

  // Deterministic dQ pass: Q and dO [kDqRows][kHeadDim], two stages of K and
  // V [kDqBlockCols][kHeadDim], 64 keys per step.
  static constexpr int kDqRows = kWarps * 16;
  static constexpr int kDqBlockCols = 64;
  static constexpr int kNTiles = kDqBlockCols / 8;  // n8 tiles of its S per warp
  static constexpr int kDqStageBytes = 2 * kDqBlockCols * kTileBytes;
  static constexpr int kDqSmemBytes = 2 * kDqRows * kTileBytes + kStages * kDqStageBytes;
};

}  // namespace jax_flash::cuda::sm80
