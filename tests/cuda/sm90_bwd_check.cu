// Standalone check of the sm90 backward (ffi/cuda/sm90/bwd_*) on a Hopper
// GPU, before it is wired into the extension: for bf16/f16 x head dims 64 /
// 128 (and padded ones) x causal x shapes with tails and GQA, every element
// of dq, dk and dv against a float reference computed on the GPU by
// one-thread-per-row kernels (from the same 16-bit out and float lse), then
// timings (median of 20 samples after warm-up) beside the sm80 backward at
// the same shapes. Exit code 1 on any FAIL; a hung launch ends the program
// after 20 s. First the building blocks alone (sm90_bwd_blocks.cuh), so that
// a failing kernel comes with the likely culprit.
//
// Then the feature variants (LaunchBackwardWithFeatures: FeatureBwdSchedule)
// against feature-aware references, and their timing rows beside sm80's
// feature backward; on every feature case also the schedules the package's
// replaced in session 19, checked the same way and counted: kLeanDq and, at
// 64, kDqFirstUniform over 64-query steps, each timed right after the
// package's on the timed cases (T=4096: documents and a window, causal, at
// 128 and 64; the soft cap at both). The bias variants (kMasksBias16,
// kMasksBias: dispatched since session 20, launched here through
// LaunchBiasScheduled at the package's feature schedule and, at 64, over
// 64-query steps) on bias cases of every broadcast shape, with the masks
// and tails, against the references with logits + bias; their timing rows
// (T=4096, [1,N,T,S] and [B,N,T,S] bf16 biases at 128, [1,N,T,S] at 64, one causal)
// in the same table (no lean-dQ column: the bias variants are dQ-first
// only). On every bias case also the sm90 bias-gradient pass
// (LaunchBiasGradientScheduled: stores for a [B,N,T,S] bias, float32
// atomics for a broadcast one) against a float reference of the summed dS
// (CheckBiasGradient), with sm80's LaunchBiasGradient beside it (SM80=1),
// and its own timing table on the timed bias shapes.
//
//   bash scripts/sm90_bwd_check.sh         # builds and runs this
//   ./sm90_bwd_check --quick               # skip the 4096-long cases
//   ./sm90_bwd_check --features            # only the feature cases (--plain: only the plain ones)
//   ./sm90_bwd_check --bias                # only the bias cases (kMasksBias16, kMasksBiasTiles, the dbias pass)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "common/params.h"
#include "cuda/sm90/bwd_launch.cuh"
#include "check_helpers.cuh"
#include "sm90_bwd_blocks.cuh"
#include "sm90_feature_check.cuh"  // RefFeatures, RefVisible, FeatureCase, SegmentIds, SegmentRanges, Upload
#ifdef JAX_FLASH_CHECK_SM80
#include "cuda/sm80/launch.cuh"
#endif

namespace {

using jax_flash::AttentionParams;
using jax_flash::ContiguousBtnh;
using namespace gpu_check;

constexpr int kMaxHead = 128;

// Logit of (query row qr, key row kr), scaled; contiguous BTNH rows.
template <typename Element>
__device__ float Dot(const Element* a, const Element* b, int H) {
  float dot = 0.0f;
  for (int d = 0; d < H; ++d) dot += ToFloat(a[d]) * ToFloat(b[d]);
  return dot;
}

// The forward, one thread per (b, h, query row), in float: out (rounded to
// the element type: the backward's delta reads it so) and the natural-log lse.
template <typename Element>
__global__ void ReferenceForward(const Element* q, const Element* k, const Element* v, Element* out, float* lse,
                                 int B, int T, int S, int N, int K, int H, float scale, bool causal) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(B) * N * T) return;
  const int i = int(idx % T), h = int(idx / T % N), b = int(idx / (int64_t(T) * N));
  const int hk = h / (N / K);
  const Element* qr = q + ((int64_t(b) * T + i) * N + h) * H;
  const int last = causal ? min(i, S - 1) : S - 1;
  auto kr = [&](int j) { return k + ((int64_t(b) * S + j) * K + hk) * H; };
  float m = -INFINITY;
  for (int j = 0; j <= last; ++j) m = fmaxf(m, Dot(qr, kr(j), H) * scale);
  float acc[kMaxHead];
  for (int d = 0; d < H; ++d) acc[d] = 0.0f;
  float l = 0.0f;
  for (int j = 0; j <= last; ++j) {
    const float p = expf(Dot(qr, kr(j), H) * scale - m);
    l += p;
    const Element* vr = v + ((int64_t(b) * S + j) * K + hk) * H;
    for (int d = 0; d < H; ++d) acc[d] += p * ToFloat(vr[d]);
  }
  Element* o = out + ((int64_t(b) * T + i) * N + h) * H;
  for (int d = 0; d < H; ++d) o[d] = FromFloat<Element>(l > 0.0f ? acc[d] / l : 0.0f);
  lse[(int64_t(b) * N + h) * T + i] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// delta = rowsum(dO * O) per (b, h, query row), float.
template <typename Element>
__global__ void ReferenceDelta(const Element* out, const Element* dout, float* delta, int B, int T, int N, int H) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(B) * N * T) return;
  const int i = int(idx % T), h = int(idx / T % N), b = int(idx / (int64_t(T) * N));
  const int64_t off = ((int64_t(b) * T + i) * N + h) * H;
  delta[(int64_t(b) * N + h) * T + i] = Dot(out + off, dout + off, H);
}

// dQ, one thread per (b, h, query row): sum over visible keys of
// dS (= P (dP - delta)) K, times scale.
template <typename Element>
__global__ void ReferenceDq(const Element* q, const Element* k, const Element* v, const Element* dout,
                            const float* lse, const float* delta, float* dq, int B, int T, int S, int N, int K,
                            int H, float scale, bool causal) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(B) * N * T) return;
  const int i = int(idx % T), h = int(idx / T % N), b = int(idx / (int64_t(T) * N));
  const int hk = h / (N / K);
  const int64_t q_off = ((int64_t(b) * T + i) * N + h) * H;
  const float row_lse = lse[(int64_t(b) * N + h) * T + i], row_delta = delta[(int64_t(b) * N + h) * T + i];
  const int last = causal ? min(i, S - 1) : S - 1;
  float acc[kMaxHead];
  for (int d = 0; d < H; ++d) acc[d] = 0.0f;
  for (int j = 0; j <= last; ++j) {
    const int64_t k_off = ((int64_t(b) * S + j) * K + hk) * H;
    const float p = expf(Dot(q + q_off, k + k_off, H) * scale - row_lse);
    const float ds = p * (Dot(dout + q_off, v + k_off, H) - row_delta);
    for (int d = 0; d < H; ++d) acc[d] += ds * ToFloat(k[k_off + d]);
  }
  for (int d = 0; d < H; ++d) dq[q_off + d] = acc[d] * scale;
}

// dK and dV, one thread per (b, key head, key row): sums over the group's
// query heads and the queries that see the key.
template <typename Element>
__global__ void ReferenceDkv(const Element* q, const Element* k, const Element* v, const Element* dout,
                             const float* lse, const float* delta, float* dk, float* dv, int B, int T, int S,
                             int N, int K, int H, float scale, bool causal) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(B) * K * S) return;
  const int j = int(idx % S), hk = int(idx / S % K), b = int(idx / (int64_t(S) * K));
  const int64_t k_off = ((int64_t(b) * S + j) * K + hk) * H;
  float acc_k[kMaxHead], acc_v[kMaxHead];
  for (int d = 0; d < H; ++d) acc_k[d] = acc_v[d] = 0.0f;
  const int group = N / K;
  for (int h = hk * group; h < (hk + 1) * group; ++h)
    for (int i = causal ? j : 0; i < T; ++i) {
      const int64_t q_off = ((int64_t(b) * T + i) * N + h) * H;
      const int64_t row = (int64_t(b) * N + h) * T + i;
      const float p = expf(Dot(q + q_off, k + k_off, H) * scale - lse[row]);
      const float ds = p * (Dot(dout + q_off, v + k_off, H) - delta[row]);
      for (int d = 0; d < H; ++d) {
        acc_v[d] += p * ToFloat(dout[q_off + d]);
        acc_k[d] += ds * ToFloat(q[q_off + d]);
      }
    }
  for (int d = 0; d < H; ++d) dk[k_off + d] = acc_k[d] * scale, dv[k_off + d] = acc_v[d];
}

struct Case {
  int B, T, S, N, K, H;
  bool causal;
  bool timed;
};

struct TimingRow {
  std::string shape;
  double sm90 = 0, sm90_serial = 0, sm80 = 0;
  // lean-dQ (kLeanDq: the default of session 17, the feature variants' in 17-18); lean_dp at 64 only.
  double sm90_lean = 0, sm90_lean_dp = 0;
  // Session 17's candidates (bwd_kernel_traits.cuh): kDqFirst,
  // kLeanDqUniform, kDqFirstUniform, kDqFirstUniformDiag,
  // kDqFirstUniformDiagCounters.
  double sm90_dq_first = 0, sm90_uniform = 0, sm90_dq_first_uniform = 0, sm90_diag = 0, sm90_counters = 0;
  // At 64 only: kLeanDqRows128, kDqFirstUniformRows128,
  // kDqFirstUniformDiagCountersRows128 (128-query steps, dQ split by rows).
  double sm90_rows128 = 0, sm90_rows128_dqfu = 0, sm90_rows128_counters = 0;
};
std::vector<TimingRow> timing_rows;

// Error of one gradient against its reference: |got - want| <= tol (scale +
// |want|) + 1e-5. The scale is the larger of the tensor's rms |want| and the
// element's row's (its H values): each element is a sum of many
// 16-bit-rounded P / dS terms, whose rounding errors scale with the terms'
// size rather than with the (possibly cancelling) element, and a row's rms
// measures its terms. The row term matters for causal: the first keys'
// dK / dV and the first queries' dQ sum terms ten times the tensor's rms
// (P near 1); with the tensor's rms alone, bf16's rounding of those P and
// dS failed 1-3 elements per million at 1.0-1.3x the tolerance, identically
// in both schedules (session 16's first run). The 1e-5 floor: exact zeros
// (a query that sees one key has dS = P (dP - delta) = 0) come out as
// float32 rounding of dP - delta, about 1e-6.
// Returns the worst error / allowed ratio; counts bad elements.
template <typename Element>
double Compare(const std::vector<Element>& got, const std::vector<float>& want, int H, double tol, int64_t* bad,
               int64_t* first_bad) {
  double sum_sq = 0;
  for (float w : want) sum_sq += double(w) * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(sum_sq / double(want.size()));
  double worst = 0;
  *bad = 0, *first_bad = -1;
  for (size_t row = 0; row < got.size(); row += H) {
    double row_sq = 0;
    for (int d = 0; d < H; ++d) row_sq += double(want[row + d]) * want[row + d];
    const double scale = std::max(rms, std::sqrt(row_sq / H));
    for (size_t i = row; i < row + H; ++i) {
      const double g = ToFloat(got[i]), w = want[i], e = std::fabs(g - w);
      const double allowed = tol * (scale + std::fabs(w)) + 1e-5;
      if (!(e <= allowed)) {  // NaN (unwritten) fails too
        if (*first_bad < 0) *first_bad = int64_t(i);
        ++*bad;
      }
      worst = std::isfinite(e) ? std::max(worst, e / allowed) : INFINITY;
    }
  }
  return worst;
}

// The shape of a backward's gradients: dQ [B, T, N, H], dK / dV [B, S, K, H].
struct GradientShape {
  int B, T, S, N, K, H;
};

// Runs `launch` (a backward writing dq, dk, dv) on poisoned outputs and
// checks every element against the references (Compare): one PASS / FAIL
// line named `what` and, per failing gradient, its count and first bad
// element. Returns whether every element passed; exits when the context is
// lost (nothing after could run).
template <typename Element, typename Launch>
bool RunAndCheck(const char* what, Launch launch, Element* dq, Element* dk, Element* dv,
                 const std::vector<float>& want_dq, const std::vector<float>& want_dk,
                 const std::vector<float>& want_dv, GradientShape c, double tol) {
  const int64_t q_elems = int64_t(want_dq.size()), kv_elems = int64_t(want_dk.size());
  Poison<<<1024, 256>>>(reinterpret_cast<uint16_t*>(dq), q_elems);
  Poison<<<1024, 256>>>(reinterpret_cast<uint16_t*>(dk), kv_elems);
  Poison<<<1024, 256>>>(reinterpret_cast<uint16_t*>(dv), kv_elems);
  CHECK_CUDA(cudaGetLastError());
  const std::string err = launch();
  const cudaError_t sync = SynchronizeOrDie(what);
  if (!err.empty() || sync != cudaSuccess) {
    std::printf("%s: FAIL (%s%s)\n", what, err.c_str(), sync != cudaSuccess ? cudaGetErrorString(sync) : "");
    std::fflush(stdout);
    if (sync != cudaSuccess) std::exit(3);  // the context is gone
    return false;
  }
  std::vector<Element> got_dq(q_elems), got_dk(kv_elems), got_dv(kv_elems);
  CHECK_CUDA(cudaMemcpy(got_dq.data(), dq, q_elems * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(got_dk.data(), dk, kv_elems * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(got_dv.data(), dv, kv_elems * 2, cudaMemcpyDeviceToHost));
  int64_t bad[3], first[3];
  const double r_dq = Compare(got_dq, want_dq, c.H, tol, &bad[0], &first[0]);
  const double r_dk = Compare(got_dk, want_dk, c.H, tol, &bad[1], &first[1]);
  const double r_dv = Compare(got_dv, want_dv, c.H, tol, &bad[2], &first[2]);
  const bool ok = bad[0] == 0 && bad[1] == 0 && bad[2] == 0;
  std::printf("%s: worst err / tol dq %.2f dk %.2f dv %.2f: %s\n", what, r_dq, r_dk, r_dv, ok ? "PASS" : "FAIL");
  const char* names[3] = {"dq", "dk", "dv"};
  const std::vector<Element>* gots[3] = {&got_dq, &got_dk, &got_dv};
  const std::vector<float>* wants[3] = {&want_dq, &want_dk, &want_dv};
  for (int x = 0; x < 3; ++x) {
    if (!bad[x]) continue;
    const int heads = x == 0 ? c.N : c.K, seq = x == 0 ? c.T : c.S;
    const int64_t i = first[x], d = i % c.H, hh = i / c.H % heads, t = i / (int64_t(c.H) * heads) % seq,
                  b = i / (int64_t(c.H) * heads * seq);
    std::printf("  %lld bad %s elements; first at b=%lld t=%lld h=%lld d=%lld: got %g want %g\n",
                (long long)bad[x], names[x], (long long)b, (long long)t, (long long)hh, (long long)d,
                double(ToFloat((*gots[x])[i])), double((*wants[x])[i]));
  }
  std::fflush(stdout);
  return ok;
}

template <typename Element, int kHeadDim>
bool RunCase(const Case& c) {
  const int64_t q_elems = int64_t(c.B) * c.T * c.N * c.H, kv_elems = int64_t(c.B) * c.S * c.K * c.H;
  const int64_t rows = int64_t(c.B) * c.N * c.T;
  Element *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float *lse, *delta, *dq_accum, *ref_delta, *ref_dq, *ref_dk, *ref_dv;
  CHECK_CUDA(cudaMalloc(&q, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&k, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&v, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&out, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&dout, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&dq, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&dk, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&dv, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&lse, rows * 4));
  CHECK_CUDA(cudaMalloc(&delta, rows * 4));
  CHECK_CUDA(cudaMalloc(&ref_delta, rows * 4));
  CHECK_CUDA(cudaMalloc(&dq_accum, q_elems * 4));
  CHECK_CUDA(cudaMalloc(&ref_dq, q_elems * 4));
  CHECK_CUDA(cudaMalloc(&ref_dk, kv_elems * 4));
  CHECK_CUDA(cudaMalloc(&ref_dv, kv_elems * 4));
  FillNormal<<<1024, 256>>>(q, q_elems, 1);
  FillNormal<<<1024, 256>>>(k, kv_elems, 2);
  FillNormal<<<1024, 256>>>(v, kv_elems, 3);
  FillNormal<<<1024, 256>>>(dout, q_elems, 4);
  CHECK_CUDA(cudaGetLastError());

  AttentionParams p;
  p.shape = {c.B, c.T, c.S, c.N, c.K, c.H};
  p.q_stride = ContiguousBtnh(c.T, c.N, c.H);
  p.k_stride = ContiguousBtnh(c.S, c.K, c.H);
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
  p.dout = dout, p.delta = delta, p.dq = dq, p.dk = dk, p.dv = dv, p.dq_accum = dq_accum;
  p.scale = 1.0 / std::sqrt(double(c.H));
  p.is_causal = c.causal;
  const float scale = float(p.scale);

  const unsigned q_grid = unsigned((rows + 127) / 128), k_grid = unsigned((int64_t(c.B) * c.K * c.S + 127) / 128);
  ReferenceForward<Element><<<q_grid, 128>>>(q, k, v, out, lse, c.B, c.T, c.S, c.N, c.K, c.H, scale, c.causal);
  ReferenceDelta<Element><<<q_grid, 128>>>(out, dout, ref_delta, c.B, c.T, c.N, c.H);
  ReferenceDq<Element><<<q_grid, 128>>>(q, k, v, dout, lse, ref_delta, ref_dq, c.B, c.T, c.S, c.N, c.K, c.H,
                                        scale, c.causal);
  ReferenceDkv<Element><<<k_grid, 128>>>(q, k, v, dout, lse, ref_delta, ref_dk, ref_dv, c.B, c.T, c.S, c.N, c.K,
                                         c.H, scale, c.causal);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> want_dq(q_elems), want_dk(kv_elems), want_dv(kv_elems);
  CHECK_CUDA(cudaMemcpy(want_dq.data(), ref_dq, q_elems * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(want_dk.data(), ref_dk, kv_elems * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(want_dv.data(), ref_dv, kv_elems * 4, cudaMemcpyDeviceToHost));
  // Tolerances relative to the 16-bit type: P and dS are rounded to it.
  const double tol = std::is_same_v<Element, __nv_bfloat16> ? 2e-2 : 4e-3;
  const double flops = 2.5 * 4.0 * c.B * c.N * double(c.T) * c.S * c.H / (c.causal ? 2.0 : 1.0);

  char name[200];
  std::snprintf(name, sizeof name, "%s H=%d (kHeadDim %d) B=%d T=%d S=%d N=%d K=%d causal=%d", TypeName<Element>(),
                c.H, kHeadDim, c.B, c.T, c.S, c.N, c.K, int(c.causal));
  // Runs a backward (sm90, or sm80 for the comparison) and checks it;
  // returns whether every element passed.
  auto run_and_check = [&](const char* family, auto launch) {
    char what[400];
    std::snprintf(what, sizeof what, "%s %s", family, name);
    return RunAndCheck<Element>(what, launch, dq, dk, dv, want_dq, want_dk, want_dv, {c.B, c.T, c.S, c.N, c.K, c.H},
                                tol);
  };

  // Every schedule (bwd_kernel_traits.cuh), early-S first: a failure of
  // only one points at its step order. kLeanDq (the default in session
  // 17, the feature variants' since) and, at 64, kLeanDqEarlyDp: their full steps take SendDqFull, their
  // tail steps and padded head dims kEarlyS's general send. Then session
  // 17's candidates, timed against kLeanDq: kDqFirst (dV, barrier, dQ, dK,
  // the send under dK), kLeanDqUniform (uniform-register descriptors),
  // kDqFirstUniform (both), kDqFirstUniformDiag (both, masks only on the
  // steps that need them: causal diagonal blocks, key tails),
  // kDqFirstUniformDiagCounters (that, the step's query block and head as
  // counters instead of a division). At 64 also kLeanDqRows128,
  // kDqFirstUniformRows128 and kDqFirstUniformDiagCountersRows128 (those
  // three over 128-query steps, dQ split between the warpgroups by query
  // rows: FlashAttention-3's 128 x 128 tile at 64).
  using jax_flash::cuda::sm90::BwdSchedule;
  using jax_flash::cuda::sm90::LaunchBackwardScheduled;
  auto launch90 = [&] { return LaunchBackwardScheduled<Element, kHeadDim, BwdSchedule::kEarlyS>(p, 0); };
  auto launch90_serial = [&] { return LaunchBackwardScheduled<Element, kHeadDim, BwdSchedule::kSerial>(p, 0); };
  auto launch90_lean = [&] { return LaunchBackwardScheduled<Element, kHeadDim, BwdSchedule::kLeanDq>(p, 0); };
  // (kLeanDqEarlyDp spills and serializes its wgmma at 128: built at 64 only.)
  constexpr BwdSchedule kLeanDp = kHeadDim == 64 ? BwdSchedule::kLeanDqEarlyDp : BwdSchedule::kLeanDq;
  auto launch90_lean_dp = [&] { return LaunchBackwardScheduled<Element, kHeadDim, kLeanDp>(p, 0); };
  auto launch90_dq_first = [&] { return LaunchBackwardScheduled<Element, kHeadDim, BwdSchedule::kDqFirst>(p, 0); };
  auto launch90_uniform = [&] {
    return LaunchBackwardScheduled<Element, kHeadDim, BwdSchedule::kLeanDqUniform>(p, 0);
  };
  auto launch90_dq_first_uniform = [&] {
    return LaunchBackwardScheduled<Element, kHeadDim, BwdSchedule::kDqFirstUniform>(p, 0);
  };
  auto launch90_diag = [&] {
    return LaunchBackwardScheduled<Element, kHeadDim, BwdSchedule::kDqFirstUniformDiag>(p, 0);
  };
  auto launch90_counters = [&] {
    return LaunchBackwardScheduled<Element, kHeadDim, BwdSchedule::kDqFirstUniformDiagCounters>(p, 0);
  };
  // (128-query steps exist at head dim 64 only: kLeanDq stands in at 128,
  // never run there.)
  constexpr bool k64 = kHeadDim == 64;
  constexpr BwdSchedule kRows128 = k64 ? BwdSchedule::kLeanDqRows128 : BwdSchedule::kLeanDq;
  constexpr BwdSchedule kRows128Dqfu = k64 ? BwdSchedule::kDqFirstUniformRows128 : BwdSchedule::kLeanDq;
  auto launch90_rows128 = [&] { return LaunchBackwardScheduled<Element, kHeadDim, kRows128>(p, 0); };
  auto launch90_rows128_dqfu = [&] { return LaunchBackwardScheduled<Element, kHeadDim, kRows128Dqfu>(p, 0); };
  constexpr BwdSchedule kRows128Counters = k64 ? BwdSchedule::kDqFirstUniformDiagCountersRows128 : BwdSchedule::kLeanDq;
  auto launch90_rows128_counters = [&] {
    return LaunchBackwardScheduled<Element, kHeadDim, kRows128Counters>(p, 0);
  };
  bool ok = run_and_check("sm90 early-S", launch90);
  ok &= run_and_check("sm90 serial", launch90_serial);
  // A candidate's failure is reported (and counted) but does not stop the
  // others' timing.
  const bool ok_lean = run_and_check("sm90 lean-dQ (the feature variants' default)", launch90_lean);
  const bool ok_lean_dp = kHeadDim != 64 || run_and_check("sm90 lean-dQ early-dP (candidate)", launch90_lean_dp);
  const bool ok_dq_first = run_and_check("sm90 dQ-first (candidate)", launch90_dq_first);
  const bool ok_uniform = run_and_check("sm90 lean-dQ uniform-desc (candidate)", launch90_uniform);
  const bool ok_dq_first_uniform = run_and_check("sm90 dQ-first uniform-desc (candidate)", launch90_dq_first_uniform);
  const bool ok_diag = run_and_check("sm90 dQ-first uniform-desc diagonal-masks (candidate)", launch90_diag);
  const bool ok_counters =
      run_and_check(k64 ? "sm90 dQ-first uniform-desc diagonal-masks counters (candidate)"
                        : "sm90 dQ-first uniform-desc diagonal-masks counters (the default at 128)",
                    launch90_counters);
  const bool ok_rows128 = !k64 || run_and_check("sm90 lean-dQ 128-query steps (candidate)", launch90_rows128);
  const bool ok_rows128_dqfu =
      !k64 || run_and_check("sm90 dQ-first uniform-desc 128-query steps (candidate)", launch90_rows128_dqfu);
  const bool ok_rows128_counters =
      !k64 || run_and_check("sm90 dQ-first uniform-desc diagonal-masks counters 128-query steps (the default at 64)",
                            launch90_rows128_counters);
  TimingRow row;
  if (ok && c.timed) {
    const float ms = TimeLaunches(launch90), ms_serial = TimeLaunches(launch90_serial);
    row.sm90 = ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0;
    row.sm90_serial = ms_serial > 0 ? flops / (ms_serial * 1e-3) / 1e12 : 0.0;
    std::printf("  time sm90 early-S: %.3f ms, %.1f TFLOP/s; serial: %.3f ms, %.1f TFLOP/s\n", ms, row.sm90,
                ms_serial, row.sm90_serial);
    if (ok_lean) {
      const float ms_lean = TimeLaunches(launch90_lean);
      row.sm90_lean = ms_lean > 0 ? flops / (ms_lean * 1e-3) / 1e12 : 0.0;
      std::printf("  time sm90 lean-dQ: %.3f ms, %.1f TFLOP/s (%.3fx early-S)\n", ms_lean, row.sm90_lean,
                  row.sm90 > 0 ? row.sm90_lean / row.sm90 : 0.0);
    }
    if (kHeadDim == 64 && ok_lean_dp) {
      const float ms_dp = TimeLaunches(launch90_lean_dp);
      row.sm90_lean_dp = ms_dp > 0 ? flops / (ms_dp * 1e-3) / 1e12 : 0.0;
      std::printf("  time sm90 lean-dQ early-dP: %.3f ms, %.1f TFLOP/s (%.3fx early-S)\n", ms_dp, row.sm90_lean_dp,
                  row.sm90 > 0 ? row.sm90_lean_dp / row.sm90 : 0.0);
    }
    // Session 17's candidates against lean-dQ, each timed
    // again right after a lean-dQ timing: the pairs share the clocks of
    // their moment (GPU.md: timings move 5-20% between runs).
    auto time_against_lean = [&](const char* label, bool passed, auto launch, double* tflops) {
      if (!passed || !ok_lean) return;
      const float ms_ref = TimeLaunches(launch90_lean), ms_cand = TimeLaunches(launch);
      *tflops = ms_cand > 0 ? flops / (ms_cand * 1e-3) / 1e12 : 0.0;
      std::printf("  time sm90 %s: %.3f ms, %.1f TFLOP/s (%.3fx lean-dQ, timed beside it: %.3f ms)\n", label, ms_cand,
                  *tflops, ms_cand > 0 ? ms_ref / ms_cand : 0.0, ms_ref);
    };
    time_against_lean("dQ-first", ok_dq_first, launch90_dq_first, &row.sm90_dq_first);
    time_against_lean("lean-dQ uniform-desc", ok_uniform, launch90_uniform, &row.sm90_uniform);
    time_against_lean("dQ-first uniform-desc", ok_dq_first_uniform, launch90_dq_first_uniform,
                      &row.sm90_dq_first_uniform);
    time_against_lean("dQ-first uniform-desc diagonal-masks", ok_diag, launch90_diag, &row.sm90_diag);
    time_against_lean("dQ-first uniform-desc diagonal-masks counters", ok_counters, launch90_counters,
                      &row.sm90_counters);
    if (k64) {
      time_against_lean("lean-dQ 128-query steps", ok_rows128, launch90_rows128, &row.sm90_rows128);
      time_against_lean("dQ-first uniform-desc 128-query steps", ok_rows128_dqfu, launch90_rows128_dqfu,
                        &row.sm90_rows128_dqfu);
      time_against_lean("dQ-first uniform-desc diagonal-masks counters 128-query steps", ok_rows128_counters,
                        launch90_rows128_counters, &row.sm90_rows128_counters);
    }
  }
#ifdef JAX_FLASH_CHECK_SM80
  // sm80's backward on the same inputs: its errors show what the tolerance
  // allows a known-good kernel (a failure here is the check's, not sm90's).
  auto launch80 = [&] { return jax_flash::cuda::sm80::LaunchBackward<Element, kHeadDim>(p, 0); };
  if (!c.timed || ok) {
    run_and_check("sm80 (reference kernel, not counted)", launch80);
    if (c.timed) {
      const float ms80 = TimeLaunches(launch80);
      row.sm80 = ms80 > 0 ? flops / (ms80 * 1e-3) / 1e12 : 0.0;
      std::printf("  time sm80: %.3f ms, %.1f TFLOP/s (sm90 lean-dQ / sm80 speed: %.2fx)\n", ms80, row.sm80,
                  row.sm80 > 0 ? row.sm90_lean / row.sm80 : 0.0);
    }
  }
#endif
  if (c.timed) {
    char shape[120];
    std::snprintf(shape, sizeof shape, "%s H=%d B=%d T=S=%d N=%d causal=%d", TypeName<Element>(), c.H, c.B, c.T,
                  c.N, int(c.causal));
    row.shape = shape;
    timing_rows.push_back(row);
  }

  for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)out, (void*)dout, (void*)dq, (void*)dk, (void*)dv,
                    (void*)lse, (void*)delta, (void*)ref_delta, (void*)dq_accum, (void*)ref_dq, (void*)ref_dk,
                    (void*)ref_dv})
    cudaFree(ptr);
  return ok && ok_lean && ok_lean_dp && ok_dq_first && ok_uniform && ok_dq_first_uniform && ok_diag && ok_counters &&
         ok_rows128 && ok_rows128_dqfu && ok_rows128_counters;
}

template <typename Element>
bool RunCaseAnyHead(const Case& c) {
  if (c.H <= 64) return RunCase<Element, 64>(c);
  return RunCase<Element, 128>(c);
}

// The launcher refuses what it cannot run with a message instead of
// launching: a misaligned q, a deterministic call, attention features.
template <typename Element>
bool RejectsUnsupported() {
  float* buf;
  CHECK_CUDA(cudaMalloc(&buf, 16 << 20));
  Element* e = reinterpret_cast<Element*>(buf);
  AttentionParams p;
  p.shape = {1, 128, 128, 2, 2, 128};
  p.q_stride = p.k_stride = ContiguousBtnh(128, 2, 128);
  p.q = e, p.k = e, p.v = e, p.out = e, p.dout = e, p.dq = e, p.dk = e, p.dv = e;
  p.lse = buf + (1 << 20), p.delta = buf + (2 << 20), p.dq_accum = buf + (3 << 20);
  p.scale = 0.1;
  bool ok = true;
  auto expect_error = [&](const char* what) {
    const std::string err = jax_flash::cuda::sm90::LaunchBackward<Element, 128>(p, 0);
    std::printf("%s (%s): %s\n", what, TypeName<Element>(), err.empty() ? "launched: FAIL" : err.c_str());
    ok &= !err.empty();
  };
  p.q = e + 1;
  expect_error("misaligned q");
  p.q = e;
  p.deterministic = true;
  expect_error("deterministic");
  p.deterministic = false;
  p.dq_accum = nullptr;
  expect_error("no dQ accumulator");
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaFree(buf);
  return ok;
}

// ---------------------------------------------------------------------------
// Feature variants (LaunchBackwardWithFeatures: kMasks, kMasksSoftcap)
// against float references that spell the semantics out
// (sm90_feature_check.cuh's RefVisible: lengths, causal with position
// offsets, windows, segment ids; the soft cap as c tanh(x / c) on the scaled
// logit, its gradient through 1 - tanh^2), with the lse of a reference
// forward with the same features.

using sm90_feature_check::FeatureCase;
using sm90_feature_check::RefFeatures;
using sm90_feature_check::RefVisible;
using sm90_feature_check::Segments;

// The bias of pair (query i, key j) of batch b, head h (0 without one):
// added to the scaled logit after any cap (as sm80; the sm90 bias variants
// refuse the cap).
__device__ inline float RefBias(const RefFeatures& f, int b, int h, int i, int j) {
  return f.bias ? f.bias[b * f.bias_batch + h * f.bias_head + i * f.bias_row + j] : 0.0f;
}

// The scaled logit of a visible pair, soft-capped; *th gets tanh(x / c) (0
// without a cap) for the chain rule.
__device__ inline float RefLogit(float dot, float scale, float softcap, float* th) {
  const float x = dot * scale;
  if (softcap <= 0.0f) {
    *th = 0.0f;
    return x;
  }
  *th = tanhf(x / softcap);
  return softcap * *th;
}

// The forward with features, one thread per (b, h, query row): out rounded
// to the element type (the delta pass reads it so), natural-log lse (-inf
// and zeros for a row that sees no key).
template <typename Element>
__global__ void ReferenceForwardFeatures(const Element* q, const Element* k, const Element* v, Element* out,
                                         float* lse, int B, int T, int S, int N, int K, int H, float scale,
                                         bool causal, RefFeatures f) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(B) * N * T) return;
  const int i = int(idx % T), h = int(idx / T % N), b = int(idx / (int64_t(T) * N));
  const int hk = h / (N / K);
  const Element* qr = q + ((int64_t(b) * T + i) * N + h) * H;
  auto kr = [&](int j) { return k + ((int64_t(b) * S + j) * K + hk) * H; };
  float th, m = -INFINITY;
  for (int j = 0; j < S; ++j)
    if (RefVisible(f, b, T, S, causal, i, j))
      m = fmaxf(m, RefLogit(Dot(qr, kr(j), H), scale, f.softcap, &th) + RefBias(f, b, h, i, j));
  float acc[kMaxHead];
  for (int d = 0; d < H; ++d) acc[d] = 0.0f;
  float l = 0.0f;
  if (m > -INFINITY)
    for (int j = 0; j < S; ++j) {
      if (!RefVisible(f, b, T, S, causal, i, j)) continue;
      const float p = expf(RefLogit(Dot(qr, kr(j), H), scale, f.softcap, &th) + RefBias(f, b, h, i, j) - m);
      l += p;
      const Element* vr = v + ((int64_t(b) * S + j) * K + hk) * H;
      for (int d = 0; d < H; ++d) acc[d] += p * ToFloat(vr[d]);
    }
  Element* o = out + ((int64_t(b) * T + i) * N + h) * H;
  for (int d = 0; d < H; ++d) o[d] = FromFloat<Element>(l > 0.0f ? acc[d] / l : 0.0f);
  lse[(int64_t(b) * N + h) * T + i] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// dQ with features, one thread per (b, h, query row): over the visible keys,
// dS = P (dP - delta), times 1 - tanh^2 under a soft cap, then dS K scale.
template <typename Element>
__global__ void ReferenceDqFeatures(const Element* q, const Element* k, const Element* v, const Element* dout,
                                    const float* lse, const float* delta, float* dq, int B, int T, int S, int N,
                                    int K, int H, float scale, bool causal, RefFeatures f) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(B) * N * T) return;
  const int i = int(idx % T), h = int(idx / T % N), b = int(idx / (int64_t(T) * N));
  const int hk = h / (N / K);
  const int64_t q_off = ((int64_t(b) * T + i) * N + h) * H;
  const float row_lse = lse[(int64_t(b) * N + h) * T + i], row_delta = delta[(int64_t(b) * N + h) * T + i];
  float acc[kMaxHead];
  for (int d = 0; d < H; ++d) acc[d] = 0.0f;
  for (int j = 0; j < S; ++j) {
    if (!RefVisible(f, b, T, S, causal, i, j)) continue;
    const int64_t k_off = ((int64_t(b) * S + j) * K + hk) * H;
    float th;
    // A -inf bias hides its pair (no term: expf(-inf - lse) is NaN where
    // the row's lse is -inf too, every visible logit -inf).
    const float x = RefLogit(Dot(q + q_off, k + k_off, H), scale, f.softcap, &th) + RefBias(f, b, h, i, j);
    if (x == -INFINITY) continue;
    const float p = expf(x - row_lse);
    const float ds = p * (Dot(dout + q_off, v + k_off, H) - row_delta) * (1.0f - th * th);
    for (int d = 0; d < H; ++d) acc[d] += ds * ToFloat(k[k_off + d]);
  }
  for (int d = 0; d < H; ++d) dq[q_off + d] = acc[d] * scale;
}

// dK and dV with features, one thread per (b, key head, key row): over the
// group's query heads and the queries that see the key (0 for a key no
// query sees).
template <typename Element>
__global__ void ReferenceDkvFeatures(const Element* q, const Element* k, const Element* v, const Element* dout,
                                     const float* lse, const float* delta, float* dk, float* dv, int B, int T,
                                     int S, int N, int K, int H, float scale, bool causal, RefFeatures f) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(B) * K * S) return;
  const int j = int(idx % S), hk = int(idx / S % K), b = int(idx / (int64_t(S) * K));
  const int64_t k_off = ((int64_t(b) * S + j) * K + hk) * H;
  float acc_k[kMaxHead], acc_v[kMaxHead];
  for (int d = 0; d < H; ++d) acc_k[d] = acc_v[d] = 0.0f;
  const int group = N / K;
  for (int i = 0; i < T; ++i) {
    if (!RefVisible(f, b, T, S, causal, i, j)) continue;
    for (int h = hk * group; h < (hk + 1) * group; ++h) {
      const int64_t q_off = ((int64_t(b) * T + i) * N + h) * H;
      const int64_t row = (int64_t(b) * N + h) * T + i;
      float th;
      const float x = RefLogit(Dot(q + q_off, k + k_off, H), scale, f.softcap, &th) + RefBias(f, b, h, i, j);
      if (x == -INFINITY) continue;  // a -inf bias hides its pair (as in ReferenceDqFeatures)
      const float p = expf(x - lse[row]);
      const float ds = p * (Dot(dout + q_off, v + k_off, H) - delta[row]) * (1.0f - th * th);
      for (int d = 0; d < H; ++d) {
        acc_v[d] += p * ToFloat(dout[q_off + d]);
        acc_k[d] += ds * ToFloat(q[q_off + d]);
      }
    }
  }
  for (int d = 0; d < H; ++d) dk[k_off + d] = acc_k[d] * scale, dv[k_off + d] = acc_v[d];
}

// The bias gradient, one thread per (b, h, query row): dS = P (dP - delta)
// of every visible pair (the bias variants refuse the soft cap: d(logit) is
// dS, unscaled, as the bias is added to the scaled logit) added into the
// float32 `dbias` at the bias's element (strides 0 along its broadcast
// dims: the sum over them), zeroed by the caller.
template <typename Element>
__global__ void ReferenceDbiasFeatures(const Element* q, const Element* k, const Element* v, const Element* dout,
                                       const float* lse, const float* delta, float* dbias, int B, int T, int S,
                                       int N, int K, int H, float scale, bool causal, RefFeatures f) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(B) * N * T) return;
  const int i = int(idx % T), h = int(idx / T % N), b = int(idx / (int64_t(T) * N));
  const int hk = h / (N / K);
  const int64_t q_off = ((int64_t(b) * T + i) * N + h) * H;
  const float row_lse = lse[(int64_t(b) * N + h) * T + i], row_delta = delta[(int64_t(b) * N + h) * T + i];
  float* const row = dbias + b * f.bias_batch + h * f.bias_head + i * f.bias_row;
  for (int j = 0; j < S; ++j) {
    if (!RefVisible(f, b, T, S, causal, i, j)) continue;
    const int64_t k_off = ((int64_t(b) * S + j) * K + hk) * H;
    float th;
    const float x = RefLogit(Dot(q + q_off, k + k_off, H), scale, f.softcap, &th) + RefBias(f, b, h, i, j);
    if (x == -INFINITY) continue;  // a -inf bias hides its pair (as in ReferenceDqFeatures)
    const float ds = expf(x - row_lse) * (Dot(dout + q_off, v + k_off, H) - row_delta);
    atomicAdd(row + j, ds);
  }
}

// The bias-gradient pass's timing rows (the bias cases' timed shapes).
struct DbiasTimingRow {
  std::string shape;
  double sm90 = 0, sm80 = 0;
};
std::vector<DbiasTimingRow> dbias_timing_rows;

// The sm90 bias-gradient pass (LaunchBiasGradientScheduled at the bias
// variants' schedule) on a bias case, set up as BiasGradientImpl
// (handlers.cu) sets up sm80's: no dq / dk / dv; a [B, N, T, S] bias's
// gradient stored into dbias_direct in the bias's type, a broadcast one's
// summed by float32 atomics into dbias (for a 16-bit bias the float32
// scratch that the handler then rounds with LaunchDbiasConvert: checked here
// before that rounding, which is not this pass's), the target zeroed first
// (inside each timed launch too, as the handler's memset). Every element
// against ReferenceDbiasFeatures by Compare over rows of S keys (the
// backward's tolerances; the row scale covers causal's first keys, whose
// dS terms are large). sm80's LaunchBiasGradient beside it (SM80=1) on the
// same target: the known-good kernel, also timed. `dbias_flops`: 4 H N per
// visible pair (the forward's two products, as scripts/bias16_check.py
// counts the dbias pass).
template <typename Element, int kHeadDim>
bool CheckBiasGradient(const FeatureCase& c, AttentionParams p, const RefFeatures& rf, const float* ref_delta,
                       const char* name, int64_t bias_elements, double tol, double dbias_flops) {
  const int64_t rows = int64_t(c.B) * c.N * c.T;
  float* ref = nullptr;
  CHECK_CUDA(cudaMalloc(&ref, bias_elements * 4));
  CHECK_CUDA(cudaMemset(ref, 0, bias_elements * 4));
  ReferenceDbiasFeatures<Element><<<unsigned((rows + 127) / 128), 128>>>(
      static_cast<const Element*>(p.q), static_cast<const Element*>(p.k), static_cast<const Element*>(p.v),
      static_cast<const Element*>(p.dout), static_cast<const float*>(p.lse), ref_delta, ref,
      c.B, c.T, c.S, c.N, c.K, c.H, float(p.scale), c.causal, rf);
  CHECK_CUDA(cudaGetLastError());
  if (SynchronizeOrDie("the dbias reference", 300.0) != cudaSuccess) std::exit(3);
  std::vector<float> want(bias_elements);
  CHECK_CUDA(cudaMemcpy(want.data(), ref, bias_elements * 4, cudaMemcpyDeviceToHost));
  cudaFree(ref);

  // The handler's choice: one writer per element only for the full shape.
  const bool full = bias_elements == int64_t(c.B) * c.N * c.T * c.S;
  const bool bias32 = p.features.bias_type == jax_flash::BiasType::kAccum;
  const size_t element_bytes = full && !bias32 ? 2 : 4;
  void* target = nullptr;
  CHECK_CUDA(cudaMalloc(&target, bias_elements * element_bytes));
  p.dq = p.dk = p.dv = nullptr;
  p.dq_accum = nullptr;
  p.features.dbias = full ? nullptr : static_cast<float*>(target);
  p.features.dbias_direct = full ? target : nullptr;
  auto with_clear = [&](auto launch) {
    return [&, launch] {
      if (cudaMemsetAsync(target, 0, bias_elements * element_bytes, 0) != cudaSuccess) return std::string("memset failed");
      return launch();
    };
  };
  auto launch90 = with_clear([&] { return jax_flash::cuda::sm90::LaunchBiasGradientScheduled<Element, kHeadDim>(p, 0); });
  auto run_and_check = [&](const char* family, auto launch) {
    char what[480];
    std::snprintf(what, sizeof what, "%s %s (%s)", family, name,
                  full ? "stores into dbias_direct" : "float32 atomics into dbias");
    const std::string err = launch();
    const cudaError_t sync = SynchronizeOrDie(what);
    if (!err.empty() || sync != cudaSuccess) {
      std::printf("%s: FAIL (%s%s)\n", what, err.c_str(), sync != cudaSuccess ? cudaGetErrorString(sync) : "");
      std::fflush(stdout);
      if (sync != cudaSuccess) std::exit(3);
      return false;
    }
    std::vector<float> got(bias_elements);
    if (element_bytes == 4) {
      CHECK_CUDA(cudaMemcpy(got.data(), target, bias_elements * 4, cudaMemcpyDeviceToHost));
    } else {
      std::vector<Element> typed(bias_elements);
      CHECK_CUDA(cudaMemcpy(typed.data(), target, bias_elements * 2, cudaMemcpyDeviceToHost));
      for (int64_t x = 0; x < bias_elements; ++x) got[x] = ToFloat(typed[x]);
    }
    int64_t bad = 0, first = -1;
    const double worst = Compare(got, want, c.S, tol, &bad, &first);
    std::printf("%s: worst err / tol dbias %.2f: %s\n", what, worst, bad ? "FAIL" : "PASS");
    if (bad)
      std::printf("  %lld bad dbias elements; first at element %lld (row %lld, key %lld): got %g want %g\n",
                  (long long)bad, (long long)first, (long long)(first / c.S), (long long)(first % c.S),
                  double(got[first]), double(want[first]));
    std::fflush(stdout);
    return bad == 0;
  };
  const bool ok = run_and_check("sm90 bias gradient", launch90);
  DbiasTimingRow row;
  row.shape = std::string(TypeName<Element>()) + " " + c.name;
  if (ok && c.timed) {
    const float ms = TimeLaunches(launch90);
    row.sm90 = ms > 0 ? dbias_flops / (ms * 1e-3) / 1e12 : 0.0;
    std::printf("  time sm90 bias gradient: %.3f ms, %.1f TFLOP/s (4 H N per visible pair)\n", ms, row.sm90);
  }
#ifdef JAX_FLASH_CHECK_SM80
  auto launch80 = with_clear([&] { return jax_flash::cuda::sm80::LaunchBiasGradient<Element, kHeadDim>(p, 0); });
  if (!c.timed || ok) {
    run_and_check("sm80 bias gradient (reference kernel, not counted)", launch80);
    if (c.timed) {
      const float ms80 = TimeLaunches(launch80);
      row.sm80 = ms80 > 0 ? dbias_flops / (ms80 * 1e-3) / 1e12 : 0.0;
      std::printf("  time sm80 bias gradient: %.3f ms, %.1f TFLOP/s (sm90 / sm80 speed: %.2fx)\n", ms80, row.sm80,
                  row.sm80 > 0 ? row.sm90 / row.sm80 : 0.0);
    }
  }
#endif
  if (c.timed) dbias_timing_rows.push_back(row);
  cudaFree(target);
  return ok;
}

struct FeatureTimingRow {
  std::string shape;
  double sm90 = 0, sm90_plain = 0, sm80 = 0;
  // The schedules beside the package's (FeatureBwdSchedule: `sm90` above):
  // kLeanDq (its schedule until session 19) and, at 64, kDqFirstUniform
  // over 64-query steps; each timed right after the package's.
  double sm90_lean = 0, sm90_dqfu64 = 0;
  // kMasksBiasTiles beside the package's kMasksBias16 (aligned 16-bit bias, 128).
  double sm90_tiles = 0;
};
std::vector<FeatureTimingRow> feature_timing_rows;

// A feature variant at `kSchedule`, chosen as LaunchBackwardWithFeatures
// chooses (kMasksSoftcap only where the soft cap is on), so that a
// candidate differs from the package's launch in its schedule only.
template <typename Element, int kHeadDim, jax_flash::cuda::sm90::BwdSchedule kSchedule>
std::string LaunchFeaturesScheduled(const AttentionParams& p) {
  using jax_flash::cuda::sm90::Features;
  using jax_flash::cuda::sm90::LaunchBackwardScheduled;
  if (p.features.softcap > 0.0) return LaunchBackwardScheduled<Element, kHeadDim, kSchedule, Features::kMasksSoftcap>(p, 0);
  return LaunchBackwardScheduled<Element, kHeadDim, kSchedule, Features::kMasks>(p, 0);
}

// The bias variants (kMasksBias16 for a bias of the inputs' 16-bit type,
// kMasksBias for float32) at `kSchedule` (dQ-first ones only): the check
// program's launch of them, not yet the package's (LaunchBackwardWithFeatures
// refuses a bias).
template <typename Element, int kHeadDim, jax_flash::cuda::sm90::BwdSchedule kSchedule>
std::string LaunchBiasScheduled(const AttentionParams& p) {
  using jax_flash::cuda::sm90::Features;
  using jax_flash::cuda::sm90::LaunchBackwardScheduled;
  if (p.features.bias_type != jax_flash::BiasType::kAccum)
    return LaunchBackwardScheduled<Element, kHeadDim, kSchedule, Features::kMasksBias16>(p, 0);
  return LaunchBackwardScheduled<Element, kHeadDim, kSchedule, Features::kMasksBias>(p, 0);
}

template <typename Element, int kHeadDim>
bool RunBwdFeatureCase(const FeatureCase& c) {
  using sm90_feature_check::Upload;
  const int64_t q_elems = int64_t(c.B) * c.T * c.N * c.H, kv_elems = int64_t(c.B) * c.S * c.K * c.H;
  const int64_t rows = int64_t(c.B) * c.N * c.T;
  Element *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float *lse, *delta, *dq_accum, *ref_delta, *ref_dq, *ref_dk, *ref_dv;
  CHECK_CUDA(cudaMalloc(&q, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&k, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&v, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&out, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&dout, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&dq, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&dk, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&dv, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&lse, rows * 4));
  CHECK_CUDA(cudaMalloc(&delta, rows * 4));
  CHECK_CUDA(cudaMalloc(&ref_delta, rows * 4));
  CHECK_CUDA(cudaMalloc(&dq_accum, q_elems * 4));
  CHECK_CUDA(cudaMalloc(&ref_dq, q_elems * 4));
  CHECK_CUDA(cudaMalloc(&ref_dk, kv_elems * 4));
  CHECK_CUDA(cudaMalloc(&ref_dv, kv_elems * 4));
  FillNormal<<<1024, 256>>>(q, q_elems, 21);
  FillNormal<<<1024, 256>>>(k, kv_elems, 22);
  FillNormal<<<1024, 256>>>(v, kv_elems, 23);
  FillNormal<<<1024, 256>>>(dout, q_elems, 24);
  CHECK_CUDA(cudaGetLastError());

  std::vector<int32_t> q_ids, kv_ids, q_ranges, kv_ranges;
  if (c.segments != Segments::kNone) {
    q_ids = sm90_feature_check::SegmentIds(c, c.T);
    kv_ids = sm90_feature_check::SegmentIds(c, c.S);
    if (c.segments != Segments::kDocumentsNoSummaries) {
      q_ranges = sm90_feature_check::SegmentRanges(q_ids, c.B, c.T);
      kv_ranges = sm90_feature_check::SegmentRanges(kv_ids, c.B, c.S);
    }
  }
  int32_t* d_q_lens = Upload(std::vector<int32_t>(c.q_lens.begin(), c.q_lens.end()));
  int32_t* d_kv_lens = Upload(std::vector<int32_t>(c.kv_lens.begin(), c.kv_lens.end()));
  int32_t* d_offsets = Upload(std::vector<int32_t>(c.offsets.begin(), c.offsets.end()));
  int32_t* d_q_ids = Upload(q_ids);
  int32_t* d_kv_ids = Upload(kv_ids);
  int32_t* d_q_ranges = Upload(q_ranges);
  int32_t* d_kv_ranges = Upload(kv_ranges);
  // A bias (c.bias >= 0; the forward check's bits and values, sm90_feature_check.cuh):
  // [B|1, N|1, T|1, S] contiguous, float32 or (kBias16) the inputs' type, whose
  // float copy the reference reads rounded to the same values.
  namespace fc = sm90_feature_check;
  float* d_bias = nullptr;
  Element* d_bias16 = nullptr;
  const bool with_bias = c.bias >= 0;
  const int64_t bias_b = with_bias && (c.bias & fc::kBiasBatch) ? c.B : 1,
                bias_n = with_bias && (c.bias & fc::kBiasHeads) ? c.N : 1,
                bias_t = with_bias && (c.bias & fc::kBiasRows) ? c.T : 1;
  if (with_bias) {
    const int64_t n = bias_b * bias_n * bias_t * c.S;
    CHECK_CUDA(cudaMalloc(&d_bias, n * 4));
    fc::FillBias<<<1024, 256>>>(d_bias, n, 25, (c.bias & fc::kBiasInf) != 0);
    if (c.bias & fc::kBias16) {
      CHECK_CUDA(cudaMalloc(&d_bias16, n * 2));
      fc::RoundBias<<<1024, 256>>>(d_bias, d_bias16, n);
    }
    CHECK_CUDA(cudaGetLastError());
  }

  AttentionParams p;
  p.shape = {c.B, c.T, c.S, c.N, c.K, c.H};
  p.q_stride = ContiguousBtnh(c.T, c.N, c.H);
  p.k_stride = ContiguousBtnh(c.S, c.K, c.H);
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
  p.dout = dout, p.delta = delta, p.dq = dq, p.dk = dk, p.dv = dv, p.dq_accum = dq_accum;
  if (with_bias) {
    // Stride 0 along the size-1 dims (attention.py's broadcast operands); one batch dim.
    p.features.bias = d_bias16 ? static_cast<const void*>(d_bias16) : d_bias;
    p.features.bias_type = !d_bias16                                    ? jax_flash::BiasType::kAccum
                           : std::is_same_v<Element, __nv_bfloat16> ? jax_flash::BiasType::kBFloat16
                                                                    : jax_flash::BiasType::kFloat16;
    p.features.num_batch_dims = 1;
    p.features.batch_dims[0] = c.B;
    p.features.bias_stride.col = 1;
    p.features.bias_stride.row = bias_t > 1 ? c.S : 0;
    p.features.bias_stride.head = bias_n > 1 ? bias_t * c.S : 0;
    p.features.bias_stride.batch[0] = bias_b > 1 ? bias_n * bias_t * c.S : 0;
  }
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
  const float scale = float(p.scale);

  RefFeatures rf;
  rf.q_lens = d_q_lens, rf.kv_lens = d_kv_lens, rf.offsets = d_offsets, rf.q_ids = d_q_ids, rf.kv_ids = d_kv_ids;
  rf.left = c.left, rf.right = c.right, rf.softcap = float(c.softcap);
  rf.bias = d_bias;
  rf.bias_batch = p.features.bias_stride.batch[0], rf.bias_head = p.features.bias_stride.head;
  rf.bias_row = p.features.bias_stride.row;
  const unsigned q_grid = unsigned((rows + 127) / 128), k_grid = unsigned((int64_t(c.B) * c.K * c.S + 127) / 128);
  ReferenceForwardFeatures<Element><<<q_grid, 128>>>(q, k, v, out, lse, c.B, c.T, c.S, c.N, c.K, c.H, scale,
                                                     c.causal, rf);
  ReferenceDelta<Element><<<q_grid, 128>>>(out, dout, ref_delta, c.B, c.T, c.N, c.H);
  ReferenceDqFeatures<Element><<<q_grid, 128>>>(q, k, v, dout, lse, ref_delta, ref_dq, c.B, c.T, c.S, c.N, c.K,
                                                c.H, scale, c.causal, rf);
  ReferenceDkvFeatures<Element><<<k_grid, 128>>>(q, k, v, dout, lse, ref_delta, ref_dk, ref_dv, c.B, c.T, c.S,
                                                 c.N, c.K, c.H, scale, c.causal, rf);
  CHECK_CUDA(cudaGetLastError());
  if (SynchronizeOrDie("the feature references", 300.0) != cudaSuccess) std::exit(3);
  std::vector<float> want_dq(q_elems), want_dk(kv_elems), want_dv(kv_elems);
  CHECK_CUDA(cudaMemcpy(want_dq.data(), ref_dq, q_elems * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(want_dk.data(), ref_dk, kv_elems * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(want_dv.data(), ref_dv, kv_elems * 4, cudaMemcpyDeviceToHost));
  // The plain cases' tolerances; the soft cap's tanh (TanhApprox for
  // bfloat16, 2^-11 relative) stays far inside them.
  const double tol = std::is_same_v<Element, __nv_bfloat16> ? 2e-2 : 4e-3;

  char name[320];
  std::snprintf(name, sizeof name, "%s H=%d (kHeadDim %d) B=%d T=%d S=%d N=%d K=%d causal=%d %s", TypeName<Element>(),
                c.H, kHeadDim, c.B, c.T, c.S, c.N, c.K, int(c.causal), c.name.c_str());
  auto run_and_check = [&](const char* family, auto launch) {
    char what[400];
    std::snprintf(what, sizeof what, "%s %s", family, name);
    return RunAndCheck<Element>(what, launch, dq, dk, dv, want_dq, want_dk, want_dv, {c.B, c.T, c.S, c.N, c.K, c.H},
                                tol);
  };

  // The package's launch (FeatureBwdSchedule: kDqFirstUniformCounters at
  // 128, kDqFirstUniformCountersRows128 at 64), then the schedules it
  // replaced on the same case, each counted like it: kLeanDq and, at 64,
  // kDqFirstUniform over 64-query steps (at 128 the package's without the
  // counters).
  using jax_flash::cuda::sm90::BwdSchedule;
  // A bias: the bias variants at the package's feature schedule (not yet
  // dispatched by it: LaunchBiasScheduled) and, at 64, over 64-query
  // steps; no lean-dQ (the bias variants are dQ-first only).
  auto launch90 = [&] {
    if (with_bias) return LaunchBiasScheduled<Element, kHeadDim, jax_flash::cuda::sm90::FeatureBwdSchedule(kHeadDim)>(p);
    return jax_flash::cuda::sm90::LaunchBackwardWithFeatures<Element, kHeadDim>(p, 0);
  };
  auto launch90_lean = [&] { return LaunchFeaturesScheduled<Element, kHeadDim, BwdSchedule::kLeanDq>(p); };
  constexpr bool k64 = kHeadDim == 64;
  auto launch90_dqfu64 = [&] {
    if (with_bias) return LaunchBiasScheduled<Element, kHeadDim, BwdSchedule::kDqFirstUniform>(p);
    return LaunchFeaturesScheduled<Element, kHeadDim, BwdSchedule::kDqFirstUniform>(p);
  };
  const bool ok = run_and_check(with_bias ? "sm90 features with bias (the package's feature schedule)"
                                          : "sm90 features (the package's schedule)",
                                launch90);
  const bool ok_lean = with_bias || run_and_check("sm90 features lean-dQ (former)", launch90_lean);
  // A 16-bit bias that TMA can read at 128: kMasksBiasTiles too (the bias
  // through a shared-memory tile per step, BwdBiasTile), beside the
  // package's kMasksBias16 (LaunchBiasScheduled).
  const bool tiles = with_bias && kHeadDim == 128 && jax_flash::cuda::sm90::BiasTilesServe(p);
  auto launch90_tiles = [&] {
    using jax_flash::cuda::sm90::Features;
    if constexpr (kHeadDim == 128)
      return jax_flash::cuda::sm90::LaunchBackwardScheduled<Element, kHeadDim,
                                                            jax_flash::cuda::sm90::FeatureBwdSchedule(kHeadDim),
                                                            Features::kMasksBiasTiles>(p, 0);
    return std::string("kMasksBiasTiles at head dim 128 only");
  };
  const bool ok_tiles = !tiles || run_and_check("sm90 features with bias tiles (kMasksBiasTiles)", launch90_tiles);
  const bool ok_dqfu64 = !k64 || run_and_check("sm90 features dQ-first uniform-desc 64-query steps", launch90_dqfu64);
  FeatureTimingRow row;
  double flops = 0;
  if (c.timed) {
    // Visible pairs, on the host from the same definition: 10 H flops each
    // per query head (the plain table's 2.5 x 4 B N T S H).
    RefFeatures hf;
    std::vector<int32_t> hq(c.q_lens.begin(), c.q_lens.end()), hk(c.kv_lens.begin(), c.kv_lens.end()),
        ho(c.offsets.begin(), c.offsets.end());
    hf.q_lens = hq.empty() ? nullptr : hq.data();
    hf.kv_lens = hk.empty() ? nullptr : hk.data();
    hf.offsets = ho.empty() ? nullptr : ho.data();
    hf.q_ids = q_ids.empty() ? nullptr : q_ids.data();
    hf.kv_ids = kv_ids.empty() ? nullptr : kv_ids.data();
    hf.left = c.left, hf.right = c.right;
    double pairs = 0;
    for (int b = 0; b < c.B; ++b)
      for (int i = 0; i < c.T; ++i)
        for (int j = 0; j < c.S; ++j) pairs += RefVisible(hf, b, c.T, c.S, c.causal, i, j);
    flops = 2.5 * 4.0 * c.H * c.N * pairs;
    row.shape = std::string(TypeName<Element>()) + " " + c.name;
  }
  if (ok && c.timed) {
    const float ms = TimeLaunches(launch90);
    row.sm90 = ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0;
    // The plain sm90 backward on the same shape and causality (no
    // features), over its own pairs: what the masks cost per visible pair.
    AttentionParams plain = p;
    plain.features = jax_flash::AttentionFeatures{};
    const double plain_flops = 2.5 * 4.0 * c.B * c.N * double(c.T) * c.S * c.H / (c.causal ? 2.0 : 1.0);
    const float ms_plain =
        TimeLaunches([&] { return jax_flash::cuda::sm90::LaunchBackward<Element, kHeadDim>(plain, 0); });
    row.sm90_plain = ms_plain > 0 ? plain_flops / (ms_plain * 1e-3) / 1e12 : 0.0;
    std::printf("  time sm90 features: %.3f ms, %.1f TFLOP/s over visible pairs; plain sm90 %.1f\n", ms, row.sm90,
                row.sm90_plain);
    // Each other schedule timed again right after a timing of the package's:
    // the pairs share the clocks of their moment (GPU.md: timings move 5-20%
    // between runs), as the plain path's time_against_lean.
    auto time_beside = [&](const char* label, bool passed, auto launch, double* tflops) {
      if (!passed) return;
      const float ms_ref = TimeLaunches(launch90), ms_cand = TimeLaunches(launch);
      *tflops = ms_cand > 0 ? flops / (ms_cand * 1e-3) / 1e12 : 0.0;
      std::printf("  time sm90 features %s: %.3f ms, %.1f TFLOP/s (the package's %.3fx of it, timed beside it: %.3f ms)\n",
                  label, ms_cand, *tflops, ms_ref > 0 ? ms_cand / ms_ref : 0.0, ms_ref);
    };
    if (!with_bias) time_beside("lean-dQ", ok_lean, launch90_lean, &row.sm90_lean);
    if (k64) time_beside("dQ-first uniform-desc 64-query steps", ok_dqfu64, launch90_dqfu64, &row.sm90_dqfu64);
    if (tiles) time_beside("with bias tiles", ok_tiles, launch90_tiles, &row.sm90_tiles);
  }
#ifdef JAX_FLASH_CHECK_SM80
  // sm80's feature backward on the same inputs (what serves these calls
  // without the sm90 dispatch; its errors show what the tolerance allows).
  auto launch80 = [&] { return jax_flash::cuda::sm80::LaunchBackward<Element, kHeadDim>(p, 0); };
  if (!c.timed || ok) {
    run_and_check("sm80 (reference kernel, not counted)", launch80);
    if (c.timed) {
      const float ms80 = TimeLaunches(launch80);
      row.sm80 = ms80 > 0 ? flops / (ms80 * 1e-3) / 1e12 : 0.0;
      std::printf("  time sm80 features: %.3f ms, %.1f TFLOP/s (sm90 / sm80 speed: %.2fx)\n", ms80, row.sm80,
                  row.sm80 > 0 ? row.sm90 / row.sm80 : 0.0);
    }
  }
#endif
  if (c.timed) feature_timing_rows.push_back(row);
  // The bias-gradient pass on the same inputs (the reference's lse and delta).
  const bool ok_dbias = !with_bias || CheckBiasGradient<Element, kHeadDim>(c, p, rf, ref_delta, name,
                                                                          bias_b * bias_n * bias_t * c.S, tol, flops / 2.5);

  for (void* ptr : std::initializer_list<void*>{q, k, v, out, dout, dq, dk, dv, lse, delta, ref_delta, dq_accum,
                                                ref_dq, ref_dk, ref_dv, d_q_lens, d_kv_lens, d_offsets, d_q_ids,
                                                d_kv_ids, d_q_ranges, d_kv_ranges, d_bias, d_bias16})
    if (ptr) cudaFree(ptr);
  return ok && ok_lean && ok_dqfu64 && ok_tiles && ok_dbias;
}

template <typename Element>
bool RunBwdFeatureCaseAnyHead(const FeatureCase& c) {
  if (c.H <= 64) return RunBwdFeatureCase<Element, 64>(c);
  return RunBwdFeatureCase<Element, 128>(c);
}

// The feature cases at head dims 64 and 128 (and padded 72 / 96 for two),
// then, unless quick, the timing rows (bf16, B=4, T=S=4096, N=16, H=128).
// Documents: `docs` lengths repeated along each row (SegmentIds), the same
// layout for queries and keys.
std::vector<FeatureCase> BackwardFeatureCases(bool quick) {
  std::vector<FeatureCase> cases;
  const Segments kDocs = Segments::kDocuments;
  // A bias of the shape `bits` give (sm90_feature_check.cuh: kBiasBatch,
  // kBiasHeads, kBiasRows full, else broadcast; kBias16 in the inputs'
  // type, else float32; kBiasInf some -inf elements) on case c.
  using namespace sm90_feature_check;
  auto biased = [](FeatureCase c, int bits, bool timed = false) {
    c.bias = bits;
    c.timed = timed;
    return c;
  };
  const int kBnts = kBiasBatch | kBiasHeads | kBiasRows, kNts = kBiasHeads | kBiasRows;
  for (int H : {64, 128})
    for (int causal : {0, 1}) {
      const bool cz = bool(causal);
      // Packed documents, 4 of them, boundaries inside 64- and 128-blocks
      // (300, 500, 757): trimmed query ranges, per-element ids at the
      // boundaries, one-document steps without id reads. GQA, tails.
      cases.push_back({"packed 4 documents 300/200/257/243", 2, 1000, 1000, 4, 2, H, cz, {}, {}, {}, -1, -1, kDocs,
                       {300, 200, 257, 243}});
      // T != S with documents (the same id layout on both sides).
      cases.push_back({"packed documents 130/70/400, T != S", 1, 700, 1000, 2, 1, H, cz, {}, {}, {}, -1, -1, kDocs,
                       {130, 70, 400}});
      // Ids that are not contiguous (key blocks of other ids between a
      // query block's own), and documents without block summaries (every
      // step checks ids per element).
      cases.push_back({"scattered ids (pos / 100) % 3", 1, 777, 777, 2, 2, H, cz, {}, {}, {}, -1, -1,
                       Segments::kScattered, {}});
      cases.push_back({"documents 300/200/500 without summaries", 1, 1000, 1000, 2, 1, H, cz, {}, {}, {}, -1, -1,
                       Segments::kDocumentsNoSummaries, {300, 200, 500}});
      // Windows: left only, right only, two-sided (with T != S).
      cases.push_back({"window (64, 0)", 2, 1000, 1000, 4, 2, H, cz, {}, {}, {}, 64, 0});
      cases.push_back({"window (200, -1) left only", 1, 600, 700, 2, 1, H, cz, {}, {}, {}, 200, -1});
      cases.push_back({"window (-1, 50) right only", 1, 600, 500, 2, 2, H, cz, {}, {}, {}, -1, 50});
      cases.push_back({"window (100, 37)", 1, 700, 900, 2, 2, H, cz, {}, {}, {}, 100, 37});
      // Lengths per batch row: a 0 (keys no query sees: dK = dV = 0 from
      // tiles without steps; queries that see nothing: dQ = 0), tails.
      cases.push_back({"kv lengths 1000/37/0/513", 4, 300, 1000, 4, 2, H, cz, {}, {1000, 37, 0, 513}});
      cases.push_back({"q lengths 300/129/0, kv lengths 1000/200/1000", 3, 300, 1000, 2, 1, H, cz, {300, 129, 0},
                       {1000, 200, 1000}});
      // Position offsets: a shard of a longer sequence, and one before the
      // keys (its first rows see nothing under causal).
      cases.push_back({"offsets 200/-50", 2, 300, 600, 2, 1, H, cz, {}, {}, {200, -50}});
      cases.push_back({"offsets 500/0, window (128, 0)", 2, 256, 1000, 2, 2, H, cz, {}, {}, {500, 0}, 128, 0});
      // The soft cap (its gradient through the forward's tanh).
      cases.push_back({"soft cap 30", 2, 1000, 1000, 4, 2, H, cz, {}, {}, {}, -1, -1, Segments::kNone, {}, 30.0});
      // Everything at once, and a strong cap.
      cases.push_back({"soft cap 5, kv lengths, documents, offsets, window (300, 0)", 2, 600, 900, 4, 2, H, cz, {},
                       {900, 450}, {100, 0}, 300, 0, kDocs, {250, 400}, 5.0});
      // One query row over key lengths.
      cases.push_back({"one query, kv lengths 77/0/300", 3, 1, 300, 2, 1, H, cz, {}, {77, 0, 300}});
      // A bias (the bias variants: kMasksBias16, kMasksBias for float32):
      // [B,N,T,S] with GQA and tails; [1,N,T,S] with T != S and tails in
      // both (the last step's query rows clamped, the last tile's keys past
      // S not read); [1,1,T,S] under a window; [B,1,1,S] (row stride 0: a
      // key bias) with kv lengths (a tile without steps); -inf elements (a
      // bias as a mask); float32; lengths, offsets and documents together;
      // one query row (a step of 1 query: 63 or 127 rows clamped).
      cases.push_back(biased({"16-bit bias [B,N,T,S]", 2, 1000, 1000, 4, 2, H, cz}, kBnts | kBias16));
      cases.push_back(biased({"16-bit bias [1,N,T,S], T != S", 2, 257, 333, 2, 1, H, cz}, kNts | kBias16));
      cases.push_back(biased({"16-bit bias [1,1,T,S], window (100, 37)", 1, 700, 900, 2, 2, H, cz, {}, {}, {}, 100, 37},
                             kBiasRows | kBias16));
      cases.push_back(biased({"16-bit bias [B,1,1,S], kv lengths 1000/37/0/513", 4, 300, 1000, 4, 2, H, cz, {},
                              {1000, 37, 0, 513}},
                             kBiasBatch | kBias16));
      cases.push_back(biased({"16-bit bias [1,N,T,S] with -inf elements", 1, 600, 500, 2, 1, H, cz}, kNts | kBiasInf | kBias16));
      cases.push_back(biased({"float32 bias [B,N,T,S], T != S", 2, 257, 333, 2, 1, H, cz}, kBnts));
      // A broadcast float32 bias: its gradient summed into dbias itself (no scratch).
      cases.push_back(biased({"float32 bias [1,N,T,S], window (64, 0)", 2, 300, 500, 4, 2, H, cz, {}, {}, {}, 64, 0},
                             kNts));
      cases.push_back(biased({"16-bit bias [1,N,T,S], kv lengths, documents, offsets", 2, 600, 900, 4, 2, H, cz, {},
                              {900, 450}, {100, 0}, -1, -1, kDocs, {250, 400}},
                             kNts | kBias16));
      cases.push_back(biased({"one query, 16-bit bias [B,N,T,S]", 3, 1, 300, 2, 1, H, cz}, kBnts | kBias16));
      // Rows in whole 16 bytes (S % 8 = 0) with tails of queries and keys:
      // at 128 kMasksBiasTiles too (and on [B,N,T,S] above, S = 1000), with
      // kv lengths (a tile without steps), a window, documents and offsets.
      cases.push_back(biased({"16-bit bias [1,N,T,S], T != S, S % 8 = 0", 2, 257, 336, 2, 1, H, cz}, kNts | kBias16));
      cases.push_back(biased({"16-bit bias [B,1,T,S] with -inf, kv lengths 600/99", 2, 333, 600, 4, 2, H, cz, {},
                              {600, 99}},
                             kBiasBatch | kBiasRows | kBiasInf | kBias16));
      cases.push_back(biased({"16-bit bias [1,N,T,S], window (100, 37), documents, offsets, S % 8 = 0", 2, 600, 904,
                              4, 2, H, cz, {}, {}, {100, 0}, 100, 37, kDocs, {250, 400}},
                             kNts | kBias16));
    }
  // Padded head dims in the 128 kernel (the dispatch takes 72..128).
  for (int H : {72, 96}) {
    cases.push_back({"packed 4 documents 300/200/257/243", 2, 1000, 1000, 4, 2, H, true, {}, {}, {}, -1, -1, kDocs,
                     {300, 200, 257, 243}});
    cases.push_back({"soft cap 30, window (100, 37)", 1, 700, 900, 2, 1, H, false, {}, {}, {}, 100, 37,
                     Segments::kNone, {}, 30.0});
  }
  // The bias at padded head dims: 96 in the 128 kernel (its second
  // warpgroup's 32 dQ columns), 48 in the 64 one.
  for (int causal : {0, 1})
    cases.push_back(biased({"16-bit bias [1,N,T,S], T != S", 2, 257, 333, 2, 1, 96, bool(causal)}, kNts | kBias16));
  cases.push_back(biased({"16-bit bias [B,N,T,S], T != S", 2, 257, 333, 2, 1, 48, true}, kBnts | kBias16));
  if (!quick) {
    cases.push_back({"T=4096 packed 4 documents, causal", 4, 4096, 4096, 16, 16, 128, true, {}, {}, {}, -1, -1, kDocs,
                     {1024}, 0.0, true});
    cases.push_back({"T=4096 window (512, 0), causal", 4, 4096, 4096, 16, 16, 128, true, {}, {}, {}, 512, 0,
                     Segments::kNone, {}, 0.0, true});
    // The same at head dim 64 (N = 32, as the plain table's), where the
    // candidates include 128-query steps; and the soft cap's variant
    // (kMasksSoftcap, every pair visible: the cap's cost alone) at both.
    cases.push_back({"T=4096 H=64 packed 4 documents, causal", 4, 4096, 4096, 32, 32, 64, true, {}, {}, {}, -1, -1,
                     kDocs, {1024}, 0.0, true});
    cases.push_back({"T=4096 H=64 window (512, 0), causal", 4, 4096, 4096, 32, 32, 64, true, {}, {}, {}, 512, 0,
                     Segments::kNone, {}, 0.0, true});
    cases.push_back({"T=4096 H=128 soft cap 30", 4, 4096, 4096, 16, 16, 128, false, {}, {}, {}, -1, -1,
                     Segments::kNone, {}, 30.0, true});
    cases.push_back({"T=4096 H=64 soft cap 30", 4, 4096, 4096, 32, 32, 64, false, {}, {}, {}, -1, -1,
                     Segments::kNone, {}, 30.0, true});
    // The bias variants (bf16 bias; cuDNN 208 TFLOP/s and sm80 137 at the
    // first shape, session 19), each shape as the plain table's. (No H = 64
    // [B,N,T,S] row: its dbias check alone would compare 2.1e9 elements on
    // the host, 22 GB.)
    cases.push_back(biased({"T=4096 bias [1,N,T,S]", 4, 4096, 4096, 16, 16, 128, false}, kNts | kBias16, true));
    cases.push_back(biased({"T=4096 bias [B,N,T,S]", 4, 4096, 4096, 16, 16, 128, false}, kBnts | kBias16, true));
    cases.push_back(biased({"T=4096 bias [1,N,T,S], causal", 4, 4096, 4096, 16, 16, 128, true}, kNts | kBias16, true));
    cases.push_back(biased({"T=4096 H=64 bias [1,N,T,S]", 4, 4096, 4096, 32, 32, 64, false}, kNts | kBias16, true));
  }
  return cases;
}

// The feature launcher refuses what stays on sm80 (a bias and dropout; a
// boolean mask is served by the masks' variants since FeatureStepMask reads
// it), and the plain one any feature, with a message instead of launching.
template <typename Element>
bool FeatureLauncherRejects() {
  float* buf;
  CHECK_CUDA(cudaMalloc(&buf, 16 << 20));
  Element* e = reinterpret_cast<Element*>(buf);
  AttentionParams p;
  p.shape = {1, 128, 128, 2, 2, 128};
  p.q_stride = p.k_stride = ContiguousBtnh(128, 2, 128);
  p.q = e, p.k = e, p.v = e, p.out = e, p.dout = e, p.dq = e, p.dk = e, p.dv = e;
  p.lse = buf + (1 << 20), p.delta = buf + (2 << 20), p.dq_accum = buf + (3 << 20);
  p.scale = 0.1;
  bool ok = true;
  auto expect_error = [&](const char* what, bool features) {
    const std::string err = features ? jax_flash::cuda::sm90::LaunchBackwardWithFeatures<Element, 128>(p, 0)
                                     : jax_flash::cuda::sm90::LaunchBackward<Element, 128>(p, 0);
    std::printf("%s (%s): %s\n", what, TypeName<Element>(), err.empty() ? "launched: FAIL" : err.c_str());
    ok &= !err.empty();
  };
  // (Never read: the launchers refuse before touching any buffer.)
  uint8_t* mask = reinterpret_cast<uint8_t*>(buf + (3 << 20));
  p.features.bias = buf + (2 << 20);
  expect_error("feature launcher, bias", true);
  p.features.bias = nullptr;
  p.features.dropout_rate = 0.1;
  expect_error("feature launcher, dropout", true);
  p.features.dropout_rate = 0.0;
  p.features.window_left = 16;
  expect_error("plain launcher, a window", false);
  p.features.window_left = -1;
  // The bias variants (LaunchBiasScheduled) refuse what they do not serve,
  // as the forward's: a boolean mask, dropout, the soft cap with a bias, a
  // bias broadcast along the keys, a float32 bias to the 16-bit variant
  // (and a 16-bit one to the float32 variant), and a bias-gradient target
  // (not theirs to write).
  using jax_flash::BiasType;
  using jax_flash::cuda::sm90::BwdSchedule;
  auto expect_bias_error = [&](const char* what) {
    const std::string err = LaunchBiasScheduled<Element, 128, BwdSchedule::kDqFirstUniform>(p);
    std::printf("bias variant, %s (%s): %s\n", what, TypeName<Element>(), err.empty() ? "launched: FAIL" : err.c_str());
    ok &= !err.empty();
  };
  auto reset_bias = [&] {
    p.features = jax_flash::AttentionFeatures{};
    p.features.bias = buf + (2 << 20);
    p.features.bias_type = std::is_same_v<Element, __nv_bfloat16> ? BiasType::kBFloat16 : BiasType::kFloat16;
    p.features.bias_stride.col = 1;
    p.features.bias_stride.row = 128;
  };
  reset_bias();
  p.features.mask = mask;
  expect_bias_error("and a boolean mask");
  reset_bias();
  p.features.dropout_rate = 0.1;
  expect_bias_error("and dropout");
  reset_bias();
  p.features.softcap = 30.0;
  expect_bias_error("and the soft cap");
  reset_bias();
  p.features.bias_stride.col = 0;
  expect_bias_error("broadcast along the keys");
  reset_bias();
  p.features.dbias = buf + (3 << 20);
  expect_bias_error("with a dbias target");
  reset_bias();
  p.features.bias_type = BiasType::kAccum;
  p.features.dbias_direct = buf + (3 << 20);
  expect_bias_error("float32, with a direct dbias target");
  // A 16-bit bias to the float32 variant (LaunchBiasScheduled picks by
  // the type, so through the launcher itself).
  reset_bias();
  {
    using jax_flash::cuda::sm90::Features;
    const std::string err =
        jax_flash::cuda::sm90::LaunchBackwardScheduled<Element, 128, BwdSchedule::kDqFirstUniform, Features::kMasksBias>(p, 0);
    std::printf("float32 bias variant, a 16-bit bias (%s): %s\n", TypeName<Element>(), err.empty() ? "launched: FAIL" : err.c_str());
    ok &= !err.empty();
  }
  // The bias-gradient pass (LaunchBiasGradientScheduled) refuses a call
  // without a dbias target, with a dk (sm80's contract: its dbias-only mode
  // is told by a null dk), with both targets, and what the bias variants
  // refuse (here the soft cap).
  auto expect_dbias_error = [&](const char* what) {
    const std::string err = jax_flash::cuda::sm90::LaunchBiasGradientScheduled<Element, 128>(p, 0);
    std::printf("bias gradient, %s (%s): %s\n", what, TypeName<Element>(), err.empty() ? "launched: FAIL" : err.c_str());
    ok &= !err.empty();
  };
  reset_bias();
  p.dk = nullptr;
  expect_dbias_error("no dbias target");
  p.features.dbias = buf + (3 << 20);
  p.dk = e;
  expect_dbias_error("with a dk");
  p.dk = nullptr;
  p.features.dbias_direct = buf + (3 << 20);
  expect_dbias_error("with both targets");
  p.features.dbias_direct = nullptr;
  p.features.softcap = 30.0;
  expect_dbias_error("and the soft cap");
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaFree(buf);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  // --quick: no 4096-long cases; --plain / --features: only that half;
  // --bias: only the bias cases of the features half.
  bool quick = false, plain = true, features = true, bias_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--plain") == 0) features = false;
    else if (std::strcmp(argv[i], "--features") == 0) plain = false;
    else if (std::strcmp(argv[i], "--bias") == 0) plain = false, bias_only = true;
    else {
      std::printf("unknown argument %s (--quick, --plain, --features, --bias)\n", argv[i]);
      return 2;
    }
  }
  if (!DeviceIsHopper("the sm90 backward kernels")) return 1;
  std::vector<Case> cases;
  for (int H : {64, 128})
    for (int causal : {0, 1}) {
      cases.push_back({1, 128, 128, 1, 1, H, bool(causal), false});    // one tile, one step: start here
      cases.push_back({1, 256, 256, 2, 2, H, bool(causal), false});    // whole blocks, several steps
      cases.push_back({2, 1000, 1000, 4, 2, H, bool(causal), false});  // tails + GQA, B > 1
      cases.push_back({1, 300, 129, 4, 1, H, bool(causal), false});    // Tq > Tk, MQA, a 1-key tail block
      cases.push_back({1, 129, 300, 2, 2, H, bool(causal), false});    // Tq < Tk, a 1-query tail block
      cases.push_back({3, 1, 77, 2, 1, H, bool(causal), false});       // one query row
    }
  for (int causal : {0, 1}) {
    // 237 = 128 + 109: the 128-query candidates' last step has warpgroup
    // 1's dQ share 45 rows long (5 full 8-row groups and a partial one,
    // the general send's row-tail path there), and its keys end inside
    // warpgroup 1's 64 too. GQA.
    cases.push_back({1, 237, 237, 4, 2, 64, bool(causal), false});
    // Padded head dims: TMA's zero fill beyond head_dim, only real columns
    // written (8, 48 in the 64 kernel; 72, 96, 120 in the 128 one, whose
    // second warpgroup then owns 8, 32, 56 dQ columns).
    for (int H : {8, 48, 72, 96, 120}) cases.push_back({2, 257, 333, 2, 1, H, bool(causal), false});
  }
  if (!quick)
    for (int causal : {0, 1}) {
      cases.push_back({4, 4096, 4096, 32, 32, 64, bool(causal), true});
      cases.push_back({4, 4096, 4096, 16, 16, 128, bool(causal), true});
    }
  if (!plain) cases.clear();
  int failures = 0;
  if (plain) {
    failures += !sm90_bwd_check::CheckBwdBuildingBlocks<__nv_bfloat16, 64>("bf16");
    failures += !sm90_bwd_check::CheckBwdBuildingBlocks<__nv_bfloat16, 128>("bf16");
    failures += !sm90_bwd_check::CheckBwdBuildingBlocks<__half, 128>("f16");
    failures += !RejectsUnsupported<__nv_bfloat16>();
  }
  for (const Case& c : cases) {
    failures += !RunCaseAnyHead<__nv_bfloat16>(c);
    failures += !RunCaseAnyHead<__half>(c);
  }
  if (features) {
    failures += !FeatureLauncherRejects<__nv_bfloat16>();
    for (const FeatureCase& c : BackwardFeatureCases(quick)) {
      if (bias_only && c.bias < 0) continue;
      failures += !RunBwdFeatureCaseAnyHead<__nv_bfloat16>(c);
      if (!c.timed) failures += !RunBwdFeatureCaseAnyHead<__half>(c);
    }
  }
  if (!timing_rows.empty()) {
    std::printf("\nTFLOP/s (2.5 x 4 B N T S H, halved when causal; delta pass + kernel + dQ conversion; median of 20 x 5)\n");
    std::printf("(defaults: +count at 128, M128cnt at 64, dQ-first uniform-desc (M128 at 64) for the feature variants; ratio: lean-dQ / sm80; dQ-first, uniform, dQF+unif, +diag, +count, "
                "M128, M128dqfu, M128cnt: session 17's candidates, ratio to lean-dQ each in its own line above; "
                "M128*: 128-query steps (lean-dQ, dQF+unif, +count), head dim 64 only)\n");
    std::printf("%-40s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "shape", "early-S", "serial",
                "lean-dQ", "+early-dP", "dQ-first", "uniform", "dQF+unif", "+diag", "+count", "M128", "M128dqfu",
                "M128cnt", "sm80", "ratio");
    for (const TimingRow& r : timing_rows)
      std::printf("%-40s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.2f\n",
                  r.shape.c_str(), r.sm90, r.sm90_serial, r.sm90_lean, r.sm90_lean_dp, r.sm90_dq_first,
                  r.sm90_uniform, r.sm90_dq_first_uniform, r.sm90_diag, r.sm90_counters, r.sm90_rows128,
                  r.sm90_rows128_dqfu, r.sm90_rows128_counters, r.sm80, r.sm80 > 0 ? r.sm90_lean / r.sm80 : 0.0);
  }
  if (!feature_timing_rows.empty()) {
    std::printf("\nfeature backward, TFLOP/s over visible pairs (2.5 x 4 H N per pair; plain: the plain sm90 "
                "backward, same shape and causality, over its own pairs)\n");
    std::printf("(sm90: the package's feature schedule, dQ-first uniform-desc, over 128-query steps at 64; "
                "lean-dQ: the former one; dQFu64: dQ-first uniform over 64-query steps, head dim 64 only; each "
                "timed beside the package's in its own line above; tiles: kMasksBiasTiles beside kMasksBias16; "
                "ratio: sm90 / sm80)\n");
    std::printf("%-48s %8s %8s %8s %8s %8s %8s %8s\n", "shape", "sm90", "lean-dQ", "dQFu64", "tiles", "plain", "sm80",
                "ratio");
    for (const FeatureTimingRow& r : feature_timing_rows)
      std::printf("%-48s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.2f\n", r.shape.c_str(), r.sm90, r.sm90_lean,
                  r.sm90_dqfu64, r.sm90_tiles, r.sm90_plain, r.sm80, r.sm80 > 0 ? r.sm90 / r.sm80 : 0.0);
  }
  if (!dbias_timing_rows.empty()) {
    std::printf("\nbias gradient (the dbias pass alone), TFLOP/s as 4 H N per visible pair (the forward's count, "
                "scripts/bias16_check.py's for the dbias pass); target memset + delta pass + kernel, no rounding of "
                "float32 sums (sm90: LaunchBiasGradientScheduled, the bias variants' schedule; sm80: "
                "LaunchBiasGradient, the package's; [B,N,T,S]: stores, else float32 atomics)\n");
    std::printf("%-48s %8s %8s %8s\n", "shape", "sm90", "sm80", "ratio");
    for (const DbiasTimingRow& r : dbias_timing_rows)
      std::printf("%-48s %8.1f %8.1f %8.2f\n", r.shape.c_str(), r.sm90, r.sm80, r.sm80 > 0 ? r.sm90 / r.sm80 : 0.0);
  }
  std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "ALL PASS", failures);
  if (failures)
    std::printf(
        "where to look: only the early-S schedule fails -> bwd_kernel.cuh's step order (send_dq after the "
        "next S^T, the wgmma waits); only a lean-dQ candidate fails, dq wrong -> SendDqFull (its constant "
        "offsets, the full-step test) or, early-dP, the send's place after dP^T's issue; only dQ-first fails -> "
        "its three commit groups and the wait<1> before the send; only the uniform-desc ones -> UniformDescriptor / "
        "KMajorOffset / MnMajorOffset; only diagonal-masks -> needs_masks (a step run unmasked that needed them); "
        "only counters -> the kCounters loop (step_m0, step_h against BwdSteps::m0 / head); "
        "only the 128-query ones -> BwdTraits<64, 128> (dS^T's two query chunks in StoreDsTranspose, DqDsRows / "
        "DqKCols' row split, the share's first row dq_row0 in send_dq); only the features 128-query candidate "
        "fails -> FeatureStepMask<128>'s 64-bit word (kVisibleRowBits, bit 32 hh + 2j + e) or FeatureQueryBlocks<128, "
        "128> (tests/cpp/sm90_feature_mask_test.cu checks both on the host); only dv wrong -> P^T (lse staging, masks) or dO's MN-major descriptor; dv right, dk "
        "wrong -> dS^T (delta, dP^T = V dO^T) or Q's MN-major descriptor; dk, dv right, dq wrong -> the dS^T "
        "smem tile / WgmmaSSMn descriptors or the dQ staging and bulk reduces (blocked layout, tails); only "
        "GQA or T != S fails -> BwdSteps / BwdTile; a HANG -> barrier phases (empty / q_full / do_full "
        "parity, do_full's 33 arrivals) or the named barriers.\n");
  return failures ? 1 : 0;
}
