// The split-KV merge inside a thread-block cluster (sm_90): the splits of a unit read each
// other's partials through distributed shared memory.
#pragma once

#include <cooperative_groups.h>
#include <cutlass/array.h>
#include <cute/tensor.hpp>

#include "common/rules.h"
#include "common/softmax_state.h"
#include "cuda/components/epilogue.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)

// The split-KV combine inside a thread-block cluster (sm_90; AttnParams::cluster_combine): the
// num_splits CTAs of a unit are one cluster along grid y (launch_tile_grid), each holding its split's
// SplitPartial. After a cluster barrier each CTA merges a share of the rows' 8-column chunks,
// reading every split's partial through distributed shared memory, by the rule of combine.cu:
//   lse = log sum_s exp(lse_s),   o = sum_s exp(lse_s - lse) o_s   (splits with lse_s = -inf skipped;
// a row whose splits are all empty gets o = 0 and lse = -inf).
// A second barrier, arrived at once the reads are done and waited on at the end, keeps every
// CTA's shared memory alive until the others have read it, off the merge's path. So a
// split decode call writes no fp32 partials to global memory and needs no combine grid.
template <class Traits>
__device__ __forceinline__ void combine_in_cluster(const AttnParams& p, const CtaInfo& c, const SplitPartial& mine,
                                                   const int64_t* o_off, int tid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Element = typename Traits::OutElement;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kRowFloats = Traits::kMergeRowFloats;
  constexpr int kChunksPerRow = Traits::kHeadDim / 8;
  // A thread's tasks (row, 8-column chunk) are idx, idx + splits x threads, ...: at most
  // kMaxTasks with the two splits a cluster has at least (kernel_choice.cpp: cluster_combine).
  constexpr int kTasks = kBlockM * kChunksPerRow;
  constexpr int kMaxTasks = (kTasks + 2 * Traits::kNThreads - 1) / (2 * Traits::kNThreads);
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();  // every split's partial is in its CTA's shared memory
  const int splits = int(cluster.num_blocks());
  const int first_task = int(cluster.block_rank()) * Traits::kNThreads + tid;
  auto task_of = [&](int t, int& r, int& col) {
    const int idx = first_task + t * splits * Traits::kNThreads;
    r = idx / kChunksPerRow;
    col = (idx % kChunksPerRow) * 8;
    return idx < kTasks && c.m0 + r < c.rows && col < p.head_dim;
  };
  // Every task's split LSEs and O chunks in one round of remote loads (an empty split's chunk is
  // read too and then skipped) ...
  float lse_s[kMaxTasks][kMaxClusterSplits];
  float4 lo_s[kMaxTasks][kMaxClusterSplits], hi_s[kMaxTasks][kMaxClusterSplits];
  CUTE_UNROLL
  for (int t = 0; t < kMaxTasks; ++t) {
    int r, col;
    const bool valid = task_of(t, r, col);
    CUTE_UNROLL
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      lse_s[t][s] = -INFINITY;
      lo_s[t][s] = hi_s[t][s] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (valid && s < splits) {
        lse_s[t][s] = cluster.map_shared_rank(mine.lse, s)[r];
        const float* src = cluster.map_shared_rank(mine.o, s) + r * kRowFloats + col;
        lo_s[t][s] = *reinterpret_cast<const float4*>(src);
        hi_s[t][s] = *reinterpret_cast<const float4*>(src + 4);
      }
    }
  }
  // ... then this thread is done with the other CTAs' shared memory (the arrive releases its
  // reads): they may leave once every thread has arrived, while this one weighs and stores.
  auto reads_done = cluster.barrier_arrive();
  CUTE_UNROLL
  for (int t = 0; t < kMaxTasks; ++t) {
    int r, col;
    if (!task_of(t, r, col)) continue;
    const SoftmaxRowState merged =
        merge_states<kMaxClusterSplits>([&](int s) { return state_of_lse(lse_s[t][s]); }, kLog2eSoftmax);
    const float lse = merged.finish(1.0f).lse;
    float acc[8];
    CUTE_UNROLL
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
    CUTE_UNROLL
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (lse_s[t][s] == -INFINITY || lse == -INFINITY) continue;  // an empty split (also s >= splits), or row
      const float w = split_weight(lse_s[t][s], lse);
      const float4 lo = lo_s[t][s], hi = hi_s[t][s];
      acc[0] += w * lo.x, acc[1] += w * lo.y, acc[2] += w * lo.z, acc[3] += w * lo.w;
      acc[4] += w * hi.x, acc[5] += w * hi.y, acc[6] += w * hi.z, acc[7] += w * hi.w;
    }
    cutlass::Array<Element, 8> out;
    CUTE_UNROLL
    for (int e = 0; e < 8; ++e) out[e] = static_cast<Element>(acc[e]);
    *reinterpret_cast<cutlass::Array<Element, 8>*>(static_cast<Element*>(p.o) + o_off[r] + col) = out;
    if (col == 0 && p.lse != nullptr) {
      const PackedRow pr = tile_row_query(p, c, c.m0 + r);
      p.lse[lse_offset(p, c.seq, c.b, pr.query, pr.head)] = lse;
    }
  }
  cluster.barrier_wait(std::move(reads_done));  // no CTA leaves while another still reads its shared memory
#else
  (void)p, (void)c, (void)mine, (void)o_off, (void)tid;
#endif
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
