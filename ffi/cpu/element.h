// Host element types for the CPU path: 16-bit floats are stored as raw bits
// and converted to float on load (round-to-nearest-even on store), so the CPU
// path needs no compiler support for _Float16 or __bf16.
#pragma once

#include <cstdint>
#include <cstring>

namespace jax_flash::cpu {

struct Float16 { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

inline uint32_t FloatBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float BitsFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float ToFloat(BFloat16 x) { return BitsFloat(uint32_t(x.bits) << 16); }

inline float ToFloat(Float16 x) {
  const uint32_t sign = uint32_t(x.bits & 0x8000) << 16;
  const uint32_t exp = (x.bits >> 10) & 0x1f;
  const uint32_t man = x.bits & 0x3ff;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (man << 13));  // inf/nan
  if (exp != 0) return BitsFloat(sign | ((exp + 112) << 23) | (man << 13));
  // Subnormal half: man * 2^-24, exact in float.
  const float mag = float(man) * 5.9604644775390625e-8f;
  return sign ? -mag : mag;
}

inline float ToFloat(float x) { return x; }
inline double ToFloat(double x) { return x; }

template <typename T> T FromFloat(float f);
template <typename T> T FromFloat(double f);

template <> inline float FromFloat<float>(float f) { return f; }
template <> inline double FromFloat<double>(double f) { return f; }

template <> inline BFloat16 FromFloat<BFloat16>(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{uint16_t((u >> 16) | 0x40)};  // nan
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return BFloat16{uint16_t(u >> 16)};
}

template <> inline Float16 FromFloat<Float16>(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return Float16{uint16_t(sign | 0x7e00)};  // nan
  if (a >= 0x477ff000u) return Float16{uint16_t(sign | 0x7c00)};  // rounds to inf
  if (a < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24, rounded to nearest even.
    const float mag = BitsFloat(a) * 16777216.0f;  // exact scaling by 2^24
    uint32_t m = uint32_t(mag);
    const float rem = mag - float(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1))) ++m;
    return Float16{uint16_t(sign | m)};  // m == 0x400 carries into the exponent
  }
  // Normal: rebias the exponent and round the mantissa to 10 bits.
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  r -= 112u << 23;
  return Float16{uint16_t(sign | (r >> 13))};
}

// Accumulation type: float for every dtype but float64 (DESIGN.md: all
// accumulation in float32; float64 keeps double so the CPU path can serve as
// a high-precision reference).
template <typename Element> struct AccumFor { using type = float; };
template <> struct AccumFor<double> { using type = double; };

}  // namespace jax_flash::cpu
