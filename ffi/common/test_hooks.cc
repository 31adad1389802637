#include "common/test_hooks.h"

#include <atomic>

namespace jax_flash {
namespace {
// Launches still to fail. One counter for the CPU and CUDA handlers of the
// module (both call TakeInjectedLaunchFailure once per launch).
std::atomic<int> injected_launch_failures{0};
}  // namespace

void InjectLaunchFailures(int count) { injected_launch_failures.store(count > 0 ? count : 0); }

bool TakeInjectedLaunchFailure() {
  int left = injected_launch_failures.load(std::memory_order_relaxed);
  while (left > 0)  // a decrement only from a positive count (concurrent launches take one each)
    if (injected_launch_failures.compare_exchange_weak(left, left - 1)) return true;
  return false;
}

}  // namespace jax_flash
