// Split-KV forward for short queries (flash-decoding) on mma.sync m16n8k16,
// float16 / bfloat16, sm_80 and later (Hopper runs the same code: decoding
// is bound by reading K and V, not by the tensor cores).
//
// One block per (KV split, block of 64 packed query rows, key head,
// sequence): grid (splits * m_blocks, K, sequences). The rows are the Tq
// query tokens x the G query heads sharing the key head (GQA packing), so a
// key and value row read from memory serves all G heads, and a decode step
// with G = 4 fills 4 rows of an m-tile rather than 1. The block streams the
// K/V tiles of its split through kStages cp.async stages (one barrier per
// tile: at the top of step i, tile i has landed and every warp is done with
// tile i - 1, whose stage the load of tile i + kStages - 1 then refills).
// Warp roles (DecodeTraits): warps sharing an m-tile take disjoint 16-key
// chunks of each tile and keep their own online-softmax state; at the end
// the block merges the warps' states through shared memory and writes either
// the final out / lse (one split) or a normalized float partial and its lse
// for the combine kernel (combine_kernel.cuh).
#pragma once

#include <math_constants.h>

#include <type_traits>

#include "common/mask_policy.h"
#include "common/params.h"
#include "common/row_end.h"
#include "cuda/decode/kernel_traits.cuh"
#include "cuda/decode/problem.cuh"
#include "cuda/decode/q_fragments.cuh"
#include "cuda/logit_features.cuh"
#include "cuda/row_stats.cuh"
#include "cuda/sm80/mma.cuh"
#include "cuda/sm80/warp_gemm.cuh"

namespace jax_flash::cuda::decode {

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(DecodeTraits<kHeadDim>::kThreads)
    SplitForwardKernel(const DecodeArgs args) {
  using Tr = DecodeTraits<kHeadDim>;
  using namespace jax_flash::cuda::sm80;
  constexpr int kD = kHeadDim / 8;  // n8 tiles of a warp's O
  constexpr int kN = Tr::kChunkNTiles;
  // The soft cap's tanh on the special-function unit for bfloat16 (FastTanh
  // for float16), as the sm80 forward.
  constexpr bool kApproxTanh = std::is_same_v<Element, __nv_bfloat16>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_tile = SmemAddr(smem);            // [kBlockM][kHeadDim], swizzled
  const uint32_t kv_stages = q_tile + Tr::kQBytes;  // kStages x (K, V) [kBlockN][kHeadDim]

  const AttentionParams& p = args.attn;
  const AttentionShape& s = p.shape;
  const int split = int(blockIdx.x) / args.m_blocks, m_block = int(blockIdx.x) % args.m_blocks;
  const int64_t hk = blockIdx.y, b = blockIdx.z;
  const int group = int(s.group()), tq = int(s.seqlen_q), d = int(s.head_dim);
  const int packed_rows = tq * group;  // of this (sequence, key head)
  const int row0 = m_block * Tr::kBlockM;
  const int rows = min(Tr::kBlockM, packed_rows - row0);
  const int64_t h0 = hk * group;  // first query head of the group
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;  // MMA fragment row / column-pair owner

  // Which keys the block's rows see: the shared policy (lengths, causal with
  // the position offset, window) of the contiguous call, or the paged rule.
  const MaskPolicy policy = args.is_paged ? PagedDecodeMask(args.paged, b) : MaskPolicy::For(p, b, h0);
  const int64_t t_lo = row0 / group, t_hi = (row0 + rows - 1) / group + 1;  // the block's tokens
  int64_t key_lo, key_hi;
  policy.KeyRange(t_lo, t_hi, &key_lo, &key_hi);
  key_lo = key_lo < 0 ? 0 : key_lo;
  // This split's share of the block's key tiles (of the sequence's own
  // visible range, so a short sequence of a ragged batch splits its few
  // tiles rather than leaving most splits idle).
  const int tile_lo = int(key_lo / Tr::kBlockN);
  const int tiles = key_hi > key_lo ? int((key_hi + Tr::kBlockN - 1) / Tr::kBlockN) - tile_lo : 0;
  const int begin = tile_lo + int(int64_t(tiles) * split / args.splits);
  const int end = tile_lo + int(int64_t(tiles) * (split + 1) / args.splits);

  const KvSource<Element> kv = KvSource<Element>::For(args, b, hk);
  // Q: packed row R is token (row0 + R) / G of head h0 + (row0 + R) % G;
  // rows past the block's and columns past head_dim read as zero.
  {
    const Element* q = static_cast<const Element*>(p.q) + b * p.q_stride.batch + h0 * p.q_stride.head;
    for (int idx = threadIdx.x; idx < Tr::kBlockM * Tr::kChunks; idx += Tr::kThreads) {
      const int r = idx / Tr::kChunks, c = idx % Tr::kChunks;
      const int packed = row0 + r, t = packed / group;
      const bool valid = r < rows && c * 8 < d;
      const Element* src = q + t * p.q_stride.row + (packed - t * group) * p.q_stride.head + c * 8;
      CpAsync16(q_tile + SwizzledOffset<Tr::kChunks>(r, c), valid ? static_cast<const void*>(src) : q, valid);
    }
  }
  auto stage_of = [&](int i) { return kv_stages + uint32_t((i % Tr::kStages) * Tr::kStageBytes); };
  auto load_tile = [&](int i) {  // tile begin + i into its stage
    const uint32_t k_dst = stage_of(i);
    kv.template LoadTileAsync<Tr::kBlockN, kHeadDim, Tr::kThreads>(
        k_dst, k_dst + Tr::kTileBytes, int64_t(begin + i) * Tr::kBlockN, key_hi, d);
  };
  const int n = end - begin;
#pragma unroll
  for (int i = 0; i < Tr::kStages - 1; ++i) {
    if (i < n) load_tile(i);
    CpAsyncCommit();  // group i (Q joins group 0); empty groups keep the count
  }

  // Warp arrangement (DecodeTraits): m_tiles m-tiles, each shared by
  // key_groups warps that split every tile's 4 chunks of 16 keys.
  const int m_tiles = rows <= 16 ? 1 : rows <= 32 ? 2 : 4;
  const int key_groups = Tr::kWarps / m_tiles;
  const int warp_mt = warp % m_tiles;
  const int chunks_per_warp = Tr::kChunksPerTile / key_groups;
  const int chunk0 = warp / m_tiles * chunks_per_warp;
  // Key bounds of this thread's two fragment rows (g, g + 8). Without mask
  // arrays or segment ids (the launcher refuses them) a row's visible keys
  // are exactly RowKeyBounds' range.
  int64_t row_key_lo[2], row_key_hi[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = warp_mt * 16 + g + 8 * hh;
    const int64_t t = r < rows ? (row0 + r) / group : int64_t(tq);  // a padding row sees nothing
    policy.RowKeyBounds(t, &row_key_lo[hh], &row_key_hi[hh]);
  }
  // The soft cap as the sm80 forward applies it (LogitFeatures::SoftcapRaw,
  // on raw q.k); the only logit transform this path takes.
  const LogitFeatures lf = LogitFeatures::For(p, b, h0);
  const bool softcap = lf.cap > 0.0f;
  const float scale_log2 = float(p.scale) * kLog2e;  // scale > 0 (the launcher checks)
  // How far (log2 units) a row's exponent offset may lag its running
  // maximum, as in the sm80 forward: probabilities up to 2^8.
  constexpr float kRescaleSlack = 8.0f;

  float o[1][kD][4] = {};
  // Q's fragments of the warp's m-tile (Tr::kQInRegisters), read once Q has
  // landed (the first step's wait).
  uint32_t q_frag[Tr::kQInRegisters ? kHeadDim / 16 : 1][4];
  float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F}, row_sum[2] = {0.0f, 0.0f};

  // One chunk of 16 keys from key j0c: S = Q K^T for the warp's m-tile,
  // masks / soft cap, the online softmax update, O += P V.
  auto process_chunk = [&](uint32_t k_tile, uint32_t v_tile, int chunk, int64_t j0c, bool check) {
    float acc[1][kN][4] = {};
    if constexpr (Tr::kQInRegisters) {
      GemmQRegsSmemT<Element, kN, kHeadDim>(acc, q_frag, k_tile, chunk * 16, lane);
    } else {
      GemmSmemSmemT<Element, 1, kN, kHeadDim, kHeadDim / 16>(acc, q_tile, warp_mt * 16, k_tile, chunk * 16, lane);
    }
    // Soft cap, then the masks (the order does not matter: hidden logits
    // become -inf either way), each a uniform branch over selects: a branch
    // per element, as one if / else-if chain compiled, cost ~3 instructions
    // an element more.
    if (softcap) {
#pragma unroll
      for (int nt = 0; nt < kN; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float unused_tanh;
          acc[0][nt][i] = lf.SoftcapRaw<kApproxTanh>(acc[0][nt][i], &unused_tanh);
        }
    }
    if (check) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        // The row's bounds relative to this thread's first column, clamped
        // into [-1, 16] so that 32-bit compares against the fragment's
        // column offsets 8 nt + e (0..9) decide.
        const int64_t c0 = j0c + 2 * t4;
        auto relative = [c0](int64_t x) { x -= c0; return int(x < -1 ? -1 : (x > 16 ? 16 : x)); };
        const int lo = relative(row_key_lo[hh]), hi = relative(row_key_hi[hh]);
#pragma unroll
        for (int nt = 0; nt < kN; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = nt * 8 + e;
            if (c < lo || c >= hi) acc[0][nt][2 * hh + e] = -CUDART_INF_F;
          }
      }
    }
    float blk_max[2];
    bool grow = false;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = fmaxf(fmaxf(acc[0][0][2 * hh], acc[0][0][2 * hh + 1]), fmaxf(acc[0][1][2 * hh], acc[0][1][2 * hh + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      blk_max[hh] = mx * scale_log2;
      grow |= blk_max[hh] > row_max[hh] + kRescaleSlack;  // false while nothing is visible
    }
    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float new_max = fmaxf(row_max[hh], blk_max[hh]);
        const float alpha = new_max == -CUDART_INF_F ? 1.0f : FastExp2(row_max[hh] - new_max);
        row_max[hh] = new_max;
        row_sum[hh] *= alpha;
#pragma unroll
        for (int dt = 0; dt < kD; ++dt) o[0][dt][2 * hh] *= alpha, o[0][dt][2 * hh + 1] *= alpha;
      }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float m_use = row_max[hh] == -CUDART_INF_F ? 0.0f : row_max[hh];
#pragma unroll
      for (int nt = 0; nt < kN; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pr = FastExp2(fmaf(acc[0][nt][2 * hh + e], scale_log2, -m_use));
          acc[0][nt][2 * hh + e] = pr;
          row_sum[hh] += pr;
        }
    }
    GemmRegsSmem<Element, 1, kN, kHeadDim>(o, acc, v_tile, chunk * 16, lane);
  };

  for (int i = 0; i < n; ++i) {
    CpAsyncWait<Tr::kStages - 2>();
    __syncthreads();
    if (i + Tr::kStages - 1 < n) load_tile(i + Tr::kStages - 1);
    CpAsyncCommit();
    if constexpr (Tr::kQInRegisters) {
      if (i == 0) LoadQFragments<kHeadDim>(q_frag, q_tile, warp_mt * 16, lane);
    }
    const int64_t j0 = int64_t(begin + i) * Tr::kBlockN;
    // Per-element masks only where the policy says some pair of the block's
    // rows x this tile is hidden (the first / last tiles of a range).
    const bool check = policy.NeedsBoundsCheck(t_lo, t_hi, j0, j0 + Tr::kBlockN);
    const uint32_t k_tile = stage_of(i), v_tile = k_tile + Tr::kTileBytes;
    for (int c = 0; c < chunks_per_warp; ++c) {
      const int chunk = chunk0 + c;
      process_chunk(k_tile, v_tile, chunk, j0 + chunk * Tr::kChunkKeys, check);
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // every warp is done with the stages: the merge reuses them

  // Merge: each warp's O (unnormalized), exponent offset and sum per row.
  float* merge_o = reinterpret_cast<float*>(smem + Tr::kQBytes);  // [kWarps][16][kMergeRowFloats]
  float* merge_stats = merge_o + Tr::kMergeOFloats;              // [kWarps][16][2]: offset, sum
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float l = row_sum[hh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = g + 8 * hh;
    if (t4 == 0) {
      merge_stats[(warp * 16 + r) * 2] = row_max[hh];
      merge_stats[(warp * 16 + r) * 2 + 1] = l;
    }
    float* dst = merge_o + (warp * 16 + r) * Tr::kMergeRowFloats + 2 * t4;
#pragma unroll
    for (int dt = 0; dt < kD; ++dt)
      *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[0][dt][2 * hh], o[0][dt][2 * hh + 1]);
  }
  __syncthreads();

  // Every (row, column pair) of the block: the key groups' states of its
  // m-tile combined by their offsets, normalized, written.
  const int pairs = d / 2;
  const int64_t all_rows = s.batch * s.num_heads * s.seqlen_q;  // lse entries of the call
  for (int idx = threadIdx.x; idx < rows * pairs; idx += Tr::kThreads) {
    const int r = idx / pairs, col = 2 * (idx - r * pairs);
    const int mt = r / 16, rr = r % 16;
    float m = -CUDART_INF_F;
    for (int k = 0; k < key_groups; ++k) m = fmaxf(m, merge_stats[((mt + k * m_tiles) * 16 + rr) * 2]);
    float l = 0.0f, o0 = 0.0f, o1 = 0.0f;
    if (m != -CUDART_INF_F) {
      for (int k = 0; k < key_groups; ++k) {
        const int w = mt + k * m_tiles;
        const float f = FastExp2(merge_stats[(w * 16 + rr) * 2] - m);  // -inf (nothing seen) -> 0
        l += f * merge_stats[(w * 16 + rr) * 2 + 1];
        const float2 ow = *reinterpret_cast<const float2*>(merge_o + (w * 16 + rr) * Tr::kMergeRowFloats + col);
        o0 += f * ow.x, o1 += f * ow.y;
      }
    }
    const int packed = row0 + r, t = packed / group;
    const int64_t h = h0 + (packed - t * group);
    // No visible key: zeros, lse -inf. The sinks join the final rows only
    // (one split: here; several: the combine).
    const RowEnd<float> end =
        EndRow(m, l, args.splits == 1 ? SinkLog2<float>(p.features, b, h, s.num_heads) : -CUDART_INF_F);
    const float inv = end.scale, lse = end.lse;
    const int64_t stat = p.row_stat_index(b, h, t);
    if (args.splits == 1) {
      Element* out = static_cast<Element*>(p.out) + b * p.q_stride.batch + t * p.q_stride.row + h * p.q_stride.head;
      *reinterpret_cast<uint32_t*>(out + col) = Pack2<Element>(o0 * inv, o1 * inv);
      if (col == 0) static_cast<float*>(p.lse)[stat] = lse;
    } else {
      const int64_t part = split * all_rows + stat;
      *reinterpret_cast<float2*>(args.partial_out + part * d + col) = make_float2(o0 * inv, o1 * inv);
      if (col == 0) args.partial_lse[part] = lse;
    }
  }
}

}  // namespace jax_flash::cuda::decode
