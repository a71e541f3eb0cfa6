// The AMX-BF16 tile kernels (kernels.h "bf16 tile kernels"): both products on the tile unit
// in blocks of 2 x 2 accumulator tiles (32 x 32 fp32) fed by two A and two B tiles; the pack
// steps and the row-major softmax passes are the AVX-512 ones shared with the AVX512-BF16 set
// (avx512_bf16_tiles.h). Every function carries the target attribute; amx_kernels() hands them
// out only where CPUID lists the features and Linux grants the tile data state.
#include "cpu/kernels.h"

#include "cpu/avx512_bf16_tiles.h"

#if defined(FLASHATTN_HAVE_AVX512_KERNELS) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

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
      for (int c0 = 0; c0 < d; c0 += kBf16Pair) {
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
      for (int j0 = 0; j0 < n; j0 += kBf16Pair) {
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

const Bf16Kernels* amx_kernels() {
  static const Bf16Kernels kernels{"amx", kAmxRows, begin, end, bf16_tiles::pack_k, bf16_tiles::pack_v,
                                   scores, bf16_tiles::row_max, bf16_tiles::row_exp2_sum, pv};
  static const bool usable = kernel_level_allowed(KernelLevel::amx) && avx512_kernels() != nullptr &&
                             cpu_has_amx_bf16() && os_grants_tile_data();
  return usable ? &kernels : nullptr;
}

}  // namespace cpu
}  // namespace flashattn

#else  // no AMX kernels in this build

namespace flashattn {
namespace cpu {
const Bf16Kernels* amx_kernels() { return nullptr; }
}  // namespace cpu
}  // namespace flashattn

#endif
