// The CPU tile kernel sets (src/cpu/kernels.h) against the portable set, for every vector set the
// CPU has (NEON, AVX2, AVX-512; a set the CPU lacks or the build leaves out is skipped): the one
// exact operation, fp32 -> bf16 output rounding, bit for bit on random values, ties, denormals,
// infinities and NaN; the products, the row passes and the rescale on random tiles of every shape
// class (tails of the register blocks, one key, one row, rows_pad of one row vector), within fp32
// rounding of a float64 sum; and each set's exp2 bit for bit the rule of exp2_poly.h, evaluated
// here in scalar steps (and the AVX2 set's the AVX-512 set's). The dispatch takes the fastest set
// within the FLASHATTN_KERNEL cap.
// The bf16 tile kernel sets (AMX, AVX512-BF16; no portable twin) against their definitions: the
// pack layouts bit for bit, the row max exactly, both products within fp32 summation error of the
// float64 sum of the bf16 products, P within bf16 rounding of exp2, the padding zero.
// The decode kernel sets (portable, NEON, AVX2, AVX-512, AVX512-BF16; D-72) on K/V rows scattered in
// memory, for each storage type: scores and P.V within fp32 summation error of the float64 sums,
// the row max exactly (NaN ignored), P within exp2's error, zero past the block's keys, and
// nothing written outside the heads' rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "cpu/avx2_math.h"
#include "cpu/exp2_poly.h"
#include "cpu/kernels.h"

namespace {

using flashattn::cpu::Bf16Kernels;
using flashattn::cpu::TileKernels;
using flashattn::cpu::kBf16Pair;
using flashattn::cpu::kRowLanes;
using flashattn::bf16_bits_to_float;
using flashattn::float_to_bf16_bits;

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint32_t to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

struct KernelSet {
  const char* name;
  const TileKernels* (*get)();
};

void PrintTo(const KernelSet& set, std::ostream* os) { *os << set.name; }

class CpuKernelSet : public ::testing::TestWithParam<KernelSet> {
 protected:
  void SetUp() override {
    fast_ = GetParam().get();
    if (fast_ == nullptr) GTEST_SKIP() << "no " << GetParam().name << " on this CPU (or not compiled in)";
    ASSERT_STREQ(fast_->name, GetParam().name);
    ASSERT_EQ(kRowLanes % fast_->row_lanes, 0) << "row_lanes divides kRowLanes";
  }
  const TileKernels& portable() const { return flashattn::cpu::portable_kernels(); }
  const TileKernels* fast_ = nullptr;
};

std::vector<float> random_floats(size_t n, unsigned seed, float stddev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = normal(gen);
  return x;
}

int round_up(int a, int b) { return (a + b - 1) / b * b; }

// K rows (keys, ld_k) in a set's K layout (kernels.h: blocks of k_block keys, column by column),
// the keys that fill up the last block zero.
std::vector<float> k_layout(const TileKernels& set, const std::vector<float>& k, int keys, int ld_k) {
  const int kb = set.k_block;
  std::vector<float> out(size_t(round_up(keys, kb)) * ld_k, 0.0f);
  for (int j = 0; j < keys; ++j) {
    for (int c = 0; c < ld_k; ++c) out[size_t(j / kb) * kb * ld_k + size_t(c) * kb + j % kb] = k[size_t(j) * ld_k + c];
  }
  return out;
}

// V rows (keys, ld_v) in a set's V layout (strips of v_cols columns, key by key; v_cols 0: the
// rows as they are); *set_ld_v: what the set takes as ld_v (the strips' distance, or ld_v).
std::vector<float> v_layout(const TileKernels& set, const std::vector<float>& v, int keys, int ld_v, int d_pad,
                            int* set_ld_v) {
  if (set.v_cols == 0) {
    *set_ld_v = ld_v;
    return v;
  }
  const int vc = set.v_cols;
  *set_ld_v = keys * vc;
  std::vector<float> out(size_t(round_up(d_pad, vc)) * keys, std::nanf(""));  // unread past d_pad
  for (int j = 0; j < keys; ++j) {
    for (int c = 0; c < d_pad; ++c) out[size_t(c / vc) * keys * vc + size_t(j) * vc + c % vc] = v[size_t(j) * ld_v + c];
  }
  return out;
}

TEST_P(CpuKernelSet, Bf16RoundingMatchesPortable) {
  std::vector<float> src = random_floats(1000, 3, 3.0f);
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x7f800000u,
                        0xff800000u, 0x7fc00001u, 0x7f800001u, 0xffffffffu, 0x00000000u, 0x80000000u}) {
    src.push_back(from_bits(bits));
  }
  for (int n : {int(src.size()), 1, 7, 8, 9, 15, 17, 31}) {
    for (float scale : {1.0f, 0.37f}) {
      std::vector<uint16_t> want(n + 8, 0xbeef), got(n + 8, 0xbeef);
      portable().scaled_to_bf16(src.data(), n, scale, want.data());
      fast_->scaled_to_bf16(src.data(), n, scale, got.data());
      for (int c = 0; c < n + 8; ++c) {  // past n: untouched
        ASSERT_EQ(got[c], want[c]) << "n=" << n << " scale=" << scale << " c=" << c << " x=" << src[c];
      }
    }
  }
}

// st = k . qt^T for head dims and key counts that end inside the register blocks and vectors, K
// in the set's layout.
TEST_P(CpuKernelSet, ScoresMatchPortable) {
  for (int d : {1, 7, 16, 40, 128, 256}) {
    for (int rows_pad : {fast_->row_lanes, 2 * fast_->row_lanes, 3 * fast_->row_lanes, 128}) {
      for (int keys : {1, 5, 6, 7, 8, 9, 11, 12, 13, 61, 64}) {
        const int ld_qt = rows_pad + 16, ld_k = d + 3, ld_st = rows_pad + 32;
        const std::vector<float> qt = random_floats(size_t(d) * ld_qt, 11 + d);
        const std::vector<float> k = random_floats(size_t(keys) * ld_k, 13 + keys);
        const std::vector<float> k_set = k_layout(*fast_, k, keys, ld_k);
        // Room for the score rows up to a whole key block, which the set may write.
        std::vector<float> want(size_t(round_up(keys, fast_->k_block)) * ld_st, -7.0f), got(want);
        portable().scores(qt.data(), ld_qt, k.data(), ld_k, d, rows_pad, keys, want.data(), ld_st);
        fast_->scores(qt.data(), ld_qt, k_set.data(), ld_k, d, rows_pad, keys, got.data(), ld_st);
        for (int j = 0; j < keys; ++j) {
          for (int r = 0; r < ld_st; ++r) {
            const size_t at = size_t(j) * ld_st + r;
            if (r >= rows_pad) {
              ASSERT_EQ(got[at], -7.0f) << "wrote past rows_pad: d=" << d << " j=" << j << " r=" << r;
              continue;
            }
            double exact = 0, magnitude = 0;
            for (int c = 0; c < d; ++c) {
              const double term = double(k[size_t(j) * ld_k + c]) * qt[size_t(c) * ld_qt + r];
              exact += term;
              magnitude += std::fabs(term);
            }
            const double tolerance = 4 * d * 0x1p-24 * magnitude;
            ASSERT_NEAR(got[at], exact, tolerance) << "d=" << d << " rows_pad=" << rows_pad << " keys=" << keys
                                                   << " j=" << j << " r=" << r;
            ASSERT_NEAR(got[at], want[at], 2 * tolerance);
          }
        }
      }
    }
  }
}

// The tile max ignores NaN and is exact: bit for bit the portable result.
TEST_P(CpuKernelSet, TileMaxMatchesPortable) {
  for (int rows_pad : {fast_->row_lanes, 3 * fast_->row_lanes, 128}) {
    for (int keys : {1, 7, 64}) {
      const int ld_st = rows_pad + 8;
      std::vector<float> st = random_floats(size_t(keys) * ld_st, 17 + keys, 10.0f);
      std::mt19937 gen(5);
      for (float& s : st) {
        const unsigned pick = gen() % 16;
        if (pick == 0) s = std::numeric_limits<float>::quiet_NaN();
        if (pick == 1) s = -INFINITY;
      }
      for (int r = 0; r < rows_pad; r += 5) {  // whole columns of -inf, of NaN
        for (int j = 0; j < keys; ++j) st[size_t(j) * ld_st + r] = r % 10 ? -INFINITY : std::nanf("");
      }
      std::vector<float> want(rows_pad), got(rows_pad);
      portable().tile_max(st.data(), ld_st, rows_pad, keys, want.data());
      fast_->tile_max(st.data(), ld_st, rows_pad, keys, got.data());
      for (int r = 0; r < rows_pad; ++r) {
        ASSERT_EQ(to_bits(got[r]), to_bits(want[r])) << "rows_pad=" << rows_pad << " keys=" << keys << " r=" << r;
      }
    }
  }
}

// exp2 of scaled scores minus the row offsets: every value within 2 ulp (plus the rounding of
// the argument) of the float64 result, including denormal results, 0 below 2^-150 and for
// -inf, NaN for NaN; the row sums within fp32 summation error.
TEST_P(CpuKernelSet, Exp2SumMatchesPortable) {
  for (int rows_pad : {fast_->row_lanes, 3 * fast_->row_lanes, 128}) {
    for (int keys : {1, 7, 64}) {
      const int ld_st = rows_pad + 8;
      std::vector<float> st = random_floats(size_t(keys) * ld_st, 19 + keys, 4.0f);
      std::mt19937 gen(9);
      for (float& s : st) {
        const unsigned pick = gen() % 32;
        if (pick == 0) s = std::numeric_limits<float>::quiet_NaN();
        if (pick == 1) s = -INFINITY;
        if (pick == 2) s = -100.0f - float(gen() % 1000) * 0.11f;  // 2^-100 .. 2^-210: denormals, 0
      }
      std::vector<float> offset = random_floats(rows_pad, 23, 1.0f);
      for (float& o : offset) o = std::fabs(o) + 8.0f;
      const float scale = 0.9f;
      std::vector<float> want(st), got(st), want_sum(rows_pad), got_sum(rows_pad);
      portable().exp2_sum(want.data(), ld_st, rows_pad, keys, scale, offset.data(), want_sum.data());
      fast_->exp2_sum(got.data(), ld_st, rows_pad, keys, scale, offset.data(), got_sum.data());
      for (int r = 0; r < rows_pad; ++r) {
        double sum = 0, sum_tolerance = 0;
        bool nan_row = false;
        for (int j = 0; j < keys; ++j) {
          const size_t at = size_t(j) * ld_st + r;
          const double x = double(st[at]) * scale - offset[r];
          const double exact = std::exp2(x);
          if (std::isnan(st[at])) {
            ASSERT_TRUE(std::isnan(got[at])) << "j=" << j << " r=" << r;
            nan_row = true;
            continue;
          }
          if (std::isinf(st[at])) {
            ASSERT_EQ(to_bits(got[at]), 0u) << "exp2(-inf) j=" << j << " r=" << r;
            continue;
          }
          // The argument is rounded once or twice (multiply, subtract): at most
          // (|s scale| + |x|) 2^-24 absolute, ln 2 times that relative in exp2.
          const double argument_error = (std::fabs(double(st[at]) * scale) + std::fabs(x)) * 0x1p-24;
          const double tolerance = exact * (2 * 0x1p-24 + 0.7 * argument_error) + 0x1p-149;
          ASSERT_NEAR(got[at], exact, tolerance) << "x=" << x << " j=" << j << " r=" << r;
          // The portable set is std::exp2 of the toolchain's libm: zig's compiler-rt (the aarch64
          // cross build of scripts/arm_check.sh) has no denormal results, only 0 below FLT_MIN.
          const double libm_flush = exact < std::numeric_limits<float>::min() ? exact : 0.0;
          ASSERT_NEAR(want[at], exact, tolerance + libm_flush) << "portable, x=" << x;
          sum += exact;
          sum_tolerance += tolerance;
        }
        if (nan_row) {
          ASSERT_TRUE(std::isnan(got_sum[r])) << "r=" << r;
        } else {
          ASSERT_NEAR(got_sum[r], sum, sum_tolerance + sum * (keys + 4) * 0x1p-24) << "r=" << r;
        }
        for (int j = 0; j < keys; ++j) {  // past rows_pad: untouched
          for (int c = rows_pad; c < ld_st; ++c) ASSERT_EQ(to_bits(got[size_t(j) * ld_st + c]), to_bits(st[size_t(j) * ld_st + c]));
        }
      }
    }
  }
}

// The rescale is one multiplication: bit for bit the portable result.
TEST_P(CpuKernelSet, ScaleRowsMatchesPortable) {
  for (int rows : {1, 5, 128}) {
    for (int d_pad : {16, 48, 256}) {
      const int ld_o = d_pad + 16;
      const std::vector<float> o = random_floats(size_t(rows) * ld_o, 29);
      std::vector<float> factor = random_floats(rows, 31);
      factor[0] = 0.0f;
      std::vector<float> want(o), got(o);
      portable().scale_rows(want.data(), ld_o, rows, d_pad, factor.data());
      fast_->scale_rows(got.data(), ld_o, rows, d_pad, factor.data());
      for (size_t i = 0; i < o.size(); ++i) ASSERT_EQ(to_bits(got[i]), to_bits(want[i])) << "rows=" << rows << " i=" << i;
    }
  }
}

// o = o * factor + p . v (factor nullptr: o += p . v) for row counts and widths that end inside
// the register blocks, V in the set's layout.
TEST_P(CpuKernelSet, PvMatchesPortable) {
  for (bool rescale : {false, true}) {
    for (int rows : {1, 5, 6, 7, 8, 9, 13, 14, 32, 127, 128}) {
      for (int keys : {1, 7, 64}) {
        for (int d_pad : {16, 32, 48, 128, 256}) {
          const int ld_st = 128 + 16, ld_v = d_pad + 8, ld_o = d_pad + 16;
          std::vector<float> st = random_floats(size_t(keys) * ld_st, 37 + rows);
          for (float& p : st) p = std::fabs(p);
          const std::vector<float> v = random_floats(size_t(keys) * ld_v, 41 + keys);
          const std::vector<float> o = random_floats(size_t(128) * ld_o, 43);
          std::vector<float> factor = random_floats(128, 47);
          factor[0] = 0.0f;
          const float* f = rescale ? factor.data() : nullptr;
          int set_ld_v = 0;
          const std::vector<float> v_set = v_layout(*fast_, v, keys, ld_v, d_pad, &set_ld_v);
          std::vector<float> want(o), got(o);
          portable().pv(st.data(), ld_st, v.data(), ld_v, rows, keys, d_pad, f, want.data(), ld_o);
          fast_->pv(st.data(), ld_st, v_set.data(), set_ld_v, rows, keys, d_pad, f, got.data(), ld_o);
          for (int r = 0; r < 128; ++r) {
            for (int c = 0; c < ld_o; ++c) {
              const size_t at = size_t(r) * ld_o + c;
              if (r >= rows || c >= d_pad) {
                ASSERT_EQ(to_bits(got[at]), to_bits(o[at])) << "wrote outside: rows=" << rows << " r=" << r << " c=" << c;
                continue;
              }
              const float start = rescale ? o[at] * factor[r] : o[at];  // one fp32 multiplication
              double exact = start, magnitude = std::fabs(start);
              for (int j = 0; j < keys; ++j) {
                const double term = double(st[size_t(j) * ld_st + r]) * v[size_t(j) * ld_v + c];
                exact += term;
                magnitude += std::fabs(term);
              }
              const double tolerance = 4 * (keys + 1) * 0x1p-24 * magnitude;
              ASSERT_NEAR(got[at], exact, tolerance) << "rows=" << rows << " keys=" << keys << " d_pad=" << d_pad
                                                     << " r=" << r << " c=" << c;
              ASSERT_NEAR(got[at], want[at], 2 * tolerance);
            }
          }
        }
      }
    }
  }
}

// The transpose moves values: bit for bit, nothing written outside the rows x cols block.
TEST_P(CpuKernelSet, TransposeMatchesDefinition) {
  for (int rows : {1, 5, 16, 17, 64, 128}) {
    for (int cols : {1, 7, 16, 40, 128, 256}) {
      const int ld_src = cols + 3, ld_dst = rows + 5;
      const std::vector<float> src = random_floats(size_t(rows) * ld_src, 47 + rows);
      const std::vector<float> before = random_floats(size_t(cols) * ld_dst, 53 + cols);
      std::vector<float> got(before);
      fast_->transpose(src.data(), ld_src, rows, cols, got.data(), ld_dst);
      for (int c = 0; c < cols; ++c) {
        for (int r = 0; r < ld_dst; ++r) {
          const size_t at = size_t(c) * ld_dst + r;
          const float want = r < rows ? src[size_t(r) * ld_src + c] : before[at];
          ASSERT_EQ(to_bits(got[at]), to_bits(want)) << "rows=" << rows << " cols=" << cols << " r=" << r << " c=" << c;
        }
      }
    }
  }
}

// 2^x by the rule of exp2_poly.h, one step at a time, each a correctly rounded fp32 operation as
// in a vector lane: x raised to kExp2Lowest (NaN kept), n = x rounded to nearest even, the
// polynomial in f = x - n by Horner's rule with fused multiply-adds, then p 2^n rounded once (exact
// in double, so that the conversion to fp32 is the one rounding, denormals included).
float exp2_rule(float x) {
  using flashattn::cpu::kExp2Coefficients;
  using flashattn::cpu::kExp2MaxDegree;
  if (std::isnan(x)) return x;
  x = std::max(x, flashattn::cpu::kExp2Lowest);
  const float n = std::nearbyint(x);
  const float f = x - n;
  float p = kExp2Coefficients[kExp2MaxDegree];
  for (int k = kExp2MaxDegree - 1; k >= 0; --k) p = std::fma(p, f, kExp2Coefficients[k]);
  return float(std::ldexp(double(p), int(n)));
}

// One exp2 rule for every set (exp2_poly.h): exp2_sum with scale 1 and offset 0 (x * 1 - 0 is x,
// rounded once) gives exp2_rule bit for bit on a fine grid over [-160, 8], the ties of the
// rounding to n, the edges of the denormal and flushed ranges, -inf (0), and NaN (NaN).
TEST_P(CpuKernelSet, Exp2IsTheRule) {
  std::vector<float> x;
  for (int i = 0; i <= 16800; ++i) x.push_back(-160.0f + float(i) * 0.01f);
  for (float special : {-INFINITY, std::numeric_limits<float>::quiet_NaN(), -0.0f, 0.0f, -150.0f, -149.99f,
                        -149.5f, -149.0f, -126.0f, -125.5f, -125.0f, -0.5f, 0.5f, -1.5f, -2.5f, 1.5f, -1e30f,
                        from_bits(0x80000001u)}) {
    x.push_back(special);
  }
  const int rows_pad = kRowLanes * 8;
  x.resize(size_t(round_up(int(x.size()), rows_pad)), -3.25f);
  const int keys = int(x.size()) / rows_pad;
  const std::vector<float> offset(rows_pad, 0.0f);
  std::vector<float> got(x), sum(rows_pad);
  fast_->exp2_sum(got.data(), rows_pad, rows_pad, keys, 1.0f, offset.data(), sum.data());
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      ASSERT_TRUE(std::isnan(got[i]));
      continue;
    }
    ASSERT_EQ(to_bits(got[i]), to_bits(exp2_rule(x[i]))) << "x=" << x[i] << " got " << got[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Sets, CpuKernelSet,
                         ::testing::Values(KernelSet{"neon", flashattn::cpu::neon_kernels},
                                           KernelSet{"avx2", flashattn::cpu::avx2_kernels},
                                           KernelSet{"avx512", flashattn::cpu::avx512_kernels}),
                         [](const ::testing::TestParamInfo<KernelSet>& info) { return std::string(info.param.name); });

// One exp2 rule (exp2_poly.h): the AVX2 set's exp2 (2^n applied as two exponent factors) gives
// the AVX-512 set's results (scalef) bit for bit, denormals, flushes and NaN included.
TEST(CpuKernels, Avx2Exp2IsAvx512Exp2) {
  const TileKernels* avx2 = flashattn::cpu::avx2_kernels();
  const TileKernels* avx512 = flashattn::cpu::avx512_kernels();
  if (avx2 == nullptr || avx512 == nullptr) GTEST_SKIP() << "needs both AVX2 and AVX-512";
  const int rows_pad = kRowLanes * 8;
  std::vector<float> x;
  for (int i = 0; x.size() < size_t(rows_pad) * 100; ++i) x.push_back(-160.0f + float(i) * 0.01003f);
  x[5] = -INFINITY;
  x[6] = std::numeric_limits<float>::quiet_NaN();
  x[7] = -0.0f;
  x[8] = 0.0f;
  const int keys = int(x.size()) / rows_pad;
  const std::vector<float> offset(rows_pad, 0.0f);
  std::vector<float> a(x), b(x), sum_a(rows_pad), sum_b(rows_pad);
  avx2->exp2_sum(a.data(), rows_pad, rows_pad, keys, 1.0f, offset.data(), sum_a.data());
  avx512->exp2_sum(b.data(), rows_pad, rows_pad, keys, 1.0f, offset.data(), sum_b.data());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(to_bits(a[i]), to_bits(b[i])) << "x=" << x[i];
}

#ifdef FLASHATTN_HAVE_AVX2_KERNELS
// exp2 of 8-lane vectors of x (x.size() a multiple of 8): by exp2_ps (with its fast path, D-77)
// into fast, by the full exp2_poly_ps into full.
FA_AVX2 void avx2_exp2_both(const std::vector<float>& x, std::vector<float>& fast, std::vector<float>& full) {
  for (size_t i = 0; i < x.size(); i += 8) {
    const __m256 v = _mm256_loadu_ps(&x[i]);
    _mm256_storeu_ps(&fast[i], flashattn::cpu::exp2_ps(v));
    _mm256_storeu_ps(&full[i], flashattn::cpu::exp2_poly_ps<flashattn::cpu::kExp2MaxDegree>(v));
  }
}

// The AVX2 exp2's fast path (n from a rounding addition, 2^n added to the exponent bits; D-77)
// gives the full rule's results bit for bit: vectors entirely in its range, vectors that mix it
// with masked lanes (at or below -150, -inf), and vectors that leave it (denormal results, NaN,
// x above the range) and so take the full path.
TEST(CpuKernels, Avx2Exp2FastPathIsTheRule) {
  if (flashattn::cpu::avx2_kernels() == nullptr) GTEST_SKIP() << "needs AVX2";
  std::vector<float> x;
  for (int i = 0; i < 240000; ++i) x.push_back(-170.0f + float(i) * 0.001f);  // -170 .. 70
  std::mt19937 gen(41);
  std::uniform_real_distribution<float> near_max(-30.0f, 0.0f);
  for (int i = 0; i < 80000; ++i) x.push_back(near_max(gen));
  const float specials[] = {-INFINITY, std::numeric_limits<float>::quiet_NaN(), -0.0f, 0.0f, -150.0f, -149.99f,
                            -125.0f, -125.01f, -124.5f, -125.5f, 64.0f, 64.5f, -1e30f, 0.5f, -0.5f, 1.5f};
  for (size_t i = 0; i + 8 <= 80000; i += 8) {  // masked lanes among in-range ones, one special per vector
    x.push_back(near_max(gen));
    x.push_back(-INFINITY);
    x.push_back(near_max(gen));
    x.push_back(-150.0f - float(i % 7));
    for (int k = 0; k < 3; ++k) x.push_back(near_max(gen));
    x.push_back(i % 64 == 0 ? specials[(i / 64) % 16] : near_max(gen));
  }
  x.resize(x.size() / 8 * 8);
  std::vector<float> fast(x.size()), full(x.size());
  avx2_exp2_both(x, fast, full);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(to_bits(fast[i]), to_bits(full[i])) << "x=" << x[i] << " i=" << i;
}
#endif

// ---- bf16 tile kernels ---------------------------------------------------------------------------

struct Bf16KernelSet {
  const char* name;
  const Bf16Kernels* (*get)();
};

void PrintTo(const Bf16KernelSet& set, std::ostream* os) { *os << set.name; }

class CpuBf16KernelSet : public ::testing::TestWithParam<Bf16KernelSet> {
 protected:
  void SetUp() override {
    set_ = GetParam().get();
    if (set_ == nullptr) GTEST_SKIP() << "no " << GetParam().name << " on this CPU (or not compiled in)";
    ASSERT_STREQ(set_->name, GetParam().name);
  }
  // Tile heights of every block class: one row_pad, a few, and a whole 128-row tile.
  std::vector<int> rows_pads() const {
    const int pad = set_->row_pad;
    return {pad, 2 * pad, 3 * pad, 5 * pad, (128 / pad) * pad};
  }
  const Bf16Kernels* set_ = nullptr;
};

std::vector<uint16_t> random_bf16(size_t n, unsigned seed, float stddev = 1.0f) {
  const std::vector<float> x = random_floats(n, seed, stddev);
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = float_to_bf16_bits(x[i]);
  return bits;
}

// n row pointers into rows of `stride` bf16 (the rows of a cache, one head of each).
std::vector<const uint16_t*> row_pointers(const std::vector<uint16_t>& rows, int n, int stride) {
  std::vector<const uint16_t*> pointers(n);
  for (int j = 0; j < n; ++j) pointers[j] = rows.data() + size_t(j) * stride;
  return pointers;
}

TEST_P(CpuBf16KernelSet, PackMatchesLayouts) {
  for (int d : {32, 64, 128, 256}) {
    for (int n : {32, 64, 128}) {
      const int stride = d + 3 * kBf16Pair;
      const std::vector<uint16_t> k = random_bf16(size_t(n) * stride, 61 + d), v = random_bf16(size_t(n) * stride, 67 + n);
      std::vector<uint16_t> k_vnni(size_t(n) * d), v_vnni(size_t(n) * d);
      set_->pack_k(row_pointers(k, n, stride).data(), n, d, k_vnni.data());
      set_->pack_v(row_pointers(v, n, stride).data(), n, d, v_vnni.data());
      for (int j = 0; j < n; ++j) {
        for (int c = 0; c < d; ++c) {
          ASSERT_EQ(k_vnni[(size_t(c / 2) * n + j) * 2 + c % 2], k[size_t(j) * stride + c]) << "d=" << d << " j=" << j << " c=" << c;
          ASSERT_EQ(v_vnni[(size_t(j / 2) * d + c) * 2 + j % 2], v[size_t(j) * stride + c]) << "d=" << d << " j=" << j << " c=" << c;
        }
      }
    }
  }
}

// s = q . k^T over k_vnni blocks of tile_keys keys, n spanning several blocks.
TEST_P(CpuBf16KernelSet, ScoresMatchFloat64) {
  for (int d : {32, 64, 128, 256}) {
    for (int rows_pad : rows_pads()) {
      for (int n : {32, 64, 96, 256}) {
        const int tile_keys = 64, blocks = (n + tile_keys - 1) / tile_keys;
        const std::vector<uint16_t> q = random_bf16(size_t(rows_pad) * d, 71 + d);
        const std::vector<uint16_t> k = random_bf16(size_t(blocks) * tile_keys * d, 73 + n);
        const std::vector<const uint16_t*> k_rows = row_pointers(k, blocks * tile_keys, d);
        std::vector<uint16_t> k_vnni(k.size());
        for (int b = 0; b < blocks; ++b) {
          set_->pack_k(k_rows.data() + b * tile_keys, tile_keys, d, &k_vnni[size_t(b) * tile_keys * d]);
        }
        std::vector<float> s(size_t(rows_pad) * n + 64, -7.0f);
        set_->begin();
        set_->scores(q.data(), rows_pad, d, k_vnni.data(), tile_keys, n, s.data());
        set_->end();
        for (int r = 0; r < rows_pad; ++r) {
          for (int j = 0; j < n; ++j) {
            double exact = 0, magnitude = 0;
            for (int c = 0; c < d; ++c) {
              const double term = double(bf16_bits_to_float(q[size_t(r) * d + c])) * bf16_bits_to_float(k[size_t(j) * d + c]);
              exact += term;
              magnitude += std::fabs(term);
            }
            ASSERT_NEAR(s[size_t(r) * n + j], exact, 4 * d * 0x1p-24 * magnitude)
                << "d=" << d << " rows_pad=" << rows_pad << " n=" << n << " r=" << r << " j=" << j;
          }
        }
        for (size_t at = size_t(rows_pad) * n; at < s.size(); ++at) ASSERT_EQ(s[at], -7.0f) << "wrote past the tile";
      }
    }
  }
}

// The row max over the first `keys` columns, NaN ignored, exact.
TEST_P(CpuBf16KernelSet, RowMaxMatchesDefinition) {
  for (int rows : {1, 5, 16}) {
    for (int keys : {1, 7, 17, 64, 200}) {
      const int n = (keys + kBf16Pair - 1) / kBf16Pair * kBf16Pair;
      std::vector<float> s = random_floats(size_t(rows) * n, 79 + keys, 10.0f);
      std::mt19937 gen(5);
      for (float& x : s) {
        const unsigned pick = gen() % 16;
        if (pick == 0) x = std::numeric_limits<float>::quiet_NaN();
        if (pick == 1) x = -INFINITY;
      }
      for (int j = keys; j < n; ++j) s[j] = 1e30f;  // past the keys: not read
      std::vector<float> got(rows);
      set_->row_max(s.data(), n, rows, keys, got.data());
      for (int r = 0; r < rows; ++r) {
        float want = -INFINITY;
        for (int j = 0; j < keys; ++j) {
          const float x = s[size_t(r) * n + j];
          if (x > want) want = x;
        }
        ASSERT_EQ(to_bits(got[r]), to_bits(want)) << "rows=" << rows << " keys=" << keys << " r=" << r;
      }
    }
  }
}

// p = bf16 of exp2(s scale - offset): within bf16 rounding (half an ulp, 2^-8 relative) plus the
// exp2 polynomial's error (3e-6) of the float64 value, 0 where fp32 or bf16 has no normal
// number for it (VCVTNEPS2BF16 flushes denormals) and for -inf, 0 past the keys and in the
// padding rows; the sums of the fp32 values within 3e-6 relative per term.
TEST_P(CpuBf16KernelSet, RowExp2SumMatchesFloat64) {
  for (int rows_pad : rows_pads()) {
    for (int keys : {1, 7, 33, 64, 200}) {
      const int n = (keys + kBf16Pair - 1) / kBf16Pair * kBf16Pair, rows = std::max(1, rows_pad - 3);
      std::vector<float> s = random_floats(size_t(rows_pad) * n, 83 + keys, 4.0f);
      std::mt19937 gen(9);
      for (float& x : s) {
        const unsigned pick = gen() % 32;
        if (pick == 0) x = -INFINITY;
        if (pick == 1) x = -100.0f - float(gen() % 1000) * 0.11f;  // 2^-100 .. 2^-210
      }
      s[0] = std::numeric_limits<float>::quiet_NaN();  // row 0 is a NaN row
      std::vector<float> offset = random_floats(rows_pad, 29, 1.0f);
      for (float& o : offset) o = std::fabs(o) + 8.0f;
      const float scale = 0.9f;
      std::vector<uint16_t> p(size_t(rows_pad) * n, 0xbeef);
      std::vector<float> sum(rows_pad, -7.0f);
      set_->row_exp2_sum(s.data(), n, rows, rows_pad, keys, scale, offset.data(), sum.data(), p.data());
      for (int r = 0; r < rows_pad; ++r) {
        double exact_sum = 0, sum_tolerance = 0;
        for (int j = 0; j < n; ++j) {
          const size_t at = size_t(r) * n + j;
          if (r >= rows || j >= keys) {
            ASSERT_EQ(p[at], 0) << "padding r=" << r << " j=" << j;
            continue;
          }
          const double x = double(s[at]) * scale - offset[r];
          const float got = bf16_bits_to_float(p[at]);
          if (std::isnan(s[at])) {
            ASSERT_TRUE(std::isnan(got));
            continue;
          }
          if (std::isinf(s[at])) {
            ASSERT_EQ(p[at], 0) << "exp2(-inf) r=" << r << " j=" << j;
            continue;
          }
          const double exact = std::exp2(x);
          const double argument_error = (std::fabs(double(s[at]) * scale) + std::fabs(x)) * 0x1p-24;
          const double tolerance = exact * (3e-6 + 0.7 * argument_error);
          ASSERT_NEAR(got, exact, exact * 0x1p-8 + tolerance + 0x1p-126) << "x=" << x << " r=" << r << " j=" << j;
          exact_sum += exact;
          sum_tolerance += tolerance + 0x1p-149;
        }
        if (r >= rows) continue;
        if (r == 0) {
          ASSERT_TRUE(std::isnan(sum[r]));
        } else {
          ASSERT_NEAR(sum[r], exact_sum, sum_tolerance + exact_sum * (keys + 4) * 0x1p-24) << "r=" << r;
        }
      }
    }
  }
}

// o += p . v over v_vnni (the pack of n keys), nothing written past d or rows_pad.
TEST_P(CpuBf16KernelSet, PvMatchesFloat64) {
  for (int d : {32, 64, 128, 256}) {
    for (int rows_pad : rows_pads()) {
      for (int n : {32, 64, 256}) {
        const int ld_o = d + 16;
        const std::vector<uint16_t> p = random_bf16(size_t(rows_pad) * n, 89 + n, 0.3f);
        const std::vector<uint16_t> v = random_bf16(size_t(n) * d, 97 + d);
        std::vector<uint16_t> v_vnni(v.size());
        set_->pack_v(row_pointers(v, n, d).data(), n, d, v_vnni.data());
        const std::vector<float> o = random_floats(size_t(rows_pad + 1) * ld_o, 101 + rows_pad);
        std::vector<float> got(o);
        set_->begin();
        set_->pv(p.data(), rows_pad, n, v_vnni.data(), d, got.data(), ld_o);
        set_->end();
        for (int r = 0; r < rows_pad + 1; ++r) {
          for (int c = 0; c < ld_o; ++c) {
            const size_t at = size_t(r) * ld_o + c;
            if (r >= rows_pad || c >= d) {
              ASSERT_EQ(to_bits(got[at]), to_bits(o[at])) << "wrote outside: r=" << r << " c=" << c;
              continue;
            }
            double exact = o[at], magnitude = std::fabs(o[at]);
            for (int j = 0; j < n; ++j) {
              const double term = double(bf16_bits_to_float(p[size_t(r) * n + j])) * bf16_bits_to_float(v[size_t(j) * d + c]);
              exact += term;
              magnitude += std::fabs(term);
            }
            ASSERT_NEAR(got[at], exact, 4 * (n + 1) * 0x1p-24 * magnitude)
                << "d=" << d << " rows_pad=" << rows_pad << " n=" << n << " r=" << r << " c=" << c;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16Sets, CpuBf16KernelSet,
                         ::testing::Values(Bf16KernelSet{"avx512bf16", flashattn::cpu::avx512bf16_kernels},
                                           Bf16KernelSet{"amx", flashattn::cpu::amx_kernels}),
                         [](const ::testing::TestParamInfo<Bf16KernelSet>& info) { return std::string(info.param.name); });

// ---- decode kernels (D-72) ---------------------------------------------------------------------

using flashattn::DType;
using flashattn::cpu::DecodeKernels;
using flashattn::cpu::kDecodeKeys;

struct DecodeSet {
  const char* name;
  const DecodeKernels* (*get)(DType storage, int d);
};

void PrintTo(const DecodeSet& set, std::ostream* os) { *os << set.name; }

const DecodeKernels* portable_decode(DType storage, int) { return flashattn::cpu::portable_decode_kernels(storage); }

// Values of a storage type: their bits (as stored) and their fp32 values.
struct StoredRows {
  DType storage;
  std::vector<float> f32;      // storage f32: the rows; else their values
  std::vector<uint16_t> bits;  // storage f16 / bf16
  std::vector<uint8_t> bytes;  // storage e4m3
  const void* row(size_t at) const {
    if (storage == DType::e4m3) return &bytes[at];
    return storage == DType::f32 ? static_cast<const void*>(&f32[at]) : static_cast<const void*>(&bits[at]);
  }
};

StoredRows stored(DType storage, const std::vector<float>& x) {
  StoredRows r{storage, x, {}, {}};
  if (storage == DType::f32) return r;
  if (storage == DType::e4m3) {
    r.bytes.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      r.bytes[i] = flashattn::float_to_e4m3_bits(x[i]);
      r.f32[i] = flashattn::e4m3_bits_to_float(r.bytes[i]);
    }
    return r;
  }
  r.bits.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    r.bits[i] = storage == DType::bf16 ? float_to_bf16_bits(x[i]) : flashattn::float_to_half_bits(x[i]);
    r.f32[i] = storage == DType::bf16 ? bf16_bits_to_float(r.bits[i]) : flashattn::half_bits_to_float(r.bits[i]);
  }
  return r;
}

class CpuDecodeSet : public ::testing::TestWithParam<DecodeSet> {
 protected:
  // The set for (storage, d), or nullptr where it does not serve them (checked to be only where
  // the CPU lacks the set or d is not a multiple of its vector).
  const DecodeKernels* set(DType storage, int d) const { return GetParam().get(storage, d); }
  bool any_served() const {
    for (DType t : {DType::f32, DType::f16, DType::bf16, DType::e4m3}) {
      if (set(t, 128) != nullptr) return true;
    }
    return false;
  }
};

constexpr DType kDecodeStorages[] = {DType::f32, DType::f16, DType::bf16, DType::e4m3};

// keys rows of d elements, each at its own place in one buffer (stride d + 48, reversed), as
// paged rows are.
std::vector<const void*> scattered_rows(const StoredRows& rows, int keys, int d) {
  std::vector<const void*> out(static_cast<size_t>(keys));
  for (int j = 0; j < keys; ++j) out[size_t(j)] = rows.row(size_t(keys - 1 - j) * (d + 48));
  return out;
}

TEST_P(CpuDecodeSet, ScoresMaxExp2AndPv) {
  if (!any_served()) GTEST_SKIP() << "no " << GetParam().name << " on this CPU (or not compiled in)";
  int checked = 0;
  for (DType storage : kDecodeStorages) {
    for (int d : {32, 64, 128, 96, 48, 40}) {
      const DecodeKernels* k = set(storage, d);
      if (k == nullptr) continue;
      ASSERT_STREQ(k->name, GetParam().name);
      for (int heads : {1, 2, 3, 4, 5, 8}) {
        for (int keys : {1, 3, 4, 5, 15, 16}) {
          ++checked;
          const std::string at = "storage=" + std::to_string(int(storage)) + " d=" + std::to_string(d) +
                                 " heads=" + std::to_string(heads) + " keys=" + std::to_string(keys);
          const uint32_t seed = uint32_t(d * 131 + heads * 17 + keys);
          const StoredRows kr = stored(storage, random_floats(size_t(keys) * (d + 48), seed));
          const StoredRows vr = stored(storage, random_floats(size_t(keys) * (d + 48), seed + 1));
          const std::vector<const void*> k_rows = scattered_rows(kr, keys, d), v_rows = scattered_rows(vr, keys, d);
          // q: bf16 values (exact in bf16 and fp32), given as the set takes them.
          const StoredRows q = stored(DType::bf16, random_floats(size_t(heads) * d, seed + 2));
          const void* q_arg = k->bf16_query ? static_cast<const void*>(q.bits.data()) : q.f32.data();
          std::vector<float> s(size_t(heads + 1) * kDecodeKeys, -7.0f);
          k->scores(q_arg, heads, d, k_rows.data(), keys, s.data());
          auto value = [&](const StoredRows& r, int j, int c) { return r.f32[size_t(keys - 1 - j) * (d + 48) + c]; };
          for (int h = 0; h < heads; ++h) {
            for (int j = 0; j < keys; ++j) {
              double exact = 0.0, magnitude = 0.0;
              for (int c = 0; c < d; ++c) {
                const double term = double(q.f32[size_t(h) * d + c]) * value(kr, j, c);
                exact += term, magnitude += std::fabs(term);
              }
              ASSERT_NEAR(s[size_t(h) * kDecodeKeys + j], exact, 2 * d * 0x1p-24 * magnitude) << at << " h=" << h << " j=" << j;
            }
          }
          for (int i = heads * kDecodeKeys; i < (heads + 1) * kDecodeKeys; ++i) ASSERT_EQ(s[size_t(i)], -7.0f) << at;
          if (heads > 1 && keys > 1) s[kDecodeKeys + 1] = std::numeric_limits<float>::quiet_NaN();  // head 1, key 1
          std::vector<float> row_max(static_cast<size_t>(heads)), offset(row_max), sum(row_max);
          k->row_max(s.data(), heads, keys, row_max.data());
          for (int h = 0; h < heads; ++h) {
            float want = -INFINITY;
            for (int j = 0; j < keys; ++j) {
              const float x = s[size_t(h) * kDecodeKeys + j];
              if (x > want) want = x;
            }
            ASSERT_EQ(row_max[size_t(h)], want) << at << " h=" << h;
            offset[size_t(h)] = row_max[size_t(h)] * 0.125f;
          }
          const std::vector<float> scores = s;
          k->exp2_sum(s.data(), heads, keys, 0.125f, offset.data(), sum.data());
          for (int h = 0; h < heads; ++h) {
            double total = 0.0;
            for (int j = 0; j < kDecodeKeys; ++j) {
              const float got = s[size_t(h) * kDecodeKeys + j];
              if (j >= keys) {
                ASSERT_EQ(got, 0.0f) << at << " past the keys, h=" << h << " j=" << j;
                continue;
              }
              const double want = std::exp2(double(scores[size_t(h) * kDecodeKeys + j]) * 0.125 - offset[size_t(h)]);
              if (std::isnan(want)) {
                ASSERT_TRUE(std::isnan(got)) << at << " h=" << h << " j=" << j;
              } else {
                ASSERT_NEAR(got, want, 2e-6 * want + 1e-30) << at << " h=" << h << " j=" << j;
              }
              total += want;
            }
            if (std::isnan(total)) {
              ASSERT_TRUE(std::isnan(sum[size_t(h)])) << at << " a NaN score makes the sum NaN, h=" << h;
            } else {
              ASSERT_NEAR(sum[size_t(h)], total, 1e-5 * total) << at << " h=" << h;
            }
          }
          if (heads > 1 && keys > 1) s[kDecodeKeys + 1] = 0.5f;  // P.V below on finite P
          std::vector<float> factor(static_cast<size_t>(heads));
          for (int h = 0; h < heads; ++h) factor[size_t(h)] = 0.25f * float(h + 1);
          const std::vector<float> o = random_floats(size_t(heads + 1) * d, seed + 3);
          std::vector<float> got(o);
          k->pv(s.data(), heads, v_rows.data(), keys, d, factor.data(), got.data());
          for (int h = 0; h < heads + 1; ++h) {
            for (int c = 0; c < d; ++c) {
              const size_t i = size_t(h) * d + c;
              if (h == heads) {
                ASSERT_EQ(to_bits(got[i]), to_bits(o[i])) << at << " wrote outside, c=" << c;
                continue;
              }
              double exact = double(o[i]) * factor[size_t(h)], magnitude = std::fabs(exact);
              for (int j = 0; j < keys; ++j) {
                const double term = double(s[size_t(h) * kDecodeKeys + j]) * value(vr, j, c);
                exact += term, magnitude += std::fabs(term);
              }
              ASSERT_NEAR(got[i], exact, 2 * (keys + 1) * 0x1p-24 * magnitude) << at << " h=" << h << " c=" << c;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// e4m3 rows (D-87) are read as their e4m3 values: with q one-hot at column c, score j is K row j's
// value at c exactly, for every byte value but the two NaNs (at every position of a vector), and
// a NaN byte in a row makes that key's score NaN.
TEST_P(CpuDecodeSet, E4m3RowsReadAsTheirValues) {
  if (!any_served()) GTEST_SKIP() << "no " << GetParam().name << " on this CPU (or not compiled in)";
  if (std::string(GetParam().name) == "avx512bf16") GTEST_SKIP() << "the AVX512-BF16 set reads bf16 rows only";
  int checked = 0;
  for (int d : {128, 64, 32}) {
    const DecodeKernels* k = set(DType::e4m3, d);
    if (k == nullptr) continue;
    ASSERT_STREQ(k->name, GetParam().name);
    ASSERT_FALSE(k->bf16_query);
    std::vector<uint8_t> bytes(size_t(kDecodeKeys) * d);
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = uint8_t(i * 37 + i / 256);  // every byte value, at shifting positions
      if ((bytes[i] & 0x7f) == 0x7f) bytes[i] = 0x7e;  // (no NaN: 0 x NaN would be NaN)
    }
    std::vector<const void*> rows(kDecodeKeys);
    for (int j = 0; j < kDecodeKeys; ++j) rows[size_t(j)] = &bytes[size_t(j) * d];
    for (int c = 0; c < d; ++c) {
      std::vector<float> q(size_t(d), 0.0f), s(kDecodeKeys);
      q[size_t(c)] = 1.0f;
      k->scores(q.data(), 1, d, rows.data(), kDecodeKeys, s.data());
      for (int j = 0; j < kDecodeKeys; ++j) {
        const uint8_t b = bytes[size_t(j) * d + c];
        ASSERT_EQ(s[size_t(j)], flashattn::e4m3_bits_to_float(b)) << "d=" << d << " byte " << int(b);
      }
      ++checked;
    }
    for (uint8_t nan : {uint8_t(0x7f), uint8_t(0xff)}) {
      std::vector<uint8_t> with_nan = bytes;
      with_nan[size_t(3) * d + 5] = nan;  // key 3, column 5
      for (int j = 0; j < kDecodeKeys; ++j) rows[size_t(j)] = &with_nan[size_t(j) * d];
      std::vector<float> q(size_t(d), 0.5f), s(kDecodeKeys);
      k->scores(q.data(), 1, d, rows.data(), kDecodeKeys, s.data());
      for (int j = 0; j < kDecodeKeys; ++j) {
        ASSERT_EQ(std::isnan(s[size_t(j)]), j == 3) << "d=" << d << " key " << j << " NaN byte " << int(nan);
      }
    }
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(DecodeSets, CpuDecodeSet,
                         ::testing::Values(DecodeSet{"portable", portable_decode},
                                           DecodeSet{"neon", flashattn::cpu::neon_decode_kernels},
                                           DecodeSet{"avx2", flashattn::cpu::avx2_decode_kernels},
                                           DecodeSet{"avx512", flashattn::cpu::avx512_decode_kernels},
                                           DecodeSet{"avx512bf16", flashattn::cpu::avx512bf16_decode_kernels}),
                         [](const ::testing::TestParamInfo<DecodeSet>& info) { return std::string(info.param.name); });

// ---- dispatch ------------------------------------------------------------------------------------

using flashattn::cpu::KernelLevel;

// A set and the level that caps it.
template <typename Set>
struct Leveled {
  KernelLevel level;
  const Set* set;
};

// The first set of `sets` (fastest first) that this CPU has within the cap, else `fallback`.
template <typename Set, size_t N>
const Set& fastest_allowed(const Leveled<Set> (&sets)[N], const Set& fallback) {
  for (const Leveled<Set>& s : sets) {
    if (s.set != nullptr && flashattn::cpu::kernel_level_allowed(s.level)) return *s.set;
  }
  return fallback;
}

// tile_kernels() and decode_kernels() take the fastest set the CPU has within the
// FLASHATTN_KERNEL=automatic,cpu=<level> cap (ctest cpu_kernels_<level> runs this under each
// cap), and aarch64 takes NEON wherever the cap allows it. Prints the sets taken (for
// scripts/arm_check.sh).
TEST(CpuKernels, DispatchTakesTheFastestAllowedSet) {
  namespace cpu = flashattn::cpu;
  const Leveled<TileKernels> tile_sets[] = {{KernelLevel::avx512, cpu::avx512_kernels()},
                                            {KernelLevel::avx2, cpu::avx2_kernels()},
                                            {KernelLevel::neon, cpu::neon_kernels()}};
  const TileKernels& tile = cpu::tile_kernels();
  EXPECT_STREQ(tile.name, fastest_allowed(tile_sets, cpu::portable_kernels()).name);
  const char* decode_names[2] = {};
  const DType storages[2] = {DType::f32, DType::bf16};
  for (int i = 0; i < 2; ++i) {
    const DType storage = storages[i];
    const int d = 128;  // served by every decode set (bf16 storage: AVX512-BF16 too)
    const Leveled<DecodeKernels> decode_sets[] = {{KernelLevel::avx512bf16, cpu::avx512bf16_decode_kernels(storage, d)},
                                                  {KernelLevel::avx512, cpu::avx512_decode_kernels(storage, d)},
                                                  {KernelLevel::avx2, cpu::avx2_decode_kernels(storage, d)},
                                                  {KernelLevel::neon, cpu::neon_decode_kernels(storage, d)}};
    decode_names[i] = cpu::decode_kernels(storage, d).name;
    EXPECT_STREQ(decode_names[i], fastest_allowed(decode_sets, *cpu::portable_decode_kernels(storage)).name)
        << "storage " << int(storage);
  }
  std::printf("[ kernels  ] tile kernels: %s; decode kernels (d 128): f32 %s, bf16 %s\n", tile.name, decode_names[0],
              decode_names[1]);
#if defined(__aarch64__) && (!defined(__BYTE_ORDER__) || __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)
  // Every aarch64 CPU has NEON, and the set is compiled in for little-endian aarch64.
  if (cpu::kernel_level_allowed(KernelLevel::neon)) {
    EXPECT_STREQ(tile.name, "neon");
    EXPECT_STREQ(decode_names[0], "neon");
    EXPECT_STREQ(decode_names[1], "neon");
  }
#endif
}

// D-88: the AVX512-BF16 products run where they outrun the fp32 tiles (AMD), or where the cap asks
// for exactly them (ctest's cpu_kernels_avx512bf16 runs the set end to end on any CPU that has
// it); elsewhere bf16 prefill takes the fp32 tiles. AMX, where present and allowed, comes first.
TEST(CpuKernels, Bf16ProductsWhereTheyPayOrAreAsked) {
  namespace cpu = flashattn::cpu;
  const Bf16Kernels* chosen = cpu::bf16_kernels();
  std::printf("[ kernels  ] bf16 tile products: %s\n", chosen != nullptr ? chosen->name : "none (the fp32 tiles)");
  if (cpu::amx_kernels() != nullptr) {
    EXPECT_EQ(chosen, cpu::amx_kernels());
    return;
  }
  const bool asked = flashattn::kernel_override_from_env().cpu_kernels == flashattn::CpuKernels::avx512bf16;
  if (cpu::avx512bf16_kernels() == nullptr) {
    EXPECT_EQ(chosen, nullptr) << "no AVX512-BF16 set on this CPU (or not allowed)";
  } else if (asked) {
    EXPECT_EQ(chosen, cpu::avx512bf16_kernels()) << "cpu=avx512bf16 asks for the set";
  } else {
    EXPECT_EQ(chosen != nullptr, cpu::avx512bf16_products_pay());
  }
}

}  // namespace
