// Multi-stage K/V buffers in shared memory (key tile n in stage n % kStages) and the copies
// that fill them: through the tile loads (any layout), or precomputed per thread for contiguous
// K/V (the wgmma kernel).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/components/tile_loads.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)

// ---- multi-stage K/V buffers (splitkeys_kernel.h, wgmma_kernel.h) -------------------------
//
// Traits::kStages K buffers, Traits::kStages V buffers and, for paged K/V in wgmma_kernel.h,
// one row-offset table per stage in shared memory; key tile n lives in stage n % kStages.
template <class Traits>
struct KvStages {
  using Element = typename Traits::Element;
  static constexpr int kElems = int(cute::cosize_v<typename Traits::SmemLayoutKV>);
  Element* k;              // [kStages] K tiles
  Element* v;              // [kStages] V tiles
  KvRowOffsets* tables;    // [kStages][kBlockN] (paged K/V through issue(n) only)
  // FP8 K/V (Traits::kKvFp8): the tiles' e4m3 mirrors, K stage s and V stage s at
  // Traits::k_mirror(smem, s) and v_mirror(smem, s); null otherwise.
  char* fp8_smem = nullptr;

  __device__ __forceinline__ uint8_t* k_mirror(int stage) const {
    if constexpr (Traits::kKvFp8) return Traits::k_mirror(fp8_smem, stage);
    return nullptr;
  }
  __device__ __forceinline__ uint8_t* v_mirror(int stage) const {
    if constexpr (Traits::kKvFp8) return Traits::v_mirror(fp8_smem, stage);
    return nullptr;
  }
  // FP8: this thread's chunks of tile n, widened once its copies landed (convert_tile).
  __device__ __forceinline__ void widen(int n, int tid) const {
    if constexpr (Traits::kKvFp8) {
      const int stage = int(unsigned(n) % Traits::kStages);
      auto k_stage = k_tile(stage);
      auto v_stage = v_tile(stage);
      convert_tile<Traits, Traits::kBlockN>(k_stage, k_mirror(stage), tid);
      convert_tile<Traits, Traits::kBlockN>(v_stage, v_mirror(stage), tid);
    }
  }

  __device__ __forceinline__ auto k_tile(int stage) const {
    return make_tensor(make_smem_ptr(k + stage * kElems), typename Traits::SmemLayoutKV{});
  }
  __device__ __forceinline__ auto v_tile(int stage) const {
    return make_tensor(make_smem_ptr(v + stage * kElems), typename Traits::SmemLayoutKV{});
  }
  // V of a stage seen as (d, n), the B operand of P V.
  __device__ __forceinline__ auto vt_tile(int stage) const {
    return make_tensor(make_smem_ptr(v + stage * kElems), typename Traits::SmemLayoutVt{});
  }
  __device__ __forceinline__ KvRowOffsets* table(int n) const {
    return tables + (unsigned(n) % Traits::kStages) * Traits::kBlockN;  // n >= 0
  }
  // The K and V copies of tile n into its stage: always one commit group (possibly empty, for
  // n before the first tile), so that wait_group counts stay in step near the end of the walk.
  __device__ __forceinline__ void issue(const AttnParams& p, const CtaInfo& c,
                                        const CtaKeyTiles& tiles, int n, int tid) const {
    if (n >= tiles.lo) {
      const int stage = int(unsigned(n) % Traits::kStages);
      auto k_stage = k_tile(stage);
      auto v_stage = v_tile(stage);
      load_kv<Traits, false>(p, c, table(n), n, k_stage, tid, k_mirror(stage));
      load_kv<Traits, true>(p, c, table(n), n, v_stage, tid, v_mirror(stage));
    }
    cp_async_commit();
  }
  // Paged K/V: the row offsets of tile n into its table, read by issue() after a barrier.
  __device__ __forceinline__ void prepare(const AttnParams& p, const CtaInfo& c,
                                          const CtaKeyTiles& tiles, int n, int tid) const {
    if (n >= tiles.lo && reads_page_table<Traits>(p)) compute_kv_offsets<Traits>(p, c, n, table(n), tid);
  }
  // issue() without the offset table (splitkeys_kernel.h, tables unset): paged K/V from the
  // pages lookup(n) read. Both always run, as one commit group per tile.
  __device__ __forceinline__ PagedRows<Traits> lookup(const AttnParams& p, const CtaInfo& c,
                                                      const CtaKeyTiles& tiles, int n, int tid) const {
    if (n >= tiles.lo && reads_page_table<Traits>(p)) return lookup_paged_rows<Traits>(p, c, n, tid);
    return PagedRows<Traits>{};
  }
  __device__ __forceinline__ void issue(const AttnParams& p, const CtaInfo& c, const CtaKeyTiles& tiles,
                                        int n, int tid, const PagedRows<Traits>& rows) const {
    if (n >= tiles.lo && reads_page_table<Traits>(p)) {
      const int stage = int(unsigned(n) % Traits::kStages);
      auto k_stage = k_tile(stage);
      auto v_stage = v_tile(stage);
      load_paged_rows<Traits, false>(p, c, rows, k_stage, tid, k_mirror(stage));
      load_paged_rows<Traits, true>(p, c, rows, v_stage, tid, v_mirror(stage));
      cp_async_commit();
    } else {
      issue(p, c, tiles, n, tid);
    }
  }
};

// This thread's copies of contiguous K/V tiles, with everything but the tile's key offset
// worked out once per CTA. A tile's rows are kv_row_offset(j0) + r * row_stride (rules.h), so
// a thread's source is its key-0 address plus j0 * row_stride. Its destinations are the
// swizzled shared address of its first chunk plus compile-time offsets: the copy partition
// steps by kGmemRowsPerPass rows (a multiple of the swizzle's 8-row period) and by 64 columns
// (whole 128-byte atoms), so each step adds a multiple of 1024 bytes to the unswizzled offset,
// which the swizzle (on address bits 4-9) leaves alone. Through KvStages::issue
// (load_strided_rows) a d = 64 tile cost ~75 instructions per K or V tile and thread, most of
// them 64-bit generic-address and swizzle arithmetic redone per tile (SASS, docs/DECISIONS.md D-7).
// The decode kernels keep KvStages::issue: no gain there (docs/DECISIONS.md D-8).
template <class Traits>
struct ContiguousKvCopies {
  using Element = typename Traits::Element;
  static constexpr int kRowStep = Traits::kGmemRowsPerPass;
  static constexpr int kCopyRows = Traits::kBlockN / kRowStep;
  static constexpr int kCopyCols = Traits::kHeadDim / 64;
  static constexpr int kStageBytes = Traits::kKVElems * int(sizeof(Element));
  static_assert(kRowStep % 8 == 0 && Traits::kBlockKSmem == 64 && Traits::kGmemThreads == Traits::kNThreads,
                "partition steps are whole swizzle periods; every thread copies");
  // A K/V stage's layout as a tensor over a shared pointer holds the unswizzled offsets (a
  // GMMA layout's swizzle moves into the pointer).
  using PlainLayoutKV = decltype(make_tensor(make_smem_ptr(static_cast<Element*>(nullptr)),
                                             typename Traits::SmemLayoutKV{}).layout());

  uint32_t k_dst = 0;           // shared address of this thread's first chunk in K stage 0
  const Element* k0 = nullptr;  // its first chunk's source at key 0
  const Element* v0 = nullptr;
  int row = 0, col = 0;         // its first chunk's row within a tile, and column

  // The unswizzled element offset of copy (m, kk) from the thread's first chunk.
  __device__ __forceinline__ static int step_elems(int m, int kk) {
    return int(PlainLayoutKV{}(m * kRowStep, kk * 64));
  }

  __device__ __forceinline__ ContiguousKvCopies(const AttnParams& p, const CtaInfo& c, Element* smem_k, int tid) {
    if (reads_page_table<Traits>(p)) return;
    auto sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});
    auto part = copy_partition<Traits, Traits::kBlockN>(sK, tid);
    row = get<0>(get<1>(part)(0, 0, 0));
    col = get<1>(get<1>(part)(0, 0, 0));
    k_dst = static_cast<uint32_t>(__cvta_generic_to_shared(&get<0>(part)(0, 0, 0)));
    const int64_t k_key0 = kv_row_offset(p, c.seq, c.b, 0, p.k_batch_stride, p.k_row_stride, p.k_head_stride, c.hk);
    const int64_t v_key0 = kv_row_offset(p, c.seq, c.b, 0, p.v_batch_stride, p.v_row_stride, p.v_head_stride, c.hk);
    k0 = static_cast<const Element*>(p.k) + k_key0 + row * p.k_row_stride + col;
    v0 = static_cast<const Element*>(p.v) + v_key0 + row * p.v_row_stride + col;
  }

  // K and V of tile n into stage n % kStages, one commit group (possibly empty), as KvStages::issue.
  __device__ __forceinline__ void issue(const AttnParams& p, const CtaInfo& c, const CtaKeyTiles& tiles,
                                        int n) const {
    if (n >= tiles.lo) {
      const int j0 = n * Traits::kBlockN;
      const int rows_valid = c.seq.seqlen_k - j0;
      const uint32_t k_stage = k_dst + (unsigned(n) % Traits::kStages) * kStageBytes;
      const uint32_t v_stage = k_stage + Traits::kStages * kStageBytes;  // V's stages follow K's
      const Element* k = k0 + j0 * p.k_row_stride;
      const Element* v = v0 + j0 * p.v_row_stride;
      CUTE_UNROLL
      for (int m = 0; m < kCopyRows; ++m) {
        const bool row_ok = row + m * kRowStep < rows_valid;
        CUTE_UNROLL
        for (int kk = 0; kk < kCopyCols; ++kk) {
          const bool valid = row_ok && col + kk * 64 < p.head_dim;
          const uint32_t delta = uint32_t(step_elems(m, kk)) * uint32_t(sizeof(Element));
          // An invalid copy reads no byte (src-size 0), so its source address is never used.
          cp_async_16_to(k_stage + delta, k + m * kRowStep * p.k_row_stride + kk * 64, valid);
          cp_async_16_to(v_stage + delta, v + m * kRowStep * p.v_row_stride + kk * 64, valid);
        }
      }
    }
    cp_async_commit();
  }
};

// The next index of a ring of kSlots.
template <int kSlots>
__device__ __forceinline__ int ring_next(int slot) {
  return slot + 1 == kSlots ? 0 : slot + 1;
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
