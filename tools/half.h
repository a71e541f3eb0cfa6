// fp16 / bf16 <-> float on the host, round-to-nearest-even, for the tool's inputs and outputs;
// e4m3 through the library's host conversions (common/half.h: RNE, saturating at +-448).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/half.h"
#include "flashattn/flashattn.h"

namespace facli {

inline uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

inline uint16_t float_to_bf16(float x) {
  const uint32_t u = float_bits(x);
  if (std::isnan(x)) return 0x7FC0;
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);  // ties to even
  return uint16_t((u + rounding) >> 16);
}

inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

inline uint16_t float_to_fp16(float x) {
  constexpr uint32_t kInfOrNan = 0x7F800000u;
  constexpr uint32_t kOverflow = 0x477FF000u;   // 65520: halfway past the largest half, 65504
  constexpr uint32_t kMinNormal = 0x38800000u;  // 2^-14
  constexpr float kSubnormalScale = 16777216.0f;  // 2^24: one unit of the smallest subnormal
  uint32_t u = float_bits(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7FFFFFFFu;
  if (u >= kInfOrNan) return sign | (u > kInfOrNan ? 0x7E00 : 0x7C00);
  if (u >= kOverflow) return sign | 0x7C00;
  if (u < kMinNormal) return sign | uint16_t(std::nearbyint(std::fabs(x) * kSubnormalScale));
  uint32_t h = ((((u >> 23) - 127 + 15) << 10) | ((u & 0x7FFFFFu) >> 13));
  const uint32_t rest = u & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent
  return uint16_t(sign | h);
}

inline float fp16_to_float(uint16_t h) {
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  if (exponent == 0) return sign * std::ldexp(float(mantissa), -24);
  if (exponent == 31) return mantissa ? NAN : sign * INFINITY;
  return sign * std::ldexp(float(1024 + mantissa), exponent - 25);
}

// The storage code of x (e4m3: its 8 bits in the low byte).
inline uint16_t to_storage(flashattn::DType t, float x) {
  if (t == flashattn::DType::e4m3) return flashattn::float_to_e4m3_bits(x);
  return t == flashattn::DType::bf16 ? float_to_bf16(x) : float_to_fp16(x);
}

inline double from_storage(flashattn::DType t, uint16_t h) {
  if (t == flashattn::DType::e4m3) return flashattn::e4m3_bits_to_float(uint8_t(h));
  return t == flashattn::DType::bf16 ? bf16_to_float(h) : fp16_to_float(h);
}

}  // namespace facli
