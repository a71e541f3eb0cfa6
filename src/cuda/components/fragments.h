// Register fragments: accumulator layouts viewed as (rows, columns) or as the A operand of the
// next product (mma.sync and wgmma), element conversion, and reductions over a row's quad.
#pragma once

#include <cute/tensor.hpp>

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)

// Accumulator layout ((2,2), MMA_M, MMA_N) viewed as (rows = (2, MMA_M), cols = (2, MMA_N)).
template <class Layout>
__device__ __forceinline__ auto acc_to_rowcol(Layout acc) {
  auto l = logical_divide(acc, Shape<_2>{});  // ((2, 2), MMA_M, MMA_N)
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

// Accumulator layout ((2,2), MMA_M, MMA_N) viewed as the A operand of an m16n8k16 MMA:
// ((2,2,2), MMA_M, MMA_N / 2) — two adjacent n8 C tiles form one k16 A tile.
template <class Layout>
__device__ __forceinline__ auto acc_to_a_operand(Layout acc) {
  auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});  // ((2,2), MMA_M, (2, MMA_N/2))
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

template <typename To, class Engine, class Layout>
__device__ __forceinline__ auto convert_fragment(const Tensor<Engine, Layout>& src) {
  Tensor dst = make_tensor<To>(src.layout());
  CUTE_UNROLL
  for (int e = 0; e < size(src); ++e) dst(e) = static_cast<To>(src(e));
  return dst;
}

template <class T>
__device__ __forceinline__ T quad_allreduce_max(T x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
template <class T>
__device__ __forceinline__ T quad_allreduce_sum(T x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// wgmma accumulator ((2, 2, N/8), MMA_M, MMA_N) — (column pair, row + 8, 8-column block) —
// viewed as (rows = (2, MMA_M), cols = (2, N/8, MMA_N)).
template <class Layout>
__device__ __forceinline__ auto gmma_acc_to_rowcol(Layout acc) {
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

// The same accumulator as the register A operand of a 64xNx16 wgmma: ((2, 2, 2), MMA_M, N/16),
// two adjacent 8-column blocks forming one 16-wide K step.
template <class Layout>
__device__ __forceinline__ auto gmma_acc_to_a_operand(Layout acc) {
  auto l = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});  // (2, 2, (2, N/16))
  return make_layout(make_layout(get<0>(l), get<1>(l), get<2, 0>(l)), get<1>(acc),
                     coalesce(make_layout(get<2, 1>(l), get<2>(acc))));
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
