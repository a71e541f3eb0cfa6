// AVX-512 helpers shared by the AVX-512 and AMX tile kernels: the target attribute that lets
// a function use them in a build with the library's ordinary flags, and a vector exp2.
#pragma once

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define FLASHATTN_HAVE_AVX512_KERNELS 1
#endif

#ifdef FLASHATTN_HAVE_AVX512_KERNELS
#include <immintrin.h>

// GCC 12 warns inside its own intrinsics (their _mm512_undefined_ps operand).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define FA_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma")))

namespace flashattn {
namespace cpu {

// 2^x for x <= 0 or NaN: 2^round(x) * 2^f, f in [-0.5, 0.5], the latter from its degree-7
// Taylor polynomial (relative error below 1e-8 on that range, under fp32's half ulp). Inputs
// below -150 flush to 0; NaN stays NaN.
FA_AVX512 inline __m512 exp2_ps(__m512 x) {
  constexpr float kLowest = -150.0f;
  constexpr float c1 = 0.6931471805599453f, c2 = 0.2402265069591007f,
                  c3 = 0.05550410866482158f, c4 = 0.009618129107628477f,
                  c5 = 0.0013333558146428443f, c6 = 0.00015403530393381608f,
                  c7 = 1.525273380405984e-05f;
  x = _mm512_max_ps(_mm512_set1_ps(kLowest), x);  // max returns its second operand on NaN
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(c7);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c5));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 2^x as exp2_ps, with the degree-5 Taylor polynomial (relative error below 3e-6): for
// probabilities that are rounded to bf16 (8 significant bits) before they are used, while
// their fp32 row sums stay within 3e-6 (the LSE within 3e-6 absolute).
FA_AVX512 inline __m512 exp2_ps_for_bf16(__m512 x) {
  constexpr float kLowest = -150.0f;
  constexpr float c1 = 0.6931471805599453f, c2 = 0.2402265069591007f,
                  c3 = 0.05550410866482158f, c4 = 0.009618129107628477f,
                  c5 = 0.0013333558146428443f;
  x = _mm512_max_ps(_mm512_set1_ps(kLowest), x);  // max returns its second operand on NaN
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(c5);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace cpu
}  // namespace flashattn

#endif
