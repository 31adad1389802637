// Test hooks, off unless a test turns them on through the extension module
// (jax_flash._ffi.inject_launch_failures): how the error path of every
// kernel launch is exercised without a broken GPU (tests/test_robustness.py,
// issue 25's fault tests). An injected failure takes the same road as a
// real one: the launcher's message, an ffi::Error from the handler, an
// exception in Python; the next call runs normally.
//
// Header-only: the counter is an inline variable, one per program (the
// extension's CPU and CUDA translation units share it), so a standalone
// check program that includes a launcher (tests/cuda/*_check.cu) links
// without anything else and never injects.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace jax_flash {

// Launches still to fail.
inline std::atomic<int> injected_launch_failures{0};

// The next `count` kernel launches report a failure (count <= 0: none).
inline void InjectLaunchFailures(int count) { injected_launch_failures.store(count > 0 ? count : 0); }

// Whether this launch is to report an injected failure (consumes one).
inline bool TakeInjectedLaunchFailure() {
  int left = injected_launch_failures.load(std::memory_order_relaxed);
  while (left > 0)  // a decrement only from a positive count (concurrent launches take one each)
    if (injected_launch_failures.compare_exchange_weak(left, left - 1)) return true;
  return false;
}

// The kernels launched while recording is on (jax_flash._ffi.record_kernels):
// each sm90 launcher records the variant it launched (its description, the
// one its errors carry), so that a test on the GPU can tell that a call
// reached the variant meant for it and not a slower one that computes the
// same values (a fallback no numeric test sees). Off, a launch pays one
// relaxed load.
inline std::atomic<bool> recording_kernels{false};
inline std::mutex recorded_kernels_mutex;
inline std::vector<std::string> recorded_kernels;

// Recording on (the list emptied) or off.
inline void RecordKernels(bool on) {
  std::lock_guard<std::mutex> lock(recorded_kernels_mutex);
  recorded_kernels.clear();
  recording_kernels.store(on);
}

inline void RecordKernel(const std::string& what) {
  if (!recording_kernels.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(recorded_kernels_mutex);
  recorded_kernels.push_back(what);
}

// The kernels recorded since the last call (or since recording began).
inline std::vector<std::string> TakeRecordedKernels() {
  std::lock_guard<std::mutex> lock(recorded_kernels_mutex);
  return std::exchange(recorded_kernels, {});
}

}  // namespace jax_flash
