// The AMX-BF16 tile kernels (kernels.h "bf16 on AMX tiles"): both products on the tile unit
// in blocks of 2 x 2 accumulator tiles (32 x 32 fp32) fed by two A and two B tiles, the pack
// steps and the row-major softmax passes in AVX-512 (with AVX512-BF16 for the fp32 -> bf16
// rounding of P). Every function carries the target attribute; amx_kernels() hands them out
// only where CPUID lists the features and Linux grants the tile data state.
#include "cpu/kernels.h"

#include "cpu/avx512_math.h"

#if defined(FLASHATTN_HAVE_AVX512_KERNELS) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstring>

#define FA_AMX __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,fma,amx-tile,amx-bf16")))

namespace flashattn {
namespace cpu {
namespace {

// Tile registers: 0-3 accumulators (16 x 16 fp32), 4-5 A operands (16 x 32 bf16), 6-7 B
// operands (16 pairs x 16 columns); all 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

constexpr int kTileBytes = 64;
constexpr int kLanes = 16;  // fp32 per zmm / accumulator tile row

TileConfig make_config() {
  TileConfig c;
  std::memset(&c, 0, sizeof c);
  c.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = kTileBytes;
    c.rows[t] = kAmxRows;
  }
  return c;
}

FA_AMX void begin() {
  static const TileConfig config = make_config();
  _tile_loadconfig(&config);
}

FA_AMX void end() { _tile_release(); }

// ---- packing ---------------------------------------------------------------------------------

// out[c] (c < 16) = column c of the 16 x 16 dword block in rows[0..15].
FA_AMX inline void transpose16x16(__m512i rows[16]) {
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
FA_AMX void pack_k(const uint16_t* const* k_rows, int n, int d, uint16_t* k_vnni) {
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
FA_AMX void pack_v(const uint16_t* const* v_rows, int n, int d, uint16_t* v_vnni) {
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
    for (int c = 0; c < d; c += kAmxPair) {
      const __m512i a = _mm512_loadu_si512(even + c), b = _mm512_loadu_si512(odd + c);
      _mm512_storeu_si512(out + 2 * c, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(out + 2 * c + kAmxPair, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

// ---- products ----------------------------------------------------------------------------------

// s (rows_pad, n) = q (rows_pad, d) . k^T; 32 x 32 blocks (16 x 32 at an odd last row tile).
// Keys j0.. of the block sit in k_vnni's block j0 / tile_keys (kernels.h).
FA_AMX void scores(const uint16_t* q, int rows_pad, int d, const uint16_t* k_vnni, int tile_keys, int n,
                   float* s) {
  const int q_stride = d * 2, k_stride = tile_keys * 4, s_stride = n * 4;  // bytes
  for (int r0 = 0; r0 < rows_pad; r0 += 2 * kAmxRows) {
    const bool two = r0 + 2 * kAmxRows <= rows_pad;
    for (int j0 = 0; j0 < n; j0 += 2 * kLanes) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int c0 = 0; c0 < d; c0 += kAmxPair) {
        const uint16_t* kb = k_vnni + size_t(j0 / tile_keys) * tile_keys * d +
                             size_t(c0 / 2) * tile_keys * 2 + (j0 % tile_keys) * 2;
        _tile_loadd(4, q + size_t(r0) * d + c0, q_stride);
        _tile_loadd(6, kb, k_stride);
        _tile_loadd(7, kb + kLanes * 2, k_stride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
          _tile_loadd(5, q + size_t(r0 + kAmxRows) * d + c0, q_stride);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      float* out = s + size_t(r0) * n + j0;
      _tile_stored(0, out, s_stride);
      _tile_stored(1, out + kLanes, s_stride);
      if (two) {
        _tile_stored(2, out + size_t(kAmxRows) * n, s_stride);
        _tile_stored(3, out + size_t(kAmxRows) * n + kLanes, s_stride);
      }
    }
  }
}

// o (rows_pad, ld_o) += p (rows_pad, n) . v; 32 x 32 blocks of o loaded, updated over the
// tile's keys, stored.
FA_AMX void pv(const uint16_t* p, int rows_pad, int n, const uint16_t* v_vnni, int d, float* o, int ld_o) {
  const int p_stride = n * 2, v_stride = d * 4, o_stride = ld_o * 4;  // bytes
  for (int r0 = 0; r0 < rows_pad; r0 += 2 * kAmxRows) {
    const bool two = r0 + 2 * kAmxRows <= rows_pad;
    for (int c0 = 0; c0 < d; c0 += 2 * kLanes) {
      float* out = o + size_t(r0) * ld_o + c0;
      _tile_loadd(0, out, o_stride);
      _tile_loadd(1, out + kLanes, o_stride);
      if (two) {
        _tile_loadd(2, out + size_t(kAmxRows) * ld_o, o_stride);
        _tile_loadd(3, out + size_t(kAmxRows) * ld_o + kLanes, o_stride);
      }
      for (int j0 = 0; j0 < n; j0 += kAmxPair) {
        const uint16_t* vb = v_vnni + size_t(j0 / 2) * d * 2 + c0 * 2;
        _tile_loadd(4, p + size_t(r0) * n + j0, p_stride);
        _tile_loadd(6, vb, v_stride);
        _tile_loadd(7, vb + kLanes * 2, v_stride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
          _tile_loadd(5, p + size_t(r0 + kAmxRows) * n + j0, p_stride);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, out, o_stride);
      _tile_stored(1, out + kLanes, o_stride);
      if (two) {
        _tile_stored(2, out + size_t(kAmxRows) * ld_o, o_stride);
        _tile_stored(3, out + size_t(kAmxRows) * ld_o + kLanes, o_stride);
      }
    }
  }
}

// ---- row-major softmax passes ----------------------------------------------------------------

// Lanes of the 16 columns from j that are keys of the tile.
FA_AMX inline __mmask16 key_lanes(int j, int keys) {
  const int left = keys - j;
  return left >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
}

FA_AMX void row_max(const float* s, int n, int rows, int keys, float* tile_max) {
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

FA_AMX void row_exp2_sum(const float* s, int n, int rows, int keys, float scale_log2,
                         const float* offset, float* tile_sum, uint16_t* p) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY), scale = _mm512_set1_ps(scale_log2);
  const __m256i zero = _mm256_setzero_si256();
  const int rows_pad = (rows + kAmxRows - 1) / kAmxRows * kAmxRows;
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

// ---- availability ------------------------------------------------------------------------------

bool cpu_has_amx_bf16() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;
  const bool avx512f = (ebx >> 16) & 1u, avx512bw = (ebx >> 30) & 1u;
  if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) return false;
  const bool avx512_bf16 = (eax >> 5) & 1u;
  return amx_bf16 && amx_tile && avx512f && avx512bw && avx512_bf16;
}

// Linux hands out the AMX tile data state only to processes that ask for it.
bool os_grants_tile_data() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

const AmxKernels* amx_kernels() {
  static const AmxKernels kernels{begin, end, pack_k, pack_v, scores, row_max, row_exp2_sum, pv};
  static const bool usable = kernel_level_allowed(KernelLevel::amx) && avx512_kernels() != nullptr &&
                             cpu_has_amx_bf16() && os_grants_tile_data();
  return usable ? &kernels : nullptr;
}

}  // namespace cpu
}  // namespace flashattn

#else  // no AMX kernels in this build

namespace flashattn {
namespace cpu {
const AmxKernels* amx_kernels() { return nullptr; }
}  // namespace cpu
}  // namespace flashattn

#endif
