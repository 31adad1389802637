// What the sm90 backward's A/B checks share (sm90_bwd_order_check.cu,
// sm90_bwd_deterministic_check.cu), which compare one backward against
// another rather than against a float reference: a case, its inputs and
// gradient buffers, runs on poisoned outputs brought back to the host, and
// the comparison of two runs' gradients.
//
// The inputs need not be a real forward's for that, or for timing: out is
// random and lse an estimate of the true one (log of the visible keys +
// 1/2, what standard normal logits give), so P stays finite and O(1/keys).
#pragma once

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "check_helpers.cuh"
#include "common/params.h"

namespace bwd_compare {

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

// One case's device buffers, filled (q, k, v, dout, out standard normal,
// lse estimated), and the AttentionParams of a plain call on them (bf16,
// contiguous BTNH, scale 1 / sqrt(H)).
struct Buffers {
  int64_t q_elems, kv_elems, rows;
  Element *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float *lse, *delta, *dq_accum;
  jax_flash::AttentionParams p;

  explicit Buffers(const Case& c)
      : q_elems(int64_t(c.B) * c.T * c.N * c.H),
        kv_elems(int64_t(c.B) * c.S * c.K * c.H),
        rows(int64_t(c.B) * c.N * c.T) {
    for (Element** x : {&q, &out, &dout, &dq}) CHECK_CUDA(cudaMalloc(x, q_elems * sizeof(Element)));
    for (Element** x : {&k, &v, &dk, &dv}) CHECK_CUDA(cudaMalloc(x, kv_elems * sizeof(Element)));
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
    p.shape = {c.B, c.T, c.S, c.N, c.K, c.H};
    p.q_stride = jax_flash::ContiguousBtnh(c.T, c.N, c.H);
    p.k_stride = jax_flash::ContiguousBtnh(c.S, c.K, c.H);
    p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
    p.dout = dout, p.delta = delta, p.dq = dq, p.dk = dk, p.dv = dv, p.dq_accum = dq_accum;
    p.scale = 1.0 / std::sqrt(double(c.H));
    p.is_causal = c.causal;
  }
  ~Buffers() {
    for (void* x : {(void*)q, (void*)k, (void*)v, (void*)out, (void*)dout, (void*)dq, (void*)dk, (void*)dv,
                    (void*)lse, (void*)delta, (void*)dq_accum})
      cudaFree(x);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
};

inline std::vector<Element> Download(const Element* d, int64_t n) {
  std::vector<Element> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(Element), cudaMemcpyDeviceToHost));
  return h;
}

struct Grads {
  std::vector<Element> dq, dk, dv;
};

// One run of `launch` (a backward on b.p, returning "" or its error) on
// outputs poisoned with NaN; *g gets its dq, dk, dv. A launch error is
// printed as FAIL with `name` and `what`, and returns false.
template <typename Launch>
bool RunPoisoned(const Buffers& b, Launch launch, const char* name, const char* what, Grads* g) {
  CHECK_CUDA(cudaMemset(b.dq, 0xff, b.q_elems * sizeof(Element)));
  CHECK_CUDA(cudaMemset(b.dk, 0xff, b.kv_elems * sizeof(Element)));
  CHECK_CUDA(cudaMemset(b.dv, 0xff, b.kv_elems * sizeof(Element)));
  const std::string err = launch();
  if (!err.empty()) {
    std::printf("FAIL %s: %s: %s\n", name, what, err.c_str());
    return false;
  }
  if (SynchronizeOrDie(what) != cudaSuccess) std::exit(3);
  *g = {Download(b.dq, b.q_elems), Download(b.dk, b.kv_elems), Download(b.dv, b.kv_elems)};
  return true;
}

// The first NaN of dq, dk, dv taken as one run of elements (poison a run
// left), or -1.
inline int64_t FirstNan(const Grads& g) {
  int64_t offset = 0;
  for (const auto* x : {&g.dq, &g.dk, &g.dv}) {
    for (size_t i = 0; i < x->size(); ++i)
      if (std::isnan(ToFloat((*x)[i]))) return offset + int64_t(i);
    offset += int64_t(x->size());
  }
  return -1;
}

// Elements of `got` unlike `want`: bit for bit (exact), or beyond one bf16
// rounding step of the larger magnitude (2^-7 relative, plus 1e-6 of the
// largest |want| for values near zero). NaN is always unlike. *first: the
// first unlike element, or -1.
inline int64_t Unlike(const std::vector<Element>& got, const std::vector<Element>& want, bool exact, int64_t* first) {
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

// "unlike at N elements, first F" for Unlike's count, else `good`.
inline std::string Describe(int64_t bad, int64_t first, const char* good) {
  return bad ? "unlike at " + std::to_string(bad) + " elements, first " + std::to_string(first) : std::string(good);
}

// The checks' command line: --quick (the small cases only), and --causal
// (causal cases only) where the caller takes it (causal != nullptr). False,
// after naming them, on any other argument.
inline bool ParseQuick(int argc, char** argv, bool* quick, bool* causal = nullptr) {
  *quick = false;
  if (causal != nullptr) *causal = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      *quick = true;
    } else if (causal != nullptr && std::strcmp(argv[i], "--causal") == 0) {
      *causal = true;
    } else {
      std::printf("unknown argument %s (--quick%s)\n", argv[i], causal != nullptr ? ", --causal" : "");
      return false;
    }
  }
  return true;
}

// The end of a check: its timing table where it has rows (the caller's
// title and column header printed first), then the verdict; the exit code.
inline int Report(int failures, const std::vector<std::string>& table, const char* title, const char* header) {
  if (!table.empty()) {
    std::printf("\n%s\n%s\n", title, header);
    for (const std::string& line : table) std::printf("%s\n", line.c_str());
  }
  std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "ALL PASS", failures);
  return failures ? 1 : 0;
}

}  // namespace bwd_compare
