// The portable tile kernels (plain loops over contiguous rows, which the compiler vectorises
// for whatever the build targets) and the run-time choice between them, the AVX2 set and the
// AVX-512 set.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/half.h"
#include "cpu/kernels.h"
#include "flashattn/flashattn.h"

namespace flashattn {
namespace cpu {
namespace {

void scores(const float* qt, int ld_qt, const float* k, int ld_k, int d, int rows_pad, int keys,
            float* st, int ld_st) {
  for (int j = 0; j < keys; ++j) {
    float* s = st + size_t(j) * ld_st;
    std::fill_n(s, rows_pad, 0.0f);
    for (int c = 0; c < d; ++c) {
      const float kc = k[size_t(j) * ld_k + c];
      const float* q = qt + size_t(c) * ld_qt;
      for (int r = 0; r < rows_pad; ++r) s[r] += kc * q[r];
    }
  }
}

void tile_max(const float* st, int ld_st, int rows_pad, int keys, float* out) {
  std::fill_n(out, rows_pad, -INFINITY);
  for (int j = 0; j < keys; ++j) {
    const float* s = st + size_t(j) * ld_st;
    // A NaN score fails the comparison and leaves the max as it was.
    for (int r = 0; r < rows_pad; ++r) out[r] = s[r] > out[r] ? s[r] : out[r];
  }
}

void exp2_sum(float* st, int ld_st, int rows_pad, int keys, float scale_log2, const float* offset,
              float* tile_sum) {
  std::fill_n(tile_sum, rows_pad, 0.0f);
  for (int j = 0; j < keys; ++j) {
    float* s = st + size_t(j) * ld_st;
    for (int r = 0; r < rows_pad; ++r) {
      s[r] = std::exp2(s[r] * scale_log2 - offset[r]);
      tile_sum[r] += s[r];
    }
  }
}

void scale_rows(float* o, int ld_o, int rows, int d_pad, const float* factor) {
  for (int r = 0; r < rows; ++r) {
    float* row = o + size_t(r) * ld_o;
    for (int c = 0; c < d_pad; ++c) row[c] *= factor[r];
  }
}

void pv(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys, int d_pad,
        float* o, int ld_o) {
  for (int r = 0; r < rows; ++r) {
    float* out = o + size_t(r) * ld_o;
    for (int j = 0; j < keys; ++j) {
      const float p = st[size_t(j) * ld_st + r];
      const float* v_row = v + size_t(j) * ld_v;
      for (int c = 0; c < d_pad; ++c) out[c] += p * v_row[c];
    }
  }
}

void scaled_to_bf16(const float* src, int n, float scale, uint16_t* dst) {
  for (int c = 0; c < n; ++c) dst[c] = float_to_bf16_bits(src[c] * scale);
}

void transpose(const float* src, int ld_src, int rows, int cols, float* dst, int ld_dst) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) dst[size_t(c) * ld_dst + r] = src[size_t(r) * ld_src + c];
  }
}

// FLASHATTN_KERNEL=...,cpu=portable|avx2|avx512|avx512bf16|amx (tests) caps the kernel set.
KernelLevel highest_allowed_level() {
  switch (kernel_override_from_env().cpu_kernels) {
    case CpuKernels::portable: return KernelLevel::portable;
    case CpuKernels::avx2: return KernelLevel::avx2;
    case CpuKernels::avx512: return KernelLevel::avx512;
    case CpuKernels::avx512bf16: return KernelLevel::avx512bf16;
    default: return KernelLevel::amx;
  }
}

}  // namespace

bool kernel_level_allowed(KernelLevel level) {
  static const KernelLevel highest = highest_allowed_level();
  return int(level) <= int(highest);
}

const TileKernels& portable_kernels() {
  static const TileKernels kernels{"portable", kRowLanes, scores, tile_max, exp2_sum, scale_rows, pv, scaled_to_bf16, transpose};
  return kernels;
}

const TileKernels& tile_kernels() {
  static const TileKernels& chosen = [&]() -> const TileKernels& {
    const TileKernels* avx512 = avx512_kernels();
    if (avx512 != nullptr && kernel_level_allowed(KernelLevel::avx512)) return *avx512;
    const TileKernels* avx2 = avx2_kernels();
    if (avx2 != nullptr && kernel_level_allowed(KernelLevel::avx2)) return *avx2;
    return portable_kernels();
  }();
  return chosen;
}

const Bf16Kernels* bf16_kernels() {
  static const Bf16Kernels* const chosen = amx_kernels() != nullptr ? amx_kernels() : avx512bf16_kernels();
  return chosen;
}

}  // namespace cpu
}  // namespace flashattn
