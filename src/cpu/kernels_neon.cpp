// The NEON tile and decode kernels (aarch64): the AVX2 set's algorithms (kernels_avx2.cpp:
// transposed scores, D-52; K and V in the set's own blocked layouts, D-76) on 4-lane fp32
// vectors with FMA (docs/DECISIONS.md D-86). Advanced SIMD is part of the base AArch64
// architecture, so this file needs no target attribute and no run-time check: where it is
// compiled in, the set exists. Elsewhere neon_kernels() and neon_decode_kernels() return nullptr.
#include "cpu/kernels.h"

// Little-endian only: the transposes below reinterpret pairs of fp32 lanes as one fp64 lane,
// whose lane order a big-endian build numbers the other way (such a build runs the portable set).
#if defined(__aarch64__) && (!defined(__BYTE_ORDER__) || __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)
#define FLASHATTN_HAVE_NEON_KERNELS 1
#endif

#ifdef FLASHATTN_HAVE_NEON_KERNELS
#include <arm_neon.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/half.h"
#include "cpu/exp2_poly.h"

namespace flashattn {
namespace cpu {
namespace {

// Complete unrolling of the loops over a register block's accumulators, so that the accumulator
// arrays become registers (kernels_avx2.cpp FA_UNROLL: g++ otherwise kept them in memory).
#define FA_UNROLL _Pragma("GCC unroll 16")

constexpr int kLanes = 4;  // fp32 per 128-bit register

// Register blocks. AArch64 has 32 vector registers; a block keeps 24 accumulators and its
// operands in 29 of them, leaving 3 to the compiler:
// - scores: 8 keys x 12 query rows (3 vectors). Per head-dim step: 3 loads of the query tile's
//   row, 2 loads of the 8 keys' column (one K block, kernels.h), and 24 FMAs that take their
//   key from a lane of those 2 registers (FMLA by element), so no key is broadcast.
// - P.V: 12 rows x 8 columns (2 vectors). Per key: 2 loads of the V strip, 3 loads of the
//   probabilities of 12 rows (st keeps a key's rows contiguous), 24 FMAs by element.
// Against the next smaller blocks of 16 accumulators (8 x 8, 4 x 16), 5 loads feed 24 FMAs
// instead of 4 (or 5) feeding 16; a block of 32 accumulators (8 keys x 16 rows) would leave no
// register for its operands. 24 independent accumulator chains also cover the FMA latency
// (about 4 cycles) of cores with 4 FMA pipes. Chosen by that count, not measured: no Arm
// hardware was at hand (D-86).
constexpr int kScoreKeys = 8, kScoreVecs = 3;
constexpr int kPvRows = 12, kPvVecs = 2;
static_assert(kRowLanes % kLanes == 0, "tiles pad rows and columns to whole vectors");

// The K and V layouts this set reads (kernels.h): K in blocks of kScoreKeys keys, column by
// column (a scores block loads its 8 keys' column c as two vectors); V in strips of kPvCols
// columns, key by key (a P.V block loads its 8 columns of a key from one 32-byte run). d_pad is
// a multiple of kRowLanes, so every strip is whole.
constexpr int kKeyBlock = kScoreKeys;
constexpr int kPvCols = kPvVecs * kLanes;
static_assert(kKeyBlock <= kMaxKeyBlock, "the walk's K pack buffers kMaxKeyBlock rows");
static_assert(kRowLanes % kPvCols == 0, "d_pad holds whole V strips");

// ---- exp2 (the rule of exp2_poly.h) ---------------------------------------------------------------

// 2^k for integer lanes k in [-126, 127]: the exponent field alone.
inline float32x4_t exp2_int(int32x4_t k) {
  return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k, vdupq_n_s32(127)), 23));
}

// 2^f for f in [-0.5, 0.5]: exp2_poly.h's polynomial of degree kExp2MaxDegree by Horner's rule,
// each step one fused multiply-add (as the AVX sets, so that the results are theirs bit for bit).
inline float32x4_t exp2_fraction(float32x4_t f) {
  float32x4_t p = vdupq_n_f32(kExp2Coefficients[kExp2MaxDegree]);
  for (int k = kExp2MaxDegree - 1; k >= 0; --k) p = vfmaq_f32(vdupq_n_f32(kExp2Coefficients[k]), p, f);
  return p;
}

// 2^x for x <= 0 or NaN by the rule of exp2_poly.h: n = round(x) (to nearest even: FRINTN, as
// the AVX sets' rounding), f = x - n, 2^f from the polynomial, times 2^n. As in avx2_math.h, 2^n
// is applied as 2^(n - n/2) * 2^(n/2), each factor a normal number for n in [-150, 1], so that a
// denormal result is rounded once, as AVX-512's scalef rounds it. Inputs below kExp2Lowest are
// raised to it, where the result is 2^-150, which rounds to 0. FMAX returns NaN where either
// operand is NaN, so NaN stays NaN through the clamp and the polynomial (the conversion of a
// NaN n gives 0, a finite factor). AVX2's fast path (D-77) is left out: it is bit for bit this
// rule, and what it saves was measured on x86 only.
inline float32x4_t exp2_q(float32x4_t x) {
  x = vmaxq_f32(x, vdupq_n_f32(kExp2Lowest));
  const float32x4_t n = vrndnq_f32(x);
  const float32x4_t p = exp2_fraction(vsubq_f32(x, n));
  const int32x4_t ni = vcvtq_s32_f32(n);
  const int32x4_t half = vshrq_n_s32(ni, 1);  // floor(n / 2)
  return vmulq_f32(vmulq_f32(p, exp2_int(vsubq_s32(ni, half))), exp2_int(half));
}

// x * scale - offset rounded once, as the AVX sets' fmsub: the fused neg_offset + x * scale.
inline float32x4_t scaled_minus(float32x4_t x, float32x4_t scale, float32x4_t neg_offset) {
  return vfmaq_f32(neg_offset, x, scale);
}

// ---- register-block helpers ---------------------------------------------------------------------

// Lanes [0, kCount) of p into a register, the others 0; reads p[0 .. kCount) only.
template <int kCount>
inline float32x4_t load_lanes(const float* p) {
  static_assert(kCount >= 1 && kCount <= kLanes, "one register");
  if constexpr (kCount == kLanes) {
    return vld1q_f32(p);
  } else {
    float32x4_t x = vld1q_lane_f32(p, vdupq_n_f32(0.0f), 0);
    if constexpr (kCount > 1) x = vld1q_lane_f32(p + 1, x, 1);
    if constexpr (kCount > 2) x = vld1q_lane_f32(p + 2, x, 2);
    return x;
  }
}

// acc[i][v] += x[v] * lanes[i] for i < kCount (<= 4): FMLA by element, whose multiplier is a
// lane of a register (the lane must be a constant, hence one line per lane).
template <int kCount, int kVecs>
inline void fma_by_lanes(float32x4_t (*acc)[kVecs], const float32x4_t (&x)[kVecs], float32x4_t lanes) {
  FA_UNROLL
  for (int v = 0; v < kVecs; ++v) {
    acc[0][v] = vfmaq_laneq_f32(acc[0][v], x[v], lanes, 0);
    if constexpr (kCount > 1) acc[1][v] = vfmaq_laneq_f32(acc[1][v], x[v], lanes, 1);
    if constexpr (kCount > 2) acc[2][v] = vfmaq_laneq_f32(acc[2][v], x[v], lanes, 2);
    if constexpr (kCount > 3) acc[3][v] = vfmaq_laneq_f32(acc[3][v], x[v], lanes, 3);
  }
}

// acc[i][v] += x[v] * scalars[i] for i < kCount: the scalars loaded 4 to a register (the last
// register partly) and taken by lane. Reads scalars[0 .. kCount) only.
template <int kCount, int kVecs>
inline void fma_by_scalars(float32x4_t (*acc)[kVecs], const float32x4_t (&x)[kVecs], const float* scalars) {
  if constexpr (kCount >= kLanes) {
    fma_by_lanes<kLanes, kVecs>(acc, x, vld1q_f32(scalars));
    fma_by_scalars<kCount - kLanes, kVecs>(acc + kLanes, x, scalars + kLanes);
  } else if constexpr (kCount > 0) {
    fma_by_lanes<kCount, kVecs>(acc, x, load_lanes<kCount>(scalars));
  }
}

// ---- scores: st (keys x rows) = k (keys x d) . qt (d x rows) ---------------------------------

// One K block (kKeyBlock keys, column c of key i at k[c * kKeyBlock + i]) x kVecs*4 rows,
// accumulated over the whole head dim in registers.
template <int kVecs>
inline void scores_block(const float* qt, int ld_qt, const float* k, int d, float* st, int ld_st) {
  float32x4_t acc[kScoreKeys][kVecs];
  FA_UNROLL
  for (int i = 0; i < kScoreKeys; ++i)
    FA_UNROLL
    for (int v = 0; v < kVecs; ++v) acc[i][v] = vdupq_n_f32(0.0f);
  for (int c = 0; c < d; ++c) {
    float32x4_t q[kVecs];
    FA_UNROLL
    for (int v = 0; v < kVecs; ++v) q[v] = vld1q_f32(qt + size_t(c) * ld_qt + v * kLanes);
    fma_by_scalars<kScoreKeys, kVecs>(acc, q, k + size_t(c) * kKeyBlock);
  }
  FA_UNROLL
  for (int i = 0; i < kScoreKeys; ++i)
    FA_UNROLL
    for (int v = 0; v < kVecs; ++v) vst1q_f32(st + size_t(i) * ld_st + v * kLanes, acc[i][v]);
}

// Whole K blocks over all keys: a last block of fewer keys computes its padding keys too, into
// the score rows past `keys`, which kernels.h lets the set write (as the AVX-512 set).
template <int kVecs>
void scores_strip(const float* qt, int ld_qt, const float* k, int ld_k, int d, int keys, float* st, int ld_st) {
  for (int j = 0; j < keys; j += kKeyBlock) {
    scores_block<kVecs>(qt, ld_qt, k + size_t(j) * ld_k, d, st + size_t(j) * ld_st, ld_st);
  }
}

// Strips of 12 rows; rows_pad (a multiple of 4) may end in a strip of 8 or 4 rows.
void scores(const float* qt, int ld_qt, const float* k, int ld_k, int d, int rows_pad, int keys, float* st,
            int ld_st) {
  int r = 0;
  for (; r + kScoreVecs * kLanes <= rows_pad; r += kScoreVecs * kLanes) {
    scores_strip<kScoreVecs>(qt + r, ld_qt, k, ld_k, d, keys, st + r, ld_st);
  }
  static_assert(kScoreVecs == 3, "the strips left over are of 2 or 1 vectors");
  if (rows_pad - r == 2 * kLanes) scores_strip<2>(qt + r, ld_qt, k, ld_k, d, keys, st + r, ld_st);
  if (rows_pad - r == kLanes) scores_strip<1>(qt + r, ld_qt, k, ld_k, d, keys, st + r, ld_st);
}

// ---- softmax row passes ------------------------------------------------------------------------

// The running max with a NaN score ignored, as the portable set's `s > m ? s : m`: a compare and
// a select, not FMAX (which returns NaN) nor FMAXNM (which orders -0 below +0, where the
// portable set keeps the first of two zeros).
inline float32x4_t max_ignoring_nan(float32x4_t s, float32x4_t m) { return vbslq_f32(vcgtq_f32(s, m), s, m); }

void tile_max(const float* st, int ld_st, int rows_pad, int keys, float* out) {
  for (int r = 0; r < rows_pad; r += kLanes) {
    float32x4_t m = vdupq_n_f32(-INFINITY);
    for (int j = 0; j < keys; ++j) m = max_ignoring_nan(vld1q_f32(st + size_t(j) * ld_st + r), m);
    vst1q_f32(out + r, m);
  }
}

void exp2_sum(float* st, int ld_st, int rows_pad, int keys, float scale_log2, const float* offset,
              float* tile_sum) {
  const float32x4_t scale = vdupq_n_f32(scale_log2);
  for (int r = 0; r < rows_pad; r += kLanes) {
    const float32x4_t neg_offset = vnegq_f32(vld1q_f32(offset + r));
    float32x4_t sum = vdupq_n_f32(0.0f);
    for (int j = 0; j < keys; ++j) {
      float* s = st + size_t(j) * ld_st + r;
      const float32x4_t p = exp2_q(scaled_minus(vld1q_f32(s), scale, neg_offset));
      vst1q_f32(s, p);
      sum = vaddq_f32(sum, p);
    }
    vst1q_f32(tile_sum + r, sum);
  }
}

void scale_rows(float* o, int ld_o, int rows, int d_pad, const float* factor) {
  for (int r = 0; r < rows; ++r) {
    float* row = o + size_t(r) * ld_o;
    for (int c = 0; c < d_pad; c += kLanes) vst1q_f32(row + c, vmulq_n_f32(vld1q_f32(row + c), factor[r]));
  }
}

// ---- o (rows x d) += p (rows x keys, stored transposed in st) . v (keys x d) ---------------------

// kRows rows (at most kPvRows) x one V strip (kPvCols columns, a key's columns kPvCols apart) of
// o, kept in registers over all keys; the rows' probabilities of key j are st[j][0 .. kRows).
template <int kRows>
inline void pv_block(const float* st, int ld_st, const float* v, int keys, const float* factor, float* o,
                     int ld_o) {
  float32x4_t acc[kRows][kPvVecs];
  FA_UNROLL
  for (int i = 0; i < kRows; ++i)
    FA_UNROLL
    for (int c = 0; c < kPvVecs; ++c) acc[i][c] = vld1q_f32(o + size_t(i) * ld_o + c * kLanes);
  if (factor != nullptr) {
    FA_UNROLL
    for (int i = 0; i < kRows; ++i)
      FA_UNROLL
      for (int c = 0; c < kPvVecs; ++c) acc[i][c] = vmulq_n_f32(acc[i][c], factor[i]);
  }
  for (int j = 0; j < keys; ++j) {
    float32x4_t vj[kPvVecs];
    FA_UNROLL
    for (int c = 0; c < kPvVecs; ++c) vj[c] = vld1q_f32(v + size_t(j) * kPvCols + c * kLanes);
    fma_by_scalars<kRows, kPvVecs>(acc, vj, st + size_t(j) * ld_st);
  }
  FA_UNROLL
  for (int i = 0; i < kRows; ++i)
    FA_UNROLL
    for (int c = 0; c < kPvVecs; ++c) vst1q_f32(o + size_t(i) * ld_o + c * kLanes, acc[i][c]);
}

// kRows rows over every V strip (ld_v apart).
template <int kRows>
void pv_rows(const float* st, int ld_st, const float* v, int ld_v, int keys, int d_pad, const float* factor,
             float* o, int ld_o) {
  for (int c = 0; c < d_pad; c += kPvCols) {
    pv_block<kRows>(st, ld_st, v + size_t(c / kPvCols) * ld_v, keys, factor, o + c, ld_o);
  }
}

// The last rows % kPvRows rows as one block of that many rows.
template <int kRows>
void pv_tail(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys, int d_pad,
             const float* factor, float* o, int ld_o) {
  if constexpr (kRows > 0) {
    if (rows == kRows) return pv_rows<kRows>(st, ld_st, v, ld_v, keys, d_pad, factor, o, ld_o);
    pv_tail<kRows - 1>(st, ld_st, v, ld_v, rows, keys, d_pad, factor, o, ld_o);
  }
}

void pv(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys, int d_pad, const float* factor,
        float* o, int ld_o) {
  int r = 0;
  for (; r + kPvRows <= rows; r += kPvRows) {
    pv_rows<kPvRows>(st + r, ld_st, v, ld_v, keys, d_pad, factor ? factor + r : nullptr, o + size_t(r) * ld_o, ld_o);
  }
  pv_tail<kPvRows - 1>(st + r, ld_st, v, ld_v, rows - r, keys, d_pad, factor ? factor + r : nullptr,
                       o + size_t(r) * ld_o, ld_o);
}

// half.h float_to_bf16_bits on 4 lanes: round to nearest even, NaN kept quiet; the last n % 4
// values by float_to_bf16_bits itself.
void scaled_to_bf16(const float* src, int n, float scale, uint16_t* dst) {
  const uint32x4_t abs_mask = vdupq_n_u32(0x7fffffffu), inf = vdupq_n_u32(0x7f800000u);
  const uint32x4_t half_ulp = vdupq_n_u32(0x7fffu), one = vdupq_n_u32(1u), quiet = vdupq_n_u32(0x40u);
  int c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    const uint32x4_t x = vreinterpretq_u32_f32(vmulq_n_f32(vld1q_f32(src + c), scale));
    const uint32x4_t upper = vshrq_n_u32(x, 16);
    const uint32x4_t rounded = vshrq_n_u32(vaddq_u32(x, vaddq_u32(half_ulp, vandq_u32(upper, one))), 16);
    const uint32x4_t nan = vcgtq_u32(vandq_u32(x, abs_mask), inf);  // |x| > inf as integers
    // Lanes hold 0 .. 0xffff: narrowing keeps them as they are.
    vst1_u16(dst + c, vmovn_u32(vbslq_u32(nan, vorrq_u32(upper, quiet), rounded)));
  }
  for (; c < n; ++c) dst[c] = float_to_bf16_bits(src[c] * scale);
}

// ---- dst (cols x rows) = src (rows x cols)^T, 4 x 4 blocks through registers -----------------

// r[i] = row i of a 4 x 4 block in, column i out: pairs of rows interleaved by lane (TRN1/TRN2
// on fp32), then pairs of pairs by 64-bit lane (TRN1/TRN2 on fp64).
inline void transpose_4x4(float32x4_t (&r)[4]) {
  const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(r[0], r[1]));  // r0[0] r1[0] | r0[2] r1[2]
  const float64x2_t t1 = vreinterpretq_f64_f32(vtrn2q_f32(r[0], r[1]));  // r0[1] r1[1] | r0[3] r1[3]
  const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(r[2], r[3]));
  const float64x2_t t3 = vreinterpretq_f64_f32(vtrn2q_f32(r[2], r[3]));
  r[0] = vreinterpretq_f32_f64(vtrn1q_f64(t0, t2));
  r[1] = vreinterpretq_f32_f64(vtrn1q_f64(t1, t3));
  r[2] = vreinterpretq_f32_f64(vtrn2q_f64(t0, t2));
  r[3] = vreinterpretq_f32_f64(vtrn2q_f64(t1, t3));
}

// Whole 4 x 4 blocks through registers; the rows and columns past the last whole block one value
// at a time.
void transpose(const float* src, int ld_src, int rows, int cols, float* dst, int ld_dst) {
  const int rows4 = rows / kLanes * kLanes, cols4 = cols / kLanes * kLanes;
  for (int r0 = 0; r0 < rows4; r0 += kLanes) {
    for (int c0 = 0; c0 < cols4; c0 += kLanes) {
      float32x4_t block[kLanes];
      for (int i = 0; i < kLanes; ++i) block[i] = vld1q_f32(src + size_t(r0 + i) * ld_src + c0);
      transpose_4x4(block);
      for (int i = 0; i < kLanes; ++i) vst1q_f32(dst + size_t(c0 + i) * ld_dst + r0, block[i]);
    }
    for (int r = r0; r < r0 + kLanes; ++r) {
      for (int c = cols4; c < cols; ++c) dst[size_t(c) * ld_dst + r] = src[size_t(r) * ld_src + c];
    }
  }
  for (int r = rows4; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) dst[size_t(c) * ld_dst + r] = src[size_t(r) * ld_src + c];
  }
}

// ---- decode (D-72): rows read in place, widened in registers ------------------------------------

// Elements are taken 8 at a time (one 128-bit load of f16 or bf16): d a multiple of 8.
constexpr int kDecodeStep = 8;
// Register blocks: scores 4 heads x 4 keys (16 accumulators; per step 8 registers of widened K,
// 2 of q), each K row widened once for the 4 heads; P.V 4 heads x 16 columns (16 accumulators,
// 4 registers of widened V), each V row widened once for the 4 heads.
constexpr int kDecodeHeads = 4, kDecodeScoreKeys = 4;
constexpr int kDecodePvCols = 2 * kDecodeStep;
static_assert(kDecodeKeys % kDecodeScoreKeys == 0, "score stores stay within a head's row");

// 8 elements of a row as two fp32 vectors.
struct Widened {
  float32x4_t lo, hi;
};

// Elements c .. c + 7 of a row stored as D, widened to fp32: f16 by FCVTL (vcvt_f32_f16), bf16
// by shifting each 16-bit element into the upper half of a 32-bit lane (SHLL), which is exactly
// the fp32 of the same bits.
// e4m3 (D-87): each byte placed as an fp16 of the e4m3 value x 2^-8 (sign at bit 15, magnitude
// at bits 7..13; subnormal bytes too), widened by FCVTL as f16 rows are, x 256; the NaN bytes
// (magnitude 0x7f) NaN.
template <DType D>
inline Widened load8(const void* row, int c) {
  if constexpr (D == DType::f32) {
    const float* p = static_cast<const float*>(row) + c;
    return {vld1q_f32(p), vld1q_f32(p + kLanes)};
  } else if constexpr (D == DType::e4m3) {
    // (the byte sign-extended to 16 bits, shifted left by 7, bit 14 cleared)
    const uint16x8_t w = vreinterpretq_u16_s16(vmovl_s8(vreinterpret_s8_u8(vld1_u8(static_cast<const uint8_t*>(row) + c))));
    const uint16x8_t bits = vandq_u16(vshlq_n_u16(w, 7), vdupq_n_u16(0xbf80));
    const float16x8_t h = vreinterpretq_f16_u16(bits);
    const float32x4_t to_value = vdupq_n_f32(256.0f), nan = vdupq_n_f32(std::numeric_limits<float>::quiet_NaN());
    // the NaN lanes' all-ones 16-bit masks, sign-extended to 32 bits
    const int16x8_t is_nan = vreinterpretq_s16_u16(vceqq_u16(vandq_u16(w, vdupq_n_u16(0x7f)), vdupq_n_u16(0x7f)));
    const float32x4_t lo = vmulq_f32(vcvt_f32_f16(vget_low_f16(h)), to_value);
    const float32x4_t hi = vmulq_f32(vcvt_high_f32_f16(h), to_value);
    return {vbslq_f32(vreinterpretq_u32_s32(vmovl_s16(vget_low_s16(is_nan))), nan, lo),
            vbslq_f32(vreinterpretq_u32_s32(vmovl_high_s16(is_nan)), nan, hi)};
  } else if constexpr (D == DType::f16) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(static_cast<const uint16_t*>(row) + c));
    return {vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
  } else {  // bf16
    const uint16x8_t b = vld1q_u16(static_cast<const uint16_t*>(row) + c);
    return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(b), 16)), vreinterpretq_f32_u32(vshll_high_n_u16(b, 16))};
  }
}

// Lane i of the result = the sum of the 4 lanes of x[i] (two rounds of pairwise adds).
inline float32x4_t sum_lanes_4(const float32x4_t (&x)[4]) {
  return vpaddq_f32(vpaddq_f32(x[0], x[1]), vpaddq_f32(x[2], x[3]));
}

// Scores of H (<= 4) heads against the keys, 4 keys at a time: s[h][j0 .. j0 + 3] stored whole
// (a last group of fewer keys repeats the last key; its extra scores lie within the head's
// kDecodeKeys slots, past `keys`, which exp2_sum overwrites with 0).
template <DType D, int H>
void decode_scores_heads(const float* q, int d, const void* const* k_rows, int keys, float* s) {
  for (int j0 = 0; j0 < keys; j0 += kDecodeScoreKeys) {
    const void* k[kDecodeScoreKeys];
    FA_UNROLL
    for (int i = 0; i < kDecodeScoreKeys; ++i) k[i] = k_rows[j0 + i < keys ? j0 + i : keys - 1];
    float32x4_t acc[H][kDecodeScoreKeys];
    FA_UNROLL
    for (int h = 0; h < H; ++h)
      FA_UNROLL
      for (int i = 0; i < kDecodeScoreKeys; ++i) acc[h][i] = vdupq_n_f32(0.0f);
    for (int c = 0; c < d; c += kDecodeStep) {
      Widened kv[kDecodeScoreKeys];
      FA_UNROLL
      for (int i = 0; i < kDecodeScoreKeys; ++i) kv[i] = load8<D>(k[i], c);
      FA_UNROLL
      for (int h = 0; h < H; ++h) {
        const float* qh = q + size_t(h) * d + c;
        const float32x4_t q_lo = vld1q_f32(qh), q_hi = vld1q_f32(qh + kLanes);
        FA_UNROLL
        for (int i = 0; i < kDecodeScoreKeys; ++i) {
          acc[h][i] = vfmaq_f32(vfmaq_f32(acc[h][i], q_lo, kv[i].lo), q_hi, kv[i].hi);
        }
      }
    }
    FA_UNROLL
    for (int h = 0; h < H; ++h) vst1q_f32(s + h * kDecodeKeys + j0, sum_lanes_4(acc[h]));
  }
}

template <DType D>
void decode_scores(const void* q, int heads, int d, const void* const* k_rows, int keys, float* s) {
  const float* q32 = static_cast<const float*>(q);
  int h = 0;
  for (; h + kDecodeHeads <= heads; h += kDecodeHeads) {
    decode_scores_heads<D, kDecodeHeads>(q32 + size_t(h) * d, d, k_rows, keys, s + h * kDecodeKeys);
  }
  static_assert(kDecodeHeads == 4, "1 to 3 heads are left over");
  const float* qh = q32 + size_t(h) * d;
  float* sh = s + h * kDecodeKeys;
  if (heads - h == 3) decode_scores_heads<D, 3>(qh, d, k_rows, keys, sh);
  if (heads - h == 2) decode_scores_heads<D, 2>(qh, d, k_rows, keys, sh);
  if (heads - h == 1) decode_scores_heads<D, 1>(qh, d, k_rows, keys, sh);
}

// Whether each lane of the 4 scores from `first` is one of the block's keys.
inline uint32x4_t in_keys(int first, int keys) {
  const uint32_t lanes[kLanes] = {0, 1, 2, 3};
  return vcltq_u32(vaddq_u32(vld1q_u32(lanes), vdupq_n_u32(uint32_t(first))), vdupq_n_u32(uint32_t(keys)));
}

void decode_row_max(const float* s, int heads, int keys, float* out) {
  const float32x4_t lowest = vdupq_n_f32(-INFINITY);
  for (int h = 0; h < heads; ++h) {
    const float* row = s + h * kDecodeKeys;
    float32x4_t m = lowest;
    for (int j = 0; j < kDecodeKeys; j += kLanes) {
      m = max_ignoring_nan(vbslq_f32(in_keys(j, keys), vld1q_f32(row + j), lowest), m);
    }
    out[h] = vmaxvq_f32(m);  // m holds no NaN
  }
}

void decode_exp2_sum(float* s, int heads, int keys, float scale_log2, const float* offset, float* sum) {
  const float32x4_t scale = vdupq_n_f32(scale_log2), zero = vdupq_n_f32(0.0f);
  for (int h = 0; h < heads; ++h) {
    float* row = s + h * kDecodeKeys;
    const float32x4_t neg_offset = vdupq_n_f32(-offset[h]);
    float32x4_t total = zero;
    for (int j = 0; j < kDecodeKeys; j += kLanes) {
      const float32x4_t x = scaled_minus(vld1q_f32(row + j), scale, neg_offset);
      const float32x4_t p = vbslq_f32(in_keys(j, keys), exp2_q(x), zero);
      vst1q_f32(row + j, p);
      total = vaddq_f32(total, p);
    }
    sum[h] = vaddvq_f32(total);
  }
}

// H (<= 4) heads x kSteps * 8 columns from c0 of o, kept in registers over the block's keys.
template <DType D, int H, int kSteps>
inline void decode_pv_block(const float* p, const void* const* v_rows, int keys, int d, int c0, const float* factor,
                            float* o) {
  float32x4_t acc[H][2 * kSteps];
  FA_UNROLL
  for (int h = 0; h < H; ++h) {
    const float* row = o + size_t(h) * d + c0;
    FA_UNROLL
    for (int v = 0; v < 2 * kSteps; ++v) acc[h][v] = vmulq_n_f32(vld1q_f32(row + v * kLanes), factor[h]);
  }
  for (int j = 0; j < keys; ++j) {
    Widened vv[kSteps];
    FA_UNROLL
    for (int w = 0; w < kSteps; ++w) vv[w] = load8<D>(v_rows[j], c0 + w * kDecodeStep);
    FA_UNROLL
    for (int h = 0; h < H; ++h) {
      const float pj = p[h * kDecodeKeys + j];
      FA_UNROLL
      for (int w = 0; w < kSteps; ++w) {
        acc[h][2 * w] = vfmaq_n_f32(acc[h][2 * w], vv[w].lo, pj);
        acc[h][2 * w + 1] = vfmaq_n_f32(acc[h][2 * w + 1], vv[w].hi, pj);
      }
    }
  }
  FA_UNROLL
  for (int h = 0; h < H; ++h)
    FA_UNROLL
    for (int v = 0; v < 2 * kSteps; ++v) vst1q_f32(o + size_t(h) * d + c0 + v * kLanes, acc[h][v]);
}

template <DType D, int H>
void decode_pv_heads(const float* p, const void* const* v_rows, int keys, int d, const float* factor, float* o) {
  int c0 = 0;
  for (; c0 + kDecodePvCols <= d; c0 += kDecodePvCols) decode_pv_block<D, H, 2>(p, v_rows, keys, d, c0, factor, o);
  if (c0 < d) decode_pv_block<D, H, 1>(p, v_rows, keys, d, c0, factor, o);  // d % 16 == 8
}

template <DType D>
void decode_pv(const float* p, int heads, const void* const* v_rows, int keys, int d, const float* factor, float* o) {
  int h = 0;
  for (; h + kDecodeHeads <= heads; h += kDecodeHeads) {
    decode_pv_heads<D, kDecodeHeads>(p + h * kDecodeKeys, v_rows, keys, d, factor + h, o + size_t(h) * d);
  }
  for (; h < heads; ++h) decode_pv_heads<D, 1>(p + h * kDecodeKeys, v_rows, keys, d, factor + h, o + size_t(h) * d);
}

template <DType D>
const DecodeKernels* neon_decode_set() {
  static const DecodeKernels kernels{"neon", false, decode_scores<D>, decode_row_max, decode_exp2_sum, decode_pv<D>};
  return &kernels;
}

}  // namespace

const TileKernels* neon_kernels() {
  static const TileKernels kernels{"neon", kLanes, kKeyBlock, kPvCols, scores, tile_max, exp2_sum, scale_rows, pv, scaled_to_bf16, transpose};
  return &kernels;
}

// Decode (D-72): d a multiple of 8.
const DecodeKernels* neon_decode_kernels(DType storage, int d) {
  if (d % kDecodeStep != 0) return nullptr;
  switch (storage) {
    case DType::f32: return neon_decode_set<DType::f32>();
    case DType::f16: return neon_decode_set<DType::f16>();
    case DType::bf16: return neon_decode_set<DType::bf16>();
    case DType::e4m3: return neon_decode_set<DType::e4m3>();
    default: return nullptr;
  }
}

}  // namespace cpu
}  // namespace flashattn

#else  // not aarch64 (or big-endian)

namespace flashattn {
namespace cpu {
const TileKernels* neon_kernels() { return nullptr; }
const DecodeKernels* neon_decode_kernels(DType, int) { return nullptr; }
}  // namespace cpu
}  // namespace flashattn

#endif
