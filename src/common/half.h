// Host conversions between fp32 and the 16-bit storage types (IEEE binary16 and bfloat16),
// bit-exact, round-to-nearest-even, no dependency beyond the standard library.
//
// The values are carried as their raw bits (uint16_t) so that host code needs no CUDA headers.
// NaN inputs give a quiet NaN; values beyond the largest finite 16-bit value round to infinity
// as round-to-nearest-even prescribes (fp16: |x| >= 65520).
#pragma once

#include <cstdint>
#include <cstring>

namespace flashattn {

namespace half_detail {
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
constexpr uint32_t kF32AbsMask = 0x7fffffffu;
constexpr uint32_t kF32Inf = 0x7f800000u;
constexpr float kHalfSubnormalUnit = 5.9604644775390625e-8f;  // 2^-24
}  // namespace half_detail

// ---- IEEE binary16 ---------------------------------------------------------------------------

inline float half_bits_to_float(uint16_t h) {
  using namespace half_detail;
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = float(mantissa) * kHalfSubnormalUnit;
    return bits_float(sign | float_bits(magnitude));
  }
  if (exponent == 0x1fu) return bits_float(sign | kF32Inf | (mantissa << 13));  // inf / NaN
  constexpr uint32_t kRebias = 127 - 15;
  return bits_float(sign | ((exponent + kRebias) << 23) | (mantissa << 13));
}

inline uint16_t float_to_half_bits(float f) {
  using namespace half_detail;
  const uint32_t x = float_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  uint32_t ax = x & kF32AbsMask;
  constexpr uint32_t kOverflow = 0x47800000u;     // 2^16: rounds to inf whatever the mantissa
  constexpr uint32_t kMinNormal = 0x38800000u;    // 2^-14: the smallest normal half
  constexpr uint16_t kHalfInf = 0x7c00u, kHalfNaN = 0x7e00u;
  if (ax >= kOverflow) return sign | (ax > kF32Inf ? kHalfNaN : kHalfInf);
  if (ax < kMinNormal) {
    // Subnormal half (or zero): adding 0.5f makes the fp32 ulp 2^-24, the half subnormal unit,
    // so the fp32 adder does the round-to-nearest-even; the half mantissa is the low bits.
    const float shifted = bits_float(ax) + 0.5f;
    return sign | uint16_t(float_bits(shifted) - float_bits(0.5f));
  }
  // Normal: rebias the exponent (-112 << 23), then add half an ulp minus one plus the lowest
  // kept bit so that the truncating shift rounds to nearest, ties to even. A carry out of the
  // mantissa bumps the exponent, and past the largest finite value gives inf (0x7c00).
  const uint32_t odd = (ax >> 13) & 1u;
  constexpr uint32_t kRebiasAndHalfUlp = 0xc8000fffu;
  ax += kRebiasAndHalfUlp + odd;
  return sign | uint16_t(ax >> 13);
}

// ---- bfloat16 ----------------------------------------------------------------------------------

inline float bf16_bits_to_float(uint16_t b) { return half_detail::bits_float(uint32_t(b) << 16); }

inline uint16_t float_to_bf16_bits(float f) {
  using namespace half_detail;
  const uint32_t x = float_bits(f);
  if ((x & kF32AbsMask) > kF32Inf) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);                  // nearest, ties to even
  return uint16_t((x + rounding) >> 16);
}

}  // namespace flashattn
