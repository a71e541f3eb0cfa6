// The parts of the bf16 tile kernels (kernels.h "bf16 tile kernels") that the AMX set and the
// AVX512-BF16 set share, in AVX-512 with AVX512-BF16: the pack steps into the pair layouts
// (k_vnni, v_vnni) and the row-major softmax passes, which round P to bf16 with VCVTNEPS2BF16.
// Each set hands these functions out in its Bf16Kernels; the products are its own.
#pragma once

#include "cpu/avx512_math.h"
#include "cpu/kernels.h"

#ifdef FLASHATTN_HAVE_AVX512_KERNELS
#include <cmath>
#include <cstring>

#define FA_AVX512_BF16 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,fma")))

namespace flashattn {
namespace cpu {
namespace bf16_tiles {

constexpr int kLanes = 16;  // fp32 (or dwords: pairs of bf16) per zmm

// ---- packing ---------------------------------------------------------------------------------

// out[c] (c < 16) = column c of the 16 x 16 dword block in rows[0..15].
FA_AVX512_BF16 inline void transpose16x16(__m512i rows[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // dword pairs of two rows
    t[i] = _mm512_unpacklo_epi32(rows[i], rows[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(rows[i], rows[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // u[g + m], lane L = column 4L + m of rows g..g+3
    u[g + 0] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int m = 0; m < 4; ++m) {  // gather lane L of u[m], u[4+m], u[8+m], u[12+m]
    const __m512i x = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44);
    const __m512i y = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xEE);
    const __m512i x2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44);
    const __m512i y2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xEE);
    rows[m] = _mm512_shuffle_i32x4(x, x2, 0x88);
    rows[4 + m] = _mm512_shuffle_i32x4(x, x2, 0xDD);
    rows[8 + m] = _mm512_shuffle_i32x4(y, y2, 0x88);
    rows[12 + m] = _mm512_shuffle_i32x4(y, y2, 0xDD);
  }
}

// k (n rows of d) -> k_vnni (d/2, n, 2): as dwords (pairs of bf16), a transpose of (n, d/2).
FA_AVX512_BF16 inline void pack_k(const uint16_t* const* k_rows, int n, int d, uint16_t* k_vnni) {
  const int pairs = d / 2;
  uint32_t* dst = reinterpret_cast<uint32_t*>(k_vnni);
  __m512i block[16];
  for (int j0 = 0; j0 < n; j0 += 16) {
    for (int c0 = 0; c0 < pairs; c0 += 16) {
      for (int i = 0; i < 16; ++i) {
        block[i] = _mm512_loadu_si512(reinterpret_cast<const uint32_t*>(k_rows[j0 + i]) + c0);
      }
      transpose16x16(block);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + size_t(c0 + i) * n + j0, block[i]);
    }
  }
}

// v (n rows of d) -> v_vnni (n/2, d, 2): the bf16 of two consecutive keys interleaved.
FA_AVX512_BF16 inline void pack_v(const uint16_t* const* v_rows, int n, int d, uint16_t* v_vnni) {
  alignas(64) uint16_t lo_index[32], hi_index[32];
  for (int i = 0; i < 16; ++i) {
    lo_index[2 * i] = uint16_t(i);
    lo_index[2 * i + 1] = uint16_t(32 + i);
    hi_index[2 * i] = uint16_t(16 + i);
    hi_index[2 * i + 1] = uint16_t(48 + i);
  }
  const __m512i lo = _mm512_load_si512(lo_index), hi = _mm512_load_si512(hi_index);
  for (int j = 0; j < n; j += 2) {
    const uint16_t* even = v_rows[j];
    const uint16_t* odd = v_rows[j + 1];
    uint16_t* out = v_vnni + size_t(j) * d;  // row j/2 of (n/2, d, 2)
    for (int c = 0; c < d; c += kBf16Pair) {
      const __m512i a = _mm512_loadu_si512(even + c), b = _mm512_loadu_si512(odd + c);
      _mm512_storeu_si512(out + 2 * c, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(out + 2 * c + kBf16Pair, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

// ---- row-major softmax passes ----------------------------------------------------------------

// Lanes of the 16 columns from j that are keys of the tile.
FA_AVX512_BF16 inline __mmask16 key_lanes(int j, int keys) {
  const int left = keys - j;
  return left >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
}

FA_AVX512_BF16 inline void row_max(const float* s, int n, int rows, int keys, float* tile_max) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  for (int r = 0; r < rows; ++r) {
    __m512 m = neg_inf;
    // max(x, m) returns m when x is NaN: NaN scores are ignored.
    for (int j = 0; j < keys; j += kLanes) {
      m = _mm512_max_ps(_mm512_mask_loadu_ps(neg_inf, key_lanes(j, keys), s + size_t(r) * n + j), m);
    }
    tile_max[r] = _mm512_reduce_max_ps(m);
  }
}

FA_AVX512_BF16 inline void row_exp2_sum(const float* s, int n, int rows, int rows_pad, int keys,
                                        float scale_log2, const float* offset, float* tile_sum, uint16_t* p) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY), scale = _mm512_set1_ps(scale_log2);
  const __m256i zero = _mm256_setzero_si256();
  for (int r = 0; r < rows; ++r) {
    const __m512 off = _mm512_set1_ps(offset[r]);
    __m512 sum = _mm512_setzero_ps();
    uint16_t* p_row = p + size_t(r) * n;
    int j = 0;
    for (; j < keys; j += kLanes) {
      const __m512 x = _mm512_mask_loadu_ps(neg_inf, key_lanes(j, keys), s + size_t(r) * n + j);
      const __m512 e = exp2_ps_for_bf16(_mm512_fmsub_ps(x, scale, off));  // -inf past the keys -> 0
      sum = _mm512_add_ps(sum, e);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p_row + j), (__m256i)_mm512_cvtneps_pbh(e));
    }
    for (; j < n; j += kLanes) _mm256_storeu_si256(reinterpret_cast<__m256i*>(p_row + j), zero);
    tile_sum[r] = _mm512_reduce_add_ps(sum);
  }
  for (int r = rows; r < rows_pad; ++r) std::memset(p + size_t(r) * n, 0, sizeof(uint16_t) * n);
}

}  // namespace bf16_tiles
}  // namespace cpu
}  // namespace flashattn

#endif
