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
// Inputs and comparisons: bwd_compare.cuh (no forward needed).
//
// Timing: the former order and sections of half, once and twice the sized
// count (session 21), each in turn, three rounds of TimeLaunches (median of 20 x 5 launches:
// delta pass, kernel, dQ conversion), medians; TFLOP/s as sm90_bwd_check's
// (2.5 x 4 B N T S H, halved causal).
//
//   bash scripts/sm90_bwd_compare_check.sh order     # builds and runs this
//   ./sm90_bwd_order_check --quick                   # the small cases only

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bwd_compare.cuh"
#include "cuda/sm90/bwd_launch.cuh"

namespace {

using jax_flash::cuda::sm90::BackwardCausalSection;
using jax_flash::cuda::sm90::CausalSectionTiles;
using jax_flash::cuda::sm90::DefaultBwdSchedule;
using jax_flash::cuda::sm90::kSizedCausalSection;
using jax_flash::cuda::sm90::LaunchBackwardScheduled;
using namespace bwd_compare;

template <int kHeadDim>
bool RunCase(const Case& c, std::vector<std::string>* table) {
  constexpr auto kSchedule = DefaultBwdSchedule(kHeadDim);
  const Buffers buffers(c);
  const jax_flash::AttentionParams& p = buffers.p;
  const int key_blocks = (c.S + 127) / 128;  // kBlockN 128 at both head dims
  const int pairs = c.B * c.K, sized = BackwardCausalSection(p.shape, key_blocks, CausalSectionTiles(kHeadDim));
  char name[160];
  std::snprintf(name, sizeof name, "bf16 H=%d B=%d T=%d S=%d N=%d K=%d causal=%d (%d pairs, sized sections of %d)",
                c.H, c.B, c.T, c.S, c.N, c.K, int(c.causal), pairs, sized);
  auto launch = [&p](int section) {
    return [&p, section] { return LaunchBackwardScheduled<Element, kHeadDim, kSchedule>(p, 0, section); };
  };
  Grads former;
  bool ok = RunPoisoned(buffers, launch(0), name, "the former order", &former);
  if (ok) {
    // The former order itself must write every element (poison left = a bug in it or in this harness).
    const int64_t nan_first = FirstNan(former);
    ok = nan_first < 0;
    if (!ok) std::printf("FAIL %s: the former order left NaN (first at %lld)\n", name, (long long)nan_first);
  }
  for (int section : {kSizedCausalSection, 1, 5}) {
    if (!ok) break;
    if (section == kSizedCausalSection && (sized == 0 || !c.causal)) continue;  // the former order again
    char what[60];
    std::snprintf(what, sizeof what, "sections of %d pairs", section == kSizedCausalSection ? sized : section);
    Grads g;
    if (!RunPoisoned(buffers, launch(section), name, what, &g)) {
      ok = false;
      break;
    }
    int64_t f_dq, f_dk, f_dv;
    const int64_t bad_dk = Unlike(g.dk, former.dk, true, &f_dk), bad_dv = Unlike(g.dv, former.dv, true, &f_dv);
    const int64_t bad_dq = Unlike(g.dq, former.dq, false, &f_dq);
    const bool passed = bad_dk == 0 && bad_dv == 0 && bad_dq == 0;
    std::printf("%s %s: %s: dk %s, dv %s, dq %s\n", passed ? "PASS" : "FAIL", name, what,
                Describe(bad_dk, f_dk, "bitwise").c_str(), Describe(bad_dv, f_dv, "bitwise").c_str(),
                Describe(bad_dq, f_dq, "within a rounding step").c_str());
    ok &= passed;
  }
  if (ok && c.timed && c.causal) {
    // The former order, then sections of sized / 2, sized and 2 sized pairs
    // (those below every pair; 1, 2, 4 where sized is 0), timed in turn,
    // three rounds, medians.
    std::vector<int> orders = {0};
    for (int x : sized > 0 ? std::vector<int>{sized / 2, sized, 2 * sized} : std::vector<int>{1, 2, 4})
      if (x >= 1 && x < pairs) orders.push_back(x);
    std::vector<std::vector<float>> ms(orders.size());
    for (int r = 0; r < 3; ++r)
      for (size_t i = 0; i < orders.size(); ++i) ms[i].push_back(TimeLaunches(launch(orders[i])));
    const double flops = 2.5 * 4.0 * c.B * c.N * double(c.T) * c.S * c.H / 2.0;
    auto tflops = [&](size_t i) {
      const float m = Median(ms[i]);
      return m > 0 ? flops / (m * 1e-3) / 1e12 : 0.0;
    };
    const double base = tflops(0);
    for (size_t i = 0; i < orders.size(); ++i) {
      char line[200];
      std::snprintf(line, sizeof line, "H=%-4d B=%-2d T=S=%-6d N=%-3d K=%-3d %6d %7d %5d %8.1f %7.3f%s", c.H, c.B, c.T,
                    c.N, c.K, pairs, orders[i], orders[i] == 0 ? 0 : orders[i] * key_blocks, tflops(i),
                    base > 0 ? tflops(i) / base : 0.0, orders[i] == sized ? "  (sized)" : "");
      std::printf("  time %s\n", line);
      table->push_back(line);
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick;
  if (!ParseQuick(argc, argv, &quick)) return 2;
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
    // Session 21: more GQA, short and mid sequences.
    cases.push_back({4, 4096, 4096, 32, 8, 64, true, true});     // GQA 4, 32 pairs
    cases.push_back({1, 16384, 16384, 32, 8, 128, true, true});  // GQA 4, 8 pairs
    cases.push_back({16, 1024, 1024, 16, 16, 128, true, true});  // 256 pairs of 8 key blocks
    cases.push_back({8, 2048, 2048, 32, 32, 64, true, true});    // 256 pairs of 16
    cases.push_back({2, 8192, 8192, 16, 16, 128, true, true});   // 32 pairs of 64
  }
  int failures = 0;
  std::vector<std::string> table;
  for (const Case& c : cases) failures += !(c.H <= 64 ? RunCase<64>(c, &table) : RunCase<128>(c, &table));
  char header[160];
  std::snprintf(header, sizeof header, "%-40s %6s %7s %5s %8s %7s", "shape", "pairs", "section", "tiles", "TFLOP/s",
                "ratio");
  return Report(failures, table,
                "causal backward, bf16, the default schedule (section 0: the former order, key blocks outermost over "
                "every (batch, key head) pair; else BwdTile's sections of `section` pairs, `tiles` tiles each; "
                "(sized): BackwardCausalSection's; medians of three rounds timing each in turn; ratio against the "
                "former order)",
                header);
}
