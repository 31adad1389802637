// Standalone check of the sm90 forward (ffi/cuda/sm90/) on a Hopper GPU,
// before it is wired into the extension: for bf16/f16 x head dims 64/128/256
// (and padded ones) x causal x shapes with tails and GQA, every output element
// and every lse against a float reference computed on the GPU by a
// one-thread-per-row kernel, then timings (median of 20 samples after
// warm-up) beside the sm80 forward at the same shapes. Causal cases also run
// the L2-aware sectioned tile order (tile_scheduler.cuh; forced small
// sections for correctness, the launch's own sizes for the timings, which
// say which order is faster). Then the feature variants
// (sm90_feature_check.cuh): each feature against a float reference of its
// own, and the issue-19 feature table's timings. Exit code 1 on any FAIL.
// Head dim 64 runs every case twice, on two and on three consumer
// warpgroups (128- and 192-row tiles; kernel_traits.cuh's kConsumersAt64),
// and the closing A/B table says which is faster per shape.
// First the building blocks alone (sm90_building_blocks.cuh), so that a
// failing kernel comes with the likely culprit.
//
//   bash scripts/sm90_check.sh            # builds and runs this
//   ./sm90_fwd_check --quick              # skip the 4096-long cases
//   ./sm90_fwd_check --plain | --features # only the plain kernel's / the feature variants' cases
//   ./sm90_fwd_check --bias               # only the bias variants' (kMasksBias, kMasksBias16) cases and timings
//   ./sm90_fwd_check --mask               # only the boolean mask variant's (kMasksBoolean) cases and timings
//   ./sm90_fwd_check --h64                # only the plain kernel's head-dim-64 cases (two and three consumers)
// (flags combine: --features --quick is the feature cases' correctness alone)
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
#include "cuda/sm90/launch.cuh"
#include "check_helpers.cuh"
#include "sm90_building_blocks.cuh"
#include "sm90_feature_check.cuh"
#ifdef JAX_FLASH_CHECK_SM80
#include "cuda/sm80/launch.cuh"
#endif

namespace {

using jax_flash::AttentionParams;
using jax_flash::ContiguousBtnh;
using namespace gpu_check;

// The obviously correct one: one thread per (b, h, query row), two passes over
// the keys in float (the maximum, then the exponentials, sum and P V).
// Contiguous BTNH inputs; out [B,T,N,H] float; lse [B,N,T].
template <typename Element>
__global__ void ReferenceForward(const Element* q, const Element* k, const Element* v, float* out,
                                 float* lse, int B, int T, int S, int N, int K, int H, float scale,
                                 bool causal) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(B) * N * T) return;
  const int i = int(idx % T), h = int(idx / T % N), b = int(idx / (int64_t(T) * N));
  const int hk = h / (N / K);
  const Element* qr = q + ((int64_t(b) * T + i) * N + h) * H;
  const int last = causal ? std::min(i, S - 1) : S - 1;
  auto logit = [&](int j) {
    const Element* kr = k + ((int64_t(b) * S + j) * K + hk) * H;
    float dot = 0.0f;
    for (int d = 0; d < H; ++d) dot += ToFloat(qr[d]) * ToFloat(kr[d]);
    return dot * scale;
  };
  float m = -INFINITY;
  for (int j = 0; j <= last; ++j) m = fmaxf(m, logit(j));
  float acc[256];
  for (int d = 0; d < H; ++d) acc[d] = 0.0f;
  float l = 0.0f;
  for (int j = 0; j <= last; ++j) {
    const float p = expf(logit(j) - m);
    l += p;
    const Element* vr = v + ((int64_t(b) * S + j) * K + hk) * H;
    for (int d = 0; d < H; ++d) acc[d] += p * ToFloat(vr[d]);
  }
  float* o = out + ((int64_t(b) * T + i) * N + h) * H;
  for (int d = 0; d < H; ++d) o[d] = l > 0.0f ? acc[d] / l : 0.0f;
  lse[(int64_t(b) * N + h) * T + i] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// One line of the closing timing table (TFLOP/s; 0 = not run or failed).
struct TimingRow {
  std::string shape;
  double serial = 0, overlap = 0, pingpong = 0, overlap176 = 0, pingpong176 = 0, sm80 = 0;
  double sections = 0;  // the default schedule in the sectioned causal order
  const char* default_schedule = "";
};
std::vector<TimingRow> timing_rows;

struct Case {
  int B, T, S, N, K, H;
  bool causal;
  double scale;  // 0: 1 / sqrt(H)
  bool timed;
};

const char* ScheduleName(jax_flash::cuda::sm90::Schedule s) {
  using jax_flash::cuda::sm90::Schedule;
  return s == Schedule::kSerial ? "serial" : s == Schedule::kOverlap ? "overlap" : "pingpong";
}

// Every schedule of the kernel (kernel_traits.cuh), so that a failure of one
// points at its schedule rather than at the shared parts.
// block_n 176 (at 128 only): the candidate key block (kernel_traits.cuh).
// order / section_pairs: the causal tile order (launch.cuh's CausalOrder;
// section_pairs > 0 forces the section size). kConsumers: the consumer
// warpgroups (2, or 3 at 64).
template <typename Element, int kHeadDim, int kConsumers>
std::string LaunchScheduled(jax_flash::cuda::sm90::Schedule schedule, const AttentionParams& p, int max_blocks,
                            int block_n,
                            jax_flash::cuda::sm90::CausalOrder order = jax_flash::cuda::sm90::CausalOrder::kDefault,
                            int section_pairs = 0) {
  using namespace jax_flash::cuda::sm90;
  constexpr Features kPlain = Features::kNone;
  constexpr Schedule kDefault = FwdTraits<kHeadDim, 0, kConsumers>::kDefaultSchedule;
  if (order != CausalOrder::kDefault)  // the default schedule only
    return LaunchForwardScheduled<Element, kHeadDim, kDefault, 0, kPlain, kConsumers>(p, 0, max_blocks, order,
                                                                                     section_pairs);
  if constexpr (kHeadDim == 128 && kConsumers == 2) {
    if (block_n == 176) {
      if (schedule == Schedule::kOverlap)
        return LaunchForwardScheduled<Element, kHeadDim, Schedule::kOverlap, 176>(p, 0, max_blocks);
      return LaunchForwardScheduled<Element, kHeadDim, Schedule::kPingPong, 176>(p, 0, max_blocks);
    }
  }
  switch (schedule) {
    case Schedule::kSerial:
      return LaunchForwardScheduled<Element, kHeadDim, Schedule::kSerial, 0, kPlain, kConsumers>(p, 0, max_blocks);
    case Schedule::kOverlap:
      return LaunchForwardScheduled<Element, kHeadDim, Schedule::kOverlap, 0, kPlain, kConsumers>(p, 0, max_blocks);
    default:
      return LaunchForwardScheduled<Element, kHeadDim, Schedule::kPingPong, 0, kPlain, kConsumers>(p, 0, max_blocks);
  }
}

// kConsumers: 2, or 3 at 64 (the A/B of kConsumersAt64).
template <typename Element, int kHeadDim, int kConsumers = 2>
bool RunCase(const Case& c) {
  using jax_flash::cuda::sm90::DefaultConsumers;
  // "(default)": the product's own kernel (its consumer count and schedule).
  constexpr bool kProductConsumers = kConsumers == DefaultConsumers(kHeadDim);
  const char* consumers = kConsumers == 3 ? " 3wg" : kHeadDim == 64 ? " 2wg" : "";
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
  FillNormal<<<1024, 256>>>(q, q_elems, 1);
  FillNormal<<<1024, 256>>>(k, kv_elems, 2);
  FillNormal<<<1024, 256>>>(v, kv_elems, 3);
  CHECK_CUDA(cudaGetLastError());

  AttentionParams p;
  p.shape = {c.B, c.T, c.S, c.N, c.K, c.H};
  p.q_stride = ContiguousBtnh(c.T, c.N, c.H);
  p.k_stride = ContiguousBtnh(c.S, c.K, c.H);
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
  p.scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(c.H));
  p.is_causal = c.causal;

  ReferenceForward<Element><<<unsigned((lse_elems + 127) / 128), 128>>>(
      q, k, v, ref_out, ref_lse, c.B, c.T, c.S, c.N, c.K, c.H, float(p.scale), c.causal);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<Element> h_out(q_elems);
  std::vector<float> h_ref(q_elems), h_lse(lse_elems), h_ref_lse(lse_elems);
  CHECK_CUDA(cudaMemcpy(h_ref.data(), ref_out, q_elems * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(h_ref_lse.data(), ref_lse, lse_elems * 4, cudaMemcpyDeviceToHost));
  const double flops = 4.0 * c.B * c.N * double(c.T) * c.S * c.H / (c.causal ? 2.0 : 1.0);

  bool all_ok = true;
  float best_ms = 0.0f;
  TimingRow row;
  if (c.timed) {
    char shape[120];
    std::snprintf(shape, sizeof shape, "%s H=%d B=%d T=S=%d N=%d causal=%d%s", TypeName<Element>(), c.H, c.B, c.T,
                  c.N, int(c.causal), consumers);
    row.shape = shape;
  }
  using jax_flash::cuda::sm90::Schedule;
  // Every schedule on the full persistent grid, then the default one on 7
  // blocks, so that each block runs several tiles (phases across tiles);
  // at 128 also the 176-key candidate (overlap and ping-pong, also on 7).
  constexpr Schedule kDefault = jax_flash::cuda::sm90::FwdTraits<kHeadDim, 0, kConsumers>::kDefaultSchedule;
  // Causal: the sectioned order too, in sections of 1 and 3 pairs (many
  // sections, a partial last one, GQA groups split) on 7 blocks and the
  // full grid, and timed (where they are the launch's own sizes).
  using jax_flash::cuda::sm90::CausalOrder;
  struct Run {
    Schedule schedule;
    int max_blocks, block_n;
    CausalOrder order = CausalOrder::kDefault;
    int section_pairs = 0;
  };
  std::vector<Run> runs = {{Schedule::kSerial, 0, 0}, {Schedule::kOverlap, 0, 0}, {Schedule::kPingPong, 0, 0},
                           {kDefault, 7, 0}};
  if (kHeadDim == 128 && kConsumers == 2)
    runs.insert(runs.end(), {{Schedule::kOverlap, 0, 176}, {Schedule::kPingPong, 0, 176}, {Schedule::kPingPong, 7, 176}});
  if (c.causal) {
    if (c.timed) {
      runs.push_back({kDefault, 0, 0, CausalOrder::kSections, 0});
    } else {
      runs.insert(runs.end(), {{kDefault, 7, 0, CausalOrder::kSections, 1}, {kDefault, 0, 0, CausalOrder::kSections, 3}});
    }
  }
  for (const Run& run : runs) {
    const Schedule schedule = run.schedule;
    auto launch = [&] {
      return LaunchScheduled<Element, kHeadDim, kConsumers>(schedule, p, run.max_blocks, run.block_n, run.order,
                                                            run.section_pairs);
    };
    const bool sectioned = run.order == CausalOrder::kSections;
    const bool is_default = kProductConsumers && schedule == kDefault && run.max_blocks == 0 && run.block_n == 0 &&
                            !sectioned;
    // This consumer count's own default schedule (the A/B table's entries).
    const bool is_own_default = schedule == kDefault && run.max_blocks == 0 && run.block_n == 0 && !sectioned;
    if (run.max_blocks > 0 && c.timed) continue;  // the full-grid runs cover these sizes
    char sections[64] = "";
    if (sectioned)
      std::snprintf(sections, sizeof sections, run.section_pairs ? " sections of %d pairs" : " sections (launch's size)",
                    run.section_pairs);
    char name[300];
    std::snprintf(name, sizeof name, "%s H=%d (kHeadDim %d%s) B=%d T=%d S=%d N=%d K=%d causal=%d scale=%.3g %s%s%s%s%s",
                  TypeName<Element>(), c.H, kHeadDim, consumers, c.B, c.T, c.S, c.N, c.K, int(c.causal), p.scale,
                  ScheduleName(schedule), run.block_n ? " 176 keys" : "", is_default ? " (default)" : "",
                  run.max_blocks ? " on 7 blocks" : "", sections);
    Poison<<<1024, 256>>>(reinterpret_cast<uint16_t*>(out), q_elems);
    Poison<<<1024, 256>>>(reinterpret_cast<uint16_t*>(lse), lse_elems * 2);
    CHECK_CUDA(cudaGetLastError());
    bool ok = true;
    const std::string err = launch();
    const cudaError_t sync = sm90_check::SynchronizeOrDie(name);
    if (!err.empty() || sync != cudaSuccess) {
      std::printf("%s: FAIL (%s%s)\n", name, err.c_str(), sync != cudaSuccess ? cudaGetErrorString(sync) : "");
      std::fflush(stdout);
      if (sync != cudaSuccess) std::exit(3);  // the context is gone
      all_ok = false;
      continue;
    }
    CHECK_CUDA(cudaMemcpy(h_out.data(), out, q_elems * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(h_lse.data(), lse, lse_elems * 4, cudaMemcpyDeviceToHost));
    // Tolerances relative to the 16-bit type: P and O are rounded to it.
    const double atol = std::is_same_v<Element, __nv_bfloat16> ? 2e-2 : 4e-3;
    double max_abs = 0, max_ratio = 0, lse_abs = 0, lse_ratio = 0;
    int64_t bad = 0, first_bad = -1, bad_lse = 0, first_bad_lse = -1;
    for (int64_t i = 0; i < q_elems; ++i) {
      const double got = ToFloat(h_out[i]), want = h_ref[i], e = std::fabs(got - want);
      const double tol = atol * std::max(1.0, std::fabs(want));
      if (!(e <= tol)) {  // NaN (unwritten) fails too
        if (first_bad < 0) first_bad = i;
        ++bad;
      }
      if (std::isfinite(e)) max_abs = std::max(max_abs, e), max_ratio = std::max(max_ratio, e / tol);
      else max_ratio = INFINITY;
    }
    for (int64_t i = 0; i < lse_elems; ++i) {
      const double got = h_lse[i], want = h_ref_lse[i];
      const double e = (got == want) ? 0.0 : std::fabs(got - want);  // both -inf: equal
      const double tol = 1e-3 * std::max(1.0, std::fabs(want));
      if (!(e <= tol)) {
        if (first_bad_lse < 0) first_bad_lse = i;
        ++bad_lse;
      }
      if (std::isfinite(e)) lse_abs = std::max(lse_abs, e), lse_ratio = std::max(lse_ratio, e / tol);
      else lse_ratio = INFINITY;
    }
    ok = bad == 0 && bad_lse == 0;
    all_ok &= ok;
    std::printf("%s: out max abs err %.3g (%.2f of tol), lse max abs err %.3g (%.2f of tol): %s\n", name,
                max_abs, max_ratio, lse_abs, lse_ratio, ok ? "PASS" : "FAIL");
    if (bad) {
      const int64_t i = first_bad, d = i % c.H, h = i / c.H % c.N, t = i / (int64_t(c.H) * c.N) % c.T,
                    b = i / (int64_t(c.H) * c.N * c.T);
      std::printf("  %lld bad out elements; first at b=%lld t=%lld h=%lld d=%lld: got %g want %g\n",
                  (long long)bad, (long long)b, (long long)t, (long long)h, (long long)d,
                  double(ToFloat(h_out[i])), double(h_ref[i]));
    }
    if (bad_lse) {
      const int64_t i = first_bad_lse;
      std::printf("  %lld bad lse; first at b=%lld h=%lld t=%lld: got %g want %g\n", (long long)bad_lse,
                  (long long)(i / (int64_t(c.N) * c.T)), (long long)(i / c.T % c.N), (long long)(i % c.T),
                  double(h_lse[i]), double(h_ref_lse[i]));
    }
    if (ok && c.timed) {
      const float ms = TimeLaunches(launch);
      std::printf("  time sm90 %s%s%s: %.3f ms, %.1f TFLOP/s\n", ScheduleName(schedule),
                  run.block_n ? " 176 keys" : "", sections, ms, flops / (ms * 1e-3) / 1e12);
      if (is_own_default) best_ms = ms;
      const double tflops = ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0;
      if (sectioned)
        row.sections = tflops;
      else if (run.block_n == 176)
        (schedule == Schedule::kOverlap ? row.overlap176 : row.pingpong176) = tflops;
      else
        (schedule == Schedule::kSerial ? row.serial : schedule == Schedule::kOverlap ? row.overlap : row.pingpong) =
            tflops;
      row.default_schedule = ScheduleName(kDefault);
    }
    std::fflush(stdout);
  }
#ifdef JAX_FLASH_CHECK_SM80
  if (all_ok && c.timed && best_ms > 0 && kConsumers == 2) {  // once per shape
    const float ms80 = TimeLaunches([&] { return jax_flash::cuda::sm80::LaunchForward<Element, kHeadDim>(p, 0); });
    if (ms80 > 0) {
      std::printf("  time sm80: %.3f ms, %.1f TFLOP/s (sm90 default / sm80 speed: %.2fx)\n", ms80,
                  flops / (ms80 * 1e-3) / 1e12, ms80 / best_ms);
      row.sm80 = flops / (ms80 * 1e-3) / 1e12;
    } else {
      std::printf("  time sm80: launch failed\n");
    }
  }
#endif
  if (c.timed) timing_rows.push_back(row);

  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(lse), cudaFree(ref_out), cudaFree(ref_lse);
  return all_ok;
}

template <typename Element>
bool RunCaseAnyHead(const Case& c) {
  if (c.H <= 64) {
    const bool two = RunCase<Element, 64, 2>(c);
    return RunCase<Element, 64, 3>(c) && two;
  }
  if (c.H <= 128) return RunCase<Element, 128>(c);
  return RunCase<Element, 256>(c);
}

// The launcher refuses what TMA cannot read (here: a misaligned q) with a
// message instead of launching.
template <typename Element>
bool RejectsMisaligned() {
  Element* buf;
  CHECK_CUDA(cudaMalloc(&buf, 4 << 20));
  AttentionParams p;
  p.shape = {1, 128, 128, 2, 2, 128};
  p.q_stride = p.k_stride = ContiguousBtnh(128, 2, 128);
  p.q = buf + 1, p.k = buf, p.v = buf, p.out = buf + (1 << 19);
  p.lse = buf + (3 << 19);
  p.scale = 0.1;
  const std::string err = jax_flash::cuda::sm90::LaunchForward<Element, 128>(p, 0);
  cudaFree(buf);
  std::printf("misaligned q (%s): %s\n", TypeName<Element>(), err.empty() ? "launched: FAIL" : err.c_str());
  return !err.empty();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, plain = true, features = true, bias_only = false, mask_only = false, h64 = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--plain") == 0) features = false;
    if (std::strcmp(argv[i], "--features") == 0) plain = false;
    if (std::strcmp(argv[i], "--bias") == 0) plain = false, bias_only = true;
    if (std::strcmp(argv[i], "--mask") == 0) plain = false, mask_only = true;
    if (std::strcmp(argv[i], "--h64") == 0) h64 = true, features = false;
  }
  if (!DeviceIsHopper("the sm90 forward kernels")) return 1;
  std::vector<Case> cases;
  for (int H : {64, 128, 256})
    for (int causal : {0, 1}) {
      cases.push_back({2, 1000, 1000, 4, 2, H, bool(causal), 0, false});  // tails + GQA
      cases.push_back({1, 128, 300, 2, 2, H, bool(causal), 0, false});    // Tq < Tk
      cases.push_back({1, 300, 128, 4, 1, H, bool(causal), 0, false});    // Tq > Tk, MQA
      cases.push_back({3, 1, 77, 2, 1, H, bool(causal), 0, false});       // one query row
      cases.push_back({1, 512, 512, 2, 2, H, bool(causal), 1.0, false});  // peaked softmax: rescales
    }
  for (int causal : {0, 1}) {
    // Padded head dims: TMA's zero fill beyond head_dim, only real columns written.
    cases.push_back({2, 257, 333, 2, 1, 48, bool(causal), 0, false});
    cases.push_back({2, 257, 333, 2, 1, 96, bool(causal), 0, false});
    cases.push_back({2, 257, 333, 2, 1, 200, bool(causal), 0, false});
  }
  if (!quick) {
    for (int causal : {0, 1}) {
      cases.push_back({4, 4096, 4096, 32, 32, 64, bool(causal), 0, true});
      cases.push_back({4, 4096, 4096, 16, 16, 128, bool(causal), 0, true});
      cases.push_back({4, 4096, 4096, 8, 8, 256, bool(causal), 0, true});
    }
    // The causal shapes that lag FlashAttention-3 most (short T, many
    // heads), for the tile order's timings.
    cases.push_back({4, 1024, 1024, 16, 16, 128, true, 0, true});
    cases.push_back({4, 4096, 4096, 16, 16, 64, true, 0, true});
    cases.push_back({4, 1024, 1024, 8, 8, 256, true, 0, true});
    // Head dim 64's short sequences (FlashAttention-3's benchmark: 16k tokens, 2048 wide).
    for (int causal : {0, 1}) cases.push_back({16, 1024, 1024, 32, 32, 64, bool(causal), 0, true});
  }
  int failures = 0;
  failures += !sm90_check::CheckBuildingBlocks<__nv_bfloat16, 64>("bf16");
  failures += !sm90_check::CheckBuildingBlocks<__nv_bfloat16, 128>("bf16");
  failures += !sm90_check::CheckBuildingBlocks<__nv_bfloat16, 256>("bf16");
  failures += !sm90_check::CheckBuildingBlocks<__half, 128>("f16");
  failures += !RejectsMisaligned<__nv_bfloat16>();
  failures += !sm90_feature_check::RejectsBias<__nv_bfloat16>();
  failures += !sm90_feature_check::RejectsMask<__nv_bfloat16>();
  for (const Case& c : cases) {
    if (!plain) break;
    if (h64 && c.H > 64) continue;
    failures += !RunCaseAnyHead<__nv_bfloat16>(c);
    failures += !RunCaseAnyHead<__half>(c);
  }
  for (const sm90_feature_check::FeatureCase& c : sm90_feature_check::FeatureCases(quick)) {
    if (!features) break;
    if (bias_only && c.bias < 0) continue;
    if (mask_only && c.mask < 0) continue;
    failures += !sm90_feature_check::RunFeatureCaseAnyHead<__nv_bfloat16>(c);
    if (!c.timed) failures += !sm90_feature_check::RunFeatureCaseAnyHead<__half>(c);
  }
  if (!timing_rows.empty()) {
    std::printf("\nTFLOP/s (4 B N T S H, halved when causal; median of 20 x 5 launches)\n");
    std::printf("%-44s %8s %8s %8s %8s %8s %8s %8s  default\n", "shape", "serial", "overlap", "pingpong", "ov176",
                "pp176", "sections", "sm80");
    for (const TimingRow& r : timing_rows) {
      std::printf("%-44s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f  %s\n", r.shape.c_str(), r.serial, r.overlap,
                  r.pingpong, r.overlap176, r.pingpong176, r.sections, r.sm80, r.default_schedule);
    }
    // Head dim 64: two against three consumer warpgroups, each at its best
    // schedule of the order-0 columns (kConsumersAt64's A/B).
    std::printf("\nhead dim 64, consumer warpgroups (kernel_traits.cuh's kConsumersAt64 is %d):\n",
                jax_flash::cuda::sm90::kConsumersAt64);
    auto best = [](const TimingRow& r) { return std::max({r.serial, r.overlap, r.pingpong}); };
    for (const TimingRow& three : timing_rows) {
      const std::string& name = three.shape;
      if (name.size() < 4 || name.compare(name.size() - 4, 4, " 3wg") != 0) continue;
      const std::string two_name = name.substr(0, name.size() - 4) + " 2wg";
      for (const TimingRow& two : timing_rows) {
        if (two.shape != two_name) continue;
        std::printf("  %-40s 2wg %7.1f, 3wg %7.1f (pingpong %7.1f vs %7.1f): %s faster (%.3fx)\n",
                    name.substr(0, name.size() - 4).c_str(), best(two), best(three), two.pingpong, three.pingpong,
                    best(three) > best(two) ? "3wg" : "2wg", best(two) > 0 ? best(three) / best(two) : 0.0);
      }
    }
    // The causal order: the sectioned one (default schedule) against the
    // default order (the same schedule's column: order 0 where
    // DefaultCausalOrder picks it), per causal shape.
    std::printf("\ncausal tile order (default schedule; tile_scheduler.cuh's DefaultCausalOrder: sections up to head "
                "dim 128, and at 256 up to 2 MiB of K/V per key head; all heads otherwise):\n");
    for (const TimingRow& r : timing_rows) {
      if (r.sections <= 0) continue;
      const std::string def = r.default_schedule;
      const double order0 = def == "serial" ? r.serial : def == "overlap" ? r.overlap : r.pingpong;
      std::printf("  %-40s default order %7.1f, sections %7.1f: %s faster (%.3fx)\n", r.shape.c_str(), order0,
                  r.sections, r.sections > order0 ? "sections" : "default order",
                  order0 > 0 ? r.sections / order0 : 0.0);
    }
  }
  sm90_feature_check::PrintFeatureTimings();
  std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "ALL PASS", failures);
  if (failures)
    std::printf(
        "where to look: building blocks S wrong -> TMA swizzle / K-major descriptors (pipeline.cuh "
        "KMajorDescriptor, tensor_map.h); O wrong -> V's MN-major descriptor (VDescriptor) or the A "
        "fragment order (softmax.cuh ToFragments); blocks pass but every schedule fails -> masks, "
        "softmax, epilogue or the ring's phases; only overlap/pingpong fail -> fwd_kernel.cuh's step "
        "(waits, turns); only 'on 7 blocks' fails -> phases across tiles (q_empty, pipe, tile_iter); "
        "padded head dims only -> TMA fill beyond head_dim or the epilogue's column bound; only 'sections' "
        "runs fail -> tile_scheduler.cuh's Next/Decode (holes, tile_iter); only feature cases fail -> "
        "feature_mask.cuh (FeatureKeyBlocks ranges: producer and consumers must agree; FeatureBlockMask: bounds "
        "or ids; soft cap).\n");
  return failures ? 1 : 0;
}
