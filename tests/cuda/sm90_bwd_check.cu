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
//   bash scripts/sm90_bwd_check.sh         # builds and runs this
//   ./sm90_bwd_check --quick               # skip the 4096-long cases
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
  std::vector<Element> got_dq(q_elems), got_dk(kv_elems), got_dv(kv_elems);
  // Tolerances relative to the 16-bit type: P and dS are rounded to it.
  const double tol = std::is_same_v<Element, __nv_bfloat16> ? 2e-2 : 4e-3;
  const double flops = 2.5 * 4.0 * c.B * c.N * double(c.T) * c.S * c.H / (c.causal ? 2.0 : 1.0);

  char name[200];
  std::snprintf(name, sizeof name, "%s H=%d (kHeadDim %d) B=%d T=%d S=%d N=%d K=%d causal=%d", TypeName<Element>(),
                c.H, kHeadDim, c.B, c.T, c.S, c.N, c.K, int(c.causal));
  // Runs a backward (sm90, or sm80 for the comparison) and checks it;
  // returns whether every element passed.
  auto run_and_check = [&](const char* family, auto launch) {
    Poison<<<1024, 256>>>(reinterpret_cast<uint16_t*>(dq), q_elems);
    Poison<<<1024, 256>>>(reinterpret_cast<uint16_t*>(dk), kv_elems);
    Poison<<<1024, 256>>>(reinterpret_cast<uint16_t*>(dv), kv_elems);
    CHECK_CUDA(cudaGetLastError());
    const std::string err = launch();
    char what[260];
    std::snprintf(what, sizeof what, "%s %s", family, name);
    const cudaError_t sync = SynchronizeOrDie(what);
    if (!err.empty() || sync != cudaSuccess) {
      std::printf("%s: FAIL (%s%s)\n", what, err.c_str(), sync != cudaSuccess ? cudaGetErrorString(sync) : "");
      std::fflush(stdout);
      if (sync != cudaSuccess) std::exit(3);  // the context is gone
      return false;
    }
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
  };

  // Both schedules (bwd_kernel_traits.cuh), the default (kEarlyS) first:
  // a failure of only one points at its step order.
  using jax_flash::cuda::sm90::BwdSchedule;
  using jax_flash::cuda::sm90::LaunchBackwardScheduled;
  auto launch90 = [&] { return LaunchBackwardScheduled<Element, kHeadDim, BwdSchedule::kEarlyS>(p, 0); };
  auto launch90_serial = [&] { return LaunchBackwardScheduled<Element, kHeadDim, BwdSchedule::kSerial>(p, 0); };
  bool ok = run_and_check("sm90 early-S (default)", launch90);
  ok &= run_and_check("sm90 serial", launch90_serial);
  TimingRow row;
  if (ok && c.timed) {
    const float ms = TimeLaunches(launch90), ms_serial = TimeLaunches(launch90_serial);
    row.sm90 = ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0;
    row.sm90_serial = ms_serial > 0 ? flops / (ms_serial * 1e-3) / 1e12 : 0.0;
    std::printf("  time sm90 early-S: %.3f ms, %.1f TFLOP/s; serial: %.3f ms, %.1f TFLOP/s\n", ms, row.sm90,
                ms_serial, row.sm90_serial);
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
      std::printf("  time sm80: %.3f ms, %.1f TFLOP/s (sm90 / sm80 speed: %.2fx)\n", ms80, row.sm80,
                  row.sm80 > 0 ? row.sm90 / row.sm80 : 0.0);
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
  return ok;
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

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  if (prop.major != 9) {
    std::printf("the sm90 backward needs compute capability 9.0: FAIL\n");
    return 1;
  }
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
  int failures = 0;
  failures += !sm90_bwd_check::CheckBwdBuildingBlocks<__nv_bfloat16, 64>("bf16");
  failures += !sm90_bwd_check::CheckBwdBuildingBlocks<__nv_bfloat16, 128>("bf16");
  failures += !sm90_bwd_check::CheckBwdBuildingBlocks<__half, 128>("f16");
  failures += !RejectsUnsupported<__nv_bfloat16>();
  for (const Case& c : cases) {
    failures += !RunCaseAnyHead<__nv_bfloat16>(c);
    failures += !RunCaseAnyHead<__half>(c);
  }
  if (!timing_rows.empty()) {
    std::printf("\nTFLOP/s (2.5 x 4 B N T S H, halved when causal; delta pass + kernel + dQ conversion; median of 20 x 5)\n");
    std::printf("%-40s %8s %8s %8s %8s\n", "shape", "early-S", "serial", "sm80", "ratio");
    for (const TimingRow& r : timing_rows)
      std::printf("%-40s %8.1f %8.1f %8.1f %8.2f\n", r.shape.c_str(), r.sm90, r.sm90_serial, r.sm80,
                  r.sm80 > 0 ? r.sm90 / r.sm80 : 0.0);
  }
  std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "ALL PASS", failures);
  if (failures)
    std::printf(
        "where to look: only the early-S schedule fails -> bwd_kernel.cuh's step order (send_dq after the "
        "next S^T, the wgmma waits); only dv wrong -> P^T (lse staging, masks) or dO's MN-major descriptor; dv right, dk "
        "wrong -> dS^T (delta, dP^T = V dO^T) or Q's MN-major descriptor; dk, dv right, dq wrong -> the dS^T "
        "smem tile / WgmmaSSMn descriptors or the dQ staging and bulk reduces (blocked layout, tails); only "
        "GQA or T != S fails -> BwdSteps / BwdTile; a HANG -> barrier phases (empty / q_full / do_full "
        "parity, do_full's 33 arrivals) or the named barriers.\n");
  return failures ? 1 : 0;
}
