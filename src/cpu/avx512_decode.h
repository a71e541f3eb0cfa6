// The AVX-512 decode kernels (kernels.h "decode kernels", D-72), shared by the AVX-512 set
// (kernels_avx512.cpp: scores with fp32 FMAs on the widened rows) and the AVX512-BF16 set
// (kernels_avx512bf16.cpp: scores with VDPBF16PS on the rows as stored), which differ only in
// the scores. Key rows are read where they are stored, 16 elements per zmm, widened to fp32 in
// registers (bf16: a shift, fp16: VCVTPH2PS); nothing is copied.
#pragma once

#include "cpu/avx512_math.h"
#include "cpu/kernels.h"

#ifdef FLASHATTN_HAVE_AVX512_KERNELS
#include <cmath>
#include <cstdint>
#include <limits>

#include "flashattn/flashattn.h"

namespace flashattn {
namespace cpu {
namespace avx512_decode {

constexpr int kLanes = 16;
// Register blocks. Scores: 4 keys x 4 heads (16 zmm accumulators, each a dot product's 16
// partial sums, reduced together by sum_lanes_16). P.V: 4 heads x 64 columns (16 zmm).
constexpr int kScoreKeys = 4, kHeads = 4;
constexpr int kPvVecs = 4;
static_assert(kDecodeKeys % kScoreKeys == 0, "score blocks tile a key block");

// Elements c .. c + 15 of a row stored as D, widened to fp32. e4m3 (D-87): each byte's sign and
// 7 magnitude bits placed as an fp16 (sign at bit 15, magnitude at bits 7..13: the byte
// sign-extended to 16 bits, shifted left by 7, bit 14 cleared) read as the e4m3 value x 2^-8,
// subnormal bytes included (fp16 has 3 more exponent bits and 7 more mantissa bits); VCVTPH2PS
// widens it exactly (it ignores MXCSR.DAZ; every fp16 is a normal fp32), x 256 is exact; the NaN
// bytes (magnitude 0x7f) become NaN.
template <DType D>
FA_AVX512 inline __m512 load16(const void* row, int c) {
  if constexpr (D == DType::f32) {
    return _mm512_loadu_ps(static_cast<const float*>(row) + c);
  } else if constexpr (D == DType::e4m3) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(row) + c));
    const __m256i half = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7),
                                          _mm256_set1_epi16(short(0xbf80)));
    const __m512 x = _mm512_mul_ps(_mm512_cvtph_ps(half), _mm512_set1_ps(256.0f));
    const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_or_si128(bytes, _mm_set1_epi8(char(0x80))), _mm_set1_epi8(char(0xff)));
    return _mm512_mask_mov_ps(x, nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
  } else {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + c));
    if constexpr (D == DType::f16) {
      return _mm512_cvtph_ps(bits);
    } else {  // bf16: the upper half of an fp32
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    }
  }
}

// Lane i of the result = the sum of the 16 lanes of x[i]: three levels of pairwise folds
// (256-bit halves, 128-bit quarters, then within 128-bit lanes). The folds leave lane 4k + i
// holding input i + {0, 8, 4, 12}[k]; the inputs are taken in that order so that the result
// is in natural order.
FA_AVX512 inline __m512 fold_halves(__m512 a, __m512 b) {  // [a lo + a hi | b lo + b hi]
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
FA_AVX512 inline __m512 fold_quarters(__m512 a, __m512 b) {  // [a0+a1, a2+a3, b0+b1, b2+b3] (128-bit blocks)
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}
FA_AVX512 inline __m512 fold_pairs(__m512 a, __m512 b) {  // per 128-bit block [a0+a2, a1+a3, b0+b2, b1+b3]
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
}
FA_AVX512 inline __m512 fold_singles(__m512 a, __m512 b) {  // per 128-bit block [a0+a1, a2+a3, b0+b1, b2+b3]
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}
FA_AVX512 inline __m512 sum_lanes_16(const __m512 (&x)[16]) {
  constexpr int kOrder[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i) t[i] = fold_halves(x[kOrder[i]], x[kOrder[i + 8]]);
  for (int i = 0; i < 4; ++i) u[i] = fold_quarters(t[i], t[i + 4]);
  return fold_singles(fold_pairs(u[0], u[1]), fold_pairs(u[2], u[3]));
}

// The scores of kScoreKeys keys (rows k[0..3]) and H heads (H <= kHeads), acc[h][i] holding the
// 16 partial sums of q_h . k_i, into s[h][j0 + i]: lane 4h + i of the folded sums.
template <int H>
FA_AVX512 inline void store_score_block(const __m512 (&acc)[kHeads][kScoreKeys], float* s, int j0) {
  __m512 x[16];
  for (int h = 0; h < kHeads; ++h) {
    for (int i = 0; i < kScoreKeys; ++i) x[h * kScoreKeys + i] = h < H ? acc[h][i] : _mm512_setzero_ps();
  }
  const __m512 sums = sum_lanes_16(x);
  // Lanes 4h .. 4h + 3 to s[h][j0 .. j0 + 3] (j0 + 3 < kDecodeKeys): the masked store's base
  // is 4h lanes before.
  for (int h = 0; h < H; ++h) {
    _mm512_mask_storeu_ps(s + h * kDecodeKeys + j0 - h * kScoreKeys, __mmask16(0xFu << (h * kScoreKeys)), sums);
  }
}

// The key rows of score block j0: rows past the last key repeat it (their scores are never used).
inline void score_block_rows(const void* const* k_rows, int keys, int j0, const void* (&k)[kScoreKeys]) {
  for (int i = 0; i < kScoreKeys; ++i) k[i] = k_rows[j0 + i < keys ? j0 + i : keys - 1];
}

// Scores of H heads of fp32 q (H <= kHeads) with fp32 FMAs on the widened rows.
template <DType D, int H>
FA_AVX512 void scores_heads(const float* q, int d, const void* const* k_rows, int keys, float* s) {
  for (int j0 = 0; j0 < keys; j0 += kScoreKeys) {
    const void* k[kScoreKeys];
    score_block_rows(k_rows, keys, j0, k);
    __m512 acc[kHeads][kScoreKeys];
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < kScoreKeys; ++i) acc[h][i] = _mm512_setzero_ps();
    for (int c = 0; c < d; c += kLanes) {
      __m512 kv[kScoreKeys];
      for (int i = 0; i < kScoreKeys; ++i) kv[i] = load16<D>(k[i], c);
      for (int h = 0; h < H; ++h) {
        const __m512 qv = _mm512_loadu_ps(q + size_t(h) * d + c);
        for (int i = 0; i < kScoreKeys; ++i) acc[h][i] = _mm512_fmadd_ps(qv, kv[i], acc[h][i]);
      }
    }
    store_score_block<H>(acc, s, j0);
  }
}

// Calls fn<H>(h0) for the groups of kHeads heads (the last one shorter) of `heads`.
template <template <int> class Group, typename... Args>
FA_AVX512 inline void by_head_groups(int heads, Args... args) {
  int h0 = 0;
  for (; h0 + kHeads <= heads; h0 += kHeads) Group<kHeads>::run(h0, args...);
  switch (heads - h0) {
    case 3: Group<3>::run(h0, args...); break;
    case 2: Group<2>::run(h0, args...); break;
    case 1: Group<1>::run(h0, args...); break;
    default: break;
  }
}

template <DType D>
struct ScoreGroup {
  template <int H>
  struct Of {
    FA_AVX512 static void run(int h0, const float* q, int d, const void* const* k_rows, int keys, float* s) {
      scores_heads<D, H>(q + size_t(h0) * d, d, k_rows, keys, s + h0 * kDecodeKeys);
    }
  };
};

template <DType D>
FA_AVX512 void scores(const void* q, int heads, int d, const void* const* k_rows, int keys, float* s) {
  by_head_groups<ScoreGroup<D>::template Of>(heads, static_cast<const float*>(q), d, k_rows, keys, s);
}

FA_AVX512 inline __mmask16 key_mask(int keys) { return __mmask16((1u << keys) - 1u); }

FA_AVX512 inline void row_max(const float* s, int heads, int keys, float* out) {
  const __m512 lowest = _mm512_set1_ps(-INFINITY);
  for (int h = 0; h < heads; ++h) {
    const __m512 x = _mm512_mask_loadu_ps(lowest, key_mask(keys), s + h * kDecodeKeys);
    // max(x, lowest) returns lowest where x is NaN: NaN scores are ignored.
    out[h] = _mm512_reduce_max_ps(_mm512_max_ps(x, lowest));
  }
}

FA_AVX512 inline void exp2_sum(float* s, int heads, int keys, float scale_log2, const float* offset, float* sum) {
  const __m512 scale = _mm512_set1_ps(scale_log2);
  for (int h = 0; h < heads; ++h) {
    float* row = s + h * kDecodeKeys;
    const __m512 x = _mm512_maskz_loadu_ps(key_mask(keys), row);
    const __m512 p = _mm512_maskz_mov_ps(key_mask(keys), exp2_ps(_mm512_fmsub_ps(x, scale, _mm512_set1_ps(offset[h]))));
    _mm512_storeu_ps(row, p);
    sum[h] = _mm512_reduce_add_ps(p);
  }
}

// o[h][c0 + ...] for H heads and V vectors of columns: rescaled, then + sum_j p[h][j] v_j.
template <DType D, int H, int V>
FA_AVX512 inline void pv_block(const float* p, const void* const* v_rows, int keys, int d, int c0,
                               const float* factor, float* o) {
  __m512 acc[H][V];
  for (int h = 0; h < H; ++h) {
    const __m512 f = _mm512_set1_ps(factor[h]);
    for (int v = 0; v < V; ++v) acc[h][v] = _mm512_mul_ps(_mm512_loadu_ps(o + size_t(h) * d + c0 + v * kLanes), f);
  }
  for (int j = 0; j < keys; ++j) {
    __m512 vv[V];
    for (int v = 0; v < V; ++v) vv[v] = load16<D>(v_rows[j], c0 + v * kLanes);
    for (int h = 0; h < H; ++h) {
      const __m512 pj = _mm512_set1_ps(p[h * kDecodeKeys + j]);
      for (int v = 0; v < V; ++v) acc[h][v] = _mm512_fmadd_ps(pj, vv[v], acc[h][v]);
    }
  }
  for (int h = 0; h < H; ++h)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(o + size_t(h) * d + c0 + v * kLanes, acc[h][v]);
}

template <DType D>
struct PvGroup {
  template <int H>
  struct Of {
    FA_AVX512 static void run(int h0, const float* p, const void* const* v_rows, int keys, int d, const float* factor,
                              float* o) {
      p += h0 * kDecodeKeys, factor += h0, o += size_t(h0) * d;
      int c0 = 0;
      for (; c0 + kPvVecs * kLanes <= d; c0 += kPvVecs * kLanes) pv_block<D, H, kPvVecs>(p, v_rows, keys, d, c0, factor, o);
      for (; c0 < d; c0 += kLanes) pv_block<D, H, 1>(p, v_rows, keys, d, c0, factor, o);
    }
  };
};

template <DType D>
FA_AVX512 void pv(const float* p, int heads, const void* const* v_rows, int keys, int d, const float* factor, float* o) {
  by_head_groups<PvGroup<D>::template Of>(heads, p, v_rows, keys, d, factor, o);
}

}  // namespace avx512_decode
}  // namespace cpu
}  // namespace flashattn

#endif
