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
#include <limits>

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

// The K and V layouts this set reads (kernels.h; D-77): K in blocks of kScoreKeys keys, column by
// column, so that a scores block broadcasts its 6 keys' column c from one 24-byte run (one
// stream instead of 6 rows d_pad floats apart); V in strips of kPvCols columns, key by key, so
// that a P.V block reads its 16 columns of each key from one contiguous strip.
constexpr int kKeyBlock = kScoreKeys;
constexpr int kPvCols = kPvVecs * kLanes;
static_assert(kKeyBlock <= kMaxKeyBlock, "the walk's K pack buffers kMaxKeyBlock rows");

// ---- scores: st (keys x rows) = k (keys x d) . qt (d x rows) ---------------------------------

// Column c of key i of a run of K blocks that starts at a block (blocks kKeyBlock * ld_k apart).
FA_AVX2 inline const float* k_at(const float* k, int ld_k, int i, int c) {
  return k + size_t(i / kKeyBlock) * kKeyBlock * ld_k + size_t(c) * kKeyBlock + i % kKeyBlock;
}

// A block of kKeys keys (from the start of a K block; more than kKeyBlock keys span the next
// blocks) x kVecs*8 rows, accumulated over the whole head dim in registers.
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
      const __m256 kc = _mm256_broadcast_ss(k_at(k, ld_k, i, c));
      FA_UNROLL
      for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm256_fmadd_ps(kc, q[v], acc[i][v]);
    }
  }
  FA_UNROLL
  for (int i = 0; i < kKeys; ++i)
    FA_UNROLL
    for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(st + size_t(i) * ld_st + v * kLanes, acc[i][v]);
}

// The last keys % kKeys keys of a strip as one block of that many keys (no score row past
// `keys` is written: the walk's score tile holds the key tile's keys only).
template <int kKeys, int kVecs>
FA_AVX2 void scores_tail(const float* qt, int ld_qt, const float* k, int ld_k, int d, int keys,
                         float* st, int ld_st) {
  if constexpr (kKeys > 0) {
    if (keys == kKeys) return scores_block<kKeys, kVecs>(qt, ld_qt, k, ld_k, d, st, ld_st);
    scores_tail<kKeys - 1, kVecs>(qt, ld_qt, k, ld_k, d, keys, st, ld_st);
  }
}

// kKeys a multiple of kKeyBlock: each block starts at a K block (key j at k + j * ld_k).
template <int kKeys, int kVecs>
FA_AVX2 void scores_strip(const float* qt, int ld_qt, const float* k, int ld_k, int d, int keys,
                          float* st, int ld_st) {
  static_assert(kKeys % kKeyBlock == 0, "register blocks start on K blocks");
  int j = 0;
  for (; j + kKeys <= keys; j += kKeys) {
    scores_block<kKeys, kVecs>(qt, ld_qt, k + size_t(j) * ld_k, ld_k, d, st + size_t(j) * ld_st, ld_st);
  }
  scores_tail<kKeys - 1, kVecs>(qt, ld_qt, k + size_t(j) * ld_k, ld_k, d, keys - j, st + size_t(j) * ld_st, ld_st);
}

// Strips of kVecs row vectors over all keys; rows_pad (a multiple of kLanes, the set's
// row_lanes) may end in a one-vector strip, which takes kKeys * kVecs keys per block (as many
// accumulators).
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
FA_AVX2 inline void pv_block(const float* st, int ld_st, const float* v, int ld_v, int keys, const float* factor,
                             float* o, int ld_o) {
  __m256 acc[kRows][kVecs];
  FA_UNROLL
  for (int i = 0; i < kRows; ++i)
    FA_UNROLL
    for (int c = 0; c < kVecs; ++c) acc[i][c] = _mm256_loadu_ps(o + size_t(i) * ld_o + c * kLanes);
  if (factor != nullptr) {
    FA_UNROLL
    for (int i = 0; i < kRows; ++i)
      FA_UNROLL
      for (int c = 0; c < kVecs; ++c) acc[i][c] = _mm256_mul_ps(acc[i][c], _mm256_set1_ps(factor[i]));
  }
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

// The column strips of the V layout (ld_v apart, kPvCols columns of a key kPvCols apart) for
// kRows rows; a narrower last strip one vector at a time.
template <int kRows, int kVecs>
FA_AVX2 void pv_rows(const float* st, int ld_st, const float* v, int ld_v, int keys, int d_pad, const float* factor,
                     float* o, int ld_o) {
  static_assert(kVecs * kLanes == kPvCols, "a block spans one strip");
  int c = 0;
  for (; c + kPvCols <= d_pad; c += kPvCols) {
    pv_block<kRows, kVecs>(st, ld_st, v + size_t(c / kPvCols) * ld_v, kPvCols, keys, factor, o + c, ld_o);
  }
  for (; c < d_pad; c += kLanes) {
    pv_block<kRows, 1>(st, ld_st, v + size_t(c / kPvCols) * ld_v + c % kPvCols, kPvCols, keys, factor, o + c, ld_o);
  }
}

// The last rows % kRows rows as one block of that many rows.
template <int kRows, int kVecs>
FA_AVX2 void pv_tail(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys, int d_pad,
                     const float* factor, float* o, int ld_o) {
  if constexpr (kRows > 0) {
    if (rows == kRows) return pv_rows<kRows, kVecs>(st, ld_st, v, ld_v, keys, d_pad, factor, o, ld_o);
    pv_tail<kRows - 1, kVecs>(st, ld_st, v, ld_v, rows, keys, d_pad, factor, o, ld_o);
  }
}

// Blocks of kRows rows; where 8 rows would be left (128-row tiles, the 32-row groups of a causal
// diagonal tile: 6 k + 8), two blocks of 4 rows (8 accumulators each) instead of one of 6 and a
// 2-row tail, whose 4 accumulator chains leave half the FMA slots empty (D-77: P.V on a hot
// tile, 1 thread, 32 rows 84.7-87.4 -> 89.9-92.5 GFLOP/s, 128 rows 87.0-91.3 -> 89.5-93.8).
template <int kRows, int kVecs>
FA_AVX2 void pv_blocked(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys,
                        int d_pad, const float* factor, float* o, int ld_o) {
  static_assert(kRows == 6, "the 8-row split is for blocks of 6 rows");
  int r = 0;
  for (; r + kRows <= rows && rows - r != 8; r += kRows) pv_rows<kRows, kVecs>(st + r, ld_st, v, ld_v, keys, d_pad, factor ? factor + r : nullptr, o + size_t(r) * ld_o, ld_o);
  if (rows - r == 8) {
    for (int i = 0; i < 2; ++i, r += 4) pv_rows<4, kVecs>(st + r, ld_st, v, ld_v, keys, d_pad, factor ? factor + r : nullptr, o + size_t(r) * ld_o, ld_o);
  }
  pv_tail<kRows - 1, kVecs>(st + r, ld_st, v, ld_v, rows - r, keys, d_pad, factor ? factor + r : nullptr, o + size_t(r) * ld_o, ld_o);
}

FA_AVX2 void pv(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys, int d_pad,
                const float* factor, float* o, int ld_o) {
  pv_blocked<kPvRows, kPvVecs>(st, ld_st, v, ld_v, rows, keys, d_pad, factor, o, ld_o);
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

// ---- dst (cols x rows) = src (rows x cols)^T, 8 x 8 blocks through registers (D-77) -----------

// r[i] = row i of an 8 x 8 block in, column i out: pairs of rows interleaved (unpack ps), then
// pairs of pairs (shuffle ps), then the 128-bit halves.
FA_AVX2 inline void transpose_8x8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m256 u[8];  // u[k], u[4 + k]: rows 0-3 / 4-7 of columns k and 4 + k (the two 128-bit halves)
  for (int h = 0; h < 2; ++h) {
    const __m256 a = t[4 * h], b = t[4 * h + 1], c = t[4 * h + 2], e = t[4 * h + 3];
    u[4 * h] = _mm256_shuffle_ps(a, c, 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(a, c, 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(b, e, 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(b, e, 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
    r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
  }
}

// Whole 8 x 8 blocks through registers, the rows and columns past the last whole block one value
// at a time. The query tile is transposed once per work item (D-68); the scalar loop took 2-3% of
// a 1-thread fp32 4 x 512 x 8/2 x 64 call.
FA_AVX2 void transpose(const float* src, int ld_src, int rows, int cols, float* dst, int ld_dst) {
  const int rows8 = rows / kLanes * kLanes, cols8 = cols / kLanes * kLanes;
  for (int r0 = 0; r0 < rows8; r0 += kLanes) {
    for (int c0 = 0; c0 < cols8; c0 += kLanes) {
      __m256 block[kLanes];
      for (int i = 0; i < kLanes; ++i) block[i] = _mm256_loadu_ps(src + size_t(r0 + i) * ld_src + c0);
      transpose_8x8(block);
      for (int i = 0; i < kLanes; ++i) _mm256_storeu_ps(dst + size_t(c0 + i) * ld_dst + r0, block[i]);
    }
    for (int r = r0; r < r0 + kLanes; ++r) {
      for (int c = cols8; c < cols; ++c) dst[size_t(c) * ld_dst + r] = src[size_t(r) * ld_src + c];
    }
  }
  for (int r = rows8; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) dst[size_t(c) * ld_dst + r] = src[size_t(r) * ld_src + c];
  }
}

// ---- decode (D-72): rows read in place, widened in registers ------------------------------------

#define FA_AVX2_F16C __attribute__((target("avx2,fma,f16c")))

// Register blocks (8 ymm accumulators each; docs/DECISIONS.md D-85): scores take the heads of a
// KV head kDecodeGroupHeads at a time, 2 keys x 4 heads, so that each K row is widened once for
// the 4 heads; heads left over take 4 keys x 2 heads (and 1). Both fold their 8 accumulators by
// sum_lanes_8. P.V: 4 heads x 16 columns.
constexpr int kDecodeGroupHeads = 4, kDecodeGroupKeys = 2;
constexpr int kDecodeScoreKeys = 4, kDecodeScoreHeads = 2;
constexpr int kDecodePvHeads = 4, kDecodePvVecs = 2;

// bf16 elements c .. c + 7 of a row widened to fp32 by one shuffle: the 16 bytes broadcast into
// both 128-bit lanes (a load alone), then each element's two bytes moved into the upper half of
// its fp32 lane and the lower half zeroed (VPSHUFB), in place of VPMOVZXWD and a shift (whose
// port the FMAs need; D-85).
FA_AVX2 inline __m256 load8_bf16(const uint16_t* row, int c) {
  const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c)));
  constexpr char z = char(0x80);  // a VPSHUFB control byte with its top bit set writes 0
  const __m256i to_upper = _mm256_setr_epi8(z, z, 0, 1, z, z, 2, 3, z, z, 4, 5, z, z, 6, 7,
                                            z, z, 8, 9, z, z, 10, 11, z, z, 12, 13, z, z, 14, 15);
  return _mm256_castsi256_ps(_mm256_shuffle_epi8(bytes, to_upper));
}

// Elements c .. c + 7 of a row stored as D, widened to fp32; e4m3 as avx512_decode.h load16 does
// (each byte placed as an fp16 of value x 2^-8, VCVTPH2PS, x 256; the NaN bytes NaN; D-87).
template <DType D>
FA_AVX2_F16C inline __m256 load8(const void* row, int c) {
  if constexpr (D == DType::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + c);
  } else if constexpr (D == DType::e4m3) {
    const __m128i w =
        _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(row) + c)));
    const __m128i half = _mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16(short(0xbf80)));
    const __m256 x = _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(256.0f));
    const __m128i nan16 = _mm_cmpeq_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7f));
    return _mm256_blendv_ps(x, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()),
                            _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan16)));
  } else if constexpr (D == DType::f16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c)));
  } else {  // bf16: the upper half of an fp32
    return load8_bf16(static_cast<const uint16_t*>(row), c);
  }
}

// Lane i of the result = the sum of the 8 lanes of x[i]: folds of 128-bit halves, then within
// 128-bit lanes (the result comes out in natural order).
FA_AVX2_F16C inline __m256 sum_lanes_8(const __m256 (&x)[8]) {
  __m256 t[4];
  FA_UNROLL
  for (int i = 0; i < 4; ++i) {  // [x_i lo + x_i hi | x_(i+4) lo + x_(i+4) hi]
    t[i] = _mm256_add_ps(_mm256_permute2f128_ps(x[i], x[i + 4], 0x20), _mm256_permute2f128_ps(x[i], x[i + 4], 0x31));
  }
  const __m256 w0 = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], 0x44), _mm256_shuffle_ps(t[0], t[1], 0xEE));
  const __m256 w1 = _mm256_add_ps(_mm256_shuffle_ps(t[2], t[3], 0x44), _mm256_shuffle_ps(t[2], t[3], 0xEE));
  return _mm256_add_ps(_mm256_shuffle_ps(w0, w1, 0x88), _mm256_shuffle_ps(w0, w1, 0xDD));
}

template <DType D, int H>
FA_AVX2_F16C void decode_scores_heads(const float* q, int d, const void* const* k_rows, int keys, float* s) {
  for (int j0 = 0; j0 < keys; j0 += kDecodeScoreKeys) {
    const void* k[kDecodeScoreKeys];
    FA_UNROLL
    for (int i = 0; i < kDecodeScoreKeys; ++i) k[i] = k_rows[j0 + i < keys ? j0 + i : keys - 1];
    __m256 acc[kDecodeScoreHeads][kDecodeScoreKeys];
    FA_UNROLL
    for (int h = 0; h < kDecodeScoreHeads; ++h)
      FA_UNROLL
      for (int i = 0; i < kDecodeScoreKeys; ++i) acc[h][i] = _mm256_setzero_ps();
    for (int c = 0; c < d; c += kLanes) {
      __m256 kv[kDecodeScoreKeys];
      FA_UNROLL
      for (int i = 0; i < kDecodeScoreKeys; ++i) kv[i] = load8<D>(k[i], c);
      FA_UNROLL
      for (int h = 0; h < H; ++h) {
        const __m256 qv = _mm256_loadu_ps(q + size_t(h) * d + c);
        FA_UNROLL
        for (int i = 0; i < kDecodeScoreKeys; ++i) acc[h][i] = _mm256_fmadd_ps(qv, kv[i], acc[h][i]);
      }
    }
    __m256 x[8];
    FA_UNROLL
    for (int h = 0; h < kDecodeScoreHeads; ++h)
      FA_UNROLL
      for (int i = 0; i < kDecodeScoreKeys; ++i) x[h * kDecodeScoreKeys + i] = acc[h][i];
    const __m256 sums = sum_lanes_8(x);  // lane 4h + i: head h, key j0 + i
    _mm_storeu_ps(s + j0, _mm256_castps256_ps128(sums));
    if (H > 1) _mm_storeu_ps(s + kDecodeKeys + j0, _mm256_extractf128_ps(sums, 1));
  }
}

// Keys k0 and k1 against kDecodeGroupHeads heads: x[2h + i] holds the 8 partial sums of head h
// and key i.
template <DType D>
FA_AVX2_F16C inline void decode_scores_pair(const float* q, int d, const void* k0, const void* k1, __m256 (&x)[8]) {
  __m256 acc[kDecodeGroupKeys][kDecodeGroupHeads];
  FA_UNROLL
  for (int i = 0; i < kDecodeGroupKeys; ++i)
    FA_UNROLL
    for (int h = 0; h < kDecodeGroupHeads; ++h) acc[i][h] = _mm256_setzero_ps();
  for (int c = 0; c < d; c += kLanes) {
    const __m256 ka = load8<D>(k0, c), kb = load8<D>(k1, c);
    FA_UNROLL
    for (int h = 0; h < kDecodeGroupHeads; ++h) {
      __m256 qv = _mm256_loadu_ps(q + size_t(h) * d + c);
      __asm__("" : "+x"(qv));  // one load per head, not one folded into each of its FMAs (hot: 300 -> 242 ns a block)
      acc[0][h] = _mm256_fmadd_ps(qv, ka, acc[0][h]);
      acc[1][h] = _mm256_fmadd_ps(qv, kb, acc[1][h]);
    }
  }
  FA_UNROLL
  for (int h = 0; h < kDecodeGroupHeads; ++h) {
    x[2 * h] = acc[0][h];
    x[2 * h + 1] = acc[1][h];
  }
}

// All kDecodeGroupHeads heads in one pass over the keys, 2 keys at a time: keys j0 .. j0 + 3
// fold into two vectors (lane 2h + i: head h, key i of the pair), whose 16 scores one shuffle
// pair puts in head order.
template <DType D>
FA_AVX2_F16C void decode_scores_group(const float* q, int d, const void* const* k_rows, int keys, float* s) {
  for (int j0 = 0; j0 < keys; j0 += 2 * kDecodeGroupKeys) {
    const void* k[2 * kDecodeGroupKeys];
    FA_UNROLL
    for (int i = 0; i < 2 * kDecodeGroupKeys; ++i) k[i] = k_rows[j0 + i < keys ? j0 + i : keys - 1];
    __m256 x[8];
    decode_scores_pair<D>(q, d, k[0], k[1], x);
    const __m256 a = sum_lanes_8(x);  // lane 2h + i: head h, key j0 + i
    decode_scores_pair<D>(q, d, k[2], k[3], x);
    const __m256 b = sum_lanes_8(x);  // lane 2h + i: head h, key j0 + 2 + i
    const __m256 even = _mm256_shuffle_ps(a, b, 0x44);  // heads 0 | 2, keys j0 .. j0 + 3
    const __m256 odd = _mm256_shuffle_ps(a, b, 0xEE);   // heads 1 | 3
    _mm_storeu_ps(s + j0, _mm256_castps256_ps128(even));
    _mm_storeu_ps(s + kDecodeKeys + j0, _mm256_castps256_ps128(odd));
    _mm_storeu_ps(s + 2 * kDecodeKeys + j0, _mm256_extractf128_ps(even, 1));
    _mm_storeu_ps(s + 3 * kDecodeKeys + j0, _mm256_extractf128_ps(odd, 1));
  }
}

template <DType D>
FA_AVX2_F16C void decode_scores(const void* q, int heads, int d, const void* const* k_rows, int keys, float* s) {
  const float* q32 = static_cast<const float*>(q);
  int h = 0;
  for (; h + kDecodeGroupHeads <= heads; h += kDecodeGroupHeads) {
    decode_scores_group<D>(q32 + size_t(h) * d, d, k_rows, keys, s + h * kDecodeKeys);
  }
  for (; h + kDecodeScoreHeads <= heads; h += kDecodeScoreHeads) {
    decode_scores_heads<D, kDecodeScoreHeads>(q32 + size_t(h) * d, d, k_rows, keys, s + h * kDecodeKeys);
  }
  if (h < heads) decode_scores_heads<D, 1>(q32 + size_t(h) * d, d, k_rows, keys, s + h * kDecodeKeys);
}

// The 16 scores of a row: lanes past `keys` replaced by `fill`.
FA_AVX2 inline void decode_row(const float* row, int keys, __m256 fill, __m256 (&x)[2]) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int v = 0; v < 2; ++v) {
    const __m256 in_keys = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(keys - v * kLanes), lane));
    x[v] = _mm256_blendv_ps(fill, _mm256_loadu_ps(row + v * kLanes), in_keys);
  }
}

FA_AVX2 inline float max_of_lanes(__m256 m) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

FA_AVX2 inline float sum_of_lanes(__m256 m) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

FA_AVX2 void decode_row_max(const float* s, int heads, int keys, float* out) {
  const __m256 lowest = _mm256_set1_ps(-INFINITY);
  for (int h = 0; h < heads; ++h) {
    __m256 x[2];
    decode_row(s + h * kDecodeKeys, keys, lowest, x);
    // max(x, m) returns m where x is NaN: NaN scores are ignored.
    out[h] = max_of_lanes(_mm256_max_ps(x[1], _mm256_max_ps(x[0], lowest)));
  }
}

FA_AVX2 void decode_exp2_sum(float* s, int heads, int keys, float scale_log2, const float* offset, float* sum) {
  const __m256 scale = _mm256_set1_ps(scale_log2), zero = _mm256_setzero_ps();
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int h = 0; h < heads; ++h) {
    float* row = s + h * kDecodeKeys;
    __m256 total = zero;
    for (int v = 0; v < 2; ++v) {
      const __m256 in_keys = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(keys - v * kLanes), lane));
      const __m256 x = _mm256_fmsub_ps(_mm256_loadu_ps(row + v * kLanes), scale, _mm256_set1_ps(offset[h]));
      const __m256 p = _mm256_blendv_ps(zero, exp2_ps(x), in_keys);
      _mm256_storeu_ps(row + v * kLanes, p);
      total = _mm256_add_ps(total, p);
    }
    sum[h] = sum_of_lanes(total);
  }
}

template <DType D, int H, int V>
FA_AVX2_F16C inline void decode_pv_block(const float* p, const void* const* v_rows, int keys, int d, int c0,
                                         const float* factor, float* o) {
  __m256 acc[H][V];
  FA_UNROLL
  for (int h = 0; h < H; ++h) {
    const __m256 f = _mm256_set1_ps(factor[h]);
    FA_UNROLL
    for (int v = 0; v < V; ++v) acc[h][v] = _mm256_mul_ps(_mm256_loadu_ps(o + size_t(h) * d + c0 + v * kLanes), f);
  }
  for (int j = 0; j < keys; ++j) {
    __m256 vv[V];
    FA_UNROLL
    for (int v = 0; v < V; ++v) vv[v] = load8<D>(v_rows[j], c0 + v * kLanes);
    FA_UNROLL
    for (int h = 0; h < H; ++h) {
      const __m256 pj = _mm256_set1_ps(p[h * kDecodeKeys + j]);
      FA_UNROLL
      for (int v = 0; v < V; ++v) acc[h][v] = _mm256_fmadd_ps(pj, vv[v], acc[h][v]);
    }
  }
  FA_UNROLL
  for (int h = 0; h < H; ++h)
    FA_UNROLL
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(o + size_t(h) * d + c0 + v * kLanes, acc[h][v]);
}

template <DType D, int H>
FA_AVX2_F16C void decode_pv_heads(const float* p, const void* const* v_rows, int keys, int d, const float* factor,
                                  float* o) {
  int c0 = 0;
  for (; c0 + kDecodePvVecs * kLanes <= d; c0 += kDecodePvVecs * kLanes) {
    decode_pv_block<D, H, kDecodePvVecs>(p, v_rows, keys, d, c0, factor, o);
  }
  for (; c0 < d; c0 += kLanes) decode_pv_block<D, H, 1>(p, v_rows, keys, d, c0, factor, o);
}

template <DType D>
FA_AVX2_F16C void decode_pv(const float* p, int heads, const void* const* v_rows, int keys, int d, const float* factor,
                            float* o) {
  int h = 0;
  for (; h + kDecodePvHeads <= heads; h += kDecodePvHeads) {
    decode_pv_heads<D, kDecodePvHeads>(p + h * kDecodeKeys, v_rows, keys, d, factor + h, o + size_t(h) * d);
  }
  for (; h < heads; ++h) decode_pv_heads<D, 1>(p + h * kDecodeKeys, v_rows, keys, d, factor + h, o + size_t(h) * d);
}

template <DType D>
const DecodeKernels* avx2_decode_set() {
  static const DecodeKernels kernels{"avx2", false, decode_scores<D>, decode_row_max, decode_exp2_sum, decode_pv<D>};
  return &kernels;
}

}  // namespace

const TileKernels* avx2_kernels() {
  static const TileKernels kernels{"avx2", kLanes, kKeyBlock, kPvCols, scores, tile_max, exp2_sum, scale_rows, pv, scaled_to_bf16, transpose};
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported ? &kernels : nullptr;
}

// Decode (D-72): d a multiple of 8; fp16 rows widen with F16C.
const DecodeKernels* avx2_decode_kernels(DType storage, int d) {
  static const bool supported = avx2_kernels() != nullptr && __builtin_cpu_supports("f16c");
  if (!supported || d % kLanes != 0) return nullptr;
  switch (storage) {
    case DType::f32: return avx2_decode_set<DType::f32>();
    case DType::f16: return avx2_decode_set<DType::f16>();
    case DType::bf16: return avx2_decode_set<DType::bf16>();
    case DType::e4m3: return avx2_decode_set<DType::e4m3>();
    default: return nullptr;
  }
}

}  // namespace cpu
}  // namespace flashattn

#else  // no AVX2 kernels in this build

namespace flashattn {
namespace cpu {
const TileKernels* avx2_kernels() { return nullptr; }
const DecodeKernels* avx2_decode_kernels(DType, int) { return nullptr; }
}  // namespace cpu
}  // namespace flashattn

#endif
