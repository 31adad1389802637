// Standalone check of the decode kernels (ffi/cuda/decode/) on a GPU, before
// they are wired into the extension: the split-KV forward, contiguous and
// paged, against a float reference computed on the GPU by a
// one-thread-per-(sequence, token, head) kernel with two passes over the
// keys. Every output element and every lse is compared, with bf16/f16
// relative tolerances, for forced split counts 1, 3 and 37 and the automatic
// one (outputs poisoned with NaN before each launch). Then timings (median
// of 20 samples of 5 launches, after warm-up) of the decode shapes of issue
// 22 beside the floor (K and V bytes at 4.3 TB/s). Exit code 1 on any FAIL.
//
//   bash scripts/decode_check.sh        # builds and runs this
//   ./decode_check --quick              # skip the S = 33000 cases and the timings
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/paged_params.h"
#include "common/params.h"
#include "cuda/decode/launch.cuh"
#include "check_helpers.cuh"

namespace {

using jax_flash::AttentionParams;
using jax_flash::ContiguousBtnh;
using jax_flash::PagedParams;
namespace decode = jax_flash::cuda::decode;
using namespace gpu_check;

// The reference's view of a call, spelled out without the kernels' headers:
// contiguous K/V [B, S, K, H], or a paged pool [num_blocks, block_size, K, H]
// read through table [B, max_blocks] (ids clamped into [0, num_blocks),
// lengths into [0, max_blocks * block_size]).
struct RefProblem {
  int B, Tq, S, N, K, H;
  float scale, softcap;
  bool causal;
  int window_left, window_right;
  const int32_t* kv_lens;  // contiguous, or null: S
  const int32_t* offsets;  // contiguous, or null: 0 (query t at position t + offset)
  const int32_t* table;    // paged, or null
  const int32_t* seq_lens;
  int num_blocks, block_size, max_blocks;
};

// One thread per (b, t, h): the maximum over its visible keys, then the
// exponentials, their sum and P V, all in float. out [B, Tq, N, H], lse [B, N, Tq].
template <typename Element>
__global__ void ReferenceForward(RefProblem r, const Element* q, const Element* k, const Element* v, float* out,
                                 float* lse) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(r.B) * r.N * r.Tq) return;
  const int h = int(idx % r.N), t = int(idx / r.N % r.Tq), b = int(idx / (int64_t(r.N) * r.Tq));
  const int hk = h / (r.N / r.K);
  int64_t len, pos;
  if (r.table) {
    len = std::min<int64_t>(std::max(r.seq_lens[b], 0), int64_t(r.max_blocks) * r.block_size);
    pos = len - r.Tq + t;
  } else {
    len = r.kv_lens ? std::min(std::max(r.kv_lens[b], 0), r.S) : r.S;
    pos = t + (r.offsets ? r.offsets[b] : 0);
  }
  auto visible = [&](int64_t j) {
    if (j >= len) return false;
    if ((r.causal || r.table) && j > pos) return false;
    if (r.window_left >= 0 && j < pos - r.window_left) return false;
    if (!r.table && r.window_right >= 0 && j > pos + r.window_right) return false;
    return true;
  };
  auto row = [&](const Element* base, int64_t j) {
    if (!r.table) return base + ((int64_t(b) * r.S + j) * r.K + hk) * r.H;
    int id = r.table[int64_t(b) * r.max_blocks + j / r.block_size];
    id = id < 0 ? 0 : (id >= r.num_blocks ? r.num_blocks - 1 : id);
    return base + ((int64_t(id) * r.block_size + j % r.block_size) * r.K + hk) * r.H;
  };
  const Element* qr = q + ((int64_t(b) * r.Tq + t) * r.N + h) * r.H;
  auto logit = [&](int64_t j) {
    const Element* kr = row(k, j);
    float dot = 0.0f;
    for (int d = 0; d < r.H; ++d) dot += ToFloat(qr[d]) * ToFloat(kr[d]);
    float x = dot * r.scale;
    if (r.softcap > 0.0f) x = r.softcap * tanhf(x / r.softcap);
    return x;
  };
  float m = -INFINITY;
  for (int64_t j = 0; j < len; ++j)
    if (visible(j)) m = fmaxf(m, logit(j));
  float acc[256];
  for (int d = 0; d < r.H; ++d) acc[d] = 0.0f;
  float l = 0.0f;
  for (int64_t j = 0; j < len; ++j) {
    if (!visible(j)) continue;
    const float p = expf(logit(j) - m);
    l += p;
    const Element* vr = row(v, j);
    for (int d = 0; d < r.H; ++d) acc[d] += p * ToFloat(vr[d]);
  }
  float* o = out + ((int64_t(b) * r.Tq + t) * r.N + h) * r.H;
  for (int d = 0; d < r.H; ++d) o[d] = l > 0.0f ? acc[d] / l : 0.0f;
  lse[(int64_t(b) * r.N + h) * r.Tq + t] = l > 0.0f ? m + logf(l) : -INFINITY;
}

struct Case {
  int B, Tq, S, N, K, H;
  bool causal;
  bool bottom_right;  // causal / window at position offsets len_b - Tq (the decode alignment)
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool ragged = false;  // kv lengths over 1..S (first 1, second S)
  int block_size = 0;   // > 0: paged, with a shuffled pool and clamped ids / lengths
};

std::string Describe(const Case& c) {
  char buf[300];
  std::snprintf(buf, sizeof buf, "%s Tq=%d S=%d B=%d N=%d K=%d (G=%d) H=%d causal=%d%s window=(%d,%d) softcap=%g%s",
                c.block_size ? "paged" : "contiguous", c.Tq, c.S, c.B, c.N, c.K, c.N / c.K, c.H, int(c.causal),
                c.bottom_right ? " bottom-right" : "", c.window_left, c.window_right, c.softcap,
                c.ragged ? " ragged" : "");
  std::string s = buf;
  if (c.block_size) s += " block_size=" + std::to_string(c.block_size);
  return s;
}

template <typename Element, int kHeadDim>
std::string Launch(const Case& c, const AttentionParams& p, const PagedParams& pp, int splits, float* scratch,
                   int64_t partial_out_floats, int* used) {
  float* lse_part = scratch + partial_out_floats;
  if (c.block_size) return decode::LaunchPagedForward<Element, kHeadDim>(pp, splits, scratch, lse_part, 0, used);
  return decode::LaunchForward<Element, kHeadDim>(p, splits, scratch, lse_part, 0, used);
}

constexpr int kManySplits = 37;

template <typename Element, int kHeadDim>
bool RunCase(const Case& c, std::mt19937& rng) {
  const int64_t q_elems = int64_t(c.B) * c.Tq * c.N * c.H, lse_elems = int64_t(c.B) * c.N * c.Tq;
  // Lengths: S, or ragged over [1, S]; paged adds one beyond the table and
  // one negative (both clamped) when B allows.
  std::vector<int32_t> lens(c.B, c.S);
  if (c.ragged)
    for (int b = 0; b < c.B; ++b) lens[b] = b == 0 ? 1 : b == 1 ? c.S : 1 + int(rng() % uint32_t(c.S));
  int max_blocks = 0, num_blocks = 0;
  std::vector<int32_t> table, seq_lens = lens;
  if (c.block_size) {
    max_blocks = (c.S + c.block_size - 1) / c.block_size;
    num_blocks = c.B * max_blocks + 3;  // a few never referenced
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    table.resize(int64_t(c.B) * max_blocks);
    for (int64_t i = 0; i < int64_t(table.size()); ++i) table[i] = perm[i];
    // Ids past each sequence's length: never read, so garbage.
    for (int b = 0; b < c.B; ++b) {
      const int used_blocks = (std::min(std::max(lens[b], 0), c.S) + c.block_size - 1) / c.block_size;
      for (int i = used_blocks; i < max_blocks; ++i) table[int64_t(b) * max_blocks + i] = i % 2 ? -1 : 1 << 30;
    }
    // Out-of-range ids that are read: two of the last sequence's (full
    // length unless ragged; clamped to 0 and num_blocks - 1, so those
    // positions read other blocks, as the reference does).
    const int64_t last = int64_t(c.B - 1) * max_blocks;
    if (max_blocks > 2) table[last + 1] = -7, table[last + 2] = num_blocks + 5;
    // Lengths beyond the table and negative ones are clamped (ragged, B >= 4:
    // sequence 2 then reads its whole table row, garbage ids clamped).
    if (c.ragged && c.B >= 4) seq_lens[2] = max_blocks * c.block_size + 1000, seq_lens[3] = -3;
  }
  const int64_t kv_elems = c.block_size ? int64_t(num_blocks) * c.block_size * c.K * c.H : int64_t(c.B) * c.S * c.K * c.H;
  std::vector<int32_t> offsets(c.B);
  for (int b = 0; b < c.B; ++b) offsets[b] = lens[b] - c.Tq;

  Element *q, *k, *v, *out;
  float *lse, *ref_out, *ref_lse;
  int32_t *d_lens, *d_offsets, *d_table = nullptr, *d_seq_lens = nullptr;
  CHECK_CUDA(cudaMalloc(&q, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&k, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&v, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&out, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&lse, lse_elems * 4));
  CHECK_CUDA(cudaMalloc(&ref_out, q_elems * 4));
  CHECK_CUDA(cudaMalloc(&ref_lse, lse_elems * 4));
  CHECK_CUDA(cudaMalloc(&d_lens, c.B * 4));
  CHECK_CUDA(cudaMalloc(&d_offsets, c.B * 4));
  CHECK_CUDA(cudaMemcpy(d_lens, lens.data(), c.B * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_offsets, offsets.data(), c.B * 4, cudaMemcpyHostToDevice));
  if (c.block_size) {
    CHECK_CUDA(cudaMalloc(&d_table, table.size() * 4));
    CHECK_CUDA(cudaMalloc(&d_seq_lens, c.B * 4));
    CHECK_CUDA(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_seq_lens, seq_lens.data(), c.B * 4, cudaMemcpyHostToDevice));
  }
  const uint64_t seed = rng();
  FillNormal<<<1024, 256>>>(q, q_elems, seed + 1);
  FillNormal<<<1024, 256>>>(k, kv_elems, seed + 2);
  FillNormal<<<1024, 256>>>(v, kv_elems, seed + 3);
  CHECK_CUDA(cudaGetLastError());

  const double scale = 1.0 / std::sqrt(double(c.H));
  AttentionParams p;
  p.shape = {c.B, c.Tq, c.S, c.N, c.K, c.H};
  p.q_stride = ContiguousBtnh(c.Tq, c.N, c.H);
  p.k_stride = ContiguousBtnh(c.S, c.K, c.H);
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
  p.scale = scale;
  p.is_causal = c.causal;
  p.features.window_left = c.window_left, p.features.window_right = c.window_right;
  p.features.softcap = c.softcap;
  if (c.ragged) p.features.kv_seqlens = d_lens;
  if (c.bottom_right) p.features.position_offsets = d_offsets;
  PagedParams pp;
  if (c.block_size) {
    pp.shape.outer = 1, pp.shape.batch = c.B, pp.shape.seqlen_q = c.Tq, pp.shape.num_heads = c.N;
    pp.shape.num_heads_k = c.K, pp.shape.head_dim = c.H, pp.shape.num_blocks = num_blocks;
    pp.shape.block_size = c.block_size, pp.shape.max_blocks = max_blocks;
    pp.q = q, pp.k_cache = k, pp.v_cache = v, pp.block_tables = d_table, pp.seq_lengths = d_seq_lens;
    pp.out = out, pp.lse = lse, pp.scale = scale, pp.softcap = c.softcap, pp.window_left = c.window_left;
  }

  RefProblem r{c.B, c.Tq, c.S, c.N, c.K, c.H, float(scale), c.softcap, c.causal, c.window_left, c.window_right,
               c.ragged ? d_lens : nullptr, c.bottom_right ? d_offsets : nullptr, d_table, d_seq_lens,
               num_blocks, c.block_size, max_blocks};
  ReferenceForward<Element><<<unsigned((lse_elems + 127) / 128), 128>>>(r, q, k, v, ref_out, ref_lse);
  CHECK_CUDA(cudaGetLastError());
  if (SynchronizeOrDie("the reference", 120.0) != cudaSuccess) std::exit(3);
  std::vector<Element> h_out(q_elems), first_out;
  std::vector<float> h_ref(q_elems), h_lse(lse_elems), h_ref_lse(lse_elems);
  CHECK_CUDA(cudaMemcpy(h_ref.data(), ref_out, q_elems * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(h_ref_lse.data(), ref_lse, lse_elems * 4, cudaMemcpyDeviceToHost));

  // Scratch for the most splits any run below may take: the forced ones,
  // and the automatic choice's bound (what a handler would request).
  const int64_t sequences = c.B;
  const int64_t keys = c.block_size ? int64_t(max_blocks) * c.block_size : c.S;
  const int64_t scratch_splits =
      std::max<int64_t>(kManySplits, decode::DecodeMaxSplits(sequences, c.Tq, c.N, c.K, keys));
  const int64_t partial_out = decode::DecodePartialOutFloats(sequences, c.Tq, c.N, c.H, scratch_splits);
  float* scratch;
  CHECK_CUDA(cudaMalloc(&scratch, decode::DecodeScratchFloats(sequences, c.Tq, c.N, c.H, scratch_splits) * 4));

  const bool bf16 = std::is_same_v<Element, __nv_bfloat16>;
  // P and O are rounded to the 16-bit type; lse only sees the soft cap's
  // approximate tanh (bf16: tanh.approx, ~2^-11 relative).
  const double atol = bf16 ? 2e-2 : 4e-3, lse_tol = bf16 ? 4e-3 : 1e-3;
  bool all_ok = true;
  const std::string name = std::string(TypeName<Element>()) + " " + Describe(c);
  for (int splits : {1, 3, kManySplits, 0}) {
    Poison<<<1024, 256>>>(reinterpret_cast<uint16_t*>(out), q_elems);
    Poison<<<1024, 256>>>(reinterpret_cast<uint16_t*>(lse), lse_elems * 2);
    CHECK_CUDA(cudaGetLastError());
    int used = 0;
    const std::string err = Launch<Element, kHeadDim>(c, p, pp, splits, scratch, partial_out, &used);
    const cudaError_t sync = SynchronizeOrDie(name.c_str());
    char label[400];
    std::snprintf(label, sizeof label, "%s splits=%d%s", name.c_str(), used, splits == 0 ? " (auto)" : "");
    if (!err.empty() || sync != cudaSuccess) {
      std::printf("%s: FAIL (%s%s)\n", label, err.c_str(), sync != cudaSuccess ? cudaGetErrorString(sync) : "");
      std::fflush(stdout);
      if (sync != cudaSuccess) std::exit(3);  // the context is gone
      all_ok = false;
      continue;
    }
    CHECK_CUDA(cudaMemcpy(h_out.data(), out, q_elems * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(h_lse.data(), lse, lse_elems * 4, cudaMemcpyDeviceToHost));
    double max_abs = 0, max_ratio = 0, lse_abs = 0, lse_ratio = 0, split_diff = 0;
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
      if (!first_out.empty()) split_diff = std::max(split_diff, std::fabs(got - double(ToFloat(first_out[i]))));
    }
    for (int64_t i = 0; i < lse_elems; ++i) {
      const double got = h_lse[i], want = h_ref_lse[i];
      const double e = (got == want) ? 0.0 : std::fabs(got - want);  // both -inf: equal
      const double tol = lse_tol * std::max(1.0, std::fabs(want));
      if (!(e <= tol)) {
        if (first_bad_lse < 0) first_bad_lse = i;
        ++bad_lse;
      }
      if (std::isfinite(e)) lse_abs = std::max(lse_abs, e), lse_ratio = std::max(lse_ratio, e / tol);
      else lse_ratio = INFINITY;
    }
    if (first_out.empty()) first_out = h_out;
    const bool ok = bad == 0 && bad_lse == 0;
    all_ok &= ok;
    std::printf("%s: out err %.3g (%.2f of tol), lse err %.3g (%.2f of tol), vs splits=1 %.3g: %s\n", label,
                max_abs, max_ratio, lse_abs, lse_ratio, split_diff, ok ? "PASS" : "FAIL");
    if (bad) {
      const int64_t i = first_bad, d = i % c.H, h = i / c.H % c.N, t = i / (int64_t(c.H) * c.N) % c.Tq,
                    b = i / (int64_t(c.H) * c.N * c.Tq);
      std::printf("  %lld bad out elements; first at b=%lld t=%lld h=%lld d=%lld: got %g want %g\n",
                  (long long)bad, (long long)b, (long long)t, (long long)h, (long long)d,
                  double(ToFloat(h_out[i])), double(h_ref[i]));
    }
    if (bad_lse) {
      const int64_t i = first_bad_lse;
      std::printf("  %lld bad lse; first at b=%lld h=%lld t=%lld: got %g want %g\n", (long long)bad_lse,
                  (long long)(i / (int64_t(c.N) * c.Tq)), (long long)(i / c.Tq % c.N), (long long)(i % c.Tq),
                  double(h_lse[i]), double(h_ref_lse[i]));
    }
    std::fflush(stdout);
  }
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(lse), cudaFree(ref_out), cudaFree(ref_lse);
  cudaFree(d_lens), cudaFree(d_offsets), cudaFree(d_table), cudaFree(d_seq_lens), cudaFree(scratch);
  return all_ok;
}

template <typename Element>
bool RunCaseAnyHead(const Case& c, std::mt19937& rng) {
  if (c.H <= 64) return RunCase<Element, 64>(c, rng);
  if (c.H <= 128) return RunCase<Element, 128>(c, rng);
  return RunCase<Element, 256>(c, rng);
}

// The decode shapes of issue 22: bf16, B=8, N=32, K=8, H=128, causal
// bottom-right (contiguous) / the paged rule, full-length sequences.
// Also, for the tuning of ChooseSplits, the contiguous call at forced split
// counts, and (extra_blocks) the paged one at block sizes 16, 32, 64 and
// 256, with shuffled and in-order tables.
void TimeDecode(int Tq, int S, bool extra_blocks) {
  using Element = __nv_bfloat16;
  const int B = 8, N = 32, K = 8, H = 128;
  int block = 64;
  const int64_t q_elems = int64_t(B) * Tq * N * H, kv_elems = int64_t(B) * S * K * H;
  Element *q, *k, *v, *out;
  float *lse, *scratch;
  int32_t *offsets, *table, *lens;
  CHECK_CUDA(cudaMalloc(&q, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&k, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&v, kv_elems * 2));
  CHECK_CUDA(cudaMalloc(&out, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&lse, int64_t(B) * N * Tq * 4));
  const int64_t max_splits = decode::DecodeMaxSplits(B, Tq, N, K, S);
  const int64_t partial_out = decode::DecodePartialOutFloats(B, Tq, N, H, max_splits);
  CHECK_CUDA(cudaMalloc(&scratch, std::max<int64_t>(1, decode::DecodeScratchFloats(B, Tq, N, H, max_splits)) * 4));
  FillNormal<<<1024, 256>>>(q, q_elems, 11);
  FillNormal<<<1024, 256>>>(k, kv_elems, 12);
  FillNormal<<<1024, 256>>>(v, kv_elems, 13);
  // The paged pool is the same memory, as blocks of 64 positions: the table
  // a shuffled permutation of them (K's layout [B, S, K, H] is exactly
  // [B * S / 64, 64, K, H]).
  std::vector<int32_t> h_offsets(B, S - Tq), h_lens(B, S);
  CHECK_CUDA(cudaMalloc(&offsets, B * 4));
  CHECK_CUDA(cudaMalloc(&lens, B * 4));
  CHECK_CUDA(cudaMalloc(&table, int64_t(B) * S * 4));  // room for block size 1
  CHECK_CUDA(cudaMemcpy(offsets, h_offsets.data(), B * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(lens, h_lens.data(), B * 4, cudaMemcpyHostToDevice));
  // in_order: block j of sequence b is pool block b * S / block_size + j,
  // so the paged call reads exactly the contiguous call's addresses: its
  // time beside the shuffled table's separates the addressing code's cost
  // from the scattered blocks' (DRAM pages, TLB).
  auto make_table = [&](int block_size, bool in_order = false) {
    std::vector<int32_t> h_table(int64_t(B) * S / block_size);
    std::iota(h_table.begin(), h_table.end(), 0);
    if (!in_order) std::shuffle(h_table.begin(), h_table.end(), std::mt19937(5));
    CHECK_CUDA(cudaMemcpy(table, h_table.data(), h_table.size() * 4, cudaMemcpyHostToDevice));
  };
  make_table(block);
  const int max_blocks = S / block, num_blocks = B * max_blocks;

  AttentionParams p;
  p.shape = {B, Tq, S, N, K, H};
  p.q_stride = ContiguousBtnh(Tq, N, H);
  p.k_stride = ContiguousBtnh(S, K, H);
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
  p.scale = 1.0 / std::sqrt(double(H));
  p.is_causal = true;
  p.features.position_offsets = offsets;
  PagedParams pp;
  pp.shape.outer = 1, pp.shape.batch = B, pp.shape.seqlen_q = Tq, pp.shape.num_heads = N;
  pp.shape.num_heads_k = K, pp.shape.head_dim = H, pp.shape.num_blocks = num_blocks;
  pp.shape.block_size = block, pp.shape.max_blocks = max_blocks;
  pp.q = q, pp.k_cache = k, pp.v_cache = v, pp.block_tables = table, pp.seq_lengths = lens;
  pp.out = out, pp.lse = lse, pp.scale = p.scale;

  const double floor_us = 2.0 * B * double(S) * K * H * 2 / 4.3e12 * 1e6;
  int splits_c = 0, splits_p = 0;
  const float c_ms = TimeLaunches([&] {
    return decode::LaunchForward<Element, 128>(p, 0, scratch, scratch + partial_out, 0, &splits_c);
  });
  const float p_ms = TimeLaunches([&] {
    return decode::LaunchPagedForward<Element, 128>(pp, 0, scratch, scratch + partial_out, 0, &splits_p);
  });
  std::printf("| %d | %d | %.1f (splits %d) | %.2f | %.1f (splits %d) | %.2f | %.2f | %.1f |\n", Tq, S, c_ms * 1e3,
              splits_c, c_ms * 1e3 / floor_us, p_ms * 1e3, splits_p, p_ms * 1e3 / floor_us, p_ms / c_ms, floor_us);
  std::fflush(stdout);
  std::string sweep = "    contiguous Tq=" + std::to_string(Tq) + " S=" + std::to_string(S) + " by forced splits:";
  for (int splits = 1; splits <= max_splits; splits *= 2) {
    const float ms = TimeLaunches([&] {
      return decode::LaunchForward<Element, 128>(p, splits, scratch, scratch + partial_out, 0, nullptr);
    });
    char buf[64];
    std::snprintf(buf, sizeof buf, " %d: %.1f us,", splits, ms * 1e3);
    sweep += buf;
  }
  std::printf("%s\n", sweep.c_str());
  if (extra_blocks)
    for (int bs : {16, 32, 64, 256})
      for (bool in_order : {false, true}) {
        if (bs == block && !in_order) continue;  // the table row's
        make_table(bs, in_order);
        pp.shape.block_size = bs, pp.shape.max_blocks = S / bs, pp.shape.num_blocks = int64_t(B) * S / bs;
        const float ms = TimeLaunches([&] {
          return decode::LaunchPagedForward<Element, 128>(pp, 0, scratch, scratch + partial_out, 0, nullptr);
        });
        std::printf("    paged Tq=%d S=%d block %d, %s table: %.1f us (%.2f of the floor, %.2f of contiguous)\n",
                    Tq, S, bs, in_order ? "in-order" : "shuffled", ms * 1e3, ms * 1e3 / floor_us, ms / c_ms);
      }
  std::fflush(stdout);
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(lse), cudaFree(scratch);
  cudaFree(offsets), cudaFree(lens), cudaFree(table);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  // A few short cases for compute-sanitizer (SANITIZE=memcheck or racecheck
  // in scripts/decode_check.sh): every path (contiguous tails, windows, the
  // soft cap, paged gather and whole-tile, clamped ids) in seconds.
  const bool sanitize = argc > 1 && std::strcmp(argv[1], "--sanitize") == 0;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  std::vector<Case> cases;
  // The grid of the issue: Tq x S x G x H, B = 2 over K = 2 key heads;
  // alternately non-causal and causal bottom-right (the decode alignment;
  // with S < Tq the first tokens see nothing).
  int index = 0;
  for (int H : {64, 128, 256})
    for (int G : {1, 4, 8})
      for (int Tq : {1, 4, 16, 64})
        for (int S : {1, 100, 4096, 33000}) {
          if (quick && S > 4096) continue;
          const bool causal = index++ % 2;
          cases.push_back({2, Tq, S, 2 * G, 2, H, causal, causal});
        }
  // Features, contiguous: ragged lengths (1 and S among them), causal top-left
  // (Tq != S as jax aligns it) and bottom-right, windows, soft cap, padded head dims.
  for (int H : {64, 128, 256}) {
    cases.push_back({5, 1, 3000, 8, 2, H, true, true, -1, -1, 0.0f, true});
    cases.push_back({5, 16, 3000, 8, 2, H, true, true, -1, -1, 0.0f, true});
    cases.push_back({3, 4, 2000, 4, 1, H, true, false});                 // top-left causal
    cases.push_back({3, 16, 2000, 8, 2, H, true, true, 300, -1});        // causal + left window
    cases.push_back({3, 16, 2000, 8, 2, H, false, true, 100, 50});       // two-sided window
    cases.push_back({3, 4, 2000, 8, 2, H, true, true, -1, -1, 5.0f});    // soft cap
    cases.push_back({4, 64, 5000, 16, 2, H, true, true, 700, -1, 8.0f, true});  // everything
  }
  cases.push_back({2, 16, 1500, 8, 2, 72, true, true});   // padded head dims: only real columns written
  cases.push_back({2, 3, 1500, 8, 2, 200, false, false, 64, 64});
  // Paged: shuffled tables, block sizes 1..256 (1 and 100: not a multiple
  // of the 64-key tile, so rows are gathered; 8, 16, 32: powers of two
  // below it, one table entry per pass of rows, except 8 at head dim 64,
  // whose passes of 16 rows span two blocks: gathered), partial last
  // blocks, ragged lengths with one beyond the table and one negative
  // (clamped), out-of-range ids.
  for (int bs : {1, 8, 16, 32, 64, 100, 256})
    for (int H : {64, 128, 256}) {
      cases.push_back({4, 1, 2000, 8, 2, H, true, false, -1, -1, 0.0f, true, bs});
      cases.push_back({4, 16, 1000, 16, 2, H, true, false, -1, -1, 0.0f, true, bs});
    }
  cases.push_back({4, 4, 3000, 16, 4, 128, true, false, 200, -1, 0.0f, true, 16});   // window
  cases.push_back({4, 4, 3000, 16, 4, 128, true, false, -1, -1, 6.0f, true, 64});    // soft cap
  cases.push_back({4, 64, 1000, 32, 4, 128, true, false, 300, -1, 6.0f, true, 256});  // everything
  cases.push_back({2, 16, 40, 8, 1, 64, true, false, -1, -1, 0.0f, false, 16});       // Tq close to S
  if (!quick) cases.push_back({2, 1, 33000, 8, 2, 128, true, false, -1, -1, 0.0f, true, 16});

  if (sanitize) {
    cases = {{2, 1, 300, 8, 2, 128, true, true, -1, -1, 0.0f, true},
             {2, 16, 200, 8, 2, 64, true, true, 50, -1, 5.0f, true},
             {2, 4, 150, 4, 1, 256, false, false, 20, 30},
             {4, 4, 300, 8, 2, 128, true, false, -1, -1, 0.0f, true, 1},
             {4, 16, 300, 16, 2, 64, true, false, 40, -1, 0.0f, true, 100},
             {4, 16, 300, 16, 2, 128, true, false, -1, -1, 0.0f, true, 16},  // per-pass entries
             {4, 1, 700, 8, 2, 256, true, false, -1, -1, 4.0f, true, 256}};
  }
  std::mt19937 rng(1234);
  int failures = 0, runs = 0;
  for (const Case& c : cases) {
    failures += !RunCaseAnyHead<__nv_bfloat16>(c, rng);
    failures += !RunCaseAnyHead<__half>(c, rng);
    runs += 2;
  }
  std::printf("%s: %d of %d cases failed (each case: splits 1, 3, %d and auto)\n", failures ? "FAIL" : "ALL PASS",
              failures, runs, kManySplits);
  if (!quick && !sanitize && failures == 0) {
    std::printf("\ndecode timings, bf16 B=8 N=32 K=8 H=128, microseconds (median of 20 x 5 launches, combine "
                "included); floor = K+V bytes at 4.3 TB/s\n");
    std::printf("| Tq | S | contiguous us | / floor | paged (block 64) us | / floor | paged / contiguous | floor us |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    TimeDecode(1, 8192, false);
    TimeDecode(1, 32768, true);
    TimeDecode(1, 131072, false);
    TimeDecode(16, 32768, true);
  }
  if (failures)
    std::printf(
        "where to look: only splits > 1 fail -> combine_kernel.cuh or the partial layout (fwd_kernel.cuh's "
        "last loop); only 'auto' -> ChooseSplits / DecodeMaxSplits; only G*Tq <= 32 rows -> the key-group "
        "merge; only paged block sizes not a multiple of 64 -> KvSource's gather; only causal/window -> the "
        "tile range and NeedsBoundsCheck; NaN -> unwritten rows or a -inf row state.\n");
  return failures ? 1 : 0;
}
