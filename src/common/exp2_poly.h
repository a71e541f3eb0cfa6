// 2^x without the exp unit: a software exp2 on the FMA and integer pipes, for the share of the
// softmax's exponentials that the FP8-products warpspec kernel moves off MUFU (issue 29; the
// approach FlashAttention-4 takes on Blackwell). Host-callable, so that the CPU tests check it.
//
// Why: with e4m3 products a 128 x 128 tile's two wgmma take about as long as its 16,384
// MUFU.EX2 (16 per clock per SM: 1024 clocks), so the exp unit bounds the tile. Every exponential
// computed here instead costs about 9 instructions on the other pipes and frees one MUFU slot.
//
// Method, for x <= 0 (the softmax's exponents x = score * scale_log2 - max; up to 127 works too):
//   1. clamp x to >= -127 (NaN kept: the comparison is false for it);
//   2. split x = i + f, i = round(x), |f| <= 1/2, with the float "magic number" rounding (adding
//      1.5 * 2^23 rounds to an integer on the FMA pipe; cvt.rmi / FRND would use the conversion
//      unit, which on sm_90 has MUFU's throughput);
//   3. 2^f = 1 + f (c1 + f (c2 + f c3)), three FMAs;
//   4. 2^i built as float bits (biased exponent i + 127 in bits 23..30), one multiply by it.
// At i = -127 step 4 makes the scale 0.0f, so x <= -127 (and -inf, masked scores) gives exactly
// 0; NaN stays NaN (p is NaN, and NaN times any scale is NaN), as rule D-57 needs.
//
// The coefficients: minimax fit of the relative error of 2^f on [-1/2, 1/2] with p(0) = 1 held
// exact (so exp2_on_fma(0) == 1, as MUFU's ex2 gives for the row max), a linear programme over a
// dense grid, rounded to float32: scripts/fit_exp2_poly.py. Degree 3 is enough here: P is
// rounded to e4m3 (3 mantissa bits, relative rounding error up to 2^-4) and the row sum is fp32.
// Measured on every float32 in [-130, 0] (a one-off host run; tests/cpu/test_exp2_poly.cpp checks
// a dense subset): relative error at most 1.0135e-4 (about 2^-13.3) for x >= -126, worst near
// x = k - 0.34; below -126 the result is within 8.4e-39 (< 2^-126) of 2^x, and 0 from -127 down
// (denormal results are flushed to 0 on the GPU (--use_fast_math), kept on the host).
//
// sm_90a SASS per exponential: FMNMX.NAN (the clamp), 3 FADD (the split), 3 FFMA, 1 LEA (the
// exponent bits, ALU pipe), 1 FMUL: 9 instructions instead of 1 MUFU.EX2.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FA_EXP2_POLY_HD __host__ __device__ __forceinline__
#else
#define FA_EXP2_POLY_HD inline
#endif

namespace flashattn {

// Below this x the result is 0 (see step 4).
constexpr float kExp2PolyMinX = -127.0f;
// 1.5 * 2^23: x + this, for |x| < 2^22, holds round(x) in its low mantissa bits.
constexpr float kExp2PolyRoundMagic = 12582912.0f;
// 2^f ~ 1 + f (c1 + f (c2 + f c3)) on [-1/2, 1/2] (scripts/fit_exp2_poly.py 3).
constexpr float kExp2PolyC1 = 6.932829022e-01f;  // 0x3f317afd
constexpr float kExp2PolyC2 = 2.422109544e-01f;  // 0x3e780626
constexpr float kExp2PolyC3 = 5.500892922e-02f;  // 0x3d61510b

FA_EXP2_POLY_HD uint32_t exp2_poly_bits_of(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

FA_EXP2_POLY_HD float exp2_poly_float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

// 2^x for x <= 0 with FMAs and integer ops only (no MUFU); relative error <= 1.02e-4 for
// x >= -126, exactly 0 for x <= -127 and -inf, NaN for NaN, exactly 1 for 0.
FA_EXP2_POLY_HD float exp2_on_fma(float x) {
  // 1. Clamp (NaN passes: `x < ...` is false for it, where fmaxf would return the bound).
  x = x < kExp2PolyMinX ? kExp2PolyMinX : x;
  // 2. x = i + f: j's low mantissa bits hold i = round(x); j - magic is i as a float, exactly.
  const float j = x + kExp2PolyRoundMagic;
  const float i = j - kExp2PolyRoundMagic;
  const float f = x - i;  // exact, in [-1/2, 1/2]
  // 3. 2^f, Horner.
  float p = fmaf(kExp2PolyC3, f, kExp2PolyC2);
  p = fmaf(p, f, kExp2PolyC1);
  p = fmaf(p, f, 1.0f);
  // 4. 2^i: j's bits are 0x4B400000 + i; shifted left by 23 the magic's part leaves the word
  // (its low 9 bits are 0), so adding 127 << 23 gives the biased exponent (i + 127) << 23, a
  // normal power of two for i >= -126 and the bits of 0.0f for i = -127.
  const uint32_t scale_bits = (exp2_poly_bits_of(j) << 23) + (127u << 23);
  return p * exp2_poly_float_of(scale_bits);
}

}  // namespace flashattn
