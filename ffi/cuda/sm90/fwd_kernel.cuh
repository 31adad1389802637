// FlashAttention forward for Hopper (sm_90a), float16/bfloat16, no attention
// features beyond causal: FlashAttention-3's design in our own code.
//
// One block per (128 query rows, head, batch), three warpgroups:
//
//   warpgroup 0 (producer, 24 registers): one thread issues TMA copies
//     Q once                      -> q_full
//     for each key block (last to first), into ring stage i % kStages:
//       wait k_empty[s]; K tile   -> k_full[s]
//       wait v_empty[s]; V tile   -> v_full[s]
//   warpgroups 1, 2 (consumers, 240 registers), 64 query rows each:
//     wait q_full
//     for each key block:
//       wait k_full[s]; S = Q K^T (wgmma, smem x smem); arrive k_empty[s]
//       mask, online softmax in registers, P to 16 bits (the A fragments)
//       wait v_full[s]; O += P V (wgmma, registers x smem); arrive v_empty[s]
//     normalize O, stage it in the warpgroup's own Q rows, 16-byte stores
//
// Every barrier is an mbarrier whose phase parity is (i / kStages) & 1 for
// the i-th key block; empties take one arrival per consumer warp.
// Key blocks run last to first so the ones needing masks (the causal
// diagonal, the seqlen_k tail) come first and the rest skip mask arithmetic.
#pragma once

#include <cuda.h>
#include <math_constants.h>

#include <cstdint>
#include <type_traits>

#include "common/params.h"
#include "cuda/row_stats.cuh"
#include "cuda/sm90/kernel_traits.cuh"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace jax_flash::cuda::sm90 {

// What the kernel reads besides the tensor maps (AttentionParams' features
// would only cost parameter space).
struct ForwardArgs {
  void* out;       // [B, Tq, N, H] strided like q
  float* lse;      // [B, N, Tq]
  Strides out_stride;
  int seqlen_q, seqlen_k, num_heads, group, head_dim;
  float scale_log2;  // scale * log2(e), scale > 0
  bool is_causal;
};

// The mbarriers of the block (kernel_traits.cuh: q_full, then per stage).
template <typename Tr>
struct Barriers {
  uint32_t base;
  __device__ uint32_t q_full() const { return base; }
  __device__ uint32_t k_full(int s) const { return base + 8 * (1 + s); }
  __device__ uint32_t v_full(int s) const { return base + 8 * (1 + Tr::kStages + s); }
  __device__ uint32_t k_empty(int s) const { return base + 8 * (1 + 2 * Tr::kStages + s); }
  __device__ uint32_t v_empty(int s) const { return base + 8 * (1 + 3 * Tr::kStages + s); }
};

template <typename Tr>
__device__ __forceinline__ void ProduceTiles(const CUtensorMap* q_map, const CUtensorMap* k_map,
                                             const CUtensorMap* v_map, Barriers<Tr> bars,
                                             uint32_t smem, int m0, int h, int hk, int b,
                                             int n_blocks) {
  PrefetchTensorMap(q_map);
  PrefetchTensorMap(k_map);
  PrefetchTensorMap(v_map);
  MbarrierArriveExpectTx(bars.q_full(), Tr::kQBytes);
#pragma unroll
  for (int c = 0; c < Tr::kChunks; ++c)
    TmaLoad4d(smem + Tr::kQOffset + c * Tr::kQChunkBytes, q_map, bars.q_full(), c * Tr::kChunkCols,
              m0, h, b);
  for (int i = 0; i < n_blocks; ++i) {
    const int nb = n_blocks - 1 - i, stage = i % Tr::kStages;
    const uint32_t parity = (i / Tr::kStages) & 1;
    const uint32_t k_tile = smem + Tr::kKOffset + stage * Tr::kKvTileBytes;
    const uint32_t v_tile = smem + Tr::kVOffset + stage * Tr::kKvTileBytes;
    // The first round finds the empties in their "previous" phase (parity 1).
    MbarrierWait(bars.k_empty(stage), parity ^ 1);
    MbarrierArriveExpectTx(bars.k_full(stage), Tr::kKvTileBytes);
#pragma unroll
    for (int c = 0; c < Tr::kChunks; ++c)
      TmaLoad4d(k_tile + c * Tr::kKvChunkBytes, k_map, bars.k_full(stage), c * Tr::kChunkCols,
                nb * Tr::kBlockN, hk, b);
    MbarrierWait(bars.v_empty(stage), parity ^ 1);
    MbarrierArriveExpectTx(bars.v_full(stage), Tr::kKvTileBytes);
#pragma unroll
    for (int c = 0; c < Tr::kChunks; ++c)
      TmaLoad4d(v_tile + c * Tr::kKvChunkBytes, v_map, bars.v_full(stage), c * Tr::kChunkCols,
                nb * Tr::kBlockN, hk, b);
  }
}

// One consumer warpgroup: 64 query rows from m0 + 64 * warpgroup.
template <typename Element, typename Tr>
__device__ __forceinline__ void ConsumeTiles(const ForwardArgs& a, Barriers<Tr> bars, uint32_t smem,
                                             int warpgroup, int m0, int h, int b, int n_blocks) {
  constexpr int kHeadDim = Tr::kHeadDim, kBlockN = Tr::kBlockN;
  constexpr int kSRegs = kBlockN / 2, kORegs = kHeadDim / 2;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  // This thread's rows inside the block: row0 and row0 + 8.
  const int row0 = warpgroup * 64 + warp * 16 + g;
  const uint32_t q_rows = smem + Tr::kQOffset + warpgroup * 64 * 128;

  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
  // Running row maxima (log2 units, scale folded in) and this thread's share
  // of the row sums, for rows row0 + 8 hh.
  float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F}, row_sum[2] = {0.0f, 0.0f};
  // How far a row's exponent offset may lag its running maximum (sm80's
  // forward: P <= 2^8 stays exact, and O is rescaled only when a row of the
  // warp outgrows it, rare past the first blocks).
  constexpr float kRescaleSlack = 8.0f;

  // Key blocks from first_masked on need masks (see the file comment).
  const int limit = a.is_causal ? min(a.seqlen_k, m0 + 1) : a.seqlen_k;
  const int first_masked = limit / kBlockN;

  MbarrierWait(bars.q_full(), 0);

  auto process_block = [&](int i, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const int nb = n_blocks - 1 - i, stage = i % Tr::kStages;
    const uint32_t parity = (i / Tr::kStages) & 1;
    const uint32_t k_tile = smem + Tr::kKOffset + stage * Tr::kKvTileBytes;
    const uint32_t v_tile = smem + Tr::kVOffset + stage * Tr::kKvTileBytes;

    // S = Q K^T  [64 rows][kBlockN], raw logits. k16 step kk reads 32 bytes
    // into the 128-byte rows of column chunk kk / 4 of both tiles.
    float s[kSRegs];
    MbarrierWait(bars.k_full(stage), parity);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t offset = (kk % 4) * 32;
      const uint64_t q_desc = SmemDescriptor(q_rows + (kk / 4) * Tr::kQChunkBytes + offset, 16, 1024);
      const uint64_t k_desc = SmemDescriptor(k_tile + (kk / 4) * Tr::kKvChunkBytes + offset, 16, 1024);
      WgmmaSS<Element, kBlockN>(s, q_desc, k_desc, kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceRegisters(s);
    if (lane == 0) MbarrierArrive(bars.k_empty(stage));

    if constexpr (kMasked) {
      // Block-relative: column c is visible to row r when c < col_limit and
      // (not causal or c <= r + diagonal).
      const int n0 = nb * kBlockN;
      const int col_limit = min(kBlockN, a.seqlen_k - n0);
      const int diagonal = m0 - n0;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = 8 * j + 2 * t + e;
            if (col >= col_limit || (a.is_causal && col > row0 + 8 * hh + diagonal))
              s[4 * j + 2 * hh + e] = -CUDART_INF_F;
          }
    }

    // Online softmax: a row's 4 owners (lanes 4g .. 4g + 3) combine by shuffles.
    float blk_max[2];
    bool grow = false;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
        mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hh], s[4 * j + 2 * hh + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      blk_max[hh] = mx * a.scale_log2;
      grow |= blk_max[hh] > row_max[hh] + kRescaleSlack;  // false while both are -inf
    }
    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float new_max = fmaxf(row_max[hh], blk_max[hh]);
        const float alpha = new_max == -CUDART_INF_F ? 1.0f : FastExp2(row_max[hh] - new_max);
        row_max[hh] = new_max;
        row_sum[hh] *= alpha;
#pragma unroll
        for (int j = 0; j < kHeadDim / 8; ++j) o[4 * j + 2 * hh] *= alpha, o[4 * j + 2 * hh + 1] *= alpha;
      }
    }
    // P in 16 bits as wgmma A fragments: k16 step kk covers n8 tiles 2kk, 2kk + 1.
    uint32_t p[kBlockN / 16][4];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      // Nothing visible yet in this row (masked blocks only): P = 0.
      const float m_use = (kMasked && row_max[hh] == -CUDART_INF_F) ? 0.0f : row_max[hh];
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        const float e0 = FastExp2(fmaf(s[4 * j + 2 * hh], a.scale_log2, -m_use));
        const float e1 = FastExp2(fmaf(s[4 * j + 2 * hh + 1], a.scale_log2, -m_use));
        sum += e0 + e1;
        p[j / 2][(j % 2) * 2 + hh] = PackPair<Element>(e0, e1);
      }
      row_sum[hh] += sum;
    }

    // O += P V  [64 rows][kHeadDim]: V's tile is [keys][kHeadDim] row-major,
    // i.e. B with N (head dim) contiguous, MN-major: 8-key atoms 1024 bytes
    // apart, 64-column chunks kKvChunkBytes apart; a k16 step is 16 keys.
    MbarrierWait(bars.v_full(stage), parity);
    FenceRegisters(o);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint64_t v_desc = SmemDescriptor(v_tile + kk * 16 * 128, Tr::kKvChunkBytes, 1024);
      WgmmaRS<Element, kHeadDim>(o, p[kk], v_desc, 1);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceRegisters(o);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) FenceRegisters(p[kk]);  // read until the wait
    if (lane == 0) MbarrierArrive(bars.v_empty(stage));
  };

  int i = 0;
  for (; i < n_blocks && n_blocks - 1 - i >= first_masked; ++i) process_block(i, std::true_type{});
  for (; i < n_blocks; ++i) process_block(i, std::false_type{});

  // Epilogue: normalize, lse, then O through shared memory. The staging
  // area is this warpgroup's own Q rows (no other warpgroup reads them), in
  // Q's layout: row r's 16-byte chunk k of column chunk c at chunk k ^ (r % 8),
  // so a warp's fragment writes (8 rows x 4 pairs) hit 32 distinct banks.
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float l = row_sum[hh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // no visible key: zeros
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) o[4 * j + 2 * hh] *= inv, o[4 * j + 2 * hh + 1] *= inv;
    const int row = m0 + row0 + 8 * hh;
    if (t == 0 && row < a.seqlen_q)
      a.lse[(int64_t(b) * a.num_heads + h) * a.seqlen_q + row] =
          l > 0.0f ? (row_max[hh] + log2f(l)) * kLn2 : -CUDART_INF_F;
  }
  // Every warp of the warpgroup is past its last read of Q (its wgmma waits).
  NamedBarrierSync(1 + warpgroup, 128);
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = row0 - warpgroup * 64 + 8 * hh;  // row within the warpgroup
      const uint32_t addr = q_rows + (j / 8) * Tr::kQChunkBytes + r * 128 + (((j % 8) ^ (r % 8)) * 16) + 4 * t;
      const uint32_t v = PackPair<Element>(o[4 * j + 2 * hh], o[4 * j + 2 * hh + 1]);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
    }
  NamedBarrierSync(1 + warpgroup, 128);
  constexpr int kRowChunks = kHeadDim / 8;  // 16-byte chunks per output row
  Element* out = static_cast<Element*>(a.out) + int64_t(b) * a.out_stride.batch + int64_t(h) * a.out_stride.head;
#pragma unroll
  for (int idx = tid; idx < 64 * kRowChunks; idx += 128) {
    const int r = idx / kRowChunks, k = idx % kRowChunks;
    const int row = m0 + warpgroup * 64 + r, col = 8 * k;
    if (row >= a.seqlen_q || col >= a.head_dim) continue;
    const uint32_t addr = q_rows + (k / 8) * Tr::kQChunkBytes + r * 128 + (((k % 8) ^ (r % 8)) * 16);
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr));
    Element* dst = out + int64_t(row) * a.out_stride.row + col;
    if (col + 8 <= a.head_dim) {
      *reinterpret_cast<uint4*>(dst) = v;  // 16-byte aligned: the launch checks the strides
    } else {
      // A head dim that is not a multiple of 8: the row's last partial chunk,
      // element by element (constant indices keep v in registers).
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      uint16_t* dst16 = reinterpret_cast<uint16_t*>(dst);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < a.head_dim - col) dst16[e] = uint16_t(words[e / 2] >> (16 * (e % 2)));
    }
  }
}

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(FwdTraits<kHeadDim>::kThreads, 1)
    ForwardKernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                  const __grid_constant__ CUtensorMap v_map, const ForwardArgs a) {
  using Tr = FwdTraits<kHeadDim>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Swizzled tiles need 1024-byte aligned atoms (kSmemBytes includes the slack).
  const uint32_t smem = (SmemAddress(smem_raw) + 1023u) & ~1023u;
  const Barriers<Tr> bars{smem + Tr::kBarrierOffset};

  // Causal: the last query blocks see the most keys; launch them first.
  const int m_block = a.is_causal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int m0 = m_block * Tr::kBlockM, h = blockIdx.y, b = blockIdx.z;
  const int kv_end = a.is_causal ? min(a.seqlen_k, m0 + Tr::kBlockM) : a.seqlen_k;
  const int n_blocks = (kv_end + Tr::kBlockN - 1) / Tr::kBlockN;

  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    MbarrierInit(bars.q_full(), 1);
    for (int s = 0; s < Tr::kStages; ++s) {
      MbarrierInit(bars.k_full(s), 1);
      MbarrierInit(bars.v_full(s), 1);
      MbarrierInit(bars.k_empty(s), Tr::kConsumerWarps);
      MbarrierInit(bars.v_empty(s), Tr::kConsumerWarps);
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (warpgroup == 0) {
    RegistersDecrease<Tr::kProducerRegisters>();
    if (threadIdx.x == 0)
      ProduceTiles<Tr>(&q_map, &k_map, &v_map, bars, smem, m0, h, h / a.group, b, n_blocks);
  } else {
    RegistersIncrease<Tr::kConsumerRegisters>();
    ConsumeTiles<Element, Tr>(a, bars, smem, warpgroup - 1, m0, h, b, n_blocks);
  }
}

}  // namespace jax_flash::cuda::sm90
