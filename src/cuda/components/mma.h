// The two products of a tile on the tensor cores: mma.sync (SM80) from shared memory or
// registers, and warpgroup MMAs (wgmma, sm_90a) issued as one group.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)

// acc += A(smem) * B(smem), ldmatrix of k-step i+1 overlapping the MMA of step i.
template <class Acc, class RA, class RB, class SA, class SB, class TiledMma, class CopyA,
          class CopyB, class ThrCopyA, class ThrCopyB>
__device__ __forceinline__ void gemm_ss(Acc& acc, RA& tCrA, RB& tCrB, const SA& tCsA,
                                        const SB& tCsB, TiledMma tiled_mma, CopyA copy_a,
                                        CopyB copy_b, ThrCopyA thr_copy_a, ThrCopyB thr_copy_b) {
  Tensor tCrA_view = thr_copy_a.retile_D(tCrA);
  Tensor tCrB_view = thr_copy_b.retile_D(tCrB);
  copy(copy_a, tCsA(_, _, _0{}), tCrA_view(_, _, _0{}));
  copy(copy_b, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k < size<2>(tCrA) - 1) {
      copy(copy_a, tCsA(_, _, k + 1), tCrA_view(_, _, k + 1));
      copy(copy_b, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
    }
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// acc += A(registers) * B(smem). (Prefetching the next k-step's B fragment, as gemm_ss does,
// measured the same at d = 128 and costs registers.)
template <class Acc, class RA, class RB, class SB, class TiledMma, class CopyB, class ThrCopyB>
__device__ __forceinline__ void gemm_rs(Acc& acc, const RA& tCrA, RB& tCrB, const SB& tCsB,
                                        TiledMma tiled_mma, CopyB copy_b, ThrCopyB thr_copy_b) {
  Tensor tCrB_view = thr_copy_b.retile_D(tCrB);
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    copy(copy_b, tCsB(_, _, k), tCrB_view(_, _, k));
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// Issues acc (+)= A B over all K steps on this warpgroup's tensor cores as one wgmma group,
// without waiting (warpgroup_wait<N> and warpgroup_fence_operand(acc) collect it).
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void wgmma_issue(TiledMma& tiled_mma, TA& tA, const TB& tB, TC& acc) {
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  tiled_mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tA); ++k) {
    cute::gemm(tiled_mma, tA(_, _, k), tB(_, _, k), acc);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
