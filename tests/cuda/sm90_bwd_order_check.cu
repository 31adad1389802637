// The sm90 backward's causal tile order on a Hopper GPU (session 20): BwdTile
// in sections of (batch, key head) pairs, sized by BackwardCausalSection or
// forced, against the order before it (one section of every pair: key
// blocks outermost over all of them), on the package's default schedule,
// bf16, head dims 64 and 128. Two kernel instantiations, so that it builds
// in well under a minute (sm90_bwd_check.cu builds every schedule).
//
// Correctness, relative to the former order (the package's until the
// sectioned one lands; the suite checks it against float64): every other
// order must give dK and dV bit for bit (each tile writes its own key rows
// once, from the same steps in the same order: a tile never run leaves the
// NaN poison, a tile run twice writes the same values) and dQ within one
// bf16 rounding step (its float32 atomics sum the tiles' shares in another
// order; a missed or repeated tile moves it by a whole key block's share).
// The inputs need not be a real forward's for that, or for timing: out is
// random and lse an estimate of the true one (log of the visible keys +
// 1/2, what standard normal logits give), so P stays finite and O(1/keys).
//
// Timing: the former and the sized order alternately, three pairs of
// TimeLaunches (median of 20 x 5 launches: delta pass, kernel, dQ
// conversion), medians; TFLOP/s as sm90_bwd_check's (2.5 x 4 B N T S H,
// halved causal).
//
//   bash scripts/sm90_bwd_order_check.sh             # builds and runs this
//   ./sm90_bwd_order_check --quick                   # the small cases only

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "check_helpers.cuh"
#include "cuda/sm90/bwd_launch.cuh"

namespace {

using jax_flash::AttentionParams;
using jax_flash::ContiguousBtnh;
using jax_flash::cuda::sm90::BackwardCausalSection;
using jax_flash::cuda::sm90::DefaultBwdSchedule;
using jax_flash::cuda::sm90::kSizedCausalSection;
using jax_flash::cuda::sm90::LaunchBackwardScheduled;
using namespace gpu_check;
using Element = __nv_bfloat16;

struct Case {
  int B, T, S, N, K, H;
  bool causal, timed;
};

// lse of row (b, h, i): log(visible keys) + 1/2 (top-left causal: i + 1 keys).
__global__ void EstimateLse(float* lse, int64_t rows, int T, int S, bool causal) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const int i = int(r % T);
    const int keys = causal ? min(i + 1, S) : S;
    lse[r] = logf(float(max(keys, 1))) + 0.5f;
  }
}

std::vector<Element> Download(const Element* d, int64_t n) {
  std::vector<Element> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(Element), cudaMemcpyDeviceToHost));
  return h;
}

// Elements of `got` unlike `want`: bit for bit (exact), or beyond one bf16
// rounding step of the larger magnitude (2^-7 relative, plus 1e-6 of the
// largest |want| for values near zero). NaN is always unlike.
int64_t Unlike(const std::vector<Element>& got, const std::vector<Element>& want, bool exact, int64_t* first) {
  float largest = 0;
  for (Element w : want) largest = std::fmax(largest, std::fabs(ToFloat(w)));
  int64_t bad = 0;
  *first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = ToFloat(got[i]), w = ToFloat(want[i]);
    bool ok;
    if (exact) ok = std::memcmp(&got[i], &want[i], sizeof(Element)) == 0 && !std::isnan(g);
    else ok = std::fabs(g - w) <= 0x1p-7f * std::fmax(std::fabs(g), std::fabs(w)) + 1e-6f * largest;
    if (!ok && bad++ == 0) *first = int64_t(i);
  }
  return bad;
}

template <int kHeadDim>
bool RunCase(const Case& c, std::vector<std::string>* table) {
  constexpr auto kSchedule = DefaultBwdSchedule(kHeadDim);
  const int64_t q_elems = int64_t(c.B) * c.T * c.N * c.H, kv_elems = int64_t(c.B) * c.S * c.K * c.H;
  const int64_t rows = int64_t(c.B) * c.N * c.T;
  Element *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float *lse, *delta, *dq_accum;
  for (Element** p : {&q, &out, &dout, &dq}) CHECK_CUDA(cudaMalloc(p, q_elems * sizeof(Element)));
  for (Element** p : {&k, &v, &dk, &dv}) CHECK_CUDA(cudaMalloc(p, kv_elems * sizeof(Element)));
  CHECK_CUDA(cudaMalloc(&lse, rows * 4));
  CHECK_CUDA(cudaMalloc(&delta, rows * 4));
  CHECK_CUDA(cudaMalloc(&dq_accum, q_elems * 4));
  FillNormal<<<1024, 256>>>(q, q_elems, 1);
  FillNormal<<<1024, 256>>>(k, kv_elems, 2);
  FillNormal<<<1024, 256>>>(v, kv_elems, 3);
  FillNormal<<<1024, 256>>>(dout, q_elems, 4);
  FillNormal<<<1024, 256>>>(out, q_elems, 5);
  EstimateLse<<<1024, 256>>>(lse, rows, c.T, c.S, c.causal);
  CHECK_CUDA(cudaGetLastError());

  AttentionParams p;
  p.shape = {c.B, c.T, c.S, c.N, c.K, c.H};
  p.q_stride = ContiguousBtnh(c.T, c.N, c.H);
  p.k_stride = ContiguousBtnh(c.S, c.K, c.H);
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
  p.dout = dout, p.delta = delta, p.dq = dq, p.dk = dk, p.dv = dv, p.dq_accum = dq_accum;
  p.scale = 1.0 / std::sqrt(double(c.H));
  p.is_causal = c.causal;
  const int pairs = c.B * c.K, sized = BackwardCausalSection(p.shape, sizeof(Element));
  char name[160];
  std::snprintf(name, sizeof name, "bf16 H=%d B=%d T=%d S=%d N=%d K=%d causal=%d (%d pairs, sized sections of %d)",
                c.H, c.B, c.T, c.S, c.N, c.K, int(c.causal), pairs, sized);
  auto order = [&](int section) {
    return [&p, section] { return LaunchBackwardScheduled<Element, kHeadDim, kSchedule>(p, 0, section); };
  };
  // One run on poisoned outputs; returns its dq, dk, dv (empty on a launch error).
  struct Grads {
    std::vector<Element> dq, dk, dv;
  };
  auto run = [&](int section, Grads* g) {
    CHECK_CUDA(cudaMemset(dq, 0xff, q_elems * sizeof(Element)));
    CHECK_CUDA(cudaMemset(dk, 0xff, kv_elems * sizeof(Element)));
    CHECK_CUDA(cudaMemset(dv, 0xff, kv_elems * sizeof(Element)));
    const std::string err = order(section)();
    if (!err.empty()) {
      std::printf("FAIL %s: section %d: %s\n", name, section, err.c_str());
      return false;
    }
    if (SynchronizeOrDie("the backward") != cudaSuccess) std::exit(3);
    *g = {Download(dq, q_elems), Download(dk, kv_elems), Download(dv, kv_elems)};
    return true;
  };
  Grads former;
  bool ok = run(0, &former);
  int64_t nan_first = -1;
  if (ok) {
    // The former order itself must write every element (poison left = a bug in it or in this harness).
    for (const auto* g : {&former.dq, &former.dk, &former.dv})
      for (size_t i = 0; i < g->size() && ok; ++i)
        if (std::isnan(ToFloat((*g)[i]))) ok = false, nan_first = int64_t(i);
    if (!ok) std::printf("FAIL %s: the former order left NaN (first at %lld)\n", name, (long long)nan_first);
  }
  for (int section : {kSizedCausalSection, 1, 5}) {
    if (!ok) break;
    if (section == kSizedCausalSection && (sized == 0 || !c.causal)) continue;  // the former order again
    Grads g;
    if (!run(section, &g)) {
      ok = false;
      break;
    }
    int64_t f_dq, f_dk, f_dv;
    const int64_t bad_dk = Unlike(g.dk, former.dk, true, &f_dk), bad_dv = Unlike(g.dv, former.dv, true, &f_dv);
    const int64_t bad_dq = Unlike(g.dq, former.dq, false, &f_dq);
    const int shown = section == kSizedCausalSection ? sized : section;
    const bool passed = bad_dk == 0 && bad_dv == 0 && bad_dq == 0;
    std::printf("%s %s: sections of %d pairs: dk %s, dv %s, dq %s\n", passed ? "PASS" : "FAIL", name, shown,
                bad_dk ? ("unlike at " + std::to_string(bad_dk) + " elements, first " + std::to_string(f_dk)).c_str()
                       : "bitwise",
                bad_dv ? ("unlike at " + std::to_string(bad_dv) + " elements, first " + std::to_string(f_dv)).c_str()
                       : "bitwise",
                bad_dq ? ("beyond a rounding step at " + std::to_string(bad_dq) + " elements, first " +
                          std::to_string(f_dq))
                             .c_str()
                       : "within a rounding step");
    ok &= passed;
  }
  if (ok && c.timed && c.causal && sized > 0) {
    std::vector<float> ms_former, ms_sized;
    for (int r = 0; r < 3; ++r) {
      ms_former.push_back(TimeLaunches(order(0)));
      ms_sized.push_back(TimeLaunches(order(kSizedCausalSection)));
    }
    const double flops = 2.5 * 4.0 * c.B * c.N * double(c.T) * c.S * c.H / 2.0;
    const float a = Median(ms_former), b = Median(ms_sized);
    const double ta = a > 0 ? flops / (a * 1e-3) / 1e12 : 0, tb = b > 0 ? flops / (b * 1e-3) / 1e12 : 0;
    std::printf("  time former %.3f ms (%.1f TFLOP/s), sized %.3f ms (%.1f TFLOP/s): %.3fx\n", a, ta, b, tb,
                b > 0 ? a / b : 0.0);
    char line[200];
    std::snprintf(line, sizeof line, "H=%-4d B=%-2d T=S=%-6d N=%-3d %6d %8.1f %8.1f %8.3f", c.H, c.B, c.T, c.N,
                  sized, ta, tb, ta > 0 ? tb / ta : 0.0);
    table->push_back(line);
  }
  for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)out, (void*)dout, (void*)dq, (void*)dk, (void*)dv,
                    (void*)lse, (void*)delta, (void*)dq_accum})
    cudaFree(ptr);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else {
      std::printf("unknown argument %s (--quick)\n", argv[i]);
      return 2;
    }
  }
  if (!DeviceIsHopper("the sm90 backward kernels")) return 1;
  std::vector<Case> cases;
  for (int H : {64, 128})
    for (int causal : {1, 0}) {
      cases.push_back({3, 1000, 1000, 8, 4, H, bool(causal), false});  // 12 pairs: sections of 5 end with 2; GQA, tails
      cases.push_back({4, 300, 129, 6, 3, H, bool(causal), false});    // Tq > Tk, a 1-key tail block
      cases.push_back({6, 129, 300, 2, 2, H, bool(causal), false});    // Tq < Tk, a 1-query tail block
    }
  if (!quick) {
    // The timed shapes (sized: 16 / 8 pairs at T = 4096, 4 / 2 at 16384),
    // checked too; the GQA one at 128 (sized 8 key heads' pairs x 4 query heads each).
    cases.push_back({4, 4096, 4096, 32, 32, 64, true, true});
    cases.push_back({4, 4096, 4096, 16, 16, 128, true, true});
    cases.push_back({1, 16384, 16384, 32, 32, 64, true, true});
    cases.push_back({1, 16384, 16384, 16, 16, 128, true, true});
    cases.push_back({4, 4096, 4096, 16, 4, 128, true, true});
  }
  int failures = 0;
  std::vector<std::string> table;
  for (const Case& c : cases) failures += !(c.H <= 64 ? RunCase<64>(c, &table) : RunCase<128>(c, &table));
  if (!table.empty()) {
    std::printf("\ncausal backward, bf16, the default schedule, TFLOP/s (former: key blocks outermost over every "
                "(batch, key head) pair; sized: BackwardCausalSection's sections of `pairs`; medians of three "
                "alternating timings)\n");
    std::printf("%-32s %6s %8s %8s %8s\n", "shape", "pairs", "former", "sized", "ratio");
    for (const std::string& line : table) std::printf("%s\n", line.c_str());
  }
  std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "ALL PASS", failures);
  return failures ? 1 : 0;
}
