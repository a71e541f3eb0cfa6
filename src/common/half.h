// Host conversions between fp32 and the 16-bit storage types (IEEE binary16 and bfloat16) and
// FP8 e4m3, bit-exact, round-to-nearest-even, no dependency beyond the standard library.
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

// ---- FP8 e4m3 (float8_e4m3fn) ------------------------------------------------------------------
//
// 1 sign, 4 exponent (bias 7), 3 mantissa bits; exponent 0 holds the subnormals m * 2^-9; the
// all-ones pattern (0x7f / 0xff) is NaN; no infinities; the largest finite value is 448.
// Every e4m3 value is exact in bf16, fp16 and fp32.

inline float e4m3_bits_to_float(uint8_t b) {
  using namespace half_detail;
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t exponent = (b >> 3) & 0xfu;
  const uint32_t mantissa = b & 0x7u;
  if (exponent == 0) return bits_float(sign | float_bits(float(mantissa) * 0.001953125f));  // 2^-9
  if (exponent == 0xfu && mantissa == 0x7u) return bits_float(sign | 0x7fc00000u);          // NaN
  constexpr uint32_t kRebias = 127 - 7;
  return bits_float(sign | ((exponent + kRebias) << 23) | (mantissa << 20));
}

// Round to nearest even, saturating: finite values beyond 448 and infinities give +-448
// (CUDA's __NV_SATFINITE); NaN gives NaN (0x7f with the sign).
inline uint8_t float_to_e4m3_bits(float f) {
  using namespace half_detail;
  const uint32_t x = float_bits(f);
  const uint8_t sign = uint8_t((x >> 24) & 0x80u);
  uint32_t ax = x & kF32AbsMask;
  if (ax > kF32Inf) return sign | 0x7fu;
  constexpr uint32_t kMaxFinite = 0x43e00000u;  // 448
  if (ax >= kMaxFinite) return sign | 0x7eu;
  constexpr uint32_t kMinNormal = 0x3c800000u;  // 2^-6
  if (ax < kMinNormal) {
    // As float_to_half_bits: 2^14 has an fp32 ulp of 2^-9, the e4m3 subnormal unit (a result
    // of 8 is the smallest normal, 0x08).
    const float shifted = bits_float(ax) + 16384.0f;
    return sign | uint8_t(float_bits(shifted) - float_bits(16384.0f));
  }
  // Normal: rebias (-120 << 23) and round the mantissa from 23 to 3 bits, ties to even; a value
  // below 448 never rounds past it (the next step, 480, is beyond the rounding midpoint 464).
  const uint32_t odd = (ax >> 20) & 1u;
  ax = ax - (120u << 23) + 0x7ffffu + odd;
  return sign | uint8_t(ax >> 20);
}

}  // namespace flashattn
