// The K/V copies of the decode kernel's fp8 pipeline (DecodePipeline::fp8, docs/DECISIONS.md
// D-66): e4m3 K/V read at half the bytes of a 16-bit cache, two tiles in flight at 3 CTAs per SM.
//
// e4m3 tiles stream through Traits::kCopyStages stages in shared memory (kernel_traits.h
// Fp8Storage k_mirror/v_mirror), row-major (a key's row is kHeadDim bytes), each filled by
// 16-byte cp.async. Each warp copies only its own keys of every tile (the kKeysPerWarp rows the
// keys split gives it: warp_tile_math.h) and, once they landed, widens them into the one Element
// buffer its MMAs read: its K rows for S = Q K^T, then its V rows over them for P V. So a warp
// waits for its own copies only, and the mainloop needs no CTA barrier (splitkeys_kernel.h),
// only the warp's own.
//
// Lane l's copy i of a K or V tile is the warp's 16-byte piece l + 32 i in row-major order: row
// l / kPiecesPerRow + i * kRowStep of the warp's keys, columns 16 (l % kPiecesPerRow) on (whole
// rows per pass, as kPiecesPerRow divides 32: tuning.h fp8_warp_kv_head_dim).
#pragma once

#include <cfloat>
#include <cstdint>

#include <cuda_fp16.h>

#include <cute/tensor.hpp>

#include "cuda/components/async_copy.h"
#include "cuda/components/kv_pipeline.h"
#include "cuda/components/tile_loads.h"

namespace flashattn {
namespace cuda {
namespace fwd {

template <class Traits>
struct Fp8WarpKv : KvStages<Traits> {
  using Element = typename Traits::Element;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kPiecesPerRow = kHeadDim / 16;
  static constexpr int kRowStep = 32 / kPiecesPerRow;
  static constexpr int kCopies = Traits::kKeysPerWarp / kRowStep;  // per lane, per K or V tile
  static constexpr int kStages = Traits::kCopyStages;
  static_assert(Traits::kFp8Pipeline && Traits::kKvFp8 && !Traits::kWarpsSplitDims, "keys split, e4m3 K/V");
  static_assert(32 % kPiecesPerRow == 0 && Traits::kKeysPerWarp % kRowStep == 0, "whole rows per pass");
  static_assert(Traits::kElemsPerChunk == 8, "a 16-byte piece widens into two Element chunks");
  static_assert(Traits::kKvBuffers == 1 && Traits::kStages == 1, "one Element buffer, for K then V");
  using Rows = PageRows<kCopies>;

  int row0;  // this lane's first row within a tile
  int col;   // its pieces' first column

  // This lane's row i of a stage's mirror, at its column.
  __device__ __forceinline__ uint8_t* piece(uint8_t* mirror, int i) const {
    return mirror + (row0 + i * kRowStep) * kHeadDim + col;
  }

  // Paged K/V: the pages of this lane's rows of tile n.
  __device__ __forceinline__ Rows lookup(const AttnParams& p, const CtaInfo& c, const CtaKeyTiles& tiles, int n,
                                         int /*tid*/) const {
    if (n >= tiles.lo && reads_page_table<Traits>(p)) {
      return lookup_page_rows<kCopies, kRowStep>(p, c, n * Traits::kBlockN + row0, true);
    }
    return Rows{};
  }

  // This lane's K and V copies of tile n into its stage: always one commit group (empty for n
  // before the first tile).
  __device__ __forceinline__ void issue(const AttnParams& p, const CtaInfo& c, const CtaKeyTiles& tiles, int n,
                                        int /*tid*/, const Rows& rows) const {
    if (n >= tiles.lo) {
      copy_tile<false>(p, c, n, rows, this->k_mirror(stage_of(n)));
      copy_tile<true>(p, c, n, rows, this->v_mirror(stage_of(n)));
    }
    cp_async_commit();
  }

  // This lane's rows of K tile n (its copies landed: cp_async_wait), then of V tile n, widened
  // into the one Element buffer (V over K once S = Q K^T is done), each between two warp
  // barriers: the warp's MMAs are done with what the buffer held, and see all of what it holds.
  __device__ __forceinline__ void widen(int n, int /*tid*/) const { widen_rows(this->k_mirror(stage_of(n))); }
  __device__ __forceinline__ void widen_v(int n) const { widen_rows(this->v_mirror(stage_of(n))); }

 private:
  __device__ __forceinline__ static int stage_of(int n) { return int(unsigned(n) % kStages); }  // n >= 0

  __device__ __forceinline__ void widen_rows(uint8_t* mirror) const {
    auto tile = this->k_tile(0);  // (the V tile is the same buffer)
    __syncwarp();
    CUTE_UNROLL
    for (int i = 0; i < kCopies; ++i) {
      const int row = row0 + i * kRowStep;
      widen_piece(&tile(row, col), &tile(row, col + 8), piece(mirror, i));
    }
    __syncwarp();
  }

  __device__ __forceinline__ static void widen_piece(Element* lo, Element* hi, const uint8_t* bytes) {
    const uint4 b = *reinterpret_cast<const uint4*>(bytes);
    *reinterpret_cast<uint4*>(lo) = widen_e4m3x8<Element>(make_uint2(b.x, b.y));
    *reinterpret_cast<uint4*>(hi) = widen_e4m3x8<Element>(make_uint2(b.z, b.w));
  }

  // K (kIsV false) or V: rows past the keys and columns >= head_dim zero-filled.
  template <bool kIsV>
  __device__ __forceinline__ void copy_tile(const AttnParams& p, const CtaInfo& c, int n, const Rows& rows,
                                            uint8_t* mirror) const {
    const uint8_t* base = static_cast<const uint8_t*>(kIsV ? p.v : p.k);
    const int64_t row_stride = kIsV ? p.v_row_stride : p.k_row_stride;
    const int bytes = max(0, min(16, p.head_dim - col));  // head_dim: a multiple of 8
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(piece(mirror, 0)));
    constexpr uint32_t kDstStep = kRowStep * kHeadDim;
    if (!reads_page_table<Traits>(p)) {
      const int j0 = n * Traits::kBlockN + row0;  // this lane's first key
      const uint8_t* src = base + kv_row_offset(p, c.seq, c.b, j0, kIsV ? p.v_batch_stride : p.k_batch_stride,
                                                row_stride, kIsV ? p.v_head_stride : p.k_head_stride, c.hk) +
                           col;
      CUTE_UNROLL
      for (int i = 0; i < kCopies; ++i) {
        const bool valid = j0 + i * kRowStep < c.seq.seqlen_k;
        cp_async_16_bytes(dst + i * kDstStep, valid ? src + i * kRowStep * row_stride : base, valid ? bytes : 0);
      }
    } else {
      const int64_t page_stride = kIsV ? p.v_batch_stride : p.k_batch_stride;
      const uint8_t* head = base + c.hk * (kIsV ? p.v_head_stride : p.k_head_stride) + col;
      const unsigned usable = usable_page_rows(p, c, rows, /*record=*/!kIsV);
      CUTE_UNROLL
      for (int i = 0; i < kCopies; ++i) {
        const bool valid = usable >> i & 1u;
        const uint8_t* src = head + rows.page[i] * page_stride + rows.in_page[i] * row_stride;
        cp_async_16_bytes(dst + i * kDstStep, valid ? src : base, valid ? bytes : 0);
      }
    }
  }
};

// bf16 q over the fp8 pipeline's fp16 tiles (Traits::kQRescaled): an e4m3 value widens into
// fp16 in one instruction, into bf16 in four, and the widening was a third of the kernel's
// instructions (D-66). Q's bf16 rows landed in their fp16 tile as bits (tile_loads.h
// copy_chunk); each thread converts its own chunks in place, times 2^s: the power of two that
// takes the tile's largest finite |q| into [2^13, 2^14), so every value down to 2^-27 of it is
// exact in fp16 (11 significant bits hold bf16's 8) and none overflows; NaN stays NaN. Returns
// 2^s, for the scores' scale to divide out (ScoreScale::scale_q). max_bits: a shared word that
// was 0 before the CTA's last barrier. One barrier (the caller's next publishes the tile).
template <class Traits, class SmemTensor>
__device__ __forceinline__ float rescale_q_into_fp16(SmemTensor& sQ, int* max_bits, int tid) {
  auto part = copy_partition<Traits, Traits::kBlockM>(sQ, tid);
  auto& tXsX = get<0>(part);  // (CPY, CPY_M, CPY_K)
  const bool copies = tid < Traits::kGmemThreads;
  auto chunk_words = [&](int m, int k) { return reinterpret_cast<uint32_t*>(&tXsX(0, m, k)); };
  auto bf16_value = [](uint32_t word, int half) { return __uint_as_float(half ? word & 0xffff0000u : word << 16); };
  if (copies) {
    float local_max = 0.0f;
    CUTE_UNROLL
    for (int m = 0; m < size<1>(tXsX); ++m) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tXsX); ++k) {
        CUTE_UNROLL
        for (int e = 0; e < 8; ++e) {
          const float x = fabsf(bf16_value(chunk_words(m, k)[e / 2], e % 2));
          if (x <= FLT_MAX) local_max = fmaxf(local_max, x);  // finite only
        }
      }
    }
    atomicMax(max_bits, __float_as_int(local_max));  // non-negative floats order as their bits
  }
  __syncthreads();
  const float q_max = __int_as_float(*max_bits);
  const int shift = q_max > 0.0f ? max(-120, min(120, 13 - ilogbf(q_max))) : 0;
  const float factor = __int_as_float((127 + shift) << 23);  // 2^shift
  if (copies) {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(tXsX); ++m) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tXsX); ++k) {
        uint32_t* words = chunk_words(m, k);
        CUTE_UNROLL
        for (int w = 0; w < 4; ++w) {
          const uint32_t word = words[w];
          const __half2 h = __floats2half2_rn(bf16_value(word, 0) * factor, bf16_value(word, 1) * factor);
          words[w] = reinterpret_cast<const uint32_t&>(h);
        }
      }
    }
  }
  return factor;
}

// The decode kernel's K/V stages: the fp8 pipeline's (above), or the copies into every stage
// (kv_pipeline.h). Paged K/V is read without an offset table (PagedRows).
template <class Traits>
__device__ __forceinline__ auto make_decode_kv(typename Traits::Element* k, typename Traits::Element* v,
                                               char* smem, int warp, int lane) {
  if constexpr (Traits::kFp8Pipeline) {
    constexpr int kPiecesPerRow = Fp8WarpKv<Traits>::kPiecesPerRow;
    return Fp8WarpKv<Traits>{{k, v, nullptr, smem},
                             warp * Traits::kKeysPerWarp + lane / kPiecesPerRow,
                             16 * (lane % kPiecesPerRow)};
  } else {
    (void)warp, (void)lane;
    return KvStages<Traits>{k, v, nullptr, smem};
  }
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
