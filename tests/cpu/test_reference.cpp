// Self-tests of the oracle and the test helpers: properties any correct attention / rounding
// must have, so that a mistake in the oracle cannot silently pass a wrong library.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "layouts.h"
#include "reference.h"
#include "test_util.h"

namespace fa_test {
namespace {

using flashattn_ref::Options;
using flashattn_ref::Storage;

// ---- rounding and bit conversions ---------------------------------------------------------------

// bf16 by the classic independent route: fp32 bits, add 0x7fff plus the kept lsb, truncate.
double bf16_by_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

TEST(Reference, Bf16RoundingMatchesBitTrick) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int i = 0; i < 100000; ++i) {
    const float f = normal(rng) * std::ldexp(1.0f, int(rng() % 40) - 20);
    ASSERT_EQ(flashattn_ref::round_to(Storage::bf16, f), bf16_by_bits(f)) << f;
  }
}

TEST(Reference, SixteenBitPatternsRoundTrip) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const uint16_t b = uint16_t(bits);
    const double h = from_f16_bits(b);
    const double bf = from_bf16_bits(b);
    if (!std::isnan(h)) {
      EXPECT_EQ(flashattn_ref::round_to(Storage::f16, h), h) << bits;
      EXPECT_EQ(f16_bits(h), b) << bits;
    }
    if (!std::isnan(bf)) {
      EXPECT_EQ(flashattn_ref::round_to(Storage::bf16, bf), bf) << bits;
      EXPECT_EQ(bf16_bits(bf), b) << bits;
    }
  }
}

// Midpoints between neighbouring values round to the one with an even last bit; just above
// or below a midpoint rounds to the nearer neighbour.
TEST(Reference, RoundsToNearestEven) {
  for (uint32_t bits = 1; bits < 0x7c00u - 1; ++bits) {  // positive finite fp16
    const double lo = from_f16_bits(uint16_t(bits)), hi = from_f16_bits(uint16_t(bits + 1));
    const double mid = 0.5 * (lo + hi);
    const double even = (bits & 1u) ? hi : lo;
    ASSERT_EQ(flashattn_ref::round_to(Storage::f16, mid), even) << bits;
    ASSERT_EQ(flashattn_ref::round_to(Storage::f16, std::nextafter(mid, 0.0)), lo) << bits;
    ASSERT_EQ(flashattn_ref::round_to(Storage::f16, std::nextafter(mid, 1e9)), hi) << bits;
  }
  EXPECT_TRUE(std::isinf(flashattn_ref::round_to(Storage::f16, 65520.0)));
  EXPECT_EQ(flashattn_ref::round_to(Storage::f16, 65519.0), 65504.0);
}

TEST(Reference, MaxAbsDiffTreatsNanAndInfinities) {
  const double inf = std::numeric_limits<double>::infinity();
  const double a[] = {1.0, -inf, 2.0}, b[] = {1.5, -inf, 2.0};
  EXPECT_EQ(flashattn_ref::max_abs_diff(a, b, 3), 0.5);
  const double c[] = {1.0, std::nan(""), 2.0};
  EXPECT_TRUE(std::isinf(flashattn_ref::max_abs_diff(a, c, 3)));
  const double d[] = {1.0, 0.0, 2.0};
  EXPECT_TRUE(std::isinf(flashattn_ref::max_abs_diff(a, d, 3)));
}

// ---- attention properties ------------------------------------------------------------------------

struct Small {
  int sq = 5, sk = 7, h = 4, hk = 2, d = 8;
  std::vector<double> q, k, v;
  Small() {
    q = random_normal(int64_t(sq) * h * d, 1, DType::f32);
    k = random_normal(int64_t(sk) * hk * d, 2, DType::f32);
    v = random_normal(int64_t(sk) * hk * d, 3, DType::f32);
  }
  void run(const Options& o, std::vector<double>& out, std::vector<double>& lse) const {
    out.assign(size_t(sq) * h * d, 0.0);
    lse.assign(size_t(h) * sq, 0.0);
    flashattn_ref::attention(q.data(), k.data(), v.data(), sq, sk, h, hk, d, o, out.data(), lse.data());
  }
};

TEST(Reference, OutputIsSoftmaxWeightedMeanAndLseNormalises) {
  Small s;
  std::vector<double> out, lse;
  s.run(Options{}, out, lse);
  // recompute row (i=2, head=3) by the definition: weights exp(s_j - lse) sum to one
  const int i = 2, head = 3, kvh = head / (s.h / s.hk);
  double total = 0.0;
  std::vector<double> o(size_t(s.d), 0.0);
  for (int j = 0; j < s.sk; ++j) {
    double dot = 0.0;
    for (int c = 0; c < s.d; ++c) dot += s.q[size_t((i * s.h + head) * s.d + c)] * s.k[size_t((j * s.hk + kvh) * s.d + c)];
    const double w = std::exp(dot / std::sqrt(double(s.d)) - lse[size_t(head * s.sq + i)]);
    total += w;
    for (int c = 0; c < s.d; ++c) o[size_t(c)] += w * s.v[size_t((j * s.hk + kvh) * s.d + c)];
  }
  EXPECT_NEAR(total, 1.0, 1e-12);
  for (int c = 0; c < s.d; ++c) EXPECT_NEAR(o[size_t(c)], out[size_t((i * s.h + head) * s.d + c)], 1e-12);
}

TEST(Reference, CausalIsWindowMinusOneZero) {
  Small s;
  std::vector<double> a, la, b, lb;
  Options causal;
  causal.causal = true;
  Options win;
  win.window_right = 0;
  s.run(causal, a, la);
  s.run(win, b, lb);
  EXPECT_EQ(flashattn_ref::max_abs_diff(a.data(), b.data(), int64_t(a.size())), 0.0);
  EXPECT_EQ(flashattn_ref::max_abs_diff(la.data(), lb.data(), int64_t(la.size())), 0.0);
}

TEST(Reference, RowWithOneVisibleKeyCopiesItsValue) {
  Small s;
  s.sq = 3;  // sq < sk: bottom-right alignment, query i's diagonal key is i + 4
  std::vector<double> out, lse;
  Options o;
  o.window_left = 0;
  o.window_right = 0;
  s.run(o, out, lse);
  for (int i = 0; i < s.sq; ++i) {
    for (int head = 0; head < s.h; ++head) {
      const int j = i + s.sk - s.sq, kvh = head / (s.h / s.hk);
      for (int c = 0; c < s.d; ++c) {
        EXPECT_DOUBLE_EQ(out[size_t((i * s.h + head) * s.d + c)], s.v[size_t((j * s.hk + kvh) * s.d + c)]);
      }
    }
  }
}

TEST(Reference, RowsWithoutKeysGiveZeroAndMinusInfinity) {
  Small s;
  s.sq = 9;  // sq > sk: causal rows 0 and 1 see no key
  s.q = random_normal(int64_t(s.sq) * s.h * s.d, 4, DType::f32);
  std::vector<double> out, lse;
  Options o;
  o.causal = true;
  s.run(o, out, lse);
  for (int i = 0; i < 2; ++i) {
    for (int head = 0; head < s.h; ++head) {
      EXPECT_EQ(lse[size_t(head * s.sq + i)], -std::numeric_limits<double>::infinity());
      for (int c = 0; c < s.d; ++c) EXPECT_EQ(out[size_t((i * s.h + head) * s.d + c)], 0.0);
    }
  }
  EXPECT_TRUE(std::isfinite(lse[size_t(2)]));  // row 2 sees key 0
}

TEST(Reference, GqaEqualsRepeatedKvHeads) {
  Small s;
  std::vector<double> a, la;
  s.run(Options{}, a, la);
  Small t = s;  // repeat every kv head h/hk times
  t.hk = s.h;
  const int g = s.h / s.hk;
  t.k.assign(size_t(s.sk) * s.h * s.d, 0.0);
  t.v = t.k;
  for (int j = 0; j < s.sk; ++j)
    for (int head = 0; head < s.h; ++head)
      for (int c = 0; c < s.d; ++c) {
        t.k[size_t((j * s.h + head) * s.d + c)] = s.k[size_t((j * s.hk + head / g) * s.d + c)];
        t.v[size_t((j * s.h + head) * s.d + c)] = s.v[size_t((j * s.hk + head / g) * s.d + c)];
      }
  std::vector<double> b, lb;
  t.run(Options{}, b, lb);
  EXPECT_LT(flashattn_ref::max_abs_diff(a.data(), b.data(), int64_t(a.size())), 1e-14);
}

TEST(Reference, AlibiShiftsEachScoreByDistance) {
  // With equal keys every score is equal, so ALiBi alone sets the weights: w_j ~ exp(-m|diag-j|).
  Small s;
  s.hk = s.h;
  s.k.assign(size_t(s.sk) * s.hk * s.d, 0.25);
  s.v = random_normal(int64_t(s.sk) * s.hk * s.d, 5, DType::f32);
  const double slopes[] = {0.1, 0.5, 1.0, 2.0};
  Options o;
  o.alibi_slopes = slopes;
  std::vector<double> out, lse;
  s.run(o, out, lse);
  const int i = 1, head = 2, diag = i + s.sk - s.sq;
  double z = 0.0;
  std::vector<double> expect(size_t(s.d), 0.0);
  for (int j = 0; j < s.sk; ++j) {
    const double w = std::exp(-slopes[head] * std::abs(diag - j));
    z += w;
    for (int c = 0; c < s.d; ++c) expect[size_t(c)] += w * s.v[size_t((j * s.hk + head) * s.d + c)];
  }
  for (int c = 0; c < s.d; ++c) EXPECT_NEAR(out[size_t((i * s.h + head) * s.d + c)], expect[size_t(c)] / z, 1e-12);
}

TEST(Reference, SoftcapBoundsScoresAndVanishesWhenLarge) {
  Small s;
  std::vector<double> a, la, b, lb;
  Options big;
  big.softcap = 1e6;
  s.run(Options{}, a, la);
  s.run(big, b, lb);
  EXPECT_LT(flashattn_ref::max_abs_diff(a.data(), b.data(), int64_t(a.size())), 1e-9);
  Options tiny;
  tiny.softcap = 1e-3;  // every score within +-1e-3: nearly uniform weights
  s.run(tiny, b, lb);
  for (double l : lb) EXPECT_NEAR(l, std::log(double(s.sk)), 2e-3);
}

TEST(Reference, LowPrecisionIsCloseToFloat64) {
  Small s;
  std::vector<double> a, la;
  s.run(Options{}, a, la);
  std::vector<double> b(a.size()), lb(la.size());
  flashattn_ref::attention_lowp(Storage::f32, s.q.data(), s.k.data(), s.v.data(), s.sq, s.sk, s.h,
                                s.hk, s.d, Options{}, b.data(), lb.data());
  EXPECT_LT(flashattn_ref::max_abs_diff(a.data(), b.data(), int64_t(a.size())), 1e-5);
  flashattn_ref::attention_lowp(Storage::bf16, s.q.data(), s.k.data(), s.v.data(), s.sq, s.sk, s.h,
                                s.hk, s.d, Options{}, b.data(), lb.data());
  const double err = flashattn_ref::max_abs_diff(a.data(), b.data(), int64_t(a.size()));
  EXPECT_GT(err, 0.0);  // P and out really are rounded
  EXPECT_LT(err, 0.05);
  for (double x : b) EXPECT_EQ(flashattn_ref::round_to(Storage::bf16, x), x);
}

TEST(Reference, RotaryPreservesPairNormsAndComposes) {
  const int rows = 3, heads = 2, d = 12, rd = 8, half = rd / 2, max_pos = 10;
  std::vector<double> cos(size_t(max_pos * half)), sin(cos.size());
  for (int p = 0; p < max_pos; ++p)
    for (int t = 0; t < half; ++t) {
      cos[size_t(p * half + t)] = std::cos(p * (t + 1) * 0.3);
      sin[size_t(p * half + t)] = std::sin(p * (t + 1) * 0.3);
    }
  const std::vector<double> x = random_normal(rows * heads * d, 9, DType::f32);
  for (bool interleaved : {true, false}) {
    std::vector<double> y = x;
    const int pos[] = {0, 3, 7};
    flashattn_ref::rotary(y.data(), rows, heads, d, cos.data(), sin.data(), rd, interleaved, pos);
    for (int r = 0; r < rows; ++r)
      for (int hh = 0; hh < heads; ++hh) {
        const double* a = x.data() + (r * heads + hh) * d;
        const double* b = y.data() + (r * heads + hh) * d;
        for (int t = 0; t < half; ++t) {
          const int i = interleaved ? 2 * t : t, j = interleaved ? 2 * t + 1 : t + half;
          EXPECT_NEAR(a[i] * a[i] + a[j] * a[j], b[i] * b[i] + b[j] * b[j], 1e-12);
          if (r == 0) EXPECT_EQ(a[i], b[i]);  // position 0: identity
        }
        for (int c = rd; c < d; ++c) EXPECT_EQ(a[c], b[c]);  // beyond rotary_dim: untouched
      }
    // rotating by 3 then by 4 equals rotating by 7 (the table is additive in the angle)
    std::vector<double> z = x;
    int p3[] = {3, 3, 3}, p4[] = {4, 4, 4}, p7[] = {7, 7, 7};
    flashattn_ref::rotary(z.data(), rows, heads, d, cos.data(), sin.data(), rd, interleaved, p3);
    flashattn_ref::rotary(z.data(), rows, heads, d, cos.data(), sin.data(), rd, interleaved, p4);
    std::vector<double> w = x;
    flashattn_ref::rotary(w.data(), rows, heads, d, cos.data(), sin.data(), rd, interleaved, p7);
    EXPECT_LT(flashattn_ref::max_abs_diff(z.data(), w.data(), int64_t(z.size())), 1e-12);
  }
}

// ---- helpers -------------------------------------------------------------------------------------

TEST(Helpers, ScatterGatherRoundTripAndPoison) {
  const View v = padded_view({2, 3, 4, 5}, kPadElements);
  const std::vector<double> plain = random_normal(v.numel(), 11, DType::bf16);
  std::vector<double> buf;
  scatter(buf, v, plain);
  EXPECT_EQ(gather(buf, v), plain);
  EXPECT_TRUE(poison_outside_view_intact(buf, v));
  EXPECT_GT(int64_t(buf.size()), v.numel());  // there are gaps
  buf.back() = 1.0;  // last element is inside the view; a gap element is not:
  buf[size_t(v.stride[2] - 1)] = 1.0;
  EXPECT_FALSE(poison_outside_view_intact(buf, v));
}

TEST(Helpers, PagedLayoutAddressesEveryKeyOnce) {
  KVLayout l;
  l.kind = KVLayout::Kind::paged;
  l.heads_k = 1;
  l.d = 1;
  l.page_size = 16;
  l.max_pages = 3;
  l.block_table = make_block_table(4, 3, 14, 0, true, 3);
  std::vector<int> seen(14 * 16, 0);
  for (int b = 0; b < 4; ++b)
    for (int p = 0; p < 48; ++p) seen[size_t(l.row_of(b, p))]++;
  int owned = 0;
  for (int s : seen) {
    EXPECT_LE(s, 1);
    owned += s;
  }
  EXPECT_EQ(owned, 4 * 48);
}

}  // namespace
}  // namespace fa_test
