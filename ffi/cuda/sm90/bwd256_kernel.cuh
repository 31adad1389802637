// FlashAttention backward for Hopper (sm_90a) at head dim 256, plain calls
// (causal or not, GQA, any lengths) and, in its kMasks variant, the masks'
// features (lengths, windows, position offsets, segment ids, a boolean
// mask: the mask policy's steps and visibility bits, below), in its
// kMasksSoftcap / kMasksDropout variants those and the soft cap / dropout,
// float16 and bfloat16. Between sm80's DeltaAndClearKernel and
// DqConvertKernel, as the 64 / 128 kernel (bwd_kernel.cuh), whose producer,
// barriers, tile order and steps it shares (bwd_launch.cuh launches both).
//
// Why a kernel of its own: the 128 kernel gives each consumer warpgroup 64
// keys with dK and dV over the whole head dim in its registers; at 256 that
// is 128 + 128 floats a thread, over the 240 setmaxnreg allows. Here both
// consumer warpgroups share one block of 64 keys and split the head dim
// (Bwd256Traits, bwd_kernel_traits.cuh; docs/sm90_bwd_256_plan.md):
//
//   warpgroup 0 (producer, 24 registers): as at 128 (ProduceBackwardTile:
//     K, V once, then Q, dO per step into a 2-stage ring; StageRowStats:
//     lse2 and delta of the step's queries).
//   warpgroups 1, 2 (consumers, 240 registers), w = 0, 1; per step of 64
//   queries m0 ..:
//     S^T_w = K Q_w^T and dP^T_w = V dO_w^T for the queries of its half,
//       m0 + 32 w .. + 31 (m64n32k16, 16 k-steps over the 256 columns; Q_w
//       starts 4 KiB into each column chunk of the stage, on 1024-byte atoms)
//     P^T = exp2(S^T scale log2(e) - lse2), dS^T = P^T (dP^T - delta),
//       written as 16 bits into the step's P^T / dS^T tiles (its 64-byte
//       half of each key's 128-byte row), fence.proxy.async, then one
//       256-thread named barrier: both halves are in place
//     dQ[:, 128 w ..] = dS K[:, 128 w ..] (m64n128k16 x 4, both operands
//       MN-major: dS^T is dS's transpose), then dV_w += P^T dO[:, 128 w ..]
//       and dK_w += dS^T Q[:, 128 w ..] (m64n128k16 x 4 each, A K-major from
//       shared memory, B MN-major): two commit groups; once dQ's is done,
//       its 64 floats go into the float32 accumulator by
//       red.global.add.v2.f32 (sm80's blocked layout, dq_accum.cuh: a warp's
//       pair of one 8 x 8 block is one 256-byte run) while dV and dK run
//     wait; every thread arrives on the stage's empty barrier
//   Epilogue: dK * scale and dV of the warpgroup's columns from registers.
//
// Shared memory (Bwd256Traits): K, V 64 KiB, the Q and dO stages 128 KiB,
// P^T / dS^T 2 x 16 KiB: ~226 KiB. No room for the float32 staging of the
// 128 kernel's bulk reduce-adds (2 x 32 KiB), hence the reds from
// registers (FlashAttention-3's way at 256). The deterministic variant
// (Deterministic256Kernel) orders those reds per query block by the 128
// kernel's counters (DqOrder's protocol, bwd_kernel.cuh; here WaitDqTurn
// and PassDqTurn, below): no staging needed, as each warp's reds are its
// own rows and columns.
//
// Barrier protocol: every consumer warp runs the same steps (BwdSteps) and
// reaches kDsBarrier once per step, from one copy of the step for the
// whole block (the masked or the unmasked copy is chosen by a block-uniform
// test, needs_masks); the producer never joins a named barrier. The P^T /
// dS^T double buffer: a warpgroup writing step i + 2's tiles (step i's
// buffer) has passed step i + 1's barrier, which the other warpgroup
// reached only after its step i products had completed (wait 0 before the
// step's end). A stage of Q / dO is released by all 256 consumer threads
// after their step's last read of it (BwdBarriers::empty).
//
// Bwd256Split::kOperands (a candidate, below): the warpgroups run loops of
// their own (the role branch taken once, before any wgmma), each warp
// entirely in one role, and meet per step at kPBarrier (warpgroup 0
// arrives after its P^T stores, 1 syncs before reading them) and
// kDsBarrier (both sync after warpgroup 1's dS^T stores); warpgroup 0
// syncs kPOwnBarrier alone before its dV reads its own P^T. Warpgroup 0
// cannot arrive at kPBarrier for step i + 1 before warpgroup 1 passed it
// for step i: in between it waits at step i's kDsBarrier, which warpgroup
// 1 reaches after. The double buffer: warpgroup 0 writes step i + 2's P^T
// after passing step i + 1's kDsBarrier, which warpgroup 1 reaches only
// after its step i (its last reads of step i's P^T: the loads and dV)
// completed; warpgroup 1 writes step i + 2's dS^T after passing step
// i + 2's kPBarrier, which warpgroup 0 arrives at only after its step i
// + 1, hence its step i (dQ and dK, the readers of step i's dS^T), ended.
// The two roles meet at kPBarrier and kDsBarrier from different
// instructions, so those are the non-.aligned barrier forms
// (NamedBarrierSyncAcrossRoles: synccheck flagged the .aligned ones, as
// the PTX ISA asks one instruction of all their threads).
#pragma once

#include <cuda.h>
#include <math_constants.h>

#include <cstdint>

#include "cuda/sm90/bwd_kernel.cuh"  // BackwardArgs, BwdTile, BwdBarriers, BwdSteps, the producer
#include "cuda/sm90/bwd_kernel_traits.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace jax_flash::cuda::sm90 {

// Adds (x, y) to the two consecutive floats at `dst` (no return value: RED).
__device__ __forceinline__ void RedAddF32x2(float* dst, float x, float y) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(x), "f"(y) : "memory");
}

// How the two consumer warpgroups share a step's S^T and dP^T (both then
// split dV, dK and dQ by head-dim columns):
//   kQueryHalves: each computes both for half of the step's queries
//     (m64n32k16: 3 KB of shared memory read per 16-clock HGMMA, 24 clocks
//     at 128 B a clock, so S^T and dP^T run at ~2/3 of the tensor peak),
//     then both halves of P^T and dS^T meet in shared memory at one
//     256-thread barrier.
//   kOperands: warpgroup 0 computes S^T and P^T over all 64 queries,
//     warpgroup 1 dP^T and then dS^T from warpgroup 0's 16-bit P^T
//     (m64n64k16: 4 KB per 32 clocks, at the tensor peak). P^T crosses
//     over before dS^T (barrier kPBarrier: warpgroup 0 arrives, 1 waits),
//     then dS^T before dQ and warpgroup 0's dK (kDsBarrier); every
//     product takes its A from shared memory (from the registers, dV's P^T
//     or dK's dS^T fragments live beside dQ, dK and dV spilled). dS
//     takes P rounded to 16 bits (the P of dV already is). Costs a serial
//     chain per step, warpgroup 0's 32 exponentials then warpgroup 1's 32
//     dS, against ~1/3 less shared-memory time for S^T and dP^T.
enum class Bwd256Split { kQueryHalves, kOperands };
// The package's plain kernel's (the deterministic kernel's is always
// kQueryHalves); the H200's timing of both decides.
constexpr Bwd256Split kBwd256Split = Bwd256Split::kOperands;
constexpr int kPBarrier = 2;     // kOperands: P^T written (warpgroup 0 arrives, 1 syncs)
constexpr int kPOwnBarrier = 3;  // kOperands: P^T written, within warpgroup 0
constexpr int kStage256Barrier = 4;  // + warpgroup: the epilogue's staging, within a warpgroup

// Two 16-bit values of one 32-bit word (PackPair's order: low half first).
template <typename Element>
__device__ __forceinline__ float2 UnpackPair(uint32_t w) {
  if constexpr (kIsBf16<Element>) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  } else {
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = w;
    return __half22float2(h);
  }
}

// The operand split's exchange tiles (P^T from warpgroup 0 to 1, dS^T from
// 1 to both): [64 keys][64 queries] 16-bit, 128-byte rows with their 16-byte
// units swizzled by the row's g (the 128B pattern wgmma reads). The word of
// the thread's pair (key row0 + 8 hh, queries 8 j + 2 t and + 1), the
// accumulator layout's, which both warpgroups share.
__device__ __forceinline__ uint32_t ExchangeWord(uint32_t tile, int row0, int hh, int j, int g, int t) {
  return tile + (row0 + 8 * hh) * 128 + ((j ^ g) * 16) + 4 * t;
}
// A ToFragments result (m64n64's 16-bit A fragments) into its exchange tile.
template <int kBlockM>
__device__ __forceinline__ void StoreExchangeTile(uint32_t tile, const uint32_t (&frag)[kBlockM / 16][4], int row0,
                                                  int g, int t) {
#pragma unroll
  for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ExchangeWord(tile, row0, hh, j, g, t)),
                   "r"(frag[j / 2][(j % 2) * 2 + hh])
                   : "memory");
}

// One warpgroup's dQ share of a step, dq = (dS K)[64 queries x its 128
// columns from col0] (m64n128 accumulator: dq[4j + 2hh + e] = query row
// 16 warp + g + 8 hh, column col0 + 8j + 2t + e), added into the float32
// accumulator rows m0 .. of (b, h). Full 8-row groups are blocked
// (dq_accum.cuh: 8 x 8 blocks, each row-major), so the pair (j, hh) sits at
// (col / 8) 64 + g 8 + 2t of its group and a warp's 32 pairs of one (j, hh)
// are one 256-byte run (two whole 128-byte lines: two L2 requests). A
// step whose 64 queries are all below seqlen_q at head_dim 256 takes
// constant offsets from one base; a tail step tests each row and column,
// its partial last group row-major.
template <typename Tr>
__device__ __forceinline__ void AddDqShare(const BackwardArgs& a, const float (&dq)[Tr::kColumns / 2], int b, int h,
                                           int m0, int col0, int warp, int g, int t) {
  constexpr int kHeadDim = Tr::kHeadDim;
  float* const head_rows = a.dq_accum + (int64_t(b) * a.num_heads + h) * int64_t(a.seqlen_q) * a.head_dim;
  if (m0 + Tr::kBlockM <= a.seqlen_q && a.head_dim == kHeadDim) {
    float* const base = head_rows + int64_t(m0 + 16 * warp) * kHeadDim + (col0 / 8) * 64 + g * 8 + 2 * t;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int j = 0; j < Tr::kColumns / 8; ++j)
        RedAddF32x2(base + hh * 8 * kHeadDim + j * 64, dq[4 * j + 2 * hh], dq[4 * j + 2 * hh + 1]);
    return;
  }
  const int d = a.head_dim;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int group_row = m0 + 16 * warp + 8 * hh, row = group_row + g;
    if (row >= a.seqlen_q) continue;
    const bool full = group_row + 8 <= a.seqlen_q;
    float* const group = head_rows + int64_t(group_row) * d;
#pragma unroll
    for (int j = 0; j < Tr::kColumns / 8; ++j) {
      const int c = col0 + 8 * j + 2 * t;
      if (c >= d) continue;
      RedAddF32x2(group + (full ? (c / 8) * 64 + g * 8 + 2 * t : g * d + c), dq[4 * j + 2 * hh],
                  dq[4 * j + 2 * hh + 1]);
    }
  }
}

// The deterministic variant's order of one warp's dQ adds into a query
// block (DqOrder's protocol, bwd_kernel.cuh: one int32 counter per (batch,
// query head, 64-query block), raised once by every consumer warp of every
// key block that visits the block, after its adds there): before the adds
// lane 0 spins until the counter holds `target`, the arrivals of the key
// blocks before this one in the order (8 warps each), and the warp meets
// it at a __syncwarp (which orders the lanes' reds after lane 0's acquire);
// after them (at the next step's first products: ConsumeBackwardTile256's
// pass_pending_turn) every lane fences its reds (gpu scope, acq_rel) and,
// past a second __syncwarp, lane 0 raises the counter with release semantics. Each
// accumulator element takes one add per tile (the warp's rows, the
// warpgroup's columns), so the order of the tiles fixes every sum's
// order: dq is the same bit for bit run to run.
__device__ __forceinline__ void WaitDqTurn(const int* counter, int target, int lane) {
  if (lane == 0) {
    int seen;
    do {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen < target);
  }
  __syncwarp();
}
__device__ __forceinline__ void PassDqTurn(int* counter, int lane) {
  // (acq_rel, not __threadfence's sequentially consistent fence: ptxas made
  // that a MEMBAR.SC.GPU per lane.)
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
  __syncwarp();
  if (lane == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// Step i's places in shared memory, as each copy of the step derives them:
// its ring stage (Q, dO and the row statistics; `parity`, the stage's
// barrier phase) and its P^T / dS^T buffer (i % 2). `base`: the block's
// shared memory through Opaque, so that ptxas rebuilds the addresses per
// step rather than holding them across the loop.
struct Step256Smem {
  int s;
  uint32_t parity, base, q_tile, do_tile, stats, p_tile, ds_tile;
  __device__ __forceinline__ Step256Smem(uint32_t smem, int i) {
    using Tr = Bwd256Traits;
    s = i % Tr::kStages;
    parity = (i / Tr::kStages) & 1;
    base = Opaque(smem);
    q_tile = base + Tr::kQOffset + s * Tr::kQTileBytes;
    do_tile = base + Tr::kDoOffset + s * Tr::kQTileBytes;
    stats = base + Tr::kStatOffset + s * Tr::kStatBytes;
    p_tile = base + Tr::kPdsOffset + (i % 2) * Tr::kPdsBytes;
    ds_tile = p_tile + Tr::kPTileBytes;
  }
};

// One consumer warpgroup's whole tile: the block's 64 keys, head-dim
// columns 128 w .. of dK, dV and dQ (w = warpgroup_index).
// kDeterministic: each step's dQ adds in the order of `dq_counters`
// (WaitDqTurn, PassDqTurn). kSplit: Bwd256Split. kFeatures: kNone, or
// kMasks (lengths, windows, position offsets, segment ids, a boolean mask:
// the mask policy of `p`), with the operand split: warpgroup 0's P^T takes
// the step's visibility bits (FeatureStepMask, as the 64 / 128 kernels'
// S^T: the same 64-query, 16-keys-a-warp fragments), and warpgroup 1's dS^T
// = P^T (dP^T - delta) is 0 wherever P^T is; or kMasksSoftcap (those and
// the soft cap) or kMasksDropout (those and dropout), by query halves:
// dS^T = P^T (dP^T - delta) (1 - tanh^2) needs the tanh of S^T beside dP^T
// in one thread, which the operand split keeps in different warpgroups (and
// its shared memory, full at ~226 KiB, has no room for a tile of the
// derivative), and dropout's dS^T = P^T (Z dP^T - delta) the undropped P^T
// beside the dropped one that dV reads; each warpgroup's half of the
// step's bits (its 32 queries) from the same FeatureStepMask, its keep
// bits from BackwardKeepBits<32> (dropout.cuh).
template <typename Element, bool kDeterministic = false, Bwd256Split kSplit = kBwd256Split,
          Features kFeatures = Features::kNone>
__device__ __forceinline__ void ConsumeBackwardTile256(const BackwardArgs& a, const AttentionParams& p,
                                                       BwdBarriers<Bwd256Traits> bars, uint32_t smem,
                                                       int warpgroup_index, const BwdTile& tile,
                                                       const BwdSteps<Bwd256Traits>& steps,
                                                       int* dq_counters = nullptr) {
  using Tr = Bwd256Traits;
  constexpr bool kPolicy = UsesMaskPolicy(kFeatures);
  constexpr bool kSoftcap = AppliesSoftcap(kFeatures), kDropout = AppliesDropout(kFeatures);
  static_assert(kFeatures == Features::kNone || kFeatures == Features::kMasks ||
                    kFeatures == Features::kMasksSoftcap || kFeatures == Features::kMasksDropout,
                "masks, the soft cap and dropout only at 256");
  static_assert(!kPolicy || !kDeterministic, "the feature variants are not deterministic");
  static_assert(!(kSoftcap || kDropout) || (kPolicy && kSplit == Bwd256Split::kQueryHalves),
                "the soft cap and dropout beside the mask policy, by query halves (dS's operands)");
  constexpr int kHalf = Tr::kHalfQueries, kColumns = Tr::kColumns;
  // Through a shuffle from lane 0, so that ptxas knows it warp-uniform and
  // keeps the descriptors derived from it in uniform registers (as the 128
  // kernel's uniform schedules).
  const int warpgroup = __shfl_sync(0xffffffffu, warpgroup_index, 0);
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = warp * 16 + g;  // this thread's keys in the block: row0, row0 + 8 (row0 % 8 = g)
  const int n0 = tile.n_block * Tr::kBlockN;
  const int col0 = kColumns * warpgroup;   // the warpgroup's head-dim columns (both splits)
  const int half0 = kHalf * warpgroup;     // its queries of S^T / dP^T within the step

  float dk[kColumns / 2], dv[kColumns / 2];
#pragma unroll
  for (int i = 0; i < kColumns / 2; ++i) dk[i] = dv[i] = 0.0f;

  // Step i's first query and head, carried as counters (query blocks
  // innermost, as BwdSteps counts them) instead of BwdSteps' division.
  int step_m0 = 0, step_h = 0;

  // kMasksDropout: the batch row's Philox keys (uniform registers), once a
  // tile; the rest of the step's FragmentDropout from the kernel's
  // arguments and the step's head (the 64 / 128 kernels' keep_bits).
  [[maybe_unused]] FragmentDropout dropout{};
  if constexpr (kDropout) dropout = FragmentDropout::For(p, tile.b, 0);

  // kDeterministic: the step's query block's counter (its index in
  // dq_counters; -1: none) whose turn this warp still has to pass. The
  // pass's fence waits until the warp's 32 reds a thread are performed at
  // gpu scope (~an L2 round trip behind the last of them): made right
  // after the reds, under dV and dK's products, it held each step until
  // then. So the pass waits for the next step's S^T and dP^T to be issued
  // (or the tile's end), and the fence drains what is left under them
  // (v40, H100: 1.04-1.08x; the kernel is still 0.61-0.68x of the default,
  // its time mostly elsewhere: pending/session31.sh's det256_parts). The
  // next key block's warps wait about a step longer for each query block;
  // no wait of this warp comes before the pass (the next step's copies
  // depend on this block's consumers only), so no cycle of waits.
  [[maybe_unused]] int pending_turn = -1;
  auto pass_pending_turn = [&] {
    if constexpr (kDeterministic)
      if (pending_turn >= 0) PassDqTurn(dq_counters + pending_turn, lane), pending_turn = -1;
  };
  // The step's dQ share (its product done) into the accumulator.
  auto send_dq = [&](const float (&dq)[kColumns / 2], int m0) {
    if constexpr (kDeterministic) {
      // The step's query block's counter ([B, N, ceil(Tq / 64)]) and the
      // arrivals before this tile's: key blocks 0 .. n - 1, each of which
      // visits every query block n visits (causal: m_first = n); descending
      // (a.keys_descending), n + 1 .. the last key block that visits it
      // (causal: the one on its diagonal, m0 / 64).
      const int m_blocks = (a.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM;
      const int counter = (tile.b * a.num_heads + step_h) * m_blocks + m0 / Tr::kBlockM;
      const int last = a.is_causal ? min(a.key_blocks - 1, m0 / Tr::kBlockN) : a.key_blocks - 1;
      const int earlier = a.keys_descending ? last - tile.n_block : tile.n_block;
      WaitDqTurn(dq_counters + counter, Tr::kConsumerWarps * earlier, lane);
      AddDqShare<Tr>(a, dq, tile.b, step_h, m0, col0, warp, g, t);
      pending_turn = counter;  // (passed under the next step's first products: pass_pending_turn)
    } else {
      AddDqShare<Tr>(a, dq, tile.b, step_h, m0, col0, warp, g, t);
    }
  };

  // kQueryHalves: step i, whole. `masked` (std::bool_constant): the
  // per-element masks, only on the steps that need them (needs_masks below).
  auto step = [&](int i, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const Step256Smem at(smem, i);
    const int s = at.s;
    const uint32_t parity = at.parity, base = at.base, q_tile = at.q_tile, do_tile = at.do_tile;
    const int m0 = step_m0;

    // S^T_w = K Q_w^T and dP^T_w = V dO_w^T [64 keys][32 queries], raw,
    // two commit groups.
    float st[kHalf / 2], dpt[kHalf / 2];
    MbarrierWait(bars.q_full(s), parity);
    WgmmaFence();
    KeysTimesRowsT<Tr, Element, kHalf>(st, base + Tr::kKOffset, q_tile + half0 * 128);
    WgmmaCommit();
    MbarrierWait(bars.do_full(s), parity);
    WgmmaFence();
    KeysTimesRowsT<Tr, Element, kHalf>(dpt, base + Tr::kVOffset, do_tile + half0 * 128);
    WgmmaCommit();
    pass_pending_turn();  // (kDeterministic: the previous step's, under S^T and dP^T)
    // kPolicy: the step's visibility bits while S^T and dP^T run (as
    // step_p's), shifted so that this warpgroup's queries (columns half0 /
    // 8 + j of FeatureStepMask's rows) sit at j.
    [[maybe_unused]] StepMaskBits<Tr::kBlockM> visible = ~StepMaskBits<Tr::kBlockM>(0);
    if constexpr (kPolicy)
      visible = FeatureStepMask<Tr::kBlockM, ReadsDenseStepMask(kFeatures, Tr::kHeadDim)>(
                    p, int(Opaque(uint32_t(tile.b))), int(Opaque(uint32_t(step_h))), m0, n0 + 16 * warp, n0 + row0,
                    t) >>
                (half0 / 4);
    [[maybe_unused]] auto seen = [&](int hh, int j, int e) {
      return bool(visible >> (Tr::kBlockM / 4 * hh + 2 * j + e) & 1u);
    };
    // kDropout: the keep bits of this warpgroup's 32 queries (bit 8 hh + 2j
    // + e), made while S^T and dP^T run.
    [[maybe_unused]] uint32_t keep = ~0u;
    if constexpr (kDropout) {
      FragmentDropout step_dropout = dropout;
      step_dropout.threshold_high = a.dropout_threshold_high;
      step_dropout.batch = p.features.dropout_shared ? 0u : uint32_t(tile.b);
      step_dropout.head = p.features.dropout_shared ? 0u : uint32_t(step_h);
      keep = step_dropout.BackwardKeepBits<kHalf>(n0 + row0, m0 + half0, t);
    }

    // P^T while dP^T still runs. Column c of the thread's accumulators is
    // query m0 + half0 + 8j + 2t + e; its lse2 and delta from the stage's
    // row statistics. Masks (kMasked): keys past seqlen_k (TMA's zero rows
    // would give P = 2^-lse2) and, causal, keys after the query. Queries
    // past seqlen_q need none (lse2 = +inf: P = 0, delta = 0). kPolicy:
    // the bits instead. kSoftcap: here only S^T's tanh, kept in st for dS
    // (the 64 / 128 kernels' way), P below.
    const uint32_t stats = at.stats;
    WgmmaWait<1>();
    FenceRegisters(st);
    [[maybe_unused]] const int diagonal = a.is_causal ? m0 + half0 - n0 : INT32_MAX / 2;  // query - key offset
    [[maybe_unused]] const int key_limit = a.seqlen_k - n0;
    if constexpr (kSoftcap) {
      SoftcapTanh<Element>(st, a.softcap_scale);
    } else {
#pragma unroll
      for (int j = 0; j < kHalf / 8; ++j) {
        float2 lse2;
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                     : "=f"(lse2.x), "=f"(lse2.y)
                     : "r"(stats + 4 * (half0 + 8 * j + 2 * t))
                     : "memory");
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = st[4 * j + 2 * hh + e];
            if constexpr (kPolicy) {
              x = seen(hh, j, e) ? x : -CUDART_INF_F;
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
    // dS^T = P^T (dP^T - delta); both as 16-bit pairs into the step's
    // tiles: key row r (r % 8 = g), the thread's 4-byte word t of 16-byte
    // chunk (half0 / 8 + j) ^ g (TMA's 128-byte swizzle, which the
    // descriptors below read): a warp's store covers 8 rows x 4 words of
    // distinct chunks, 32 banks.
    const uint32_t p_tile = at.p_tile, ds_tile = at.ds_tile;
#pragma unroll
    for (int j = 0; j < kHalf / 8; ++j) {
      float2 delta;
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                   : "=f"(delta.x), "=f"(delta.y)
                   : "r"(stats + 4 * (Tr::kBlockM + half0 + 8 * j + 2 * t))
                   : "memory");
      // kSoftcap: P = exp2(capped logit * scale log2(e) - lse2) of the
      // forward's formula (capped = tanh * cap / scale), hidden pairs 0 by
      // a select (no -inf through the tanh's derivative); dS = P (dP -
      // delta) (1 - tanh^2), the soft cap's chain rule. kDropout: with Z =
      // keep / (1 - rate), dS = P (Z dP - delta), and dV's P^T is keep ? P
      // : 0 (dV scaled by 1 / (1 - rate) at its store).
      [[maybe_unused]] float2 lse2;
      if constexpr (kSoftcap)
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                     : "=f"(lse2.x), "=f"(lse2.y)
                     : "r"(stats + 4 * (half0 + 8 * j + 2 * t))
                     : "memory");
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int k = 4 * j + 2 * hh;
        [[maybe_unused]] float ds[2];
        if constexpr (kSoftcap) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float th = st[k + e];
            const float prob = FastExp2(fmaf(th * a.softcap_unscale, a.scale_log2, -(e ? lse2.y : lse2.x)));
            st[k + e] = seen(hh, j, e) ? prob : 0.0f;
            ds[e] = st[k + e] * (dpt[k + e] - (e ? delta.y : delta.x)) * (1.0f - th * th);
          }
        } else if constexpr (kDropout) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const bool kept = keep >> (8 * hh + 2 * j + e) & 1u;
            ds[e] = st[k + e] * fmaf(dpt[k + e], kept ? a.dropout_keep_scale : 0.0f, -(e ? delta.y : delta.x));
            st[k + e] = kept ? st[k + e] : 0.0f;
          }
        }
        const uint32_t p_word = PackPair<Element>(st[k], st[k + 1]);
        const uint32_t ds_word =
            kSoftcap || kDropout
                ? PackPair<Element>(ds[0], ds[1])
                : PackPair<Element>(st[k] * (dpt[k] - delta.x), st[k + 1] * (dpt[k + 1] - delta.y));
        const uint32_t offset = (row0 + 8 * hh) * 128 + (((half0 / 8 + j) ^ g) * 16) + 4 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(p_tile + offset), "r"(p_word) : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_tile + offset), "r"(ds_word) : "memory");
      }
    }
    // Both warpgroups' halves written before either's products read them
    // (async proxy).
    FenceProxyAsync();
    NamedBarrierSync(kDsBarrier, 256);

    // dQ share = dS K[:, col0 ..]: A = dS (queries x keys) from dS^T, B = K
    // (keys x columns), both MN-major (M = 64 queries: one 128-byte row
    // width, so the leading offset is unused). Then dV += P^T dO[:, col0 ..]
    // and dK += dS^T Q[:, col0 ..]: A K-major (keys x queries), B MN-major
    // (its two 64-column chunks kQChunkBytes apart).
    float dq[kColumns / 2];
    FenceRegisters(dv);
    FenceRegisters(dk);
    WgmmaFence();
    {
      const UniformDescriptor ds_mn(ds_tile, Tr::kPTileBytes, 1024),
          k_cols(base + Tr::kKOffset + (col0 / 64) * Tr::kKvChunkBytes, Tr::kKvChunkBytes, 1024);
#pragma unroll
      for (int kk = 0; kk < Tr::kBlockN / 16; ++kk)
        WgmmaSSMn<Element, kColumns>(dq, ds_mn.At(MnMajorOffset(kk)), k_cols.At(MnMajorOffset(kk)), kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
    {
      const UniformDescriptor p_desc(p_tile, 16, 1024), ds_desc(ds_tile, 16, 1024),
          do_cols(do_tile + (col0 / 64) * Tr::kQChunkBytes, Tr::kQChunkBytes, 1024),
          q_cols(q_tile + (col0 / 64) * Tr::kQChunkBytes, Tr::kQChunkBytes, 1024);
#pragma unroll
      for (int kk = 0; kk < Tr::kBlockM / 16; ++kk)
        WgmmaSSTransB<Element, kColumns>(dv, p_desc.At(KMajorOffset(Tr::kPTileBytes, kk)),
                                         do_cols.At(MnMajorOffset(kk)), 1);
#pragma unroll
      for (int kk = 0; kk < Tr::kBlockM / 16; ++kk)
        WgmmaSSTransB<Element, kColumns>(dk, ds_desc.At(KMajorOffset(Tr::kPTileBytes, kk)),
                                         q_cols.At(MnMajorOffset(kk)), 1);
    }
    WgmmaCommit();
    WgmmaWait<1>();
    FenceRegisters(dq);
    send_dq(dq, m0);
    WgmmaWait<0>();
    FenceRegisters(dv);
    FenceRegisters(dk);
    // Q, dO and the row statistics of stage s are read: each thread
    // releases the stage (BwdBarriers::empty).
    MbarrierArrive(bars.empty(s));
  };

  // kOperands, warpgroup 0: S^T = K Q^T over the step's 64 queries, P^T
  // (masked where `masked`), P^T to shared memory for warpgroup 1 and the
  // products, dV += P^T dO[:, 0 .. 127] (under warpgroup 1's dS^T), then
  // after dS^T's barrier dQ and dK of columns 0 .. 127.
  auto step_p = [&](int i, auto masked) {
    [[maybe_unused]] constexpr bool kMasked = decltype(masked)::value;  // (kPolicy: the bits decide)
    const Step256Smem at(smem, i);
    const int s = at.s;
    const uint32_t parity = at.parity, base = at.base, q_tile = at.q_tile, do_tile = at.do_tile;
    const int m0 = step_m0;
    const uint32_t p_tile = at.p_tile, ds_tile = at.ds_tile;
    float st[Tr::kBlockM / 2];
    MbarrierWait(bars.q_full(s), parity);
    WgmmaFence();
    KeysTimesRowsT<Tr, Element, Tr::kBlockM>(st, base + Tr::kKOffset, q_tile);
    WgmmaCommit();
    // kMasks: the step's visibility bits for this thread's pairs while S^T
    // runs (FeatureStepMask's reads hide under the product); b and h
    // opaque, so that the policy is rebuilt from the parameters per step
    // rather than held across the loop.
    [[maybe_unused]] StepMaskBits<Tr::kBlockM> visible = ~StepMaskBits<Tr::kBlockM>(0);
    if constexpr (kPolicy)
      visible = FeatureStepMask<Tr::kBlockM, ReadsDenseStepMask(kFeatures, Tr::kHeadDim)>(
          p, int(Opaque(uint32_t(tile.b))), int(Opaque(uint32_t(step_h))), m0, n0 + 16 * warp, n0 + row0, t);
    const uint32_t stats = at.stats;
    // The row statistics are published by do_full (StageRowStats' arrivals),
    // not by q_full: wait for it before the lse2 loads below.
    MbarrierWait(bars.do_full(s), parity);
    WgmmaWait<0>();
    FenceRegisters(st);
    [[maybe_unused]] const int diagonal = a.is_causal ? m0 - n0 : INT32_MAX / 2;
    [[maybe_unused]] const int key_limit = a.seqlen_k - n0;
#pragma unroll
    for (int j = 0; j < Tr::kBlockM / 8; ++j) {
      float2 lse2;
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(lse2.x), "=f"(lse2.y) : "r"(stats + 4 * (8 * j + 2 * t))
                   : "memory");
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = st[4 * j + 2 * hh + e];
          if constexpr (kPolicy) {
            x = visible >> (2 * (Tr::kBlockM / 8) * hh + 2 * j + e) & 1u ? x : -CUDART_INF_F;
          } else if constexpr (kMasked) {
            const int key = row0 + 8 * hh, q = 8 * j + 2 * t + e;
            x = key < key_limit && key <= q + diagonal ? x : -CUDART_INF_F;
          }
          x = FastExp2(fmaf(x, a.scale_log2, -(e ? lse2.y : lse2.x)));
        }
    }
    uint32_t p_frag[Tr::kBlockM / 16][4];
    OnlineSoftmax<Tr::kBlockM, Tr::kHeadDim>::template ToFragments<Element>(st, p_frag);
    // P^T to shared memory before dV takes p_frag as its A operand (an
    // in-flight wgmma's A registers may not be read).
    StoreExchangeTile<Tr::kBlockM>(p_tile, p_frag, row0, g, t);
    FenceProxyAsync();
    NamedBarrierArriveAcrossRoles(kPBarrier, 256);
    // This warpgroup's P^T stores before its own dV reads them (A from
    // shared memory: from the registers, p_frag live beside dQ and dK made
    // ptxas spill).
    NamedBarrierSync(kPOwnBarrier, 128);
    FenceRegisters(dv);
    WgmmaFence();
    {
      const UniformDescriptor p_desc(p_tile, 16, 1024), do_cols(do_tile, Tr::kQChunkBytes, 1024);
#pragma unroll
      for (int kk = 0; kk < Tr::kBlockM / 16; ++kk)
        WgmmaSSTransB<Element, kColumns>(dv, p_desc.At(KMajorOffset(Tr::kPTileBytes, kk)),
                                         do_cols.At(MnMajorOffset(kk)), 1);
    }
    WgmmaCommit();
    NamedBarrierSyncAcrossRoles(kDsBarrier, 256);  // dS^T written (warpgroup 1)
    float dq[kColumns / 2];
    FenceRegisters(dk);
    WgmmaFence();
    {
      const UniformDescriptor ds_mn(ds_tile, Tr::kPTileBytes, 1024), k_cols(base + Tr::kKOffset, Tr::kKvChunkBytes, 1024);
#pragma unroll
      for (int kk = 0; kk < Tr::kBlockN / 16; ++kk)
        WgmmaSSMn<Element, kColumns>(dq, ds_mn.At(MnMajorOffset(kk)), k_cols.At(MnMajorOffset(kk)), kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
    {
      const UniformDescriptor ds_desc(ds_tile, 16, 1024), q_cols(q_tile, Tr::kQChunkBytes, 1024);
#pragma unroll
      for (int kk = 0; kk < Tr::kBlockM / 16; ++kk)
        WgmmaSSTransB<Element, kColumns>(dk, ds_desc.At(KMajorOffset(Tr::kPTileBytes, kk)),
                                         q_cols.At(MnMajorOffset(kk)), 1);
    }
    WgmmaCommit();
    WgmmaWait<1>();  // dV and dQ
    FenceRegisters(dq);
    FenceRegisters(dv);
    send_dq(dq, m0);
    WgmmaWait<0>();
    FenceRegisters(dk);
    MbarrierArrive(bars.empty(s));
  };
  // kOperands, warpgroup 1: dP^T = V dO^T over the step's 64 queries, then
  // (past kPBarrier) dS^T = P^T (dP^T - delta) from warpgroup 0's 16-bit
  // P^T (0 where masked, so dS^T needs no masks), dS^T to shared memory,
  // and after dS^T's barrier dV, dQ and dK of columns 128 .. 255.
  auto step_ds = [&](int i) {
    const Step256Smem at(smem, i);
    const int s = at.s;
    const uint32_t parity = at.parity, base = at.base, q_tile = at.q_tile, do_tile = at.do_tile;
    const int m0 = step_m0;
    const uint32_t p_tile = at.p_tile, ds_tile = at.ds_tile;
    float dpt[Tr::kBlockM / 2];
    MbarrierWait(bars.do_full(s), parity);
    WgmmaFence();
    KeysTimesRowsT<Tr, Element, Tr::kBlockM>(dpt, base + Tr::kVOffset, do_tile);
    WgmmaCommit();
    const uint32_t stats = at.stats;
    WgmmaWait<0>();
    FenceRegisters(dpt);
    NamedBarrierSyncAcrossRoles(kPBarrier, 256);  // P^T written (warpgroup 0)
    // P^T's words where this thread's (warp, g, t) twin of warpgroup 0
    // wrote them: its accumulator layout is this one's.
#pragma unroll
    for (int j = 0; j < Tr::kBlockM / 8; ++j) {
      float2 delta;
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                   : "=f"(delta.x), "=f"(delta.y)
                   : "r"(stats + 4 * (Tr::kBlockM + 8 * j + 2 * t))
                   : "memory");
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        uint32_t w;
        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w) : "r"(ExchangeWord(p_tile, row0, hh, j, g, t)) : "memory");
        const float2 prob = UnpackPair<Element>(w);
        float* const x = dpt + 4 * j + 2 * hh;
        x[0] = prob.x * (x[0] - delta.x);
        x[1] = prob.y * (x[1] - delta.y);
      }
    }
    uint32_t ds_frag[Tr::kBlockM / 16][4];
    OnlineSoftmax<Tr::kBlockM, Tr::kHeadDim>::template ToFragments<Element>(dpt, ds_frag);
    StoreExchangeTile<Tr::kBlockM>(ds_tile, ds_frag, row0, g, t);
    FenceProxyAsync();
    NamedBarrierSyncAcrossRoles(kDsBarrier, 256);
    MbarrierWait(bars.q_full(s), parity);  // (done long since: warpgroup 0 waited on it; this thread's view of Q)
    float dq[kColumns / 2];
    FenceRegisters(dv);
    FenceRegisters(dk);
    WgmmaFence();
    {
      const UniformDescriptor p_desc(p_tile, 16, 1024),
          do_cols(do_tile + 2 * Tr::kQChunkBytes, Tr::kQChunkBytes, 1024);
#pragma unroll
      for (int kk = 0; kk < Tr::kBlockM / 16; ++kk)
        WgmmaSSTransB<Element, kColumns>(dv, p_desc.At(KMajorOffset(Tr::kPTileBytes, kk)),
                                         do_cols.At(MnMajorOffset(kk)), 1);
    }
    WgmmaCommit();
    {
      const UniformDescriptor ds_mn(ds_tile, Tr::kPTileBytes, 1024),
          k_cols(base + Tr::kKOffset + 2 * Tr::kKvChunkBytes, Tr::kKvChunkBytes, 1024);
#pragma unroll
      for (int kk = 0; kk < Tr::kBlockN / 16; ++kk)
        WgmmaSSMn<Element, kColumns>(dq, ds_mn.At(MnMajorOffset(kk)), k_cols.At(MnMajorOffset(kk)), kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
    {
      const UniformDescriptor ds_desc(ds_tile, 16, 1024),
          q_cols(q_tile + 2 * Tr::kQChunkBytes, Tr::kQChunkBytes, 1024);
#pragma unroll
      for (int kk = 0; kk < Tr::kBlockM / 16; ++kk)
        WgmmaSSTransB<Element, kColumns>(dk, ds_desc.At(KMajorOffset(Tr::kPTileBytes, kk)),
                                         q_cols.At(MnMajorOffset(kk)), 1);
    }
    WgmmaCommit();
    WgmmaWait<1>();  // dV and dQ
    FenceRegisters(dq);
    FenceRegisters(dv);
    send_dq(dq, m0);
    WgmmaWait<0>();
    FenceRegisters(dk);
    MbarrierArrive(bars.empty(s));
  };

  // Whether step i's keys x queries need the per-element masks (a
  // block-uniform test, so that both warpgroups take the same copy of the
  // step and its named barrier is one instruction for all 256 threads):
  // causal where a key may follow a query (the one step m0 = n0, as
  // kBlockM = kBlockN and causal steps start at the diagonal), any where
  // the block's keys pass seqlen_k.
  auto needs_masks = [&] {
    return (a.is_causal && step_m0 - n0 < Tr::kBlockN - 1) || n0 + Tr::kBlockN > a.seqlen_k;
  };

  // (A masks' tile without steps: no copies to wait for; dK, dV are 0.)
  if (!kPolicy || steps.count > 0) MbarrierWait(bars.kv_full(), 0);
  // The step's first query runs on as counter_m0 (wrapping back by m_count
  // blocks at each head of the group) and the loop's bound is rebuilt per
  // test from an opaque m_count and the group (a kernel parameter): held
  // as steps.count and steps.m_first, the count was the word ptxas spilled,
  // an LDL per step after the stage's release (bwd_kernel.cuh's 64 / 128
  // kernels do the same).
  int counter_m = 0, counter_h = tile.hk * a.group, counter_m0 = steps.m_first * Tr::kBlockM;
  // No wgmma is in flight between steps, so the branch between the two
  // copies of the step is free of ptxas's wgmma serialization (C7520).
  // (kOperands: each warpgroup its own loop, the roles' branch taken once.)
  auto for_each_step = [&](auto&& run) {
    for (int i = 0; i < int(Opaque(uint32_t(steps.m_count))) * a.group; ++i) {
      step_m0 = counter_m0;
      step_h = counter_h;
      run(i);
      counter_m0 += Tr::kBlockM;
      if (++counter_m == steps.m_count) counter_m = 0, counter_m0 -= steps.m_count * Tr::kBlockM, ++counter_h;
    }
  };
  if constexpr (kSplit == Bwd256Split::kQueryHalves) {
    for_each_step([&](int i) {
      if constexpr (kPolicy) step(i, std::true_type{});  // (the policy's bits: every step)
      else if (needs_masks()) step(i, std::true_type{});
      else step(i, std::false_type{});
    });
  } else if (warpgroup == 0) {
    for_each_step([&](int i) {
      if constexpr (kPolicy) step_p(i, std::true_type{});  // (the policy's bits: every step)
      else if (needs_masks()) step_p(i, std::true_type{});
      else step_p(i, std::false_type{});
    });
  } else {
    for_each_step([&](int i) { step_ds(i); });
  }
  pass_pending_turn();  // (kDeterministic: the tile's last step's)

  // dK, dV through shared memory (KeyRowPiece, as the 64 / 128 kernels'
  // epilogue): warpgroup w stages its column half of the block's 64 rows in
  // its own two 64-column chunks of the K and V tiles, then stores 16-byte
  // pieces. Those chunks are free here: the other warpgroup's last reads of
  // them (S^T and dP^T, which read every column) completed before both
  // passed the last step's kDsBarrier, and its dQ reads its own half of K;
  // this warpgroup's own products completed at its last step's wait.
  const uint32_t k_tile = Opaque(smem) + Tr::kKOffset, v_tile = Opaque(smem) + Tr::kVOffset;
  StageKeyGradient<Element, Tr, kColumns>(k_tile, 0, dk, a.scale, row0, t, col0 / 8);
  StageKeyGradient<Element, Tr, kColumns>(v_tile, 0, dv, kDropout ? a.dropout_keep_scale : 1.0f, row0, t, col0 / 8);
  if (warpgroup == 0) NamedBarrierSync(kStage256Barrier, 128);
  else NamedBarrierSync(kStage256Barrier + 1, 128);
  StoreStagedKeyRows<Element, Tr, kColumns>(a, a.dk, k_tile, 0, n0, tile.b, tile.hk, tid, col0 / 8);
  StoreStagedKeyRows<Element, Tr, kColumns>(a, a.dv, v_tile, 0, n0, tile.b, tile.hk, tid, col0 / 8);
}

// One block's tile (BwdTile), both kernels' roles. kDeterministic:
// Deterministic256Kernel's (the sectioned tile order for
// non-causal calls too, where a.causal_section asks for it: BwdTile's
// kSectionsAlways; the dQ adds ordered by `dq_counters`).
template <typename Element, bool kDeterministic, Features kFeatures = Features::kNone>
__device__ __forceinline__ void RunBackward256Block(const CUtensorMap* q_map, const CUtensorMap* k_map,
                                                    const CUtensorMap* v_map, const CUtensorMap* do_map,
                                                    const BackwardArgs& a, const AttentionParams& p,
                                                    int* dq_counters) {
  using Tr = Bwd256Traits;
  constexpr bool kPolicy = UsesMaskPolicy(kFeatures);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t smem = (SmemAddress(smem_raw) + 1023u) & ~1023u;
  const BwdBarriers<Tr> bars{smem + Tr::kBarrierOffset};
  if (threadIdx.x == 0) bars.Init();
  __syncthreads();
  const BwdTile tile(a, int(blockIdx.x), std::bool_constant<kDeterministic>{});
  // kMasks: the tile's query blocks from the mask policy.
  const BwdSteps<Tr> steps = BwdSteps<Tr>::template ForTile<kPolicy>(a, p, tile);
  // setmaxnreg needs each warpgroup's role as one branch of a single if/else.
  if (threadIdx.x / 128 == 0) {
    RegistersDecrease<Tr::kProducerRegisters>();
    if (threadIdx.x == 0) {
      // (A masks' tile without steps copies nothing.)
      if (!kPolicy || steps.count > 0)
        ProduceBackwardTile<Tr>(q_map, k_map, v_map, do_map, a, bars, smem, tile, steps);
    }
    else if (threadIdx.x / 32 == 1) StageRowStats<Tr>(a, p, bars, smem, tile, steps, threadIdx.x % 32);
  } else {
    RegistersIncrease<Tr::kConsumerRegisters>();
    // (The deterministic kernel splits by query halves whatever the
    // default: kOperands' deterministic build spilled, 30 local accesses in
    // its step loops. So do the soft cap's and dropout's, whose dS needs
    // S^T's tanh or undropped P^T beside dP^T: ConsumeBackwardTile256.)
    constexpr Bwd256Split kSplit = kDeterministic || AppliesSoftcap(kFeatures) || AppliesDropout(kFeatures)
                                       ? Bwd256Split::kQueryHalves
                                       : kBwd256Split;
    ConsumeBackwardTile256<Element, kDeterministic, kSplit, kFeatures>(a, p, bars, smem, threadIdx.x / 128 - 1,
                                                                       tile, steps, dq_counters);
  }
}

// grid: key_blocks (of 64 keys) * num_heads_k * batch blocks, one tile each
// (BwdTile). kFeatures: kNone (`p` then only for StageRowStats' signature),
// kMasks (its mask policy; ConsumeBackwardTile256), kMasksSoftcap or
// kMasksDropout (the policy and the soft cap or dropout, by query halves).
template <typename Element, Features kFeatures = Features::kNone>
__global__ void __launch_bounds__(Bwd256Traits::kThreads, 1)
    Backward256Kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                      const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                      const BackwardArgs a, const __grid_constant__ AttentionParams p) {
  RunBackward256Block<Element, false, kFeatures>(&q_map, &k_map, &v_map, &do_map, a, p, nullptr);
}

// The deterministic variant (bwd_launch.cuh's LaunchBackwardDeterministic
// at 256): `dq_counters`, int32 [B, N, ceil(Tq / 64)], zeroed before the
// call (the 128 kernel's DeterministicBackwardKernel's contract).
template <typename Element>
__global__ void __launch_bounds__(Bwd256Traits::kThreads, 1)
    Deterministic256Kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                           const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                           const BackwardArgs a, const __grid_constant__ AttentionParams p, int* dq_counters) {
  RunBackward256Block<Element, true>(&q_map, &k_map, &v_map, &do_map, a, p, dq_counters);
}

}  // namespace jax_flash::cuda::sm90
