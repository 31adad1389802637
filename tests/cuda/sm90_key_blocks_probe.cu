// Device probe of the mask summary's block trims, which are warp votes and
// hence not in the host check tests/cpp/sm90_feature_mask_test.cu: for a
// per-query mask with its block summary,
//   - the Hopper forward producer's FeatureKeyBlocks: each 128-row tile's key
//     blocks [lo, hi) against the blocks the summary says hold a visible pair;
//   - the Hopper backward's FeatureQueryBlocks: each 128-key tile's 64-query
//     steps likewise;
//   - MaskBlocks::SpanOf on the device against Span on the host, every block
//     of 128 x 128, 64 x 128 and 64 x 16.
// Masks: causal (j <= i), prefix-LM (j < max(i + 1, T / 4)), the last half of
// the keys hidden, a band (|i - j| < 300). Session 27 found the forward's
// trim a no-op on the H200 this way (Span's loops miscompiled: SpanOf).
// Prints one line per mask and "N failures"; exits non-zero on a failure.
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Iffi \
//     -isystem <jaxlib>/include tests/cuda/sm90_key_blocks_probe.cu -o /tmp/probe && /tmp/probe
#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "cuda/sm90/feature_mask.cuh"

using namespace jax_flash;
using namespace jax_flash::cuda::sm90;

constexpr int T = 4096, S = 4096, kEntryRows = T / 64, kEntryCols = S / 64;

// out: [0, 2 T/128) the forward tiles' [lo, hi); [2 T/128, + 2 S/128) the
// backward tiles' query steps; then SpanOf of the 128x128, 64x128 and 64x16 grids.
__global__ void TrimProbe(AttentionParams p, int* out) {
  for (int mb = 0; mb < T / 128; ++mb) {
    const KeyBlocks kb = FeatureKeyBlocks<128, 128, true, true>(p, mb * 128, 0, 0);
    if (threadIdx.x == 0) out[2 * mb] = kb.lo, out[2 * mb + 1] = kb.hi;
  }
  int* bwd = out + 2 * (T / 128);
  for (int nb = 0; nb < S / 128; ++nb) {
    const KeyBlocks mb = FeatureQueryBlocks<64, 128>(p, nb * 128, 0, 0);
    if (threadIdx.x == 0) bwd[2 * nb] = mb.lo, bwd[2 * nb + 1] = mb.hi;
  }
  int* spans = bwd + 2 * (S / 128);
  const MaskBlocks blocks = SliceMaskBlocks(p.features, 0, 0);
  for (int e = threadIdx.x; e < (T / 128) * (S / 128); e += blockDim.x)
    spans[e] = int(blocks.SpanOf<128, 128, true>(e / (S / 128) * 128, e % (S / 128) * 128));
  spans += (T / 128) * (S / 128);
  for (int e = threadIdx.x; e < (T / 64) * (S / 128); e += blockDim.x)
    spans[e] = int(blocks.SpanOf<64, 128, true>(e / (S / 128) * 64, e % (S / 128) * 128));
  spans += (T / 64) * (S / 128);
  for (int e = threadIdx.x; e < (T / 64) * (S / 16); e += blockDim.x)
    spans[e] = int(blocks.SpanOf<64, 16, true>(e / (S / 16) * 64, e % (S / 16) * 16));
}

int main() {
  int failures = 0;
  const std::pair<const char*, std::function<bool(int, int)>> masks[] = {
      {"causal", [](int i, int j) { return j <= i; }},
      {"prefix_lm", [&](int i, int j) { return j < std::max(i + 1, T / 4); }},
      {"first_half_keys", [&](int, int j) { return j < S / 2; }},
      {"band_300", [&](int i, int j) { return std::abs(i - j) < 300; }},
  };
  const int fwd_n = 2 * (T / 128), bwd_n = 2 * (S / 128);
  const int span_n = (T / 128) * (S / 128) + (T / 64) * (S / 128) + (T / 64) * (S / 16);
  uint8_t *d_mask, *d_blocks;
  int* d_out;
  cudaMalloc(&d_mask, size_t(T) * S);
  cudaMalloc(&d_blocks, kEntryRows * kEntryCols);
  cudaMalloc(&d_out, (fwd_n + bwd_n + span_n) * sizeof(int));
  for (const auto& named : masks) {
    const char* name = named.first;
    const auto& visible = named.second;
    std::vector<uint8_t> mask(size_t(T) * S), entries(kEntryRows * kEntryCols);
    for (int i = 0; i < T; ++i)
      for (int j = 0; j < S; ++j) mask[size_t(i) * S + j] = visible(i, j);
    for (int r = 0; r < kEntryRows; ++r)
      for (int c = 0; c < kEntryCols; ++c) {
        int count = 0;
        for (int i = 64 * r; i < 64 * r + 64; ++i)
          for (int j = 64 * c; j < 64 * c + 64; ++j) count += mask[size_t(i) * S + j];
        entries[r * kEntryCols + c] = (count > 0 ? kMaskBlockSome : 0) | (count == 64 * 64 ? kMaskBlockAll : 0);
      }
    cudaMemcpy(d_mask, mask.data(), mask.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(d_blocks, entries.data(), entries.size(), cudaMemcpyHostToDevice);
    AttentionParams p;
    p.shape = {1, T, S, 1, 1, 128};
    p.scale = 0.088f;
    p.features.mask = d_mask;
    p.features.mask_stride.row = S;
    p.features.mask_stride.col = 1;
    p.features.mask_blocks = d_blocks;
    p.features.mask_block_rows = kEntryRows;
    p.features.mask_block_cols = kEntryCols;
    p.features.mask_blocks_stride.row = kEntryCols;
    p.features.mask_blocks_stride.col = 1;
    TrimProbe<<<1, 32>>>(p, d_out);
    std::vector<int> out(fwd_n + bwd_n + span_n);
    const cudaError_t e = cudaMemcpy(out.data(), d_out, out.size() * sizeof(int), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
      std::printf("%s: %s\n", name, cudaGetErrorString(e));
      return 1;
    }
    MaskBlocks host;
    host.entries = entries.data(), host.rows = kEntryRows, host.cols = kEntryCols;
    auto fail = [&](const char* what, int a, int b, int got0, int got1, int want0, int want1) {
      if (failures++ < 12)
        std::printf("  %s %s %d/%d: [%d, %d), want [%d, %d)\n", name, what, a, b, got0, got1, want0, want1);
    };
    // The trims: the blocks with a visible pair per the summary, from both ends.
    auto check_trim = [&](const char* what, const int* got, int tiles, int steps, auto some) {
      long visited = 0, wanted = 0;
      for (int tile = 0; tile < tiles; ++tile) {
        int lo = -1, hi = 0;  // the first block with a visible pair and one past the last
        for (int k = 0; k < steps; ++k)
          if (some(tile, k)) hi = k + 1, lo = lo < 0 ? k : lo;
        if (lo < 0) lo = 0;  // none: the trims leave [0, 0)
        visited += got[2 * tile + 1] - got[2 * tile];
        wanted += hi - lo;
        const bool both_empty = hi == lo && got[2 * tile + 1] == got[2 * tile];  // (an empty range's ends are free)
        if (!both_empty && (got[2 * tile] != lo || got[2 * tile + 1] != hi)) fail(what, tile, 0, got[2 * tile], got[2 * tile + 1], lo, hi);
      }
      std::printf("%s %s: %ld blocks visited, %ld wanted\n", name, what, visited, wanted);
    };
    check_trim("forward tiles", out.data(), T / 128, S / 128,
               [&](int mb, int nb) { return host.Span(mb * 128, mb * 128 + 128, nb * 128, nb * 128 + 128) & kMaskBlockSome; });
    check_trim("backward tiles", out.data() + fwd_n, S / 128, T / 64,
               [&](int nb, int m) { return host.Span(m * 64, m * 64 + 64, nb * 128, nb * 128 + 128) & kMaskBlockSome; });
    const int* spans = out.data() + fwd_n + bwd_n;
    auto check_spans = [&](const char* what, int rows, int cols) {
      for (int e = 0; e < (T / rows) * (S / cols); ++e) {
        const int i0 = e / (S / cols) * rows, j0 = e % (S / cols) * cols;
        const int want = int(host.Span(i0, i0 + rows, j0, j0 + cols));
        if (spans[e] != want) fail(what, i0, j0, spans[e], 0, want, 0);
      }
      spans += (T / rows) * (S / cols);
    };
    check_spans("SpanOf<128, 128>", 128, 128);
    check_spans("SpanOf<64, 128>", 64, 128);
    check_spans("SpanOf<64, 16>", 64, 16);
  }
  std::printf("%d failures\n", failures);
  return failures != 0;
}
