// The sm90 backward's deterministic variant on a Hopper GPU (issue 21):
// LaunchBackwardDeterministic (DeterministicBackwardKernel: dQ's float32
// adds into each query block in key block order, DqOrder in bwd_kernel.cuh;
// since session 21 descending where causal, DqKeyOrder) against the package's default backward (LaunchBackward),
// bf16, head dims 64 and 128, causal and not, GQA, ragged tails, Tq != Tk,
// many key blocks. Six kernel instantiations besides the default two, so
// that it builds in well under a minute.
//
// Correctness, per case, every run on poisoned (NaN) outputs:
//   (a) the deterministic backward twice on the same tile order, once
//       more on another (BwdTile's sections: other timings, other blocks
//       side by side), and once with each candidate handoff (DqHandoff):
//       dq, dk, dv bit for bit the same each time (the order of dQ's adds
//       is the key blocks', whatever the tile order), no NaN left;
//       The other key order (DqKeyOrder: causal ascending, the order before
//       session 21; non-causal descending) twice: bit for bit run to run;
//   (b) against the default backward: dk, dv bit for bit (both write each
//       key row once, from the same steps), dq within one bf16 rounding
//       step (the default sums the same shares in the copy engine's order);
//       the other key order's likewise.
// The default's own run-to-run difference is printed, not checked (it
// shows that (a) has something to catch).
// Inputs and comparisons: bwd_compare.cuh (no forward needed).
//
// Timing (the timed shapes): the default and the deterministic backward
// alternately, three pairs of TimeLaunches (median of 20 x 5 launches:
// delta pass, kernel, dQ conversion; the deterministic one's counter clear
// too), medians; the deterministic one on its own tile order
// (kDeterministicSection) and, for the record, on the other (non-causal:
// key blocks side by side; causal: the L2-sized sections), the two
// candidate handoffs (DqHandoff::kAtSend, where the counters are raised
// and first read; kHelperWarp, session 31's: the producer warpgroup's warp
// 2 waits, sends and counts instead of the consumers) on its order, and the other key
// order at kAtSend (the package's handoff since session 21). Target
// (issue 21): at most 15% slower than the default, >= 0.87x its speed.
//
//   bash scripts/sm90_bwd_compare_check.sh deterministic  # builds and runs this
//   ./sm90_bwd_deterministic_check --quick                # the small cases only
//   ./sm90_bwd_deterministic_check --causal               # causal cases only

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bwd_compare.cuh"
#include "cuda/sm90/bwd_launch.cuh"

namespace {

using jax_flash::AttentionParams;
using jax_flash::cuda::sm90::L2SizedSection;
using jax_flash::cuda::sm90::DeterministicCounterCount;
using jax_flash::cuda::sm90::DqHandoff;
using jax_flash::cuda::sm90::DqKeyOrder;
using jax_flash::cuda::sm90::kDeterministicSection;
using jax_flash::cuda::sm90::LaunchBackward;
using jax_flash::cuda::sm90::LaunchBackwardDeterministic;
using namespace bwd_compare;

template <int kHeadDim>
bool RunCase(const Case& c, std::vector<std::string>* table) {
  Buffers buffers(c);
  AttentionParams& p = buffers.p;
  int* counters;
  const int64_t counter_count = DeterministicCounterCount<kHeadDim>(p.shape);
  CHECK_CUDA(cudaMalloc(&counters, std::max<int64_t>(counter_count, 1) * sizeof(int)));
  p.deterministic = true;  // the deterministic launcher takes it; LaunchBackward refuses it (below: false)
  const int pairs = c.B * c.K, sized = L2SizedSection(p.shape, sizeof(Element));
  const int key_blocks = (c.S + 127) / 128;
  char name[200];
  std::snprintf(name, sizeof name,
                "bf16 H=%d B=%d T=%d S=%d N=%d K=%d causal=%d (%d key blocks, %d pairs, sized sections of %d)", c.H,
                c.B, c.T, c.S, c.N, c.K, int(c.causal), key_blocks, pairs, sized);
  // handoff: where the kernel raises and reads its counters (DqHandoff: the default and two candidates).
  // order: the key block order of dQ's adds (DqKeyOrder; kDefault: descending causal, else ascending).
  auto deterministic = [&p, counters](int section, DqHandoff handoff = DqHandoff::kUnderS,
                                      DqKeyOrder order = DqKeyOrder::kDefault) {
    return [&p, counters, section, handoff, order] {
      AttentionParams d = p;
      d.deterministic = true;
      switch (handoff) {
        case DqHandoff::kAtSend:
          return LaunchBackwardDeterministic<Element, kHeadDim, DqHandoff::kAtSend>(d, counters, 0, section, order);
        case DqHandoff::kHelperWarp:
          return LaunchBackwardDeterministic<Element, kHeadDim, DqHandoff::kHelperWarp>(d, counters, 0, section,
                                                                                             order);
        default:
          return LaunchBackwardDeterministic<Element, kHeadDim>(d, counters, 0, section, order);
      }
    };
  };
  // The order the default does not take here (session 21: causal ascending,
  // the order before; non-causal descending), at the package's handoff.
  const DqKeyOrder flipped = c.causal ? DqKeyOrder::kAscending : DqKeyOrder::kDescending;
  auto standard = [&p] {
    AttentionParams d = p;
    d.deterministic = false;
    return LaunchBackward<Element, kHeadDim>(d, 0);
  };
  auto run = [&](auto launch, const char* what, Grads* g) { return RunPoisoned(buffers, launch, name, what, g); };
  // (a) the deterministic backward on its own order (kDeterministicSection:
  // non-causal sized sections, causal the order over every pair) twice,
  // then on the other (causal sized, non-causal 0; 1 pair where sized is 0).
  const int other = sized == 0 ? 1 : c.causal ? sized : 0;
  // Then each candidate handoff once (bit for bit too).
  Grads first, again, reordered, at_send, read_ahead, plain, plain_again, flip, flip_again;
  bool ok = run(deterministic(kDeterministicSection), "deterministic", &first) &&
            run(deterministic(kDeterministicSection), "deterministic again", &again) &&
            run(deterministic(other), "deterministic, another tile order", &reordered) &&
            run(deterministic(kDeterministicSection, DqHandoff::kAtSend), "deterministic, kAtSend", &at_send) &&
            run(deterministic(kDeterministicSection, DqHandoff::kHelperWarp), "deterministic, kHelperWarp",
                &read_ahead);
  if (ok) {
    const int64_t nan_first = FirstNan(first);
    int64_t f[12];
    const int64_t bad[12] = {
        Unlike(again.dq, first.dq, true, &f[0]),       Unlike(again.dk, first.dk, true, &f[1]),
        Unlike(again.dv, first.dv, true, &f[2]),       Unlike(reordered.dq, first.dq, true, &f[3]),
        Unlike(reordered.dk, first.dk, true, &f[4]),   Unlike(reordered.dv, first.dv, true, &f[5]),
        Unlike(at_send.dq, first.dq, true, &f[6]),     Unlike(at_send.dk, first.dk, true, &f[7]),
        Unlike(at_send.dv, first.dv, true, &f[8]),     Unlike(read_ahead.dq, first.dq, true, &f[9]),
        Unlike(read_ahead.dk, first.dk, true, &f[10]), Unlike(read_ahead.dv, first.dv, true, &f[11])};
    bool passed = nan_first < 0;
    for (int64_t b : bad) passed &= b == 0;
    std::printf("%s %s: deterministic run to run%s; again: dq %s, dk %s, dv %s; sections of %d: dq %s, dk %s, dv %s; "
                "kAtSend: dq %s, dk %s, dv %s; kHelperWarp: dq %s, dk %s, dv %s\n",
                passed ? "PASS" : "FAIL", name,
                nan_first >= 0 ? (", NaN left (first at " + std::to_string(nan_first) + ")").c_str() : "",
                Describe(bad[0], f[0], "bitwise").c_str(), Describe(bad[1], f[1], "bitwise").c_str(),
                Describe(bad[2], f[2], "bitwise").c_str(), other, Describe(bad[3], f[3], "bitwise").c_str(),
                Describe(bad[4], f[4], "bitwise").c_str(), Describe(bad[5], f[5], "bitwise").c_str(),
                Describe(bad[6], f[6], "bitwise").c_str(), Describe(bad[7], f[7], "bitwise").c_str(),
                Describe(bad[8], f[8], "bitwise").c_str(), Describe(bad[9], f[9], "bitwise").c_str(),
                Describe(bad[10], f[10], "bitwise").c_str(), Describe(bad[11], f[11], "bitwise").c_str());
    ok &= passed;
  }
  // The flipped order twice: bit for bit run to run (its own sums: dq not first's bits).
  if (ok) {
    ok = run(deterministic(kDeterministicSection, DqHandoff::kAtSend, flipped), "deterministic, the other key order",
             &flip) &&
         run(deterministic(kDeterministicSection, DqHandoff::kAtSend, flipped),
             "deterministic, the other key order again", &flip_again);
    if (ok) {
      int64_t f[3];
      const int64_t bad[3] = {Unlike(flip_again.dq, flip.dq, true, &f[0]), Unlike(flip_again.dk, flip.dk, true, &f[1]),
                              Unlike(flip_again.dv, flip.dv, true, &f[2])};
      const bool passed = bad[0] == 0 && bad[1] == 0 && bad[2] == 0 && FirstNan(flip) < 0;
      std::printf("%s %s: %s key order run to run: dq %s, dk %s, dv %s\n", passed ? "PASS" : "FAIL", name,
                  c.causal ? "ascending" : "descending", Describe(bad[0], f[0], "bitwise").c_str(),
                  Describe(bad[1], f[1], "bitwise").c_str(), Describe(bad[2], f[2], "bitwise").c_str());
      ok &= passed;
    }
  }
  // (b) against the default backward, twice (its own run-to-run difference shown); the flipped order too.
  if (ok) ok = run(standard, "default", &plain) && run(standard, "default again", &plain_again);
  if (ok) {
    int64_t f_dq, f_dk, f_dv;
    const int64_t bad_dk = Unlike(flip.dk, plain.dk, true, &f_dk), bad_dv = Unlike(flip.dv, plain.dv, true, &f_dv);
    const int64_t bad_dq = Unlike(flip.dq, plain.dq, false, &f_dq);
    const bool passed = bad_dk == 0 && bad_dv == 0 && bad_dq == 0;
    std::printf("%s %s: the other key order against the default: dk %s, dv %s, dq %s\n", passed ? "PASS" : "FAIL",
                name, Describe(bad_dk, f_dk, "bitwise").c_str(), Describe(bad_dv, f_dv, "bitwise").c_str(),
                Describe(bad_dq, f_dq, "within a rounding step").c_str());
    ok &= passed;
  }
  if (ok) {
    int64_t f_dq, f_dk, f_dv, f_self;
    const int64_t bad_dk = Unlike(first.dk, plain.dk, true, &f_dk), bad_dv = Unlike(first.dv, plain.dv, true, &f_dv);
    const int64_t bad_dq = Unlike(first.dq, plain.dq, false, &f_dq);
    const int64_t self = Unlike(plain_again.dq, plain.dq, true, &f_self);
    const bool passed = bad_dk == 0 && bad_dv == 0 && bad_dq == 0;
    std::printf("%s %s: against the default: dk %s, dv %s, dq %s (the default's dq run to run: %s)\n",
                passed ? "PASS" : "FAIL", name, Describe(bad_dk, f_dk, "bitwise").c_str(),
                Describe(bad_dv, f_dv, "bitwise").c_str(),
                bad_dq ? ("beyond a rounding step at " + std::to_string(bad_dq) + " elements, first " +
                          std::to_string(f_dq))
                             .c_str()
                       : "within a rounding step",
                self ? (std::to_string(self) + " elements differ").c_str() : "the same");
    ok &= passed;
  }
  // (c) timing.
  if (ok && c.timed) {
    std::vector<float> ms_default, ms_det, ms_det_other, ms_det_at_send, ms_det_read_ahead, ms_det_flipped;
    for (int r = 0; r < 3; ++r) {
      ms_default.push_back(TimeLaunches(standard));
      ms_det.push_back(TimeLaunches(deterministic(kDeterministicSection)));
      ms_det_other.push_back(TimeLaunches(deterministic(other)));
      ms_det_at_send.push_back(TimeLaunches(deterministic(kDeterministicSection, DqHandoff::kAtSend)));
      ms_det_read_ahead.push_back(TimeLaunches(deterministic(kDeterministicSection, DqHandoff::kHelperWarp)));
      ms_det_flipped.push_back(TimeLaunches(deterministic(kDeterministicSection, DqHandoff::kAtSend, flipped)));
    }
    double flops = 2.5 * 4.0 * c.B * c.N * double(c.T) * c.S * c.H;
    if (c.causal) flops /= 2.0;
    const float a = Median(ms_default), b = Median(ms_det), b0 = Median(ms_det_other), b1 = Median(ms_det_at_send),
                b2 = Median(ms_det_read_ahead), b3 = Median(ms_det_flipped);
    auto tflops = [&](float ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };
    const double ratio = b > 0 ? a / b : 0.0, ratio0 = b0 > 0 ? a / b0 : 0.0, ratio1 = b1 > 0 ? a / b1 : 0.0,
                 ratio2 = b2 > 0 ? a / b2 : 0.0, ratio3 = b3 > 0 ? a / b3 : 0.0;
    std::printf("  time default %.3f ms (%.1f TFLOP/s), deterministic %.3f ms (%.1f TFLOP/s): %.3fx; "
                "deterministic on sections of %d %.3f ms: %.3fx; kAtSend %.3f ms: %.3fx; kHelperWarp %.3f ms: "
                "%.3fx; the other key order (kAtSend) %.3f ms: %.3fx\n",
                a, tflops(a), b, tflops(b), ratio, other, b0, ratio0, b1, ratio1, b2, ratio2, b3, ratio3);
    char line[260];
    std::snprintf(line, sizeof line,
                  "H=%-4d B=%-2d T=S=%-6d N=%-3d causal=%d %7d %6d %8.1f %8.1f %7.3f %8.1f %7.3f %8.1f %7.3f %8.1f "
                  "%7.3f %8.1f %7.3f %s",
                  c.H, c.B, c.T, c.N, int(c.causal), c.causal ? 0 : sized, other, tflops(a), tflops(b), ratio,
                  tflops(b0), ratio0, tflops(b1), ratio1, tflops(b2), ratio2, tflops(b3), ratio3,
                  ratio1 >= 0.87 ? "" : "(at send below 0.87x)");
    table->push_back(line);
  }
  cudaFree(counters);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick;
  bool causal_only;
  if (!ParseQuick(argc, argv, &quick, &causal_only)) return 2;
  if (!DeviceIsHopper("the sm90 backward kernels")) return 1;
  std::vector<Case> cases;
  for (int H : {64, 128})
    for (int causal : causal_only ? std::vector<int>{1} : std::vector<int>{1, 0}) {
      cases.push_back({3, 1000, 1000, 8, 4, H, bool(causal), false});  // GQA (2 query heads per key head), tails
      cases.push_back({4, 300, 129, 6, 3, H, bool(causal), false});    // Tq > Tk, a 1-key tail block
      cases.push_back({6, 129, 300, 2, 2, H, bool(causal), false});    // Tq < Tk, a 1-query tail block
      cases.push_back({2, 1500, 4100, 8, 2, H, bool(causal), false});  // 33 key blocks, GQA 4, Tq < Tk
      cases.push_back({1, 4133, 3900, 4, 4, H, bool(causal), false});  // 31 key blocks, Tq > Tk, both ragged
      // An unpadded head dim (48 in the 64 kernel, 96 in the 128 one): every
      // share through StageDq / ReduceDqRows, dq_cols < kDqCols.
      cases.push_back({2, 257, 333, 4, 2, H - H / 4, bool(causal), false});
    }
  if (!quick) {
    for (int causal : causal_only ? std::vector<int>{1} : std::vector<int>{1, 0}) {
      cases.push_back({4, 4096, 4096, 32, 32, 64, bool(causal), true});
      cases.push_back({4, 4096, 4096, 16, 16, 128, bool(causal), true});
      cases.push_back({1, 16384, 16384, 32, 32, 64, bool(causal), true});
      cases.push_back({1, 16384, 16384, 16, 16, 128, bool(causal), true});
    }
  }
  int failures = 0;
  std::vector<std::string> table;
  for (const Case& c : cases) failures += !(c.H <= 64 ? RunCase<64>(c, &table) : RunCase<128>(c, &table));
  char header[200];
  std::snprintf(header, sizeof header, "%-44s %7s %6s %8s %8s %7s %8s %7s %8s %7s %8s %7s %8s %7s", "shape",
                "section", "other", "default", "determ", "ratio", "other", "ratio", "at send", "ratio", "helper",
                "ratio", "flipped", "ratio");
  return Report(failures, table,
                "backward, bf16, TFLOP/s (default: LaunchBackward; determ: LaunchBackwardDeterministic on its "
                "order, BwdTile's sections of `section` pairs (0: non-causal key blocks side by side, causal the "
                "order over every pair); other: on sections of `other`; at send / helper: the candidate "
                "DqHandoff::kAtSend / kHelperWarp on its order; flipped: the other key order (causal "
                "ascending, non-causal descending) at kAtSend; medians of three alternating timings; ratio = "
                "default time / deterministic time, target >= 0.87)",
                header);
}
