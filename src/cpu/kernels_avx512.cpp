// The AVX-512 tile kernels: register-blocked products (16 zmm accumulators per block, see
// kScoreKeys) and the softmax row passes, 16 query rows per vector. Every function carries the target attribute, so that this file
// builds with the library's ordinary flags and runs only where avx512_kernels() found the CPU features.
#include "cpu/kernels.h"

#include "cpu/avx512_decode.h"
#include "cpu/avx512_math.h"

#ifdef FLASHATTN_HAVE_AVX512_KERNELS
#include <algorithm>
#include <cmath>

namespace flashattn {
namespace cpu {
namespace {

constexpr int kLanes = 16;      // fp32 per zmm; = kRowLanes
// Register blocks: 16 zmm accumulators each. Scores: 8 keys x 32 query rows (per head-dim step
// 2 loads of the query tile and 8 key broadcasts per 16 FMAs), so that a 32-row strip of the
// transposed query tile (16 KB at d = 128) stays in L1 while the key tile streams past; PV: 8
// rows x 32 columns. Measured against 4 x 64 blocks (single thread, fp32 1 x 1024 x 4, causal,
// best of 3 alternating runs on the loaded machine): d = 128 70 vs 64 GFLOP/s, d = 256 72 vs 66.
constexpr int kScoreKeys = 8, kScoreVecs = 2;
constexpr int kPvRows = 8, kPvVecs = 2;
static_assert(kLanes == kRowLanes, "the row passes run one zmm of rows at a time");
// The K and V layouts this set reads (kernels.h): K in blocks of kScoreKeys keys, column by
// column, so that a scores block broadcasts its 8 keys' column c from one 32-byte run; V in
// strips of kPvCols columns, key by key, so that a P.V block reads its columns of each key from
// one contiguous strip. Against rows read in place (512 bytes apart at d 128), hot-tile
// microbenchmark, 1 thread, K/V from L3 (8 MB): scores 180-186 -> 195 GFLOP/s, P.V 149-153 ->
// 165 (D-76).
constexpr int kPvCols = kPvVecs * kLanes;
static_assert(kScoreKeys <= kMaxKeyBlock, "the walk's K pack buffers kMaxKeyBlock rows");

// ---- scores: st (keys x rows) = k (keys x d) . qt (d x rows) ---------------------------------

// A block of kScoreKeys keys (one block of the K layout: column c of key i at
// k[c * kScoreKeys + i]) x kVecs*16 rows, accumulated over the whole head dim in registers.
template <int kVecs>
FA_AVX512 inline void scores_block(const float* qt, int ld_qt, const float* k, int d, float* st, int ld_st) {
  __m512 acc[kScoreKeys][kVecs];
  for (int i = 0; i < kScoreKeys; ++i)
    for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int c = 0; c < d; ++c) {
    __m512 q[kVecs];
    for (int v = 0; v < kVecs; ++v) q[v] = _mm512_loadu_ps(qt + size_t(c) * ld_qt + v * kLanes);
    for (int i = 0; i < kScoreKeys; ++i) {
      const __m512 kc = _mm512_set1_ps(k[size_t(c) * kScoreKeys + i]);
      for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm512_fmadd_ps(kc, q[v], acc[i][v]);
    }
  }
  for (int i = 0; i < kScoreKeys; ++i)
    for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(st + size_t(i) * ld_st + v * kLanes, acc[i][v]);
}

// Whole key blocks (a tail of fewer than kScoreKeys keys computes its block's padding keys too,
// into the score rows past `keys`, which kernels.h lets the set write); once per row strip.
template <int kVecs>
FA_AVX512 void scores_strip(const float* qt, int ld_qt, const float* k, int ld_k, int d, int keys,
                            float* st, int ld_st) {
  for (int j = 0; j < keys; j += kScoreKeys) {
    scores_block<kVecs>(qt, ld_qt, k + size_t(j) * ld_k, d, st + size_t(j) * ld_st, ld_st);
  }
}

// Strips of kScoreVecs row vectors (kScoreVecs * 16 query rows) over all keys, then one-vector
// strips.
FA_AVX512 void scores(const float* qt, int ld_qt, const float* k, int ld_k, int d, int rows_pad,
                      int keys, float* st, int ld_st) {
  int r = 0;
  for (; r + kScoreVecs * kLanes <= rows_pad; r += kScoreVecs * kLanes) {
    scores_strip<kScoreVecs>(qt + r, ld_qt, k, ld_k, d, keys, st + r, ld_st);
  }
  for (; r < rows_pad; r += kLanes) scores_strip<1>(qt + r, ld_qt, k, ld_k, d, keys, st + r, ld_st);
}

// ---- softmax row passes ------------------------------------------------------------------------

FA_AVX512 void tile_max(const float* st, int ld_st, int rows_pad, int keys, float* out) {
  for (int r = 0; r < rows_pad; r += kLanes) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    // max(s, m) returns m when s is NaN: NaN scores are ignored, as in the portable set.
    for (int j = 0; j < keys; ++j) m = _mm512_max_ps(_mm512_loadu_ps(st + size_t(j) * ld_st + r), m);
    _mm512_storeu_ps(out + r, m);
  }
}

FA_AVX512 void exp2_sum(float* st, int ld_st, int rows_pad, int keys, float scale_log2,
                        const float* offset, float* tile_sum) {
  const __m512 scale = _mm512_set1_ps(scale_log2);
  for (int r = 0; r < rows_pad; r += kLanes) {
    const __m512 off = _mm512_loadu_ps(offset + r);
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < keys; ++j) {
      float* s = st + size_t(j) * ld_st + r;
      const __m512 p = exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s), scale, off));
      _mm512_storeu_ps(s, p);
      sum = _mm512_add_ps(sum, p);
    }
    _mm512_storeu_ps(tile_sum + r, sum);
  }
}

FA_AVX512 void scale_rows(float* o, int ld_o, int rows, int d_pad, const float* factor) {
  for (int r = 0; r < rows; ++r) {
    const __m512 f = _mm512_set1_ps(factor[r]);
    float* row = o + size_t(r) * ld_o;
    for (int c = 0; c < d_pad; c += kLanes) _mm512_storeu_ps(row + c, _mm512_mul_ps(_mm512_loadu_ps(row + c), f));
  }
}

// ---- o (rows x d) += p (rows x keys, stored transposed in st) . v (keys x d) ---------------------

// A block of kRows rows x kVecs*16 columns of o, kept in registers over all keys.
template <int kRows, int kVecs>
FA_AVX512 inline void pv_block(const float* st, int ld_st, const float* v, int ld_v, int keys,
                               const float* factor, float* o, int ld_o) {
  __m512 acc[kRows][kVecs];
  for (int i = 0; i < kRows; ++i)
    for (int c = 0; c < kVecs; ++c) acc[i][c] = _mm512_loadu_ps(o + size_t(i) * ld_o + c * kLanes);
  if (factor != nullptr) {
    for (int i = 0; i < kRows; ++i)
      for (int c = 0; c < kVecs; ++c) acc[i][c] = _mm512_mul_ps(acc[i][c], _mm512_set1_ps(factor[i]));
  }
  for (int j = 0; j < keys; ++j) {
    __m512 vj[kVecs];
    for (int c = 0; c < kVecs; ++c) vj[c] = _mm512_loadu_ps(v + size_t(j) * ld_v + c * kLanes);
    for (int i = 0; i < kRows; ++i) {
      const __m512 p = _mm512_set1_ps(st[size_t(j) * ld_st + i]);
      for (int c = 0; c < kVecs; ++c) acc[i][c] = _mm512_fmadd_ps(p, vj[c], acc[i][c]);
    }
  }
  for (int i = 0; i < kRows; ++i)
    for (int c = 0; c < kVecs; ++c) _mm512_storeu_ps(o + size_t(i) * ld_o + c * kLanes, acc[i][c]);
}

// The column strips of the V layout (ld_v apart, kPvCols columns of a key kPvCols apart) for
// kRows rows; a narrower last strip one vector at a time.
template <int kRows, int kVecs>
FA_AVX512 void pv_rows(const float* st, int ld_st, const float* v, int ld_v, int keys, int d_pad,
                       const float* factor, float* o, int ld_o) {
  static_assert(kVecs * kLanes == kPvCols, "a block spans one strip");
  int c = 0;
  for (; c + kPvCols <= d_pad; c += kPvCols) {
    pv_block<kRows, kVecs>(st, ld_st, v + size_t(c / kPvCols) * ld_v, kPvCols, keys, factor, o + c, ld_o);
  }
  for (; c < d_pad; c += kLanes) {
    pv_block<kRows, 1>(st, ld_st, v + size_t(c / kPvCols) * ld_v + c % kPvCols, kPvCols, keys, factor, o + c, ld_o);
  }
}

template <int kRows, int kVecs>
FA_AVX512 void pv_blocked(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys,
                          int d_pad, const float* factor, float* o, int ld_o) {
  int r = 0;
  for (; r + kRows <= rows; r += kRows) pv_rows<kRows, kVecs>(st + r, ld_st, v, ld_v, keys, d_pad, factor ? factor + r : nullptr, o + size_t(r) * ld_o, ld_o);
  for (; r < rows; ++r) pv_rows<1, kVecs>(st + r, ld_st, v, ld_v, keys, d_pad, factor ? factor + r : nullptr, o + size_t(r) * ld_o, ld_o);
}

FA_AVX512 void pv(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys,
                  int d_pad, const float* factor, float* o, int ld_o) {
  pv_blocked<kPvRows, kPvVecs>(st, ld_st, v, ld_v, rows, keys, d_pad, factor, o, ld_o);
}

// half.h float_to_bf16_bits on 16 lanes: round to nearest even, NaN kept quiet.
FA_AVX512 void scaled_to_bf16(const float* src, int n, float scale, uint16_t* dst) {
  const __m512 f = _mm512_set1_ps(scale);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i half_ulp = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
  for (int c = 0; c < n; c += kLanes) {
    const __mmask16 lanes = n - c >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << (n - c)) - 1u);
    const __m512i x = _mm512_castps_si512(_mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, src + c), f));
    const __m512i rounding = _mm512_add_epi32(half_ulp, _mm512_and_si512(_mm512_srli_epi32(x, 16), one));
    __m512i bits = _mm512_srli_epi32(_mm512_add_epi32(x, rounding), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, abs_mask), inf);
    bits = _mm512_mask_mov_epi32(bits, nan, _mm512_or_si512(_mm512_srli_epi32(x, 16), quiet));
    _mm256_mask_storeu_epi16(dst + c, lanes, _mm512_cvtepi32_epi16(bits));
  }
}

// ---- dst (cols x rows) = src (rows x cols)^T, 16 x 16 blocks through registers -----------------

// r[i] = row i of a 16 x 16 block in, column i out: pairs of rows interleaved (unpack ps), then
// pairs of pairs (unpack pd), then the 128-bit lanes gathered across the four row groups.
FA_AVX512 inline void transpose_16x16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + k], 128-bit lane L: rows 4i..4i+3 of column 4L + k
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), e = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
  }
  for (int k = 0; k < 4; ++k) {  // column 4L + k takes lane L of u[k], u[4 + k], u[8 + k], u[12 + k]
    const __m512 w0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), w1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
    const __m512 w2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88), w3 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
    r[k] = _mm512_shuffle_f32x4(w0, w2, 0x88);
    r[4 + k] = _mm512_shuffle_f32x4(w1, w3, 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(w0, w2, 0xdd);
    r[12 + k] = _mm512_shuffle_f32x4(w1, w3, 0xdd);
  }
}

FA_AVX512 inline __mmask16 first_lanes(int n) {
  return n >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
}

FA_AVX512 void transpose(const float* src, int ld_src, int rows, int cols, float* dst, int ld_dst) {
  for (int r0 = 0; r0 < rows; r0 += kLanes) {
    const int block_rows = std::min(kLanes, rows - r0);
    for (int c0 = 0; c0 < cols; c0 += kLanes) {
      const int block_cols = std::min(kLanes, cols - c0);
      const __mmask16 col_mask = first_lanes(block_cols), row_mask = first_lanes(block_rows);
      __m512 block[kLanes];
      for (int i = 0; i < kLanes; ++i) {
        block[i] = i < block_rows ? _mm512_maskz_loadu_ps(col_mask, src + size_t(r0 + i) * ld_src + c0)
                                  : _mm512_setzero_ps();
      }
      transpose_16x16(block);
      for (int c = 0; c < block_cols; ++c) _mm512_mask_storeu_ps(dst + size_t(c0 + c) * ld_dst + r0, row_mask, block[c]);
    }
  }
}

}  // namespace

const TileKernels* avx512_kernels() {
  static const TileKernels kernels{"avx512", kLanes, kScoreKeys, kPvCols, scores, tile_max, exp2_sum, scale_rows, pv, scaled_to_bf16, transpose};
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  return supported ? &kernels : nullptr;
}

// Decode (D-72): the rows widened in registers, fp32 FMAs; d a multiple of 16.
const DecodeKernels* avx512_decode_kernels(DType storage, int d) {
  namespace dec = avx512_decode;
  static const DecodeKernels f32{"avx512", false, dec::scores<DType::f32>, dec::row_max, dec::exp2_sum, dec::pv<DType::f32>};
  static const DecodeKernels f16{"avx512", false, dec::scores<DType::f16>, dec::row_max, dec::exp2_sum, dec::pv<DType::f16>};
  static const DecodeKernels bf16{"avx512", false, dec::scores<DType::bf16>, dec::row_max, dec::exp2_sum,
                                  dec::pv<DType::bf16>};
  static const DecodeKernels e4m3{"avx512", false, dec::scores<DType::e4m3>, dec::row_max, dec::exp2_sum,
                                  dec::pv<DType::e4m3>};
  if (avx512_kernels() == nullptr || d % dec::kLanes != 0) return nullptr;
  switch (storage) {
    case DType::f32: return &f32;
    case DType::f16: return &f16;
    case DType::bf16: return &bf16;
    case DType::e4m3: return &e4m3;
    default: return nullptr;
  }
}

}  // namespace cpu
}  // namespace flashattn

#else  // no AVX-512 kernels in this build

namespace flashattn {
namespace cpu {
const TileKernels* avx512_kernels() { return nullptr; }
const DecodeKernels* avx512_decode_kernels(DType, int) { return nullptr; }
}  // namespace cpu
}  // namespace flashattn

#endif
