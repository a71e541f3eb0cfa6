// Tiles of Q, K and V loaded by the Tensor Memory Accelerator (TMA, sm_90).
//
// Each tensor gets one descriptor, built on the host over its (rows, d, heads, batch) view with
// the strides of AttnParams (params.h TmaRows: per batch entry, or varlen's packed rows as one
// entry). A tile is one bulk tensor copy issued by one thread; it lands in the swizzled
// shared-memory layout that wgmma reads and completes on an mbarrier by its byte count. Rows and
// columns past the tensor's extent (a dense sequence's end, a head dim below the instance's)
// arrive as zeros. Packed rows past a sequence's end are the next sequence's (or, with
// seqused_k, unused rows): the kernel masks their scores and zeroes their V rows
// (zero_tile_rows).
//
// Only tensors that meet the hardware's rules for a descriptor get here: api/kernel_choice.h
// tma_describable checks them, and the kernel choice sends other layouts to the gathering
// kernels.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

#include "api/kernel_choice.h"
#include "common/params.h"
#include "cuda/components/cta_geometry.h"
#include "cuda/components/index_checks.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)

// (rows, d, heads, batch) with strides (row, 1, head, batch), in elements.
using TmaGmemLayout =
    Layout<Shape<int32_t, int32_t, int32_t, int32_t>, Stride<int64_t, _1, int64_t, int64_t>>;

// The descriptor type of a tile of SmemLayout (rows x d) loaded from a TmaGmemLayout tensor.
template <class Element, class SmemLayout>
using TmaTileLoad = decltype(make_tma_copy(
    SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)), TmaGmemLayout{}),
    SmemLayout{}, make_shape(size<0>(SmemLayout{}), size<1>(SmemLayout{})), _1{}));

// The descriptor type of a tile of SmemLayout stored to a TmaGmemLayout tensor.
template <class Element, class SmemLayout>
using TmaTileStore = decltype(make_tma_copy(
    SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), TmaGmemLayout{}), SmemLayout{},
    make_shape(size<0>(SmemLayout{}), size<1>(SmemLayout{})), _1{}));

// The rows a descriptor spans, as the kernel's coordinate tensors need them (params.h TmaRows).
struct TmaRowsExtent {
  int32_t rows, batches;
  bool packed;
};

inline TmaRowsExtent tma_rows_extent(const TmaRows& r) {
  return TmaRowsExtent{int32_t(r.rows), int32_t(r.batches), r.packed};
}

// Paged K/V: the first kTmaPageSlabRows rows of a K/V tile (params.h), in the tile's own layout
// (each 128-byte column block of a tile is a run of rows, so a slab is one box per column
// block); slab i of a tile is this layout at row kTmaPageSlabRows * i.
template <class Traits>
using SmemLayoutKVSlab = decltype(composition(
    typename Traits::SmemLayoutKV{},
    Layout<Shape<Int<kTmaPageSlabRows>, Int<Traits::kHeadDim>>, Stride<_1, Int<Traits::kBlockN>>>{}));

// One consumer warpgroup's rows of the staged O tile (kBlockM / 2 rows of Traits::SmemLayoutO),
// as the TMA store reads them; the second half starts at row kBlockM / 2.
template <class Traits>
using SmemLayoutOHalf = decltype(composition(
    typename Traits::SmemLayoutO{},
    Layout<Shape<Int<Traits::kBlockM / 2>, Int<Traits::kHeadDim>>, Stride<_1, Int<Traits::kBlockM>>>{}));

// The descriptors of one call: Q tiles of kBlockM rows, K and V tiles of kBlockN rows (of a
// page's rows, with paged K/V), or with pages that do not hold whole tiles K and V slabs instead
// (the unused pair is left unset); O in halves of a tile where api/kernel_choice.h tma_stores_o
// (o_by_tma; else unset, and the kernel stores O's rows itself).
template <class Traits>
struct TmaQkv {
  TmaTileLoad<typename Traits::Element, typename Traits::SmemLayoutQ> q;
  TmaTileLoad<typename Traits::Element, typename Traits::SmemLayoutKV> k, v;
  TmaTileLoad<typename Traits::Element, SmemLayoutKVSlab<Traits>> k_slabs, v_slabs;
  TmaTileStore<typename Traits::OutElement, SmemLayoutOHalf<Traits>> o;
  TmaRowsExtent q_rows, kv_rows;
  bool o_by_tma;
};

inline TmaGmemLayout tma_gmem_layout(int rows, int head_dim, int heads, int batch, int64_t row_stride,
                                     int64_t head_stride, int64_t batch_stride) {
  return make_layout(make_shape(int32_t(rows), int32_t(head_dim), int32_t(heads), int32_t(batch)),
                     make_stride(row_stride, _1{}, head_stride, batch_stride));
}

// Paged K/V: whether a page holds whole key tiles, each then loaded as a contiguous tile is (the
// tile descriptors spanning a page's rows), else in slabs (tma_load_page_slab).
template <class Traits>
__host__ __device__ __forceinline__ bool pages_hold_whole_tiles(const AttnParams& p) {
  return p.page_size % Traits::kBlockN == 0;
}

// Built on the host for a dense, varlen or KV-cache call; the caller has checked tma_describable.
template <class Traits>
TmaQkv<Traits> make_tma_qkv(const AttnParams& p) {
  using Element = typename Traits::Element;
  auto tile_load = [&](const void* base, const TmaRows& rows, int heads, int64_t row, int64_t head, auto smem_layout) {
    Tensor g = make_tensor(make_gmem_ptr(static_cast<const Element*>(base)),
                           tma_gmem_layout(int(rows.rows), p.head_dim, heads, int(rows.batches), row, head,
                                           rows.batch_stride));
    return make_tma_copy(SM90_TMA_LOAD{}, g, smem_layout,
                         make_shape(size<0>(smem_layout), size<1>(smem_layout)), _1{});
  };
  const TmaRows q_rows = tma_q_rows(p);
  const TmaRows k_rows = tma_kv_rows(p, p.k_batch_stride, p.k_row_stride);
  const TmaRows v_rows = tma_kv_rows(p, p.v_batch_stride, p.v_row_stride);
  TmaQkv<Traits> tma{};
  tma.q = tile_load(p.q, q_rows, p.num_heads, p.q_row_stride, p.q_head_stride, typename Traits::SmemLayoutQ{});
  if (p.block_table != nullptr && !pages_hold_whole_tiles<Traits>(p)) {
    tma.k_slabs = tile_load(p.k, k_rows, p.num_heads_k, p.k_row_stride, p.k_head_stride, SmemLayoutKVSlab<Traits>{});
    tma.v_slabs = tile_load(p.v, v_rows, p.num_heads_k, p.v_row_stride, p.v_head_stride, SmemLayoutKVSlab<Traits>{});
  } else {
    tma.k = tile_load(p.k, k_rows, p.num_heads_k, p.k_row_stride, p.k_head_stride, typename Traits::SmemLayoutKV{});
    tma.v = tile_load(p.v, v_rows, p.num_heads_k, p.v_row_stride, p.v_head_stride, typename Traits::SmemLayoutKV{});
  }
  tma.q_rows = tma_rows_extent(q_rows);
  tma.kv_rows = tma_rows_extent(k_rows);
  tma.o_by_tma = tma_stores_o(p);
  if (tma.o_by_tma) {
    Tensor o = make_tensor(make_gmem_ptr(static_cast<typename Traits::OutElement*>(p.o)),
                           tma_gmem_layout(p.seqlen_q, p.head_dim, p.num_heads, p.batch, p.o_row_stride,
                                           p.o_head_stride, p.o_batch_stride));
    using Half = SmemLayoutOHalf<Traits>;
    tma.o = make_tma_copy(SM90_TMA_STORE{}, o, Half{}, make_shape(size<0>(Half{}), size<1>(Half{})), _1{});
  }
  return tma;
}

// The TMA coordinate tensor of one (batch entry, head) of a descriptor spanning `extent`, its
// row 0 at row first_row of the entry (a packed sequence's offset; 0 for a dense one): (rows, d).
template <class Tma>
__device__ __forceinline__ auto tma_rows(const Tma& tma, const TmaRowsExtent& extent, const AttnParams& p,
                                         int heads, int head, int b, int first_row) {
  Tensor m = tma.get_tma_tensor(make_shape(extent.rows, int32_t(p.head_dim), int32_t(heads), extent.batches));
  return domain_offset(make_coord(first_row, _0{}), m(_, _, head, extent.packed ? 0 : b));
}

// Packed rows past a sequence's last key (varlen: the next sequence's keys; with seqused_k or a
// cache, rows it does not use; paged, the rest of its last page) can hold any value, NaN too;
// their scores are masked, but a V row enters P V as 0 x value, so a partial last key tile has
// its V rows zeroed (zero_tile_rows) first. Dense sequences end at their descriptor's extent,
// past which TMA writes zeros.
__device__ __forceinline__ bool keys_end_before_their_rows(const AttnParams& p) {
  return p.cu_seqlens_k != nullptr || p.seqused_k != nullptr || p.block_table != nullptr;
}

// The shared-memory tile layouts keep each 16-byte unit of a row contiguous (a few points of
// each unit, at compile time): zero_tile_rows stores whole units.
template <class Element, class SmemLayout>
constexpr bool row_units_contiguous() {
  constexpr int kUnit = 16 / int(sizeof(Element));
  constexpr int kRows = int(size<0>(SmemLayout{})), kCols = int(size<1>(SmemLayout{}));
  SmemLayout s{};
  for (int r : {0, 1, 7, kRows - 1}) {
    for (int c = 0; c < kCols; c += kUnit) {
      if (int(s(r, c + kUnit - 1)) != int(s(r, c)) + kUnit - 1 || int(s(r, c)) % kUnit != 0) return false;
    }
  }
  return true;
}

// Zeroes rows [first_row, rows) of shared-memory tile s (rows x cols) in 16-byte stores, thread
// `thread` of `threads`; the layout passes row_units_contiguous.
template <class STile>
__device__ __forceinline__ void zero_tile_rows(STile&& s, int first_row, int thread, int threads) {
  using Element = typename std::decay_t<STile>::value_type;
  constexpr int kUnit = 16 / int(sizeof(Element));
  constexpr int kRows = decltype(size<0>(s))::value;
  constexpr int kUnits = decltype(size<1>(s))::value / kUnit;
  for (int u = first_row * kUnits + thread; u < kRows * kUnits; u += threads) {
    const int r = u / kUnits, c = (u - r * kUnits) * kUnit;
    *reinterpret_cast<uint4*>(&s(r, c)) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// Paged K/V: where a page holds whole key tiles (pages_hold_whole_tiles), a tile loads as one box
// per column block from its page, as a contiguous tile does; otherwise as kBlockN /
// kTmaPageSlabRows slabs, slab i by lane i of the producer warp, each from the page that
// block_table names for its keys (rules.h kv_page). Either way the stage's barrier expects the
// whole tile's bytes.
template <class Traits>
constexpr int kPageSlabsPerTile = Traits::kBlockN / kTmaPageSlabRows;

// The block_table entry of slab `slab` of key tile n of sequence c (slab 0: the tile's page where
// pages hold whole tiles), as read, unchecked; num_pages for a slab past the sequence's keys (or
// past the tile). Read a key tile ahead of its loads (its latency off the producer's path), then
// checked by checked_slab_page.
template <class Traits>
__device__ __forceinline__ int slab_table_entry(const AttnParams& p, const CtaInfo& c, int n, int slab) {
  const int key = n * Traits::kBlockN + slab * kTmaPageSlabRows;
  if (slab >= kPageSlabsPerTile<Traits> || key >= c.seq.seqlen_k) return p.num_pages;
  return kv_page(p, c.seq, c.b, key);
}

// The page to load a slab from: its entry, or num_pages (past the descriptor's extent: TMA writes
// zeros, and their bytes still count) for an entry that names no page of the cache, the fault
// recorded (index_checks.h checked_page).
__device__ __forceinline__ int checked_slab_page(const AttnParams& p, const CtaInfo& c, int entry) {
  return entry == p.num_pages || checked_page(p, c.b, entry) ? entry : p.num_pages;
}

// Loads slab `slab` of key tile n (of KV head hk) from `page` into its rows of `stage`, completing
// on barrier.
template <class Traits, class Tma, class Element>
__device__ __forceinline__ void tma_load_page_slab(const Tma& tma, const TmaRowsExtent& extent, uint64_t& barrier,
                                                   const AttnParams& p, int hk, int n, int slab, int page,
                                                   Element* stage) {
  const int row_in_page = (n * Traits::kBlockN + slab * kTmaPageSlabRows) % p.page_size;  // no left pad
  Tensor m = tma.get_tma_tensor(make_shape(extent.rows, int32_t(p.head_dim), int32_t(p.num_heads_k), extent.batches));
  Tensor g = local_tile(m(_, _, hk, page), make_shape(Int<kTmaPageSlabRows>{}, Int<Traits::kHeadDim>{}),
                        make_coord(row_in_page / kTmaPageSlabRows, _0{}));
  // slab `slab` of the stage: its first row's offset, whole 1 KB swizzle periods on
  const int offset = typename Traits::SmemLayoutKV{}.layout_b()(slab * kTmaPageSlabRows, 0);
  Tensor s = make_tensor(make_smem_ptr(stage + offset), SmemLayoutKVSlab<Traits>{});
  auto cta = tma.get_slice(_0{});
  copy(tma.with(barrier), cta.partition_S(g), cta.partition_D(s));
}

// Stores half `half` (the rows of consumer warpgroup `half`) of the O tile staged at staged_o
// (Traits::SmemLayoutO) to query tile m_block of (batch b, head) through tma.o, and commits it
// as a bulk group (cute::tma_store_wait reads its completion). One thread issues it; rows and
// columns past O's extent are not written.
template <class Traits, class Tma, class Element>
__device__ __forceinline__ void tma_store_o_half(const Tma& tma, const AttnParams& p, int b, int head, int m_block,
                                                 int half, Element* staged_o) {
  constexpr int kHalfRows = Traits::kBlockM / 2;
  Tensor m = tma.get_tma_tensor(
      make_shape(int32_t(p.seqlen_q), int32_t(p.head_dim), int32_t(p.num_heads), int32_t(p.batch)));
  Tensor g = local_tile(m(_, _, head, b), make_shape(Int<kHalfRows>{}, Int<Traits::kHeadDim>{}),
                        make_coord(m_block * 2 + half, _0{}));
  // the half's first row: whole 1 KB swizzle periods from the tile's start
  const int offset = typename Traits::SmemLayoutO{}.layout_b()(half * kHalfRows, 0);
  Tensor s = make_tensor(make_smem_ptr(staged_o + offset), SmemLayoutOHalf<Traits>{});
  auto cta = tma.get_slice(_0{});
  copy(tma, cta.partition_S(s), cta.partition_D(g));
  tma_store_arrive();
}

// Loads tile `tile` (of the tile shape of sTile) of the (rows, d) coordinate tensor gRows into
// sTile, completing on barrier. One thread issues it.
template <class Tma, class GRows, class STile>
__device__ __forceinline__ void tma_load_tile(const Tma& tma, uint64_t& barrier, const GRows& gRows, int tile,
                                              STile&& sTile) {
  Tensor g = local_tile(gRows, make_shape(size<0>(sTile), size<1>(sTile)), make_coord(tile, _0{}));
  auto cta = tma.get_slice(_0{});
  copy(tma.with(barrier), cta.partition_S(g), cta.partition_D(sTile));
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
