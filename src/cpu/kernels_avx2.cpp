// The AVX2 tile kernels: the AVX-512 set's algorithms (kernels_avx512.cpp) on 8-lane fp32
// vectors with FMA, for CPUs that have AVX2 but not AVX-512. Register blocks of 12 ymm
// accumulators (of 16 registers; see kScoreKeys). Every function carries the target attribute,
// so that this file builds with the library's ordinary flags and runs only where avx2_kernels()
// found AVX2 and FMA.
#include "cpu/kernels.h"

#include "cpu/avx2_math.h"

#ifdef FLASHATTN_HAVE_AVX2_KERNELS
#include <algorithm>
#include <cmath>
#include <cstring>

namespace flashattn {
namespace cpu {
namespace {

// Complete unrolling of the loops over a register block's accumulators, early enough that the
// accumulator arrays become registers: without it g++ 12 keeps each array in memory too and
// stores every accumulator once per key (12 stack stores per 12 FMAs). fp16 1 x 1024 x 4,
// causal, 1 thread: d = 64 15.1 -> 11.6 ms, d = 128 28.1 -> 21.6, d = 256 59.9 -> 53.9.
#define FA_UNROLL _Pragma("GCC unroll 16")

constexpr int kLanes = 8;  // fp32 per ymm
// Register blocks, 12 accumulators each (with the operands, the 16 ymm registers). Scores: 6
// keys x 16 query rows (per head-dim step 2 loads of the query tile and 6 key broadcasts per 12
// FMAs); PV: 6 rows x 16 columns. Blocks of fewer keys or rows take the tails below.
constexpr int kScoreKeys = 6, kScoreVecs = 2;
constexpr int kPvRows = 6, kPvVecs = 2;
static_assert(kRowLanes % kLanes == 0, "tiles pad rows and columns to whole ymm vectors");

// ---- scores: st (keys x rows) = k (keys x d) . qt (d x rows) ---------------------------------

// A block of kKeys keys x kVecs*8 rows, accumulated over the whole head dim in registers.
template <int kKeys, int kVecs>
FA_AVX2 inline void scores_block(const float* qt, int ld_qt, const float* k, int ld_k, int d,
                                 float* st, int ld_st) {
  __m256 acc[kKeys][kVecs];
  FA_UNROLL
  for (int i = 0; i < kKeys; ++i)
    FA_UNROLL
    for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm256_setzero_ps();
  for (int c = 0; c < d; ++c) {
    __m256 q[kVecs];
    FA_UNROLL
    for (int v = 0; v < kVecs; ++v) q[v] = _mm256_loadu_ps(qt + size_t(c) * ld_qt + v * kLanes);
    FA_UNROLL
    for (int i = 0; i < kKeys; ++i) {
      const __m256 kc = _mm256_broadcast_ss(k + size_t(i) * ld_k + c);
      FA_UNROLL
      for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm256_fmadd_ps(kc, q[v], acc[i][v]);
    }
  }
  FA_UNROLL
  for (int i = 0; i < kKeys; ++i)
    FA_UNROLL
    for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(st + size_t(i) * ld_st + v * kLanes, acc[i][v]);
}

// The last keys % kKeys keys of a strip as one block of that many keys.
template <int kKeys, int kVecs>
FA_AVX2 void scores_tail(const float* qt, int ld_qt, const float* k, int ld_k, int d, int keys,
                         float* st, int ld_st) {
  if constexpr (kKeys > 0) {
    if (keys == kKeys) return scores_block<kKeys, kVecs>(qt, ld_qt, k, ld_k, d, st, ld_st);
    scores_tail<kKeys - 1, kVecs>(qt, ld_qt, k, ld_k, d, keys, st, ld_st);
  }
}

template <int kKeys, int kVecs>
FA_AVX2 void scores_strip(const float* qt, int ld_qt, const float* k, int ld_k, int d, int keys,
                          float* st, int ld_st) {
  int j = 0;
  for (; j + kKeys <= keys; j += kKeys) {
    scores_block<kKeys, kVecs>(qt, ld_qt, k + size_t(j) * ld_k, ld_k, d, st + size_t(j) * ld_st, ld_st);
  }
  scores_tail<kKeys - 1, kVecs>(qt, ld_qt, k + size_t(j) * ld_k, ld_k, d, keys - j, st + size_t(j) * ld_st, ld_st);
}

// Strips of kVecs row vectors over all keys; rows_pad (a multiple of kLanes, the set's
// row_lanes) may end in a one-vector strip, which takes kKeys * kVecs keys per block (as many
// accumulators): decode tiles of 8 rows or fewer are all one such strip.
template <int kKeys, int kVecs>
FA_AVX2 void scores_blocked(const float* qt, int ld_qt, const float* k, int ld_k, int d, int rows_pad,
                            int keys, float* st, int ld_st) {
  int r = 0;
  for (; r + kVecs * kLanes <= rows_pad; r += kVecs * kLanes) {
    scores_strip<kKeys, kVecs>(qt + r, ld_qt, k, ld_k, d, keys, st + r, ld_st);
  }
  for (; r < rows_pad; r += kLanes) scores_strip<kKeys * kVecs, 1>(qt + r, ld_qt, k, ld_k, d, keys, st + r, ld_st);
}

FA_AVX2 void scores(const float* qt, int ld_qt, const float* k, int ld_k, int d, int rows_pad,
                    int keys, float* st, int ld_st) {
  scores_blocked<kScoreKeys, kScoreVecs>(qt, ld_qt, k, ld_k, d, rows_pad, keys, st, ld_st);
}

// ---- softmax row passes ------------------------------------------------------------------------

FA_AVX2 void tile_max(const float* st, int ld_st, int rows_pad, int keys, float* out) {
  for (int r = 0; r < rows_pad; r += kLanes) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    // max(s, m) returns m when s is NaN: NaN scores are ignored, as in the portable set.
    for (int j = 0; j < keys; ++j) m = _mm256_max_ps(_mm256_loadu_ps(st + size_t(j) * ld_st + r), m);
    _mm256_storeu_ps(out + r, m);
  }
}

FA_AVX2 void exp2_sum(float* st, int ld_st, int rows_pad, int keys, float scale_log2,
                      const float* offset, float* tile_sum) {
  const __m256 scale = _mm256_set1_ps(scale_log2);
  for (int r = 0; r < rows_pad; r += kLanes) {
    const __m256 off = _mm256_loadu_ps(offset + r);
    __m256 sum = _mm256_setzero_ps();
    for (int j = 0; j < keys; ++j) {
      float* s = st + size_t(j) * ld_st + r;
      const __m256 p = exp2_ps(_mm256_fmsub_ps(_mm256_loadu_ps(s), scale, off));
      _mm256_storeu_ps(s, p);
      sum = _mm256_add_ps(sum, p);
    }
    _mm256_storeu_ps(tile_sum + r, sum);
  }
}

FA_AVX2 void scale_rows(float* o, int ld_o, int rows, int d_pad, const float* factor) {
  for (int r = 0; r < rows; ++r) {
    const __m256 f = _mm256_set1_ps(factor[r]);
    float* row = o + size_t(r) * ld_o;
    for (int c = 0; c < d_pad; c += kLanes) _mm256_storeu_ps(row + c, _mm256_mul_ps(_mm256_loadu_ps(row + c), f));
  }
}

// ---- o (rows x d) += p (rows x keys, stored transposed in st) . v (keys x d) ---------------------

// A block of kRows rows x kVecs*8 columns of o, kept in registers over all keys.
template <int kRows, int kVecs>
FA_AVX2 inline void pv_block(const float* st, int ld_st, const float* v, int ld_v, int keys, float* o,
                             int ld_o) {
  __m256 acc[kRows][kVecs];
  FA_UNROLL
  for (int i = 0; i < kRows; ++i)
    FA_UNROLL
    for (int c = 0; c < kVecs; ++c) acc[i][c] = _mm256_loadu_ps(o + size_t(i) * ld_o + c * kLanes);
  for (int j = 0; j < keys; ++j) {
    __m256 vj[kVecs];
    FA_UNROLL
    for (int c = 0; c < kVecs; ++c) vj[c] = _mm256_loadu_ps(v + size_t(j) * ld_v + c * kLanes);
    FA_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const __m256 p = _mm256_broadcast_ss(st + size_t(j) * ld_st + i);
      FA_UNROLL
      for (int c = 0; c < kVecs; ++c) acc[i][c] = _mm256_fmadd_ps(p, vj[c], acc[i][c]);
    }
  }
  FA_UNROLL
  for (int i = 0; i < kRows; ++i)
    FA_UNROLL
    for (int c = 0; c < kVecs; ++c) _mm256_storeu_ps(o + size_t(i) * ld_o + c * kLanes, acc[i][c]);
}

// Column strips of kVecs vectors for kRows rows; narrower tails one vector at a time.
template <int kRows, int kVecs>
FA_AVX2 void pv_rows(const float* st, int ld_st, const float* v, int ld_v, int keys, int d_pad, float* o,
                     int ld_o) {
  int c = 0;
  for (; c + kVecs * kLanes <= d_pad; c += kVecs * kLanes) pv_block<kRows, kVecs>(st, ld_st, v + c, ld_v, keys, o + c, ld_o);
  for (; c < d_pad; c += kLanes) pv_block<kRows, 1>(st, ld_st, v + c, ld_v, keys, o + c, ld_o);
}

// The last rows % kRows rows as one block of that many rows.
template <int kRows, int kVecs>
FA_AVX2 void pv_tail(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys, int d_pad,
                     float* o, int ld_o) {
  if constexpr (kRows > 0) {
    if (rows == kRows) return pv_rows<kRows, kVecs>(st, ld_st, v, ld_v, keys, d_pad, o, ld_o);
    pv_tail<kRows - 1, kVecs>(st, ld_st, v, ld_v, rows, keys, d_pad, o, ld_o);
  }
}

template <int kRows, int kVecs>
FA_AVX2 void pv_blocked(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys,
                        int d_pad, float* o, int ld_o) {
  int r = 0;
  for (; r + kRows <= rows; r += kRows) pv_rows<kRows, kVecs>(st + r, ld_st, v, ld_v, keys, d_pad, o + size_t(r) * ld_o, ld_o);
  pv_tail<kRows - 1, kVecs>(st + r, ld_st, v, ld_v, rows - r, keys, d_pad, o + size_t(r) * ld_o, ld_o);
}

FA_AVX2 void pv(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys, int d_pad,
                float* o, int ld_o) {
  pv_blocked<kPvRows, kPvVecs>(st, ld_st, v, ld_v, rows, keys, d_pad, o, ld_o);
}

// half.h float_to_bf16_bits on 8 lanes: round to nearest even, NaN kept quiet.
FA_AVX2 void scaled_to_bf16(const float* src, int n, float scale, uint16_t* dst) {
  const __m256 f = _mm256_set1_ps(scale);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i half_ulp = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int c = 0; c < n; c += kLanes) {
    const int count = std::min(kLanes, n - c);
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), lane);
    const __m256i x = _mm256_castps_si256(_mm256_mul_ps(_mm256_maskload_ps(src + c, lanes), f));
    const __m256i rounding = _mm256_add_epi32(half_ulp, _mm256_and_si256(_mm256_srli_epi32(x, 16), one));
    __m256i bits = _mm256_srli_epi32(_mm256_add_epi32(x, rounding), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);  // |x| > inf as integers
    bits = _mm256_blendv_epi8(bits, _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet), nan);
    // Lanes hold 0 .. 0xffff: packing with unsigned saturation keeps them as they are.
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
    if (count == kLanes) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + c), packed);
    } else {
      uint16_t out[kLanes];
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), packed);
      std::memcpy(dst + c, out, sizeof(uint16_t) * size_t(count));
    }
  }
}

// 8 x 8 blocks through registers would gain little here: the query tile is transposed once per
// work item. Plain loops, one source row at a time.
FA_AVX2 void transpose(const float* src, int ld_src, int rows, int cols, float* dst, int ld_dst) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) dst[size_t(c) * ld_dst + r] = src[size_t(r) * ld_src + c];
  }
}

}  // namespace

const TileKernels* avx2_kernels() {
  static const TileKernels kernels{"avx2", kLanes, scores, tile_max, exp2_sum, scale_rows, pv, scaled_to_bf16, transpose};
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported ? &kernels : nullptr;
}

}  // namespace cpu
}  // namespace flashattn

#else  // no AVX2 kernels in this build

namespace flashattn {
namespace cpu {
const TileKernels* avx2_kernels() { return nullptr; }
}  // namespace cpu
}  // namespace flashattn

#endif
