// The online-softmax step of a tile on the rows a thread holds (common/softmax_state.h is the
// state and its rules; this applies them to register fragments).
#pragma once

#include <cute/tensor.hpp>

#include "common/softmax_state.h"
#include "cuda/components/fragments.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)

// The softmax half of an online-softmax step: fold the scores s (rows, cols) into the running
// state of each row and turn s into P = exp2(x * scale_log2 - max'); correction[i] is the
// factor row i of O must be scaled by (rescale_rows) before P V is added. A row's sum stays
// thread-local (reduced across the quad at the end).
template <class S>
__device__ __forceinline__ void softmax_update(S& s, SoftmaxRowState* rows, float scale_log2, float* correction) {
  constexpr int kRows = decltype(size<0>(s))::value;
  constexpr int kCols = decltype(size<1>(s))::value;
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    float m = rows[i].max;
    CUTE_UNROLL
    for (int jj = 0; jj < kCols; ++jj) m = fmaxf(m, s(i, jj));
    m = quad_allreduce_max(m);
    correction[i] = rows[i].raise_max(m, scale_log2);
    const float m_scaled = rows[i].exp2_offset(scale_log2);
    float sum = 0.0f;
    CUTE_UNROLL
    for (int jj = 0; jj < kCols; ++jj) {
      s(i, jj) = exp2f(s(i, jj) * scale_log2 - m_scaled);
      sum += s(i, jj);
    }
    rows[i].sum += sum;
  }
}

template <class O>
__device__ __forceinline__ void rescale_rows(O& o_rc, const float* correction) {
  constexpr int kRows = decltype(size<0>(o_rc))::value;
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    CUTE_UNROLL
    for (int d = 0; d < size<1>(o_rc); ++d) o_rc(i, d) *= correction[i];
  }
}

// Whether any row of the warp must rescale O: some correction is not exactly 1 (a row max
// rose). Skipping the rescale otherwise is exact (x * 1.0f == x) and, after a walk's first tiles,
// the usual case: a row max rises at its n-th tile with probability about 1/n. A whole warp
// calls it uniformly.
template <int kRows>
__device__ __forceinline__ bool rows_need_rescale(const float* correction) {
  bool rescale = false;
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) rescale |= correction[i] != 1.0f;
  return __any_sync(0xffffffffu, rescale);
}

// rescale_rows where rows_need_rescale.
template <class O>
__device__ __forceinline__ void rescale_rows_unless_unit(O& o_rc, const float* correction) {
  if (rows_need_rescale<decltype(size<0>(o_rc))::value>(correction)) rescale_rows(o_rc, correction);
}

// One online-softmax step: softmax_update, then rescale the rows of O (o_rc: rows, d);
// kSkipUnitRescale: through rescale_rows_unless_unit (splitkeys_kernel.h).
template <bool kSkipUnitRescale = false, class S, class O>
__device__ __forceinline__ void online_softmax_step(S& s, O& o_rc, SoftmaxRowState* rows, float scale_log2) {
  constexpr int kRows = decltype(size<0>(s))::value;
  float correction[kRows];
  softmax_update(s, rows, scale_log2, correction);
  if constexpr (kSkipUnitRescale) {
    rescale_rows_unless_unit(o_rc, correction);
  } else {
    rescale_rows(o_rc, correction);
  }
}

// Every row starts with no key seen.
template <int kRows>
__device__ __forceinline__ void start_softmax_rows(SoftmaxRowState (&rows)[kRows]) {
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) rows[i] = SoftmaxRowState::empty();
}

// Row i's state over the whole quad of threads that hold its columns (each thread's sum covers
// its own columns; the max is already the quad's).
__device__ __forceinline__ SoftmaxRowState quad_row_state(const SoftmaxRowState& row) {
  return SoftmaxRowState{row.max, quad_allreduce_sum(row.sum)};
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
