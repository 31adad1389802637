// Device probe of the sm90 forward producer's key-block trim (FeatureKeyBlocks,
// a warp vote, hence not in the host check tests/cpp/sm90_feature_mask_test.cu):
// for a per-query mask with its block summary, each 128-row tile's [lo, hi)
// against the blocks the summary says hold a visible pair. Masks: causal
// (j <= i), prefix-LM (j < max(i + 1, T / 4)), the last half of the keys
// hidden. Prints one line per mask and "N failures".
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Iffi \
//     tests/cuda/sm90_key_blocks_probe.cu -o /tmp/probe && /tmp/probe
#include <cstdio>
#include <functional>
#include <vector>

#include "cuda/sm90/feature_mask.cuh"

using namespace jax_flash;
using namespace jax_flash::cuda::sm90;

__global__ void TrimProbe(AttentionParams p, int m_blocks, int* out) {
  for (int mb = 0; mb < m_blocks; ++mb) {
    const KeyBlocks kb = FeatureKeyBlocks<128, 128, true, true>(p, mb * 128, 0, 0);
    if (threadIdx.x == 0) out[2 * mb] = kb.lo, out[2 * mb + 1] = kb.hi;
  }
}

int main() {
  const int T = 4096, S = 4096, tb = T / 64, sb = S / 64, m_blocks = T / 128;
  int failures = 0;
  const std::pair<const char*, std::function<bool(int, int)>> masks[] = {
      {"causal", [](int i, int j) { return j <= i; }},
      {"prefix_lm", [&](int i, int j) { return j < std::max(i + 1, T / 4); }},
      {"first_half_keys", [&](int, int j) { return j < S / 2; }},
  };
  uint8_t* d_mask;
  uint8_t* d_blocks;
  int* d_out;
  cudaMalloc(&d_mask, size_t(T) * S);
  cudaMalloc(&d_blocks, tb * sb);
  cudaMalloc(&d_out, 2 * m_blocks * sizeof(int));
  for (const auto& [name, visible] : masks) {
    std::vector<uint8_t> mask(size_t(T) * S), blocks(tb * sb);
    for (int i = 0; i < T; ++i)
      for (int j = 0; j < S; ++j) mask[size_t(i) * S + j] = visible(i, j);
    for (int r = 0; r < tb; ++r)
      for (int c = 0; c < sb; ++c) {
        int count = 0;
        for (int i = 64 * r; i < 64 * r + 64; ++i)
          for (int j = 64 * c; j < 64 * c + 64; ++j) count += mask[size_t(i) * S + j];
        blocks[r * sb + c] = (count > 0 ? kMaskBlockSome : 0) | (count == 64 * 64 ? kMaskBlockAll : 0);
      }
    cudaMemcpy(d_mask, mask.data(), mask.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(d_blocks, blocks.data(), blocks.size(), cudaMemcpyHostToDevice);
    AttentionParams p;
    p.shape = {1, T, S, 1, 1, 128};
    p.scale = 0.088f;
    p.features.mask = d_mask;
    p.features.mask_stride.row = S;
    p.features.mask_stride.col = 1;
    p.features.mask_blocks = d_blocks;
    p.features.mask_block_rows = tb;
    p.features.mask_block_cols = sb;
    p.features.mask_blocks_stride.row = sb;
    p.features.mask_blocks_stride.col = 1;
    TrimProbe<<<1, 32>>>(p, m_blocks, d_out);
    std::vector<int> out(2 * m_blocks);
    const cudaError_t e = cudaMemcpy(out.data(), d_out, out.size() * sizeof(int), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
      std::printf("%s: %s\n", name, cudaGetErrorString(e));
      return 1;
    }
    long visited = 0, wanted = 0;
    for (int mb = 0; mb < m_blocks; ++mb) {
      int lo = -1, hi = -1;  // the blocks with a visible pair, from the summary
      for (int nb = 0; nb < S / 128; ++nb) {
        bool some = false;
        for (int r = 2 * mb; r < 2 * mb + 2; ++r)
          for (int c = 2 * nb; c < 2 * nb + 2; ++c) some |= blocks[r * sb + c] & kMaskBlockSome;
        if (some) hi = nb + 1, lo = lo < 0 ? nb : lo;
      }
      visited += out[2 * mb + 1] - out[2 * mb];
      wanted += hi - lo;
      if (out[2 * mb] != lo || out[2 * mb + 1] != hi) {
        if (failures++ < 8) std::printf("  %s tile %d: [%d, %d), want [%d, %d)\n", name, mb, out[2 * mb], out[2 * mb + 1], lo, hi);
      }
    }
    std::printf("%s: %ld key blocks visited, %ld wanted\n", name, visited, wanted);
  }
  std::printf("%d failures\n", failures);
  return failures != 0;
}
