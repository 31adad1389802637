// Host check of cuda::VisibleBits, the tensor-core kernels' per-fragment-row
// visibility, against MaskPolicy::Visible (the definition every platform
// shares): random lengths, causal, windows, segment ids and masks of every
// broadcast kind, for the forward's layout (rows = queries) and the
// backward's (rows = keys), including rows and columns past the arrays' ends.
// Built with AddressSanitizer by tests/test_visible_bits.py, so a read
// outside the mask or segment arrays fails too. Exit status 0 = all agree.
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/logit_features.cuh"

using namespace jax_flash;

namespace {

constexpr int kNTiles = 8;  // the kernels' 64-column blocks: 16 columns per thread

struct Counts {
  long checked = 0, mismatched = 0;
};

// Every thread t (4 per fragment row) of every block, against Visible.
template <bool kRowsAreQueries, typename VisibleFn>
void CheckLayout(const MaskPolicy& m, int64_t rows, int64_t cols, VisibleFn visible, Counts* n) {
  for (int64_t c_block = 0; c_block < cols; c_block += 8 * kNTiles)
    for (int64_t row = 0; row < rows + 5; ++row)  // + rows past the end (tail blocks)
      for (int t = 0; t < 4; ++t) {
        const uint32_t bits = cuda::VisibleBits<kNTiles, kRowsAreQueries>(m, row, c_block + 2 * t);
        for (int nt = 0; nt < kNTiles; ++nt)
          for (int e = 0; e < 2; ++e) {
            const int64_t col = c_block + 2 * t + 8 * nt + e;
            const bool want = visible(row, col);
            n->mismatched += want != bool(bits >> (2 * nt + e) & 1u);
            ++n->checked;
          }
      }
}

}  // namespace

int main() {
  std::mt19937 rng(20261130);
  Counts n;
  for (int trial = 0; trial < 2000; ++trial) {
    const int tq = 1 + rng() % 200, tk = 1 + rng() % 200;
    // Exact-size arrays, so AddressSanitizer sees any read past their ends.
    std::vector<int32_t> q_ids(tq), kv_ids(tk);
    for (auto& x : q_ids) x = rng() % 3;
    for (auto& x : kv_ids) x = rng() % 3;
    const int mask_kind = rng() % 4;  // none, [T, S], key padding [1, S], query-only [T, 1]
    const int mask_rows = mask_kind == 2 ? 1 : tq, mask_cols = mask_kind == 3 ? 1 : tk;
    std::vector<uint8_t> mask(mask_rows * mask_cols);
    for (auto& x : mask) x = rng() % 4 != 0;

    MaskPolicy m;
    m.seqlen_q = tq - (rng() % 3 == 0 ? int(rng() % tq) : 0);  // effective lengths
    m.seqlen_k = tk - (rng() % 3 == 0 ? int(rng() % tk) : 0);
    m.causal = rng() % 2;
    m.window_left = rng() % 2 ? int(rng() % 50) : -1;
    m.window_right = rng() % 2 ? int(rng() % 50) : -1;
    if (rng() % 2) {
      m.q_segments = q_ids.data();
      m.kv_segments = kv_ids.data();
    }
    if (mask_kind) {
      m.mask = mask.data();
      m.mask_row = mask_kind == 2 ? 0 : mask_cols;
      m.mask_col = mask_kind == 3 ? 0 : 1;
    }
    auto visible = [&](int64_t i, int64_t j) { return i < tq && j < tk && m.Visible(i, j); };
    CheckLayout<true>(m, tq, tk, visible, &n);
    CheckLayout<false>(m, tk, tq, [&](int64_t j, int64_t i) { return visible(i, j); }, &n);
  }
  std::printf("checked %ld pairs, %ld mismatched\n", n.checked, n.mismatched);
  return n.mismatched == 0 && n.checked > 0 ? 0 : 1;
}
