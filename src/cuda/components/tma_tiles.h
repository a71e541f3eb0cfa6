// Tiles of Q, K and V loaded by the Tensor Memory Accelerator (TMA, sm_90).
//
// Each tensor gets one descriptor, built on the host over its (rows, d, heads, batch) view with
// the strides of AttnParams. A tile is one bulk tensor copy issued by one thread; it lands in
// the swizzled shared-memory layout that wgmma reads and completes on an mbarrier by its byte
// count. Rows and columns past the tensor's extent (the sequence's end, a head dim below the
// instance's) arrive as zeros, so no tile needs a bounds check of its own.
//
// Only tensors that meet the hardware's rules for a descriptor get here: api/kernel_choice.h
// tma_describable checks them, and the kernel choice sends other layouts to the gathering
// kernels.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

#include "common/params.h"

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

// The descriptors of one call: Q tiles of kBlockM rows, K and V tiles of kBlockN rows.
template <class Traits>
struct TmaQkv {
  TmaTileLoad<typename Traits::Element, typename Traits::SmemLayoutQ> q;
  TmaTileLoad<typename Traits::Element, typename Traits::SmemLayoutKV> k, v;
};

inline TmaGmemLayout tma_gmem_layout(int rows, int head_dim, int heads, int batch, int64_t row_stride,
                                     int64_t head_stride, int64_t batch_stride) {
  return make_layout(make_shape(int32_t(rows), int32_t(head_dim), int32_t(heads), int32_t(batch)),
                     make_stride(row_stride, _1{}, head_stride, batch_stride));
}

// Built on the host for a dense call (one K/V row range per batch entry, no page table); the
// caller has checked tma_describable.
template <class Traits>
TmaQkv<Traits> make_tma_qkv(const AttnParams& p) {
  using Element = typename Traits::Element;
  auto tile_load = [&](const void* base, int rows, int heads, int64_t row, int64_t head, int64_t batch,
                       auto smem_layout) {
    Tensor g = make_tensor(make_gmem_ptr(static_cast<const Element*>(base)),
                           tma_gmem_layout(rows, p.head_dim, heads, p.batch, row, head, batch));
    return make_tma_copy(SM90_TMA_LOAD{}, g, smem_layout,
                         make_shape(size<0>(smem_layout), size<1>(smem_layout)), _1{});
  };
  return TmaQkv<Traits>{
      tile_load(p.q, p.seqlen_q, p.num_heads, p.q_row_stride, p.q_head_stride, p.q_batch_stride,
                typename Traits::SmemLayoutQ{}),
      tile_load(p.k, p.seqlen_k, p.num_heads_k, p.k_row_stride, p.k_head_stride, p.k_batch_stride,
                typename Traits::SmemLayoutKV{}),
      tile_load(p.v, p.seqlen_k, p.num_heads_k, p.v_row_stride, p.v_head_stride, p.v_batch_stride,
                typename Traits::SmemLayoutKV{})};
}

// The TMA coordinate tensors of the three descriptors (device side), one (batch, head) slice.
template <class Tma>
__device__ __forceinline__ auto tma_rows(const Tma& tma, int rows, const AttnParams& p, int heads, int head,
                                         int b) {
  Tensor m = tma.get_tma_tensor(make_shape(int32_t(rows), int32_t(p.head_dim), int32_t(heads), int32_t(p.batch)));
  return m(_, _, head, b);  // (rows, d)
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
