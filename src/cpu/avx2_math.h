// AVX2 helpers of the AVX2 tile kernels: the target attribute that lets a function use AVX2 and
// FMA in a build with the library's ordinary flags, and a vector exp2 (the rule and its
// coefficients: exp2_poly.h, shared with avx512_math.h).
#pragma once

// Where the target attribute exists (GCC and Clang on x86-64), as for the AVX-512 set.
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define FLASHATTN_HAVE_AVX2_KERNELS 1
#endif

#ifdef FLASHATTN_HAVE_AVX2_KERNELS
#include <immintrin.h>

#include "cpu/exp2_poly.h"

#define FA_AVX2 __attribute__((target("avx2,fma")))

namespace flashattn {
namespace cpu {

// 2^k for integer lanes k in [-126, 127]: the exponent field alone.
FA_AVX2 inline __m256 exp2_int_ps(__m256i k) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

// 2^f for f in [-0.5, 0.5]: exp2_poly.h's polynomial of degree kDegree, by Horner's rule.
template <int kDegree>
FA_AVX2 inline __m256 exp2_fraction_ps(__m256 f) {
  __m256 p = _mm256_set1_ps(kExp2Coefficients[kDegree]);
  for (int k = kDegree - 1; k >= 0; --k) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Coefficients[k]));
  return p;
}

// 2^x for x <= 0 or NaN by the rule of exp2_poly.h, with a polynomial of degree kDegree.
// AVX2 has no scalef: 2^n is applied as 2^(n - n/2) * 2^(n/2), each factor a normal number for
// n in [-150, 1], so that results down to 2^-150 come out as the AVX-512 set's (denormals
// included). On NaN, n's lanes hold garbage but p is NaN, and so is the product.
template <int kDegree>
FA_AVX2 inline __m256 exp2_poly_ps(__m256 x) {
  static_assert(kDegree >= 1 && kDegree <= kExp2MaxDegree, "exp2_poly.h has the coefficients up to kExp2MaxDegree");
  x = _mm256_max_ps(_mm256_set1_ps(kExp2Lowest), x);  // max returns its second operand on NaN
  // Lanes at kExp2Lowest (masked scores) are 0 by the rule: computed as 2^0 and zeroed, since a
  // product that underflows takes a microcode assist on Intel cores (avx512_math.h, D-76).
  const __m256 nonzero = _mm256_cmp_ps(x, _mm256_set1_ps(kExp2Lowest), _CMP_NEQ_UQ);  // NaN kept
  const __m256 n = _mm256_and_ps(nonzero, _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m256 f = _mm256_and_ps(nonzero, _mm256_sub_ps(x, n));
  const __m256 p = exp2_fraction_ps<kDegree>(f);
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);  // floor(n / 2)
  const __m256 scaled = _mm256_mul_ps(_mm256_mul_ps(p, exp2_int_ps(_mm256_sub_epi32(ni, half))), exp2_int_ps(half));
  return _mm256_and_ps(nonzero, scaled);
}

// Degree 7, as the AVX-512 set's exp2_ps: relative error below 1e-8 on [-0.5, 0.5].
// Where every lane is in [kExp2FastLowest, kExp2FastHighest] or at or below kExp2Lowest (the
// common case: the scores of a row near its max, and masked ones), the same result bit for bit
// in fewer operations (D-77): n comes from adding 1.5 * 2^23, whose sum holds round(x) (to
// nearest even, as _mm256_round_ps) in its low mantissa bits, so that shifting the sum's bits
// left by 23 gives n in the exponent field; p * 2^n is then one integer addition to p's bits,
// exact where the result is a normal number (n >= -125 with p >= 2^-0.5). Any other lane (a
// denormal or underflowing result, NaN, or x above the range) sends the whole vector through
// exp2_poly_ps. Tile microbenchmark (exp2_sum, 1 thread, hot): 0.45-0.48 -> 0.37-0.40 ns a score.
constexpr float kExp2FastLowest = -125.0f, kExp2FastHighest = 64.0f;

FA_AVX2 inline __m256 exp2_ps(__m256 x) {
  const __m256 zeroed = _mm256_cmp_ps(x, _mm256_set1_ps(kExp2Lowest), _CMP_LE_OQ);  // 0 by the rule
  const __m256 fast = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(kExp2FastLowest), _CMP_GE_OQ),
                                    _mm256_cmp_ps(x, _mm256_set1_ps(kExp2FastHighest), _CMP_LE_OQ));
  if (_mm256_movemask_ps(_mm256_or_ps(fast, zeroed)) != 0xff) return exp2_poly_ps<kExp2MaxDegree>(x);
  const __m256 magic = _mm256_set1_ps(0x1.8p23f);
  const __m256 shifted = _mm256_add_ps(x, magic);  // 1.5 * 2^23 + round(x)
  const __m256 n = _mm256_sub_ps(shifted, magic);
  const __m256 f = _mm256_sub_ps(x, n);
  const __m256 p = exp2_fraction_ps<kExp2MaxDegree>(f);
  const __m256i scaled = _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(shifted), 23));
  return _mm256_andnot_ps(zeroed, _mm256_castsi256_ps(scaled));
}

}  // namespace cpu
}  // namespace flashattn

#endif
