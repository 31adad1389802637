// The sm90 forward's feature variants (ffi/cuda/sm90/feature_mask.cuh) in
// sm90_fwd_check: query / key lengths, local windows, position offsets,
// segment ids (packed documents with their block summaries, ids that are not
// contiguous, ids without summaries), the soft cap and (kMasksBias, built
// here only until its check passes) an additive float32 bias broadcast over
// any of batch, heads and queries (kMasksBias16: the same in the inputs'
// 16-bit type, whose pair loads the even-S cases take and whose element
// loads the odd-S one: BiasRows), and (kMasksBoolean, likewise) a boolean
// mask [B|1, N|1, T|1, S], each against a float
// reference of its own that spells the semantics out (jax_flash/reference.py;
// offsets as in common/mask_policy.h: query row i sits at key position
// i + offset), not through MaskPolicy. Then the issue-19 feature table's
// timings beside the plain kernel (and the sm80 forward, which serves these
// calls today).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "check_helpers.cuh"
#include "common/params.h"
#include "cuda/sm90/launch.cuh"
#ifdef JAX_FLASH_CHECK_SM80
#include "cuda/sm80/launch.cuh"
#endif

namespace sm90_feature_check {

using jax_flash::AttentionParams;
using jax_flash::ContiguousBtnh;
using namespace gpu_check;
namespace sm90 = jax_flash::cuda::sm90;

// The features as the reference reads them (null / negative: off).
struct RefFeatures {
  const int32_t *q_lens = nullptr, *kv_lens = nullptr, *offsets = nullptr;
  const int32_t *q_ids = nullptr, *kv_ids = nullptr;  // [B, T], [B, S]
  long long left = -1, right = -1;
  float softcap = 0.0f;
  // [B|1, N|1, T|1, S] float32, element strides (0 along a broadcast dim).
  const float* bias = nullptr;
  long long bias_batch = 0, bias_head = 0, bias_row = 0;
  // [B|1, N|1, T|1, S] bool (1 = visible), strides as the bias's.
  const uint8_t* mask = nullptr;
  long long mask_batch = 0, mask_head = 0, mask_row = 0;
};

// Whether query i of batch b sees key j (reference.py's visibility, with the
// position offset moving the diagonal).
__host__ __device__ inline bool RefVisible(const RefFeatures& f, int b, int T, int S, bool causal, long long i,
                                           long long j, int h = 0) {
  const long long lq = f.q_lens ? std::min<long long>(std::max(f.q_lens[b], 0), T) : T;
  const long long lk = f.kv_lens ? std::min<long long>(std::max(f.kv_lens[b], 0), S) : S;
  const long long d = f.offsets ? f.offsets[b] : 0;
  if (i >= lq || j >= lk) return false;
  if (causal && j > i + d) return false;
  if (f.left >= 0 && j < i + d - f.left) return false;
  if (f.right >= 0 && j > i + d + f.right) return false;
  if (f.q_ids && f.q_ids[int64_t(b) * T + i] != f.kv_ids[int64_t(b) * S + j]) return false;
  if (f.mask && !f.mask[b * f.mask_batch + h * f.mask_head + i * f.mask_row + j]) return false;
  return true;
}

// One thread per (b, h, query row), two passes in float: logits scale * q.k,
// soft-capped (cap * tanh(x / cap)), -inf where not visible; rows with no
// visible key give zeros and lse -inf.
template <typename Element>
__global__ void ReferenceForwardFeatures(const Element* q, const Element* k, const Element* v, float* out,
                                         float* lse, int B, int T, int S, int N, int K, int H, float scale,
                                         bool causal, RefFeatures f) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(B) * N * T) return;
  const int i = int(idx % T), h = int(idx / T % N), b = int(idx / (int64_t(T) * N));
  const int hk = h / (N / K);
  const Element* qr = q + ((int64_t(b) * T + i) * N + h) * H;
  auto logit = [&](int j) {
    const Element* kr = k + ((int64_t(b) * S + j) * K + hk) * H;
    float dot = 0.0f;
    for (int d = 0; d < H; ++d) dot += ToFloat(qr[d]) * ToFloat(kr[d]);
    float x = dot * scale;
    if (f.softcap > 0.0f) x = f.softcap * tanhf(x / f.softcap);
    if (f.bias) x += f.bias[b * f.bias_batch + h * f.bias_head + i * f.bias_row + j];  // after the cap, as sm80
    return x;
  };
  float m = -INFINITY;
  for (int j = 0; j < S; ++j)
    if (RefVisible(f, b, T, S, causal, i, j, h)) m = fmaxf(m, logit(j));
  float acc[256];
  for (int d = 0; d < H; ++d) acc[d] = 0.0f;
  float l = 0.0f;
  if (m > -INFINITY)
    for (int j = 0; j < S; ++j) {
      if (!RefVisible(f, b, T, S, causal, i, j, h)) continue;
      const float p = expf(logit(j) - m);
      l += p;
      const Element* vr = v + ((int64_t(b) * S + j) * K + hk) * H;
      for (int d = 0; d < H; ++d) acc[d] += p * ToFloat(vr[d]);
    }
  float* o = out + ((int64_t(b) * T + i) * N + h) * H;
  for (int d = 0; d < H; ++d) o[d] = l > 0.0f ? acc[d] / l : 0.0f;
  lse[(int64_t(b) * N + h) * T + i] = l > 0.0f ? m + logf(l) : -INFINITY;
}

enum class Segments { kNone, kDocuments, kScattered, kDocumentsNoSummaries };

// One feature case. Documents: `docs` lengths, repeated along each row
// (ids 0, 1, ...; positions past their sum continue the pattern), the same
// layout for queries and keys; scattered: id (position / 100) % 3, so key
// blocks of other ids sit between a query block's own.
struct FeatureCase {
  std::string name;
  int B, T, S, N, K, H;
  bool causal;
  std::vector<int> q_lens, kv_lens, offsets;  // [B] each, empty: off
  long long left = -1, right = -1;
  Segments segments = Segments::kNone;
  std::vector<int> docs;
  double softcap = 0.0;
  bool timed = false;
  // A bias (kMasksBias) when >= 0, of the shape these bits give: kBiasBatch,
  // kBiasHeads, kBiasRows each a full dim (else broadcast, size 1); the keys
  // always full. kBiasInf: about 1 in 29 elements -inf (a bias as a mask).
  // kBias16: in the inputs' 16-bit type (kMasksBias16), else float32;
  // kBiasTiles with it: kMasksBiasTiles (the bias through shared memory),
  // which the case's bias must suit (sm90::BiasTilesServe).
  int bias = -1;
  // A boolean mask (kMasksBoolean) when >= 0, of the shape kMaskBatch,
  // kMaskHeads, kMaskRows give (as the bias's bits; keys always full), with
  // the values MaskValue spells out: kMaskPadding key padding (a visible
  // prefix per batch row and head; batch row 2 none), kMaskHole with keys
  // [S / 4, S / 4 + 200) hidden too (empty key blocks inside the range),
  // else random with probability 1/2 (1/8 hidden with kMaskDense), and with
  // kMaskRows rows i % 13 == 5 hidden whole.
  int mask = -1;
};
constexpr int kBiasBatch = 1, kBiasHeads = 2, kBiasRows = 4, kBiasInf = 8, kBias16 = 16, kBiasTiles = 32;
constexpr int kMaskBatch = 1, kMaskHeads = 2, kMaskRows = 4, kMaskPadding = 8, kMaskHole = 16, kMaskDense = 32;

// Element (b, h, i, j) of a case's mask (b, h, i 0 along broadcast dims).
inline uint8_t MaskValue(const FeatureCase& c, int b, int h, int i, int j) {
  if (c.mask & kMaskPadding) {
    // (Timed cases: exactly 7/8 of the keys visible in every row.)
    const int visible = c.timed ? c.S * 7 / 8 : b == 2 ? 0 : std::max(0, c.S * 7 / 8 - 97 * b - 31 * h);
    if (c.mask & kMaskHole && j >= c.S / 4 && j < c.S / 4 + 200) return 0;
    return j < visible;
  }
  if (c.mask & kMaskRows && !c.timed && i % 13 == 5) return 0;
  const uint64_t r = SplitMix(((uint64_t(b) * 131 + h) * 1000003 + uint64_t(i)) * 1000033 + uint64_t(j));
  return (c.mask & kMaskDense) ? (r >> 40) % 8 != 0 : (r >> 40) % 2 != 0;
}

// Bias values in [-2, 2) (a softmax-moving range), from the element index;
// kBiasInf: some -inf.
__global__ void FillBias(float* x, int64_t n, uint64_t seed, bool with_inf) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = SplitMix(seed * 0x100000001B3ull + uint64_t(i));
    x[i] = with_inf && (r >> 32) % 29 == 0 ? -INFINITY : float(r & 0xFFFFFF) / 4194304.0f - 2.0f;
  }
}
// The 16-bit copy of a float bias, and the float one rounded to it (so the
// reference reads the same values).
template <typename Element>
__global__ void RoundBias(float* x, Element* x16, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    x16[i] = FromFloat<Element>(x[i]);
    x[i] = ToFloat(x16[i]);
  }
}

inline std::vector<int32_t> SegmentIds(const FeatureCase& c, int len) {
  std::vector<int32_t> ids(int64_t(c.B) * len);
  for (int b = 0; b < c.B; ++b)
    for (int pos = 0; pos < len; ++pos) {
      int32_t id = 0;
      if (c.segments == Segments::kScattered) {
        id = (pos / 100) % 3;
      } else {
        int start = 0, doc = 0;
        while (start + c.docs[doc % c.docs.size()] <= pos) start += c.docs[doc % c.docs.size()], ++doc;
        id = doc;
      }
      ids[int64_t(b) * len + pos] = id;
    }
  return ids;
}

// The block summaries attention.py builds: per kSegmentBlock positions, (min, max).
inline std::vector<int32_t> SegmentRanges(const std::vector<int32_t>& ids, int B, int len) {
  const int64_t blocks = (len + jax_flash::kSegmentBlock - 1) / jax_flash::kSegmentBlock;
  std::vector<int32_t> r(2 * B * blocks);
  for (int b = 0; b < B; ++b)
    for (int64_t e = 0; e < blocks; ++e) {
      int32_t lo = INT32_MAX, hi = INT32_MIN;
      for (int64_t pos = e * jax_flash::kSegmentBlock; pos < std::min<int64_t>(len, (e + 1) * jax_flash::kSegmentBlock);
           ++pos)
        lo = std::min(lo, ids[b * len + pos]), hi = std::max(hi, ids[b * len + pos]);
      r[2 * (b * blocks + e)] = lo, r[2 * (b * blocks + e) + 1] = hi;
    }
  return r;
}

template <typename T>
T* Upload(const std::vector<T>& host) {
  if (host.empty()) return nullptr;
  T* dev;
  CHECK_CUDA(cudaMalloc(&dev, host.size() * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return dev;
}

// Feature-table timings (TFLOP/s over the visible pairs: 4 H per pair).
struct FeatureTiming {
  std::string shape;
  double sm90 = 0, sm90_plain = 0, sm80 = 0;
};
inline std::vector<FeatureTiming> feature_timings;

// The launches a case runs: the full persistent grid and 7 blocks (several
// tiles per block, empty ones among them), and for causal cases the
// sectioned order with sections of 1 and 3 pairs (many sections, a partial
// last one).
struct FeatureRun {
  int max_blocks;
  sm90::CausalOrder order;
  int section_pairs;
  const char* what;
  bool bias16 = false;      // p.features.bias holds Element values (kMasksBias16)
  bool bias_tiles = false;  // and kMasksBiasTiles reads them
};

template <typename Element, int kHeadDim>
std::string LaunchFeatures(const AttentionParams& p, const FeatureRun& run) {
  constexpr sm90::Schedule kSchedule = sm90::FwdTraits<kHeadDim>::kDefaultSchedule;
  if (p.features.mask) {
    // kMasksBoolean at 64 and 128 only (pending/sm90-fwd-mask.patch's dispatch).
    if constexpr (kHeadDim <= 128)
      return sm90::LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, sm90::Features::kMasksBoolean>(
          p, 0, run.max_blocks, run.order, run.section_pairs);
    return "no kMasksBoolean variant at head dim 256";
  }
  if (p.features.bias) {
    // kMasksBias at 64 and 128 only (pending/sm90-fwd-bias.patch's dispatch).
    if constexpr (kHeadDim <= 128) {
      if (run.bias_tiles) {
        if (!sm90::BiasTilesServe(p)) return "the case's bias does not suit kMasksBiasTiles (BiasTilesServe)";
        return sm90::LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, sm90::Features::kMasksBiasTiles>(
            p, 0, run.max_blocks, run.order, run.section_pairs);
      }
      if (run.bias16)
        return sm90::LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, sm90::Features::kMasksBias16>(
            p, 0, run.max_blocks, run.order, run.section_pairs);
      return sm90::LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, sm90::Features::kMasksBias>(
          p, 0, run.max_blocks, run.order, run.section_pairs);
    }
    return "no kMasksBias variant at head dim 256";
  }
  if (p.features.softcap > 0.0) {
    // kMasksSoftcap at 64 and 128 only: it reads a boolean mask beside the
    // soft cap (ReadsMaskArray), whose loads take 128-key blocks (256's
    // are 80: their static_asserts refuse the instantiation).
    if constexpr (kHeadDim <= 128)
      return sm90::LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, sm90::Features::kMasksSoftcap>(
          p, 0, run.max_blocks, run.order, run.section_pairs);
    return "no kMasksSoftcap variant at head dim 256";
  }
  return sm90::LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, sm90::Features::kMasks>(
      p, 0, run.max_blocks, run.order, run.section_pairs);
}

template <typename Element, int kHeadDim>
bool RunFeatureCase(const FeatureCase& c) {
  const int64_t q_elems = int64_t(c.B) * c.T * c.N * c.H, kv_elems = int64_t(c.B) * c.S * c.K * c.H;
  const int64_t lse_elems = int64_t(c.B) * c.N * c.T;
  Element *q, *k, *v, *out;
  float *ref_out, *ref_lse, *lse;
  CHECK_CUDA(cudaMalloc(&q, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&k, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&v, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&out, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&lse, lse_elems * 4));
  CHECK_CUDA(cudaMalloc(&ref_out, q_elems * 4));
  CHECK_CUDA(cudaMalloc(&ref_lse, lse_elems * 4));
  FillNormal<<<1024, 256>>>(q, q_elems, 11);
  FillNormal<<<1024, 256>>>(k, kv_elems, 12);
  FillNormal<<<1024, 256>>>(v, kv_elems, 13);
  CHECK_CUDA(cudaGetLastError());

  std::vector<int32_t> q_ids, kv_ids, q_ranges, kv_ranges;
  if (c.segments != Segments::kNone) {
    q_ids = SegmentIds(c, c.T);
    kv_ids = SegmentIds(c, c.S);
    if (c.segments != Segments::kDocumentsNoSummaries) {
      q_ranges = SegmentRanges(q_ids, c.B, c.T);
      kv_ranges = SegmentRanges(kv_ids, c.B, c.S);
    }
  }
  int32_t* d_q_lens = Upload(std::vector<int32_t>(c.q_lens.begin(), c.q_lens.end()));
  int32_t* d_kv_lens = Upload(std::vector<int32_t>(c.kv_lens.begin(), c.kv_lens.end()));
  int32_t* d_offsets = Upload(std::vector<int32_t>(c.offsets.begin(), c.offsets.end()));
  int32_t* d_q_ids = Upload(q_ids);
  int32_t* d_kv_ids = Upload(kv_ids);
  int32_t* d_q_ranges = Upload(q_ranges);
  int32_t* d_kv_ranges = Upload(kv_ranges);
  float* d_bias = nullptr;
  Element* d_bias16 = nullptr;
  const int64_t bias_b = c.bias >= 0 && (c.bias & kBiasBatch) ? c.B : 1,
                bias_n = c.bias >= 0 && (c.bias & kBiasHeads) ? c.N : 1,
                bias_t = c.bias >= 0 && (c.bias & kBiasRows) ? c.T : 1;
  if (c.bias >= 0) {
    const int64_t n = bias_b * bias_n * bias_t * c.S;
    CHECK_CUDA(cudaMalloc(&d_bias, n * 4));
    FillBias<<<1024, 256>>>(d_bias, n, 14, (c.bias & kBiasInf) != 0);
    if (c.bias & kBias16) {
      CHECK_CUDA(cudaMalloc(&d_bias16, n * 2));
      RoundBias<<<1024, 256>>>(d_bias, d_bias16, n);
    }
    CHECK_CUDA(cudaGetLastError());
  }
  const int64_t mask_b = c.mask >= 0 && (c.mask & kMaskBatch) ? c.B : 1,
                mask_n = c.mask >= 0 && (c.mask & kMaskHeads) ? c.N : 1,
                mask_t = c.mask >= 0 && (c.mask & kMaskRows) ? c.T : 1;
  std::vector<uint8_t> h_mask;
  if (c.mask >= 0) {
    h_mask.resize(mask_b * mask_n * mask_t * c.S);
    for (int64_t bb = 0; bb < mask_b; ++bb)
      for (int64_t nn = 0; nn < mask_n; ++nn)
        for (int64_t i = 0; i < mask_t; ++i)
          for (int j = 0; j < c.S; ++j)
            h_mask[((bb * mask_n + nn) * mask_t + i) * c.S + j] = MaskValue(c, int(bb), int(nn), int(i), j);
  }
  uint8_t* d_mask = Upload(h_mask);

  AttentionParams p;
  p.shape = {c.B, c.T, c.S, c.N, c.K, c.H};
  p.q_stride = ContiguousBtnh(c.T, c.N, c.H);
  p.k_stride = ContiguousBtnh(c.S, c.K, c.H);
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
  p.scale = 1.0 / std::sqrt(double(c.H));
  p.is_causal = c.causal;
  p.features.q_seqlens = d_q_lens;
  p.features.kv_seqlens = d_kv_lens;
  p.features.position_offsets = d_offsets;
  p.features.q_segment_ids = d_q_ids;
  p.features.kv_segment_ids = d_kv_ids;
  p.features.q_segment_ranges = d_q_ranges;
  p.features.kv_segment_ranges = d_kv_ranges;
  p.features.window_left = c.left;
  p.features.window_right = c.right;
  p.features.softcap = c.softcap;
  if (d_bias) {
    // Contiguous [bias_b, bias_n, bias_t, S]; stride 0 along the size-1 dims
    // (attention.py's broadcast operands). One batch dim of size B.
    p.features.bias = d_bias16 ? static_cast<const void*>(d_bias16) : d_bias;
    // As DecodeFeatures types it (kMasksBias16 refuses a bias typed float32).
    p.features.bias_type = !d_bias16                                  ? jax_flash::BiasType::kAccum
                           : std::is_same_v<Element, __nv_bfloat16> ? jax_flash::BiasType::kBFloat16
                                                                    : jax_flash::BiasType::kFloat16;
    p.features.num_batch_dims = 1;
    p.features.batch_dims[0] = c.B;
    p.features.bias_stride.col = 1;
    p.features.bias_stride.row = bias_t > 1 ? c.S : 0;
    p.features.bias_stride.head = bias_n > 1 ? bias_t * c.S : 0;
    p.features.bias_stride.batch[0] = bias_b > 1 ? bias_n * bias_t * c.S : 0;
  }
  if (d_mask) {
    // Contiguous [mask_b, mask_n, mask_t, S], stride 0 along the size-1 dims.
    p.features.mask = d_mask;
    p.features.num_batch_dims = 1;
    p.features.batch_dims[0] = c.B;
    p.features.mask_stride.col = 1;
    p.features.mask_stride.row = mask_t > 1 ? c.S : 0;
    p.features.mask_stride.head = mask_n > 1 ? mask_t * c.S : 0;
    p.features.mask_stride.batch[0] = mask_b > 1 ? mask_n * mask_t * c.S : 0;
  }

  RefFeatures rf;
  rf.q_lens = d_q_lens, rf.kv_lens = d_kv_lens, rf.offsets = d_offsets, rf.q_ids = d_q_ids, rf.kv_ids = d_kv_ids;
  rf.left = c.left, rf.right = c.right, rf.softcap = float(c.softcap);
  rf.bias = d_bias;
  rf.bias_batch = p.features.bias_stride.batch[0], rf.bias_head = p.features.bias_stride.head;
  rf.bias_row = p.features.bias_stride.row;
  rf.mask = d_mask;
  rf.mask_batch = p.features.mask_stride.batch[0], rf.mask_head = p.features.mask_stride.head;
  rf.mask_row = p.features.mask_stride.row;
  ReferenceForwardFeatures<Element><<<unsigned((lse_elems + 127) / 128), 128>>>(
      q, k, v, ref_out, ref_lse, c.B, c.T, c.S, c.N, c.K, c.H, float(p.scale), c.causal, rf);
  CHECK_CUDA(cudaGetLastError());
  if (SynchronizeOrDie("the feature reference", 120.0) != cudaSuccess) std::exit(3);
  std::vector<Element> h_out(q_elems);
  std::vector<float> h_ref(q_elems), h_lse(lse_elems), h_ref_lse(lse_elems);
  CHECK_CUDA(cudaMemcpy(h_ref.data(), ref_out, q_elems * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(h_ref_lse.data(), ref_lse, lse_elems * 4, cudaMemcpyDeviceToHost));

  std::vector<FeatureRun> runs = {{0, sm90::CausalOrder::kDefault, 0, "full grid"},
                                  {7, sm90::CausalOrder::kDefault, 0, "on 7 blocks"}};
  if (c.causal && !c.timed)
    runs.insert(runs.end(), {{7, sm90::CausalOrder::kSections, 1, "on 7 blocks, sections of 1 pair"},
                             {0, sm90::CausalOrder::kSections, 3, "full grid, sections of 3 pairs"}});
  if (c.timed) runs.resize(1);
  for (FeatureRun& run : runs) run.bias16 = d_bias16 != nullptr, run.bias_tiles = c.bias >= 0 && (c.bias & kBiasTiles);
  bool all_ok = true;
  for (const FeatureRun& run : runs) {
    char name[320];
    std::snprintf(name, sizeof name, "%s H=%d (kHeadDim %d) B=%d T=%d S=%d N=%d K=%d causal=%d %s, %s",
                  TypeName<Element>(), c.H, kHeadDim, c.B, c.T, c.S, c.N, c.K, int(c.causal), c.name.c_str(),
                  run.what);
    Poison<<<1024, 256>>>(reinterpret_cast<uint16_t*>(out), q_elems);
    Poison<<<1024, 256>>>(reinterpret_cast<uint16_t*>(lse), lse_elems * 2);
    CHECK_CUDA(cudaGetLastError());
    const std::string err = LaunchFeatures<Element, kHeadDim>(p, run);
    const cudaError_t sync = SynchronizeOrDie(name);
    if (!err.empty() || sync != cudaSuccess) {
      std::printf("%s: FAIL (%s%s)\n", name, err.c_str(), sync != cudaSuccess ? cudaGetErrorString(sync) : "");
      std::fflush(stdout);
      if (sync != cudaSuccess) std::exit(3);  // the context is gone
      all_ok = false;
      continue;
    }
    CHECK_CUDA(cudaMemcpy(h_out.data(), out, q_elems * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(h_lse.data(), lse, lse_elems * 4, cudaMemcpyDeviceToHost));
    // The plain cases' tolerances (sm90_fwd_check.cu); the soft cap's tanh
    // (TanhApprox for bfloat16, 2^-11 relative) stays far inside them.
    const double atol = std::is_same_v<Element, __nv_bfloat16> ? 2e-2 : 4e-3;
    int64_t bad = 0, first_bad = -1, bad_lse = 0, first_bad_lse = -1;
    double max_ratio = 0, lse_ratio = 0;
    for (int64_t i = 0; i < q_elems; ++i) {
      const double got = ToFloat(h_out[i]), want = h_ref[i], e = std::fabs(got - want);
      const double tol = atol * std::max(1.0, std::fabs(want));
      if (!(e <= tol)) {  // NaN (unwritten) fails too
        if (first_bad < 0) first_bad = i;
        ++bad;
      }
      max_ratio = std::isfinite(e) ? std::max(max_ratio, e / tol) : INFINITY;
    }
    for (int64_t i = 0; i < lse_elems; ++i) {
      const double got = h_lse[i], want = h_ref_lse[i];
      const double e = (got == want) ? 0.0 : std::fabs(got - want);  // both -inf: equal
      const double tol = 1e-3 * std::max(1.0, std::fabs(want));
      if (!(e <= tol)) {
        if (first_bad_lse < 0) first_bad_lse = i;
        ++bad_lse;
      }
      lse_ratio = std::isfinite(e) ? std::max(lse_ratio, e / tol) : INFINITY;
    }
    const bool ok = bad == 0 && bad_lse == 0;
    all_ok &= ok;
    std::printf("%s: out %.2f of tol, lse %.2f of tol: %s\n", name, max_ratio, lse_ratio, ok ? "PASS" : "FAIL");
    if (bad) {
      const int64_t i = first_bad, d = i % c.H, h = i / c.H % c.N, t = i / (int64_t(c.H) * c.N) % c.T,
                    b = i / (int64_t(c.H) * c.N * c.T);
      std::printf("  %lld bad out elements; first at b=%lld t=%lld h=%lld d=%lld: got %g want %g\n", (long long)bad,
                  (long long)b, (long long)t, (long long)h, (long long)d, double(ToFloat(h_out[i])),
                  double(h_ref[i]));
    }
    if (bad_lse) {
      const int64_t i = first_bad_lse;
      std::printf("  %lld bad lse; first at b=%lld h=%lld t=%lld: got %g want %g\n", (long long)bad_lse,
                  (long long)(i / (int64_t(c.N) * c.T)), (long long)(i / c.T % c.N), (long long)(i % c.T),
                  double(h_lse[i]), double(h_ref_lse[i]));
    }
    std::fflush(stdout);
  }

  if (all_ok && c.timed) {
    // Visible pairs, on the host from the same definition.
    RefFeatures hf;
    std::vector<int32_t> hq(c.q_lens.begin(), c.q_lens.end()), hk(c.kv_lens.begin(), c.kv_lens.end()),
        ho(c.offsets.begin(), c.offsets.end());
    hf.q_lens = hq.empty() ? nullptr : hq.data();
    hf.kv_lens = hk.empty() ? nullptr : hk.data();
    hf.offsets = ho.empty() ? nullptr : ho.data();
    hf.q_ids = q_ids.empty() ? nullptr : q_ids.data();
    hf.kv_ids = kv_ids.empty() ? nullptr : kv_ids.data();
    hf.left = c.left, hf.right = c.right;
    hf.mask = h_mask.empty() ? nullptr : h_mask.data();
    hf.mask_batch = rf.mask_batch, hf.mask_head = rf.mask_head, hf.mask_row = rf.mask_row;
    // Pairs of every head (counted per head only where the mask has heads).
    const int heads = c.mask >= 0 && (c.mask & kMaskHeads) ? c.N : 1;
    double pairs = 0;
    for (int h = 0; h < heads; ++h)
      for (int b = 0; b < c.B; ++b)
        for (int i = 0; i < c.T; ++i)
          for (int j = 0; j < c.S; ++j) pairs += RefVisible(hf, b, c.T, c.S, c.causal, i, j, h);
    pairs *= double(c.N) / heads;
    const double flops = 4.0 * c.H * pairs;
    FeatureTiming row;
    row.shape = std::string(TypeName<Element>()) + " " + c.name;
    const float ms = TimeLaunches([&] { return LaunchFeatures<Element, kHeadDim>(p, runs[0]); });
    if (ms > 0) row.sm90 = flops / (ms * 1e-3) / 1e12;
    // The plain kernel on the same shape and causality (no features):
    // TFLOP/s over its own (all, or causal) pairs.
    AttentionParams plain = p;
    plain.features = jax_flash::AttentionFeatures{};
    const double plain_flops = 4.0 * c.B * c.N * double(c.T) * c.S * c.H / (c.causal ? 2.0 : 1.0);
    const float ms_plain = TimeLaunches([&] { return sm90::LaunchForward<Element, kHeadDim>(plain, 0); });
    if (ms_plain > 0) row.sm90_plain = plain_flops / (ms_plain * 1e-3) / 1e12;
#ifdef JAX_FLASH_CHECK_SM80
    AttentionParams p80 = p;  // sm80 reads a float32 bias: the rounded float copy of a 16-bit one
    if (d_bias16) p80.features.bias = d_bias, p80.features.bias_type = jax_flash::BiasType::kAccum;
    const float ms80 = TimeLaunches([&] { return jax_flash::cuda::sm80::LaunchForward<Element, kHeadDim>(p80, 0); });
    if (ms80 > 0) row.sm80 = flops / (ms80 * 1e-3) / 1e12;
#endif
    std::printf("  time sm90 features: %.3f ms (%.0f visible pairs per head), %.1f TFLOP/s; plain %.1f; sm80 %.1f\n",
                ms, pairs / (double(c.B) * c.N), row.sm90, row.sm90_plain, row.sm80);
    feature_timings.push_back(row);
  }

  for (void* ptr : std::initializer_list<void*>{q, k, v, out, lse, ref_out, ref_lse, d_q_lens, d_kv_lens, d_offsets,
                                                d_q_ids, d_kv_ids, d_q_ranges, d_kv_ranges, d_bias, d_bias16,
                                                d_mask})
    if (ptr) cudaFree(ptr);
  return all_ok;
}

template <typename Element>
bool RunFeatureCaseAnyHead(const FeatureCase& c) {
  if (c.H <= 64) return RunFeatureCase<Element, 64>(c);
  if (c.H <= 128) return RunFeatureCase<Element, 128>(c);
  return RunFeatureCase<Element, 256>(c);
}

// The bias cases (kMasksBias, H = 64 and 128): every broadcast shape, tails
// (T, S not multiples of 128), causal or not, GQA, Tq != Tk, -inf elements,
// with the masks' features beside it; then, unless quick, its timing rows
// (bf16, B=4, T=S=4096, N=16, H=128, beside the plain kernel and sm80).
inline std::vector<FeatureCase> BiasCases(bool quick) {
  std::vector<FeatureCase> cases;
  const int kFull = kBiasBatch | kBiasHeads | kBiasRows;
  auto add = [&](std::string name, int B, int T, int S, int N, int K, int H, bool causal, int bias,
                 std::vector<int> kv_lens = {}, long long left = -1, long long right = -1,
                 Segments segments = Segments::kNone, std::vector<int> docs = {}, bool timed = false) {
    cases.push_back({name, B, T, S, N, K, H, causal, {}, kv_lens, {}, left, right, segments, docs, 0.0, timed, bias});
  };
  for (int H : {64, 128}) {
    add("bias [B,N,T,S]", 2, 300, 1000, 4, 2, H, false, kFull);
    add("bias [B,N,T,S], causal", 2, 1000, 1000, 4, 2, H, true, kFull);
    add("bias [1,N,T,S], causal, T < S", 2, 200, 777, 4, 4, H, true, kBiasHeads | kBiasRows);
    add("bias [B,1,T,S] with -inf", 2, 555, 333, 2, 1, H, false, kBiasBatch | kBiasRows | kBiasInf);
    add("bias [B,1,1,S] with -inf (a key mask), causal", 3, 400, 400, 2, 2, H, true, kBiasBatch | kBiasInf);
    add("bias [1,1,T,S]", 1, 129, 1025, 2, 1, H, false, kBiasRows);
    add("bias [1,1,1,S], one query", 2, 1, 300, 2, 1, H, false, 0);
    add("bias [B,N,T,S], kv lengths 900/450, causal", 2, 600, 900, 4, 2, H, true, kFull, {900, 450});
    add("bias [1,N,T,S], window (100, 37), documents 300/200/500", 2, 1000, 1000, 2, 2, H, false,
        kBiasHeads | kBiasRows, {}, 100, 37, Segments::kDocuments, {300, 200, 500});
    add("16-bit bias [B,N,T,S], causal", 2, 1000, 1000, 4, 2, H, true, kFull | kBias16);
    add("16-bit bias [B,1,1,S] with -inf, kv lengths 300/77", 2, 300, 300, 2, 1, H, false,
        kBiasBatch | kBiasInf | kBias16, {300, 77});
    // S odd: BiasRows's element loads (the even-S cases above take its pair loads).
    add("16-bit bias [1,N,T,S] with -inf, S odd (element loads), T < S", 2, 129, 1025, 2, 1, H, false,
        kBiasHeads | kBiasRows | kBiasInf | kBias16);
    // kMasksBiasTiles (S a multiple of 8: rows in whole 16 bytes): every
    // broadcast its map takes (batch, heads; queries broadcast is
    // kMasksBias16's), tails of rows and keys, GQA, the masks beside it.
    const int kTiles = kBias16 | kBiasTiles;
    add("bias tiles [B,N,T,S], causal", 2, 1000, 1000, 4, 2, H, true, kFull | kTiles);
    add("bias tiles [B,N,T,S], T != S", 2, 300, 1000, 4, 2, H, false, kFull | kTiles);
    add("bias tiles [1,N,T,S] with -inf, causal, T < S", 2, 200, 776, 4, 4, H, true,
        kBiasHeads | kBiasRows | kBiasInf | kTiles);
    add("bias tiles [B,1,T,S], T > S", 2, 555, 336, 2, 1, H, false, kBiasBatch | kBiasRows | kTiles);
    add("bias tiles [1,1,T,S], one row of tiles", 1, 129, 1032, 2, 1, H, false, kBiasRows | kTiles);
    add("bias tiles [B,N,T,S], kv lengths 900/450, causal", 2, 600, 904, 4, 2, H, true, kFull | kTiles, {900, 450});
    add("bias tiles [1,N,T,S], window (100, 37), documents 300/200/500", 2, 1000, 1000, 2, 2, H, false,
        kBiasHeads | kBiasRows | kTiles, {}, 100, 37, Segments::kDocuments, {300, 200, 500});
  }
  if (!quick) {
    add("T=4096 bias [B,N,T,S]", 4, 4096, 4096, 16, 16, 128, false, kFull, {}, -1, -1, Segments::kNone, {}, true);
    add("T=4096 bias [1,N,T,S]", 4, 4096, 4096, 16, 16, 128, false, kBiasHeads | kBiasRows, {}, -1, -1,
        Segments::kNone, {}, true);
    add("T=4096 bias [1,1,T,S]", 4, 4096, 4096, 16, 16, 128, false, kBiasRows, {}, -1, -1, Segments::kNone, {},
        true);
    add("T=4096 bias [B,N,T,S], causal", 4, 4096, 4096, 16, 16, 128, true, kFull, {}, -1, -1, Segments::kNone, {},
        true);
    add("T=4096 16-bit bias [B,N,T,S]", 4, 4096, 4096, 16, 16, 128, false, kFull | kBias16, {}, -1, -1,
        Segments::kNone, {}, true);
    add("T=4096 16-bit bias [B,N,T,S], causal", 4, 4096, 4096, 16, 16, 128, true, kFull | kBias16, {}, -1, -1,
        Segments::kNone, {}, true);
    add("T=4096 bias tiles [B,N,T,S]", 4, 4096, 4096, 16, 16, 128, false, kFull | kBias16 | kBiasTiles, {}, -1,
        -1, Segments::kNone, {}, true);
    add("T=4096 bias tiles [1,N,T,S]", 4, 4096, 4096, 16, 16, 128, false, kBiasHeads | kBiasRows | kBias16 |
        kBiasTiles, {}, -1, -1, Segments::kNone, {}, true);
    add("T=4096 bias tiles [B,N,T,S], causal", 4, 4096, 4096, 16, 16, 128, true, kFull | kBias16 | kBiasTiles, {},
        -1, -1, Segments::kNone, {}, true);
    add("T=4096 H=64 bias tiles [1,N,T,S]", 4, 4096, 4096, 32, 32, 64, false, kBiasHeads | kBiasRows | kBias16 |
        kBiasTiles, {}, -1, -1, Segments::kNone, {}, true);
    add("T=4096 H=64 16-bit bias [1,N,T,S]", 4, 4096, 4096, 32, 32, 64, false, kBiasHeads | kBiasRows | kBias16, {},
        -1, -1, Segments::kNone, {}, true);
  }
  return cases;
}

// The boolean mask cases (kMasksBoolean, H = 64 and 128): key padding
// ([B,1,1,S], [B,N,1,S]: the key-only vote, trimmed ends, a hidden block
// inside the range, a batch row with nothing visible), per-query masks
// ([1,1,T,S], [B,N,T,S], random, rows hidden whole; S odd for the byte
// loads), with causal, key lengths, windows and segment ids beside them,
// tails, GQA, T != S; then, unless quick, the timing rows (bf16, B=4,
// T=S=4096, N=16, H=128: key padding 87.5% visible, random [1,1,T,S] 50%).
inline std::vector<FeatureCase> MaskCases(bool quick) {
  std::vector<FeatureCase> cases;
  const int kFull = kMaskBatch | kMaskHeads | kMaskRows;
  auto add = [&](std::string name, int B, int T, int S, int N, int K, int H, bool causal, int mask,
                 std::vector<int> kv_lens = {}, long long left = -1, long long right = -1,
                 Segments segments = Segments::kNone, std::vector<int> docs = {}, bool timed = false) {
    cases.push_back(
        {name, B, T, S, N, K, H, causal, {}, kv_lens, {}, left, right, segments, docs, 0.0, timed, -1, mask});
  };
  for (int H : {64, 128}) {
    add("mask [B,1,1,S] key padding", 3, 300, 1000, 4, 2, H, false, kMaskBatch | kMaskPadding);
    add("mask [B,N,1,S] key padding with a hole, causal", 3, 1000, 1000, 2, 1, H, true,
        kMaskBatch | kMaskHeads | kMaskPadding | kMaskHole);
    add("mask [1,1,1,S] key padding, one query", 3, 1, 300, 2, 1, H, false, kMaskPadding);
    add("mask [B,1,1,S] key padding, scattered ids", 3, 777, 777, 2, 2, H, false, kMaskBatch | kMaskPadding, {}, -1,
        -1, Segments::kScattered);
    add("mask [1,1,T,S] random", 2, 555, 333, 2, 1, H, false, kMaskRows);
    add("mask [B,N,T,S] random, hidden rows, causal", 2, 1000, 1000, 4, 2, H, true, kFull);
    add("mask [1,N,T,S] dense, causal, T < S", 2, 200, 777, 4, 4, H, true, kMaskHeads | kMaskRows | kMaskDense);
    add("mask [B,1,T,S], kv lengths 900/450, causal", 2, 600, 900, 4, 2, H, true, kMaskBatch | kMaskRows, {900, 450});
    add("mask [1,1,T,S], S odd (byte loads)", 1, 129, 1025, 2, 1, H, false, kMaskRows | kMaskDense);
    add("mask [1,N,T,S] dense, window (100, 37), documents 300/200/500", 2, 1000, 1000, 2, 2, H, false,
        kMaskHeads | kMaskRows | kMaskDense, {}, 100, 37, Segments::kDocuments, {300, 200, 500});
  }
  if (!quick) {
    add("T=4096 mask [B,1,1,S] key padding 87.5%", 4, 4096, 4096, 16, 16, 128, false, kMaskBatch | kMaskPadding, {},
        -1, -1, Segments::kNone, {}, true);
    add("T=4096 mask [B,1,1,S] key padding 87.5%, causal", 4, 4096, 4096, 16, 16, 128, true,
        kMaskBatch | kMaskPadding, {}, -1, -1, Segments::kNone, {}, true);
    add("T=4096 mask [1,1,T,S] random 50%", 4, 4096, 4096, 16, 16, 128, false, kMaskRows, {}, -1, -1,
        Segments::kNone, {}, true);
    add("T=4096 mask [1,1,T,S] random 87.5%", 4, 4096, 4096, 16, 16, 128, false, kMaskRows | kMaskDense, {}, -1, -1,
        Segments::kNone, {}, true);
  }
  return cases;
}

// The correctness cases (at every head dim) and, unless quick, the issue-19
// feature table (bf16, B=4, T=S=4096, N=16, H=128); then the bias cases.
inline std::vector<FeatureCase> FeatureCases(bool quick) {
  std::vector<FeatureCase> cases;
  for (int H : {64, 128, 256}) {
    // Key lengths (one of them 0: rows with nothing visible), GQA.
    cases.push_back({"kv lengths 1000/37/0/513", 4, 300, 1000, 4, 2, H, false, {}, {1000, 37, 0, 513}});
    // Query and key lengths, causal, Tq < Tk.
    cases.push_back({"q lengths 300/129, kv lengths 1000/200", 2, 300, 1000, 2, 1, H, true, {300, 129}, {1000, 200}});
    cases.push_back({"window (64, 0)", 2, 1000, 1000, 4, 2, H, true, {}, {}, {}, 64, 0});
    cases.push_back({"window (100, 37)", 1, 700, 900, 2, 2, H, false, {}, {}, {}, 100, 37});
    // Offsets: a shard of a longer sequence (200), and one before the keys
    // (-50: its first rows see nothing).
    cases.push_back({"offsets 200/-50", 2, 300, 600, 2, 1, H, true, {}, {}, {200, -50}});
    cases.push_back({"offsets 500/0, window (128, 0)", 2, 256, 1000, 2, 2, H, true, {}, {}, {500, 0}, 128, 0});
    cases.push_back({"packed documents 300/200/500", 2, 1000, 1000, 4, 2, H, true, {}, {}, {}, -1, -1,
                     Segments::kDocuments, {300, 200, 500}});
    cases.push_back({"packed documents 77/1000, non-causal", 2, 1000, 1000, 2, 1, H, false, {}, {}, {}, -1, -1,
                     Segments::kDocuments, {77, 1000}});
    cases.push_back({"scattered ids (pos / 100) % 3", 1, 777, 777, 2, 2, H, false, {}, {}, {}, -1, -1,
                     Segments::kScattered, {}});
    cases.push_back({"documents 300/200/500 without summaries", 1, 1000, 1000, 2, 1, H, true, {}, {}, {}, -1, -1,
                     Segments::kDocumentsNoSummaries, {300, 200, 500}});
    // The soft cap at 64 and 128 (kMasksSoftcap: none at 256, LaunchFeatures).
    if (H <= 128) {
      cases.push_back({"soft cap 30", 2, 1000, 1000, 2, 2, H, false, {}, {}, {}, -1, -1, Segments::kNone, {}, 30.0});
      // Everything at once, and a strong cap.
      cases.push_back({"soft cap 5, kv lengths, documents, offsets, window (300, 0)", 2, 600, 900, 4, 2, H, true,
                       {}, {900, 450}, {100, 0}, 300, 0, Segments::kDocuments, {250, 400}, 5.0});
    }
    // One query row (decode-like), key lengths.
    cases.push_back({"one query, kv lengths 77/0/300", 3, 1, 300, 2, 1, H, false, {}, {77, 0, 300}});
  }
  if (!quick) {
    // The issue-19 feature table: bf16, B=4, T=S=4096, N=16, H=128.
    cases.push_back({"T=4096 packed 4 documents, causal", 4, 4096, 4096, 16, 16, 128, true, {}, {}, {}, -1, -1,
                     Segments::kDocuments, {1024}, 0.0, true});
    cases.push_back({"T=4096 window (512, 0), causal", 4, 4096, 4096, 16, 16, 128, true, {}, {}, {}, 512, 0,
                     Segments::kNone, {}, 0.0, true});
    cases.push_back({"T=4096 kv lengths 62.5% (2560)", 4, 4096, 4096, 16, 16, 128, false, {},
                     {2560, 2560, 2560, 2560}, {}, -1, -1, Segments::kNone, {}, 0.0, true});
    cases.push_back({"T=4096 kv lengths 4096/3072/2048/1024 (62.5%)", 4, 4096, 4096, 16, 16, 128, false, {},
                     {4096, 3072, 2048, 1024}, {}, -1, -1, Segments::kNone, {}, 0.0, true});
    cases.push_back({"T=4096 kv lengths 62.5% (2560), causal", 4, 4096, 4096, 16, 16, 128, true, {},
                     {2560, 2560, 2560, 2560}, {}, -1, -1, Segments::kNone, {}, 0.0, true});
    cases.push_back({"T=4096 soft cap 30", 4, 4096, 4096, 16, 16, 128, false, {}, {}, {}, -1, -1, Segments::kNone,
                     {}, 30.0, true});
  }
  for (FeatureCase& c : BiasCases(quick)) cases.push_back(c);
  for (FeatureCase& c : MaskCases(quick)) cases.push_back(c);
  return cases;
}

// The launches refuse what this version leaves to the sm80 forward with a
// message naming the kernel, instead of launching: in the product's feature
// launcher (which routes a bias to kMasksBias) and in kMasksBias itself, a
// bias with the soft cap or one not contiguous along the keys (broadcast
// there: stride 0).
template <typename Element>
bool RejectsBias() {
  AttentionParams p;
  p.shape = {1, 128, 128, 2, 2, 128};
  p.q_stride = p.k_stride = ContiguousBtnh(128, 2, 128);
  float dummy = 0;
  p.features.bias = &dummy;
  p.scale = 0.1;
  auto refused = [&](const char* what, const std::string& err) {
    std::printf("%s (%s): %s\n", what, TypeName<Element>(), err.empty() ? "launched: FAIL" : err.c_str());
    return !err.empty();
  };
  p.features.bias_stride.col = 1;
  p.features.softcap = 30.0;
  bool ok = refused("bias with the soft cap", sm90::LaunchForwardWithFeatures<Element, 128>(p, 0));
  p.features.softcap = 0.0;
  constexpr sm90::Schedule kSchedule = sm90::FwdTraits<128>::kDefaultSchedule;
  auto bias_variant = [&] {
    return sm90::LaunchForwardScheduled<Element, 128, kSchedule, 0, sm90::Features::kMasksBias>(p, 0);
  };
  p.features.softcap = 30.0;
  ok &= refused("kMasksBias: bias with the soft cap", bias_variant());
  p.features.softcap = 0.0;
  p.features.bias_stride.col = 0;
  ok &= refused("kMasksBias: bias broadcast along the keys", bias_variant());
  return ok;
}

// kMasksBoolean refuses a mask with the soft cap, one broadcast along the
// keys (stride 0 there) and a call without a mask, with a message naming the
// kernel; the product's feature launcher refuses a mask with a bias. (A mask
// with the soft cap is no longer refused there: kMasksSoftcap serves it.)
template <typename Element>
bool RejectsMask() {
  AttentionParams p;
  p.shape = {1, 128, 128, 2, 2, 128};
  p.q_stride = p.k_stride = ContiguousBtnh(128, 2, 128);
  uint8_t dummy = 1;
  p.features.mask = &dummy;
  p.features.mask_stride.col = 1;
  p.scale = 0.1;
  auto refused = [&](const char* what, const std::string& err) {
    std::printf("%s (%s): %s\n", what, TypeName<Element>(), err.empty() ? "launched: FAIL" : err.c_str());
    return !err.empty();
  };
  constexpr sm90::Schedule kSchedule = sm90::FwdTraits<128>::kDefaultSchedule;
  auto mask_variant = [&] {
    return sm90::LaunchForwardScheduled<Element, 128, kSchedule, 0, sm90::Features::kMasksBoolean>(p, 0);
  };
  p.features.softcap = 30.0;
  bool ok = refused("kMasksBoolean: mask with the soft cap", mask_variant());
  p.features.softcap = 0.0;
  // A mask and a bias together: neither variant takes both (the product
  // routes a bias to kMasksBias, which refuses the mask).
  const float bias_dummy = 0.0f;
  p.features.bias = &bias_dummy;
  p.features.bias_stride.col = 1;
  ok &= refused("mask with a bias", sm90::LaunchForwardWithFeatures<Element, 128>(p, 0));
  ok &= refused("kMasksBoolean: mask with a bias", mask_variant());
  p.features.bias = nullptr;
  p.features.mask_stride.col = 0;
  ok &= refused("kMasksBoolean: mask broadcast along the keys", mask_variant());
  p.features.mask = nullptr;
  p.features.mask_stride.col = 1;
  ok &= refused("kMasksBoolean: no mask", mask_variant());
  return ok;
}

inline void PrintFeatureTimings() {
  if (feature_timings.empty()) return;
  std::printf("\nfeature table, TFLOP/s over visible pairs (plain: the plain sm90 kernel, same shape and causality, "
              "over its own pairs)\n");
  std::printf("%-56s %8s %8s %8s\n", "shape", "sm90", "plain", "sm80");
  for (const FeatureTiming& r : feature_timings)
    std::printf("%-56s %8.1f %8.1f %8.1f\n", r.shape.c_str(), r.sm90, r.sm90_plain, r.sm80);
}

}  // namespace sm90_feature_check
