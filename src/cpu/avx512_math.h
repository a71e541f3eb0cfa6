// AVX-512 helpers shared by the AVX-512 and AMX tile kernels: the target attribute that lets
// a function use them in a build with the library's ordinary flags, and a vector exp2 (the rule
// and its coefficients: exp2_poly.h, shared with avx2_math.h).
#pragma once

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define FLASHATTN_HAVE_AVX512_KERNELS 1
#endif

#ifdef FLASHATTN_HAVE_AVX512_KERNELS
#include <immintrin.h>

#include "cpu/exp2_poly.h"

// GCC 12 warns inside its own intrinsics (their _mm512_undefined_ps operand).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define FA_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma")))

namespace flashattn {
namespace cpu {

// 2^x for x <= 0 or NaN by the rule of exp2_poly.h, with a polynomial of degree kDegree.
// Lanes at kExp2Lowest (masked scores: -inf) are 0 by the rule (2^-150 rounds to 0); they are
// computed as 2^0 and zeroed instead, because a scalef that underflows takes a microcode assist
// on Intel cores: a 64 x 128 tile of causal-diagonal scores, half -inf, took 22 us against
// 1.1 us (D-76). Results that are denormal (x in (-150, -126)) still take the assist.
template <int kDegree>
FA_AVX512 inline __m512 exp2_poly_ps(__m512 x) {
  static_assert(kDegree >= 1 && kDegree <= kExp2MaxDegree, "exp2_poly.h has the coefficients up to kExp2MaxDegree");
  x = _mm512_max_ps(_mm512_set1_ps(kExp2Lowest), x);  // max returns its second operand on NaN
  const __mmask16 nonzero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExp2Lowest), _CMP_NEQ_UQ);  // NaN kept
  const __m512 n = _mm512_maskz_roundscale_ps(nonzero, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_maskz_sub_ps(nonzero, x, n);
  __m512 p = _mm512_set1_ps(kExp2Coefficients[kDegree]);
  for (int k = kDegree - 1; k >= 0; --k) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Coefficients[k]));
  return _mm512_maskz_scalef_ps(nonzero, p, n);
}

// Degree 7: relative error below 1e-8 on [-0.5, 0.5], under fp32's half ulp.
FA_AVX512 inline __m512 exp2_ps(__m512 x) { return exp2_poly_ps<kExp2MaxDegree>(x); }

// Degree 5 (relative error below 3e-6): for probabilities that are rounded to bf16 (8
// significant bits) before they are used, while their fp32 row sums stay within 3e-6 (the LSE
// within 3e-6 absolute).
FA_AVX512 inline __m512 exp2_ps_for_bf16(__m512 x) { return exp2_poly_ps<5>(x); }

}  // namespace cpu
}  // namespace flashattn

#endif
