// What the standalone GPU checks (sm90_fwd_check.cu, decode_check.cu) share:
// a CUDA error guard, 16-bit conversions, reproducible normal inputs, NaN
// poisoning of outputs, a synchronize with a deadline, launch timing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <type_traits>
#include <vector>
#include <algorithm>

#define CHECK_CUDA(expr)                                                                     \
  do {                                                                                       \
    cudaError_t err_ = (expr);                                                               \
    if (err_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(err_), __FILE__, __LINE__); \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)

namespace gpu_check {

template <typename Element>
const char* TypeName() {
  return std::is_same_v<Element, __nv_bfloat16> ? "bf16" : "f16";
}
template <typename Element>
__host__ __device__ Element FromFloat(float x) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) return __float2bfloat16(x);
  else return __float2half(x);
}
template <typename Element>
__host__ __device__ float ToFloat(Element x) {
  if constexpr (std::is_same_v<Element, float>) return x;  // a float32 result (sm90_bwd_check's dbias)
  else if constexpr (std::is_same_v<Element, __nv_bfloat16>) return __bfloat162float(x);
  else return __half2float(x);
}

// Standard normal values from a counter hash (splitmix64 + Box-Muller): fixed
// seed, reproducible, never all zeros.
__host__ __device__ inline uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
template <typename Element>
__global__ void FillNormal(Element* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = SplitMix(seed * 0x100000001B3ull + uint64_t(i));
    const float u1 = (float((r >> 40) & 0xFFFFFF) + 0.5f) / 16777216.0f;
    const float u2 = float(r & 0xFFFFFF) / 16777216.0f;
    x[i] = FromFloat<Element>(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}
// 0xFFFF: a NaN in both bf16 and f16: an element the kernels do not write
// stays NaN and fails.
__global__ void Poison(uint16_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = 0xFFFF;
}

// cudaDeviceSynchronize with a deadline: a barrier-phase or pipeline-count
// bug hangs a kernel, and device time is scarce, so after `seconds` this
// names the launch and ends the process (which tears the context down).
inline cudaError_t SynchronizeOrDie(const char* what, double seconds = 20.0) {
  cudaEvent_t done;
  cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (e != cudaSuccess) return e;
  cudaEventRecord(done);
  const auto start = std::chrono::steady_clock::now();
  while ((e = cudaEventQuery(done)) == cudaErrorNotReady) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) {
      std::printf("HANG: %s did not finish in %.0f s (a barrier phase or count is wrong): FAIL\n", what, seconds);
      std::fflush(stdout);
      std::_Exit(4);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  cudaEventDestroy(done);
  return e == cudaSuccess ? cudaDeviceSynchronize() : e;
}

// Prints device 0 and whether it is a Hopper (compute capability 9.x),
// which `kernels` (named in the FAIL line) need.
inline bool DeviceIsHopper(const char* kernels) {
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  if (prop.major == 9) return true;
  std::printf("%s need compute capability 9.0: FAIL\n", kernels);
  return false;
}

inline float Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds per launch over 20 samples of 5 back-to-back launches
// each, after 3 warm-ups; -1 if a launch failed. Back to back, the host work
// of a launch (tensor maps, attributes) overlaps the previous kernel instead
// of landing between the events. `launch` returns "" on success.
template <typename Launch>
float TimeLaunches(Launch launch) {
  for (int i = 0; i < 3; ++i)
    if (!launch().empty()) return -1.0f;
  if (SynchronizeOrDie("a timed launch") != cudaSuccess) std::exit(3);
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  constexpr int kPerSample = 5;
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    CHECK_CUDA(cudaEventRecord(start));
    for (int j = 0; j < kPerSample; ++j) launch();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t / kPerSample);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return Median(ms);
}

}  // namespace gpu_check
