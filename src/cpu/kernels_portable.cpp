// The portable tile kernels (plain loops over contiguous rows, which the compiler vectorises
// for whatever the build targets) and the run-time choice between them, the NEON set (aarch64),
// the AVX2 set and the AVX-512 set.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/half.h"
#include "cpu/kernels.h"
#include "cpu/storage.h"
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
        const float* factor, float* o, int ld_o) {
  for (int r = 0; r < rows; ++r) {
    float* out = o + size_t(r) * ld_o;
    if (factor != nullptr) {
      for (int c = 0; c < d_pad; ++c) out[c] *= factor[r];
    }
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


// ---- decode (D-72): plain loops over the rows as stored ------------------------------------------

template <typename S>
void decode_scores(const void* q, int heads, int d, const void* const* k_rows, int keys, float* s) {
  using T = typename S::Element;
  const float* q32 = static_cast<const float*>(q);
  for (int j = 0; j < keys; ++j) {
    const T* k = static_cast<const T*>(k_rows[j]);
    for (int h = 0; h < heads; ++h) {
      const float* qh = q32 + size_t(h) * d;
      float acc = 0.0f;
      for (int c = 0; c < d; ++c) acc += qh[c] * S::load(k[c]);
      s[h * kDecodeKeys + j] = acc;
    }
  }
}

void decode_row_max(const float* s, int heads, int keys, float* out) {
  for (int h = 0; h < heads; ++h) {
    float m = -INFINITY;
    // A NaN score fails the comparison and leaves the max as it was.
    for (int j = 0; j < keys; ++j) m = s[h * kDecodeKeys + j] > m ? s[h * kDecodeKeys + j] : m;
    out[h] = m;
  }
}

void decode_exp2_sum(float* s, int heads, int keys, float scale_log2, const float* offset, float* sum) {
  for (int h = 0; h < heads; ++h) {
    float* row = s + h * kDecodeKeys;
    float total = 0.0f;
    for (int j = 0; j < keys; ++j) {
      row[j] = std::exp2(row[j] * scale_log2 - offset[h]);
      total += row[j];
    }
    std::fill(row + keys, row + kDecodeKeys, 0.0f);
    sum[h] = total;
  }
}

template <typename S>
void decode_pv(const float* s, int heads, const void* const* v_rows, int keys, int d, const float* factor,
               float* o) {
  using T = typename S::Element;
  for (int h = 0; h < heads; ++h) {
    float* out = o + size_t(h) * d;
    for (int c = 0; c < d; ++c) out[c] *= factor[h];
    for (int j = 0; j < keys; ++j) {
      const float p = s[h * kDecodeKeys + j];
      const T* v = static_cast<const T*>(v_rows[j]);
      for (int c = 0; c < d; ++c) out[c] += p * S::load(v[c]);
    }
  }
}

template <typename S>
const DecodeKernels* portable_decode_set(const char* name) {
  static const DecodeKernels kernels{name, false, decode_scores<S>, decode_row_max, decode_exp2_sum, decode_pv<S>};
  return &kernels;
}

// FLASHATTN_KERNEL=...,cpu=portable|neon|avx2|avx512|avx512bf16|amx (tests) caps the kernel set.
KernelLevel highest_allowed_level() {
  switch (kernel_override_from_env().cpu_kernels) {
    case CpuKernels::portable: return KernelLevel::portable;
    case CpuKernels::neon: return KernelLevel::neon;
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

bool avx512bf16_products_pay() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool amd = __builtin_cpu_is("amd");
  return amd;
#else
  return false;
#endif
}

const TileKernels& portable_kernels() {
  static const TileKernels kernels{"portable", kRowLanes, 1, 0, scores, tile_max, exp2_sum, scale_rows, pv, scaled_to_bf16, transpose};
  return kernels;
}

const TileKernels& tile_kernels() {
  static const TileKernels& chosen = [&]() -> const TileKernels& {
    const TileKernels* avx512 = avx512_kernels();
    if (avx512 != nullptr && kernel_level_allowed(KernelLevel::avx512)) return *avx512;
    const TileKernels* avx2 = avx2_kernels();
    if (avx2 != nullptr && kernel_level_allowed(KernelLevel::avx2)) return *avx2;
    const TileKernels* neon = neon_kernels();
    if (neon != nullptr && kernel_level_allowed(KernelLevel::neon)) return *neon;
    return portable_kernels();
  }();
  return chosen;
}

const DecodeKernels* portable_decode_kernels(DType storage) {
  switch (storage) {
    case DType::f32: return portable_decode_set<Storage<DType::f32>>("portable");
    case DType::f16: return portable_decode_set<Storage<DType::f16>>("portable");
    case DType::bf16: return portable_decode_set<Storage<DType::bf16>>("portable");
    case DType::e4m3: return portable_decode_set<Storage<DType::e4m3>>("portable");
    default: return nullptr;
  }
}

const DecodeKernels& decode_kernels(DType storage, int d) {
  if (kernel_level_allowed(KernelLevel::avx512bf16)) {
    if (const DecodeKernels* set = avx512bf16_decode_kernels(storage, d)) return *set;
  }
  if (kernel_level_allowed(KernelLevel::avx512)) {
    if (const DecodeKernels* set = avx512_decode_kernels(storage, d)) return *set;
  }
  if (kernel_level_allowed(KernelLevel::avx2)) {
    if (const DecodeKernels* set = avx2_decode_kernels(storage, d)) return *set;
  }
  if (kernel_level_allowed(KernelLevel::neon)) {
    if (const DecodeKernels* set = neon_decode_kernels(storage, d)) return *set;
  }
  return *portable_decode_kernels(storage);
}

const Bf16Kernels* bf16_kernels() {
  static const Bf16Kernels* const chosen = [] {
    if (amx_kernels() != nullptr) return amx_kernels();
    const bool asked = kernel_override_from_env().cpu_kernels == CpuKernels::avx512bf16;
    return avx512bf16_products_pay() || asked ? avx512bf16_kernels() : nullptr;  // D-88
  }();
  return chosen;
}

}  // namespace cpu
}  // namespace flashattn
