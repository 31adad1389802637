// A minimal parallel-for for the CPU handlers: tasks are claimed from an
// atomic counter by short-lived worker threads. XLA may run several of our
// handlers at once (pmap over host devices), so there is no shared pool to
// contend for; thread start-up (~tens of microseconds) is small beside the
// work of any call that is worth splitting.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace jax_flash::cpu {

// JAX_FLASH_CPU_THREADS overrides the hardware thread count.
inline int NumThreads() {
  static const int n = [] {
    if (const char* env = std::getenv("JAX_FLASH_CPU_THREADS")) {
      const int v = std::atoi(env);
      if (v > 0) return v;
    }
    return int(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return n;
}

// Runs fn(i) for i in [0, n). Exceptions (std::bad_alloc) are rethrown on the
// calling thread after every worker has joined.
template <typename Fn>
void ParallelFor(int64_t n, Fn&& fn) {
  const int workers = int(std::min<int64_t>(n, NumThreads()));
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    try {
      for (int64_t i = next++; i < n; i = next++) fn(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = n;
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (int t = 1; t < workers; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace jax_flash::cpu
