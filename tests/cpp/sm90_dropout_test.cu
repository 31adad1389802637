// Host check of the sm90 kernels' dropout on wgmma fragments
// (ffi/cuda/sm90/dropout.cuh) against DropoutPolicy::Factor, the definition
// every family shares (common/mask_policy.h; jax_flash/reference.py's
// dropout_factor reproduces it in Python): for random seeds, rates (among
// them thresholds of 0, 2^16 - 1 and 2^16), batch and head counts, several
// seeds over the batch (vmapped keys), and the shared (broadcast) mask,
//   - ForwardDrop, for every lane of the 4 warps of both consumer
//     warpgroups, key block offsets and tile rows: each element of its S
//     fragment (row i0 + 8hh, key n0 + 8j + 2t + e) is kept exactly where
//     Factor > 0, and keep_scale is Factor's value there;
//   - BackwardKeepHalves: a lane's own half and its partner warp's other
//     half make its BackwardKeepBits<64>;
//   - BackwardKeepBits at 32 (the 256 backward's query halves), 64 and 128
//     queries per step, for every lane of
//     both consumer warpgroups of a 128-key tile and every step start: bit
//     kRowBits hh + 2j + e is set exactly where the pair (query m0 + 8j + 2t
//     + e, key + 8hh) has Factor > 0, through the launch's constants
//     (ThresholdHigh, KeepScale) as the kernel takes them.
// Exit status 0 = all hold.
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/sm90/dropout.cuh"

using namespace jax_flash;
using namespace jax_flash::cuda::sm90;

namespace {

int failures = 0;

void Expect(bool ok, const char* what, int a, int b, int c, int d) {
  if (!ok && ++failures <= 20) std::printf("FAIL %s (%d, %d, %d, %d)\n", what, a, b, c, d);
}

struct Case {
  int batch, heads, seeds;
  double rate;
  bool shared;
};

void Check(const Case& c, std::mt19937& rng) {
  std::vector<uint32_t> seed(2 * c.seeds);
  for (auto& x : seed) x = rng();
  AttentionParams p{};
  p.shape.batch = c.batch;
  p.shape.num_heads = c.heads;
  p.features.dropout_rate = c.rate;
  p.features.dropout_seed = seed.data();
  p.features.seed_count = c.seeds;
  p.features.dropout_shared = c.shared;
  std::uniform_int_distribution<int> block(0, 40);
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h) {
      const DropoutPolicy policy = DropoutPolicy::For(p, b);
      const FragmentDropout dropout = FragmentDropout::For(p, b, h);
      // The forward: a tile of 128 rows (two consumer warpgroups), key block n0.
      const int m0 = 128 * block(rng), n0 = 128 * block(rng);
      for (int warpgroup = 0; warpgroup < 2; ++warpgroup)
        for (int tid = 0; tid < 128; ++tid) {
          const int warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
          const int i0 = m0 + 64 * warpgroup + 16 * warp + g;
          float s[64];
          for (float& x : s) x = 1.0f;
          dropout.ForwardDrop<128>(s, i0, n0, t);
          for (int j = 0; j < 16; ++j)
            for (int hh = 0; hh < 2; ++hh)
              for (int e = 0; e < 2; ++e) {
                const float want = policy.Factor(b, h, i0 + 8 * hh, n0 + 8 * j + 2 * t + e);
                const float got = s[4 * j + 2 * hh + e] * dropout.keep_scale;
                Expect(got == want, "forward: the element's factor", b, h, i0 + 8 * hh, n0 + 8 * j + 2 * t + e);
              }
        }
      // The backward: a tile of 128 keys (two warpgroups of 64), steps of
      // 64 and 128 queries from m0, with the launch's constants.
      FragmentDropout step = dropout;
      step.threshold_high = FragmentDropout::ThresholdHigh(policy.threshold);
      const float keep_scale = FragmentDropout::KeepScale(policy);
      for (int warpgroup = 0; warpgroup < 2; ++warpgroup)
        for (int tid = 0; tid < 128; ++tid) {
          const int warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
          const int key = n0 + 64 * warpgroup + 16 * warp + g;
          const uint32_t bits64 = step.BackwardKeepBits<64>(key, m0 + 64 * (tid % 2), t);
          // The warp pair's shared calls (BackwardKeepHalves): this lane's
          // own half and its partner's (lane tid % 32 of warp ^ 1: the same
          // step, keys 16 apart) make bits64, each half the bits of one
          // column parity.
          {
            const int partner_key = key + (warp % 2 ? -16 : 16);
            const auto mine = step.BackwardKeepHalves(key, m0 + 64 * (tid % 2), t);
            const auto theirs = step.BackwardKeepHalves(partner_key, m0 + 64 * (tid % 2), t);
            const uint32_t parity = warp % 2 ? 0xAAAAAAAAu : 0x55555555u;  // bits 2j + e, e = warp % 2
            Expect((mine.own | theirs.other) == bits64, "backward, 64 queries: own | partner's other", b, h, tid, key);
            Expect((mine.own & ~parity) == 0 && (theirs.other & parity) == 0, "backward: halves by column parity",
                   b, h, tid, key);
          }
          const uint64_t bits128 = step.BackwardKeepBits<128>(key, m0, t);
          // (32 queries from m0 + 32 (tid % 2): both halves of a 64-query step.)
          const uint32_t bits32 = step.BackwardKeepBits<32>(key, m0 + 32 * (tid % 2), t);
          Expect((bits32 >> 16) == 0, "backward, 32 queries: 16 bits", b, h, tid, key);
          for (int hh = 0; hh < 2; ++hh)
            for (int e = 0; e < 2; ++e) {
              for (int j = 0; j < 8; ++j) {
                const int q = m0 + 64 * (tid % 2) + 8 * j + 2 * t + e;
                const float want = policy.Factor(b, h, q, key + 8 * hh);
                const float got = (bits64 >> (16 * hh + 2 * j + e) & 1u) ? keep_scale : 0.0f;
                Expect(got == want, "backward, 64 queries: the pair's factor", b, h, q, key + 8 * hh);
              }
              for (int j = 0; j < 4; ++j) {
                const int q = m0 + 32 * (tid % 2) + 8 * j + 2 * t + e;
                const float want = policy.Factor(b, h, q, key + 8 * hh);
                const float got = (bits32 >> (8 * hh + 2 * j + e) & 1u) ? keep_scale : 0.0f;
                Expect(got == want, "backward, 32 queries: the pair's factor", b, h, q, key + 8 * hh);
              }
              for (int j = 0; j < 16; ++j) {
                const int q = m0 + 8 * j + 2 * t + e;
                const float want = policy.Factor(b, h, q, key + 8 * hh);
                const float got = (bits128 >> (32 * hh + 2 * j + e) & 1u) ? keep_scale : 0.0f;
                Expect(got == want, "backward, 128 queries: the pair's factor", b, h, q, key + 8 * hh);
              }
            }
        }
    }
}

}  // namespace

int main() {
  std::mt19937 rng(20261202);
  const double below_one = 1.0 - 0.4 / 65536.0;  // threshold 2^16: every pair dropped
  const double one_step = 1.0 / 65536.0;         // threshold 1
  const Case cases[] = {
      {2, 3, 1, 0.1, false}, {4, 2, 2, 0.5, false}, {3, 2, 3, 0.25, true},  {2, 2, 1, one_step, false},
      {2, 2, 1, 0.9, false}, {1, 2, 1, below_one, false}, {2, 2, 2, 1.0 - 1.0 / 65536.0, false},
      {1, 1, 1, 0.3, true},
  };
  int count = 0;
  for (const Case& c : cases) {
    Check(c, rng);
    ++count;
  }
  std::printf("%d cases, %d failures\n", count, failures);
  return failures == 0 ? 0 : 1;
}
