// The software exp2 of the FP8-products softmax (src/common/exp2_poly.h) against std::exp2 in
// double: relative error <= kRelBound for x >= -126, absolute error <= 2^-126 below, and the
// special values of the softmax (-inf from masks -> exactly 0, NaN -> NaN, 0 -> exactly 1).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/exp2_poly.h"

namespace {

using flashattn::exp2_on_fma;

// The fit's minimax relative error is 1.013e-4 (scripts/fit_exp2_poly.py); float32 rounding of
// the Horner steps adds a few ulp.
constexpr double kRelBound = 1.02e-4;
const double kAbsBoundBelow = std::ldexp(1.0, -126);  // below x = -126 (results near denormal)

float float_of(uint32_t u) {
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

struct ErrorStats {
  double max_rel = 0.0;  // over x >= -126
  double max_abs_below = 0.0;  // over x < -126
  float worst_x = 0.0f;
  long points = 0;

  void add(float x) {
    const double want = std::exp2(double(x));
    const double got = double(exp2_on_fma(x));
    ++points;
    if (x >= -126.0f) {
      const double rel = std::fabs(got - want) / want;
      if (!(rel <= max_rel)) {  // (a NaN result counts as the worst)
        max_rel = std::isnan(rel) ? INFINITY : rel;
        worst_x = x;
      }
    } else {
      const double abs_err = std::fabs(got - want);
      max_abs_below = std::isnan(abs_err) ? INFINITY : std::fmax(max_abs_below, abs_err);
    }
  }
};

void expect_within_bounds(const ErrorStats& s) {
  EXPECT_LE(s.max_rel, kRelBound) << "worst x = " << s.worst_x;
  EXPECT_LE(s.max_abs_below, kAbsBoundBelow);
  std::printf("exp2_on_fma: %ld points, max relative error %.4e (x >= -126, worst at x = %.9g), "
              "max absolute error %.3e below -126\n",
              s.points, s.max_rel, double(s.worst_x), s.max_abs_below);
}

// A grid of step 2^-12 over [-130, 0] (every point exact in float32), and the floats next to
// each integer and half-integer there: the split x = round(x) + f changes i at the half-integers
// and f's sign at the integers.
TEST(Exp2Poly, DenseSweep) {
  ErrorStats s;
  for (int k = 0; k <= 130 * 4096; ++k) s.add(-float(k) / 4096.0f);
  for (int h = 0; h <= 2 * 130; ++h) {
    const float at = -0.5f * float(h);
    float lo = at, hi = at;
    for (int step = 0; step < 64; ++step) {
      lo = std::nextafter(lo, -INFINITY);
      hi = std::nextafter(hi, 0.0f);
      s.add(lo);
      s.add(hi);
    }
  }
  expect_within_bounds(s);
}

// Every float32 in [-1, 0] whose 12 low mantissa bits are one pattern (a stride over all the
// exponents, where the dense grid has only a few points near 0), and every float of [-126, -125].
TEST(Exp2Poly, FloatStrides) {
  ErrorStats s;
  const uint32_t minus_one = 0xBF800000u;
  for (uint32_t u = 0x80000000u; u <= minus_one; u += 4093u) s.add(float_of(u));
  for (uint32_t u = 0xC2FA0000u /* -125 */; u <= 0xC2FC0000u /* -126 */; ++u) s.add(float_of(u));
  expect_within_bounds(s);
}

TEST(Exp2Poly, SpecialValues) {
  EXPECT_EQ(exp2_on_fma(0.0f), 1.0f);
  EXPECT_EQ(exp2_on_fma(-0.0f), 1.0f);
  EXPECT_EQ(exp2_on_fma(-1.0f), 0.5f);  // f = 0: an exact power of two
  EXPECT_EQ(exp2_on_fma(-126.0f), std::ldexp(1.0f, -126));
  // Masked scores (-inf), and anything from -127 down: exactly +0.
  for (float x : {-INFINITY, -std::numeric_limits<float>::max(), -1e30f, -1000.0f, -127.0f}) {
    const float got = exp2_on_fma(x);
    EXPECT_EQ(got, 0.0f) << "x = " << x;
    EXPECT_FALSE(std::signbit(got)) << "x = " << x;
  }
  // A NaN score makes its row NaN (rule D-57): the exponential must not hide it.
  EXPECT_TRUE(std::isnan(exp2_on_fma(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(exp2_on_fma(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(exp2_on_fma(float_of(0xFFC12345u))));
}

// Probabilities never exceed 1 by more than the error bound and do not decrease with x on the
// grid beyond it (the row's max element is the largest P).
TEST(Exp2Poly, AtMostOneForNonPositive) {
  for (int k = 0; k <= 4096; ++k) {
    const float x = -float(k) / 4096.0f;
    EXPECT_LE(exp2_on_fma(x), 1.0f + kRelBound) << "x = " << x;
  }
}

}  // namespace
