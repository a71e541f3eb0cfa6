// The end of a tile: O normalised by the row state, the warps' partial rows merged, and O, the
// LSE or a split's fp32 partials written (from shared memory or straight from registers).
#pragma once

#include <cutlass/array.h>
#include <cute/tensor.hpp>

#include "common/params.h"
#include "common/rules.h"
#include "cuda/components/cta_geometry.h"
#include "cuda/components/fragments.h"
#include "cuda/components/online_softmax.h"
#include "cuda/components/score_rules.h"
#include "cuda/components/tile_loads.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)

// O rows from the staged smem tile sO (kBlockM x kHeadDim, Element) to global memory with
// 16-byte stores, row r at p.o + o_off[r] (kNoRow: not stored), columns < head_dim.
template <class Traits, class SmemTensor>
__device__ __forceinline__ void store_o_rows(const AttnParams& p, const SmemTensor& sO,
                                             const int64_t* o_off, int tid) {
  if (tid >= Traits::kGmemThreads) return;
  using Element = typename Traits::OutElement;  // (the tile's type: the same)
  static_assert(std::is_same_v<Element, typename Traits::Element>, "O staged in its own type");
  Element* o = static_cast<Element*>(p.o);
  typename Traits::GmemTiledCopy gmem_copy;
  auto thr_copy = gmem_copy.get_thread_slice(tid);
  Tensor tOsO = thr_copy.partition_S(sO);  // (CPY, CPY_M, CPY_K)
  Tensor cO = make_identity_tensor(Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{});
  Tensor tOcO = thr_copy.partition_S(cO);  // (CPY, CPY_M, CPY_K) -> (row, col)
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tOsO); ++m) {
    const int64_t off = o_off[get<0>(tOcO(0, m, 0))];
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tOsO); ++k) {
      const int col = get<1>(tOcO(0, m, k));
      if (off != kNoRow && col < p.head_dim) {
        *reinterpret_cast<uint4*>(o + off + col) = *reinterpret_cast<const uint4*>(&tOsO(0, m, k));
      }
    }
  }
}

// v, hidden from the compiler's loop-invariant code motion: what is derived from it is computed
// where it is used, once per query tile. The epilogue's shared-memory addresses depend only on
// the thread; hoisted out of the warpspec kernel's tile loop, ptxas kept 16 of them at d = 256
// and spilled them to local memory (D-80).
__device__ __forceinline__ int recomputed_here(int v) {
  asm volatile("mov.b32 %0, %0;" : "+r"(v));
  return v;
}

// The end of a tile computed by warpgroup MMAs (wgmma_kernel.h, warpspec_kernel.h): this
// thread's rows of O (acc_o, partitioned by thr_o) normalised by their state and staged in sO
// (kBlockM x kHeadDim, the Q buffer's swizzled layout), and their LSE written by one thread of
// each quad. The caller then synchronises and stores sO (store_o_rows).
//
// O is staged by stmatrix: a thread holds, for each of its two rows i (a warp's rows r0 + l / 4
// and + 8, lane l) and each 8-column block j, the pair of columns 8 j + 2 (l % 4) + {0, 1}, which
// is one lane's share of an 8 x 8 block of 16-bit elements. One stmatrix.x4 stores four blocks
// (rows i = 0, 1 of blocks j, j + 1); lane l gives the address of row l % 8 of block l / 8, 16
// contiguous bytes (the swizzle moves whole 16-byte chunks). 8 stores per thread at d = 128;
// 32-bit stores were 32, each with its swizzled address (docs/DECISIONS.md D-9, D-80).
template <class ThrMma, class AccO, int kRows, class SO>
__device__ __forceinline__ void stage_wgmma_o(const AttnParams& p, const CtaInfo& c, const ScoreScale& sc,
                                              const ThrMma& thr_o, AccO& acc_o,
                                              const SoftmaxRowState (&rows)[kRows], SO& sO) {
  using Element = typename SO::value_type;
  static_assert(sizeof(Element) == 2 && kRows == 2, "16-bit O, a thread's two accumulator rows");
  Tensor o_rc = make_tensor(acc_o.data(), gmma_acc_to_rowcol(acc_o.layout()));  // (kRows, d)
  constexpr int kBlocks = decltype(size<1>(o_rc))::value / 2;  // 8-column blocks
  static_assert(kBlocks % 2 == 0, "two blocks per stmatrix.x4");
  Tensor cO = make_identity_tensor(make_shape(size<0>(sO), size<1>(sO)));  // (rows, d), flat
  Tensor tOcO = thr_o.partition_C(cO);
  Tensor tOcO_rc = make_tensor(tOcO.data(), gmma_acc_to_rowcol(tOcO.layout()));
  const int lane = recomputed_here(int(threadIdx.x) % 32);
  const bool owns_row_lse = get<1>(tOcO_rc(0, 0)) == 0;  // one thread of each quad
  float out_scale[kRows];
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    const SoftmaxRowState row = quad_row_state(rows[i]);
    const SoftmaxResult result = sc.finish(row);  // no visible key: O = 0, LSE = -inf
    out_scale[i] = result.out_scale;
    const int r = get<0>(tOcO_rc(i, 0));
    if (p.lse != nullptr && owns_row_lse && c.m0 + r < c.rows) {
      const PackedRow pr = tile_row_query(p, c, c.m0 + r);
      p.lse[lse_offset(p, c.seq, c.b, pr.query, pr.head)] = result.lse;
    }
  }
  auto pair_of = [&](int i, int j) {  // row i, block j: the thread's two columns as one register
    cutlass::Array<Element, 2> pair;
    pair[0] = static_cast<Element>(o_rc(i, 2 * j) * out_scale[i]);
    pair[1] = static_cast<Element>(o_rc(i, 2 * j + 1) * out_scale[i]);
    return reinterpret_cast<const uint32_t&>(pair);
  };
  const int block = lane / 8;  // the block whose row this lane addresses: row i = block % 2, j + block / 2
  const int row = get<0>(tOcO_rc(0, 0)) - lane / 4 + 8 * (block % 2) + lane % 8;
  CUTE_UNROLL
  for (int j = 0; j < kBlocks; j += 2) {
    const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(&sO(row, 8 * (j + block / 2))));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(pair_of(0, j)), "r"(pair_of(1, j)), "r"(pair_of(0, j + 1)), "r"(pair_of(1, j + 1))
                 : "memory");
  }
}

// The rows [row0, row0 + kRows) of the staged O tile sO to global memory with 16-byte stores by
// the 128 threads of one warpgroup (thread: 0..127), row r at p.o + o_off[r] (kNoRow: not
// stored), columns < head_dim (warpspec_kernel.h: each consumer warpgroup stores its own rows).
template <int kRows, class SmemTensor>
__device__ __forceinline__ void store_warpgroup_o_rows(const AttnParams& p, const SmemTensor& sO, int row0,
                                                       const int64_t* o_off, int thread) {
  using Element = typename SmemTensor::value_type;
  constexpr int kChunk = 16 / int(sizeof(Element));
  constexpr int kChunksPerRow = decltype(size<1>(sO))::value / kChunk;
  constexpr int kThreads = 128;
  Element* o = static_cast<Element*>(p.o);
  static_assert(kRows * kChunksPerRow % kThreads == 0, "whole passes of the warpgroup");
  thread = recomputed_here(thread);
  CUTE_UNROLL
  for (int pass = 0; pass < kRows * kChunksPerRow / kThreads; ++pass) {
    const int e = pass * kThreads + thread;
    const int r = row0 + e / kChunksPerRow, col = (e % kChunksPerRow) * kChunk;
    const int64_t off = o_off[r];
    if (off != kNoRow && col < p.head_dim) {
      *reinterpret_cast<uint4*>(o + off + col) = *reinterpret_cast<const uint4*>(&sO(r, col));
    }
  }
}

// A split's result kept in the CTA's shared memory for combine_in_cluster: O normalised by the
// split's own sum, o[row * Traits::kMergeRowFloats + col] in fp32, and lse[row] (-inf: no key).
struct SplitPartial {
  float* o;
  float* lse;
};

// The end of a warp that holds its rows' statistics and O columns whole (no merge with other
// warps): for each of this thread's accumulator rows inside the tile's rows, row_fn(r, lse,
// quad_leader, for_each_pair), where for_each_pair(store) calls store(col, o0, o1) for the row's
// column pairs normalised by the row's sum (col within the warp's kDims columns), and
// quad_leader marks one thread per row. A row with no visible key (or an empty split) gets 0 and
// LSE -inf.
template <class Traits, int kDims, class AccO, int kRows, class RowFn>
__device__ __forceinline__ void for_each_warp_row(const CtaInfo& c, const AccO& acc_o, const SoftmaxRowState (&rows)[kRows], const ScoreScale& sc, int lane,
                                                  RowFn row_fn) {
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(lane);
  Tensor cO = make_identity_tensor(Shape<Int<Traits::kBlockM>, Int<kDims>>{});
  Tensor tOcO = thr_mma.partition_C(cO);
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_to_rowcol(tOcO.layout()));  // (rows, columns)
  Tensor o_rc = make_tensor(acc_o.data(), acc_to_rowcol(acc_o.layout()));
  const bool quad_leader = get<1>(tOcO_rc(0, 0)) == 0;
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    const SoftmaxRowState row = quad_row_state(rows[i]);
    const int r = get<0>(tOcO_rc(i, 0));
    if (c.m0 + r >= c.rows) continue;
    const SoftmaxResult result = sc.finish(row);
    const float inv = result.out_scale;
    const float lse = result.lse;
    auto for_each_pair = [&](auto store) {
      CUTE_UNROLL
      for (int d = 0; d < size<1>(o_rc); d += 2) store(get<1>(tOcO_rc(i, d)), o_rc(i, d) * inv, o_rc(i, d + 1) * inv);
    };
    row_fn(r, lse, quad_leader, for_each_pair);
  }
}

// The end of a CTA whose warps split the head dim (Traits::kWarpsSplitDims): every warp holds
// the same row statistics and its own columns of O, so it normalises and writes them straight
// from registers as the split's fp32 partials (global, or the CTA's SplitPartial with
// cluster_combine), and warp 0 writes the LSE (tuning.h decode_warps_split_dims takes this
// kernel only to split).
template <class Traits, class AccO, int kRows>
__device__ __forceinline__ void store_warp_columns(const AttnParams& p, const CtaInfo& c, int split,
                                                   const AccO& acc_o, const SoftmaxRowState (&rows)[kRows], const ScoreScale& sc,
                                                   const SplitPartial& part, int warp, int lane) {
  constexpr int kDimsPerWarp = Traits::kDimsPerWarp;
  const int col0 = warp * kDimsPerWarp;
  for_each_warp_row<Traits, kDimsPerWarp>(
      c, acc_o, rows, sc, lane, [&](int r, float lse, bool quad_leader, auto for_each_pair) {
        int64_t row = 0;
        float* dst = part.o + r * Traits::kMergeRowFloats + col0;
        if (!p.cluster_combine) {
          const PackedRow pr = tile_row_query(p, c, c.m0 + r);
          row = accum_row(p, split, c.b, pr.head, pr.query);
          dst = p.o_accum + row * p.head_dim + col0;
        }
        for_each_pair([&](int col, float o0, float o1) {
          if (col0 + col < p.head_dim) *reinterpret_cast<float2*>(dst + col) = make_float2(o0, o1);
        });
        if (warp == 0 && quad_leader) (p.cluster_combine ? part.lse[r] : p.lse_accum[row]) = lse;
      });
}

// Where the warps' fp32 O slabs (16 rows x d each) of the merge lie in shared memory.
// Padded: one buffer of kNWarps slabs, rows padded by 8 floats against bank conflicts, laid
// over all the K/V buffers (splitkeys_kernel).
template <class Traits>
struct PaddedMergeO {
  float* base;
  __device__ __forceinline__ float* at(int warp, int r, int col) const {
    return base + (warp * Traits::kBlockM + r) * Traits::kMergeRowFloats + col;
  }
};
// One K/V stage (persistent_decode_kernel.h, whose other stage holds the next unit's first
// tile): the first half of the warps' slabs over the stage's K tile, the second over its V
// tile, rows unpadded with their 8-float chunks permuted per row (chunk ^ row % 8) against
// bank conflicts. A float2 at an even column, or a float4 at a multiple of 4, stays whole.
template <class Traits>
struct StageMergeO {
  static constexpr int kHalf = Traits::kNWarps / 2;
  static constexpr int kSlabFloats = Traits::kBlockM * Traits::kHeadDim;
  static_assert(Traits::kHeadDim % 64 == 0, "whole groups of eight 8-float chunks per row");
  static_assert(kHalf * kSlabFloats * int(sizeof(float)) <= Traits::kSmemKVBytes, "half the slabs fit a K tile");
  float* k;  // the stage's K tile
  float* v;  // the stage's V tile
  __device__ __forceinline__ float* at(int warp, int r, int col) const {
    float* slab = (warp < kHalf ? k : v) + (warp % kHalf) * kSlabFloats;
    return slab + r * Traits::kHeadDim + (col ^ ((r % 8) * 8));
  }
};

// The end of a CTA whose warps split the keys: per row the max M and sum L over the warps,
// O = sum_w O_w e^(m_w - M) / L, merged through shared memory (merge_o: the K/V buffers, which
// every warp is done with); then O (or the split's fp32 partials, global or, with
// cluster_combine, the SplitPartial part: warp 0's slab of a PaddedMergeO, each element
// rewritten by the one thread that summed it) with 16-byte stores, and LSE.
template <class Traits, class MergeO, class AccO, int kRows>
__device__ __forceinline__ void merge_warps_and_store(const AttnParams& p, const CtaInfo& c, int split,
                                                      AccO& acc_o, const SoftmaxRowState (&rows)[kRows], const ScoreScale& sc,
                                                      float* merge_max, float* merge_sum, const MergeO& merge_o,
                                                      const SplitPartial& part, const int64_t* o_off,
                                                      int tid) {
  using Element = typename Traits::OutElement;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kNWarps = Traits::kNWarps;
  const int warp = tid / 32;
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid % 32);
  Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});
  Tensor tOcO = thr_mma.partition_C(cO);
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_to_rowcol(tOcO.layout()));  // (rows, d)
  const bool owns_row_stat = get<1>(tOcO_rc(0, 0)) == 0;  // one thread of each quad
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    const SoftmaxRowState row = quad_row_state(rows[i]);
    if (owns_row_stat) {
      const int r = get<0>(tOcO_rc(i, 0));
      merge_max[warp * kBlockM + r] = row.max;
      merge_sum[warp * kBlockM + r] = row.sum;
    }
  }
  __syncthreads();

  // The merged state of row r over the warps (softmax_state.h merge_states).
  auto merged_row = [&](int r) {
    return merge_states<kNWarps>(
        [&](int w) { return SoftmaxRowState{merge_max[w * kBlockM + r], merge_sum[w * kBlockM + r]}; },
        sc.scale_log2);
  };

  constexpr int kRowFloats = Traits::kMergeRowFloats;
  Tensor o_rc = make_tensor(acc_o.data(), acc_to_rowcol(acc_o.layout()));
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    const int r = get<0>(tOcO_rc(i, 0));
    const float factor = rows[i].weight_in(merged_row(r), sc.scale_log2) * sc.out_descale;
    CUTE_UNROLL
    for (int d = 0; d < size<1>(o_rc); d += 2) {
      const int col = get<1>(tOcO_rc(i, d));
      if constexpr (Traits::o_column(1) == 1) {
        *reinterpret_cast<float2*>(merge_o.at(warp, r, col)) =
            make_float2(o_rc(i, d) * factor, o_rc(i, d + 1) * factor);
      } else {  // columns in another order (Traits::o_column): two apart
        *merge_o.at(warp, r, Traits::o_column(col)) = o_rc(i, d) * factor;
        *merge_o.at(warp, r, Traits::o_column(col + 1)) = o_rc(i, d + 1) * factor;
      }
    }
  }
  __syncthreads();

  // ---- store: each thread sums 8 columns of one row over the warps (a 16-byte output chunk)
  constexpr int kChunksPerRow = kHeadDim / 8;
  for (int idx = tid; idx < kBlockM * kChunksPerRow; idx += Traits::kNThreads) {
    const int r = idx / kChunksPerRow;
    const int col = (idx % kChunksPerRow) * 8;
    if (c.m0 + r >= c.rows || col >= p.head_dim) continue;
    float acc[8];
    CUTE_UNROLL
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
    CUTE_UNROLL
    for (int w = 0; w < kNWarps; ++w) {
      const float* src = merge_o.at(w, r, col);
      const float4 lo = *reinterpret_cast<const float4*>(src);
      const float4 hi = *reinterpret_cast<const float4*>(src + 4);
      acc[0] += lo.x, acc[1] += lo.y, acc[2] += lo.z, acc[3] += lo.w;
      acc[4] += hi.x, acc[5] += hi.y, acc[6] += hi.z, acc[7] += hi.w;
    }
    if (p.cluster_combine) {
      float* dst = part.o + r * kRowFloats + col;
      *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
    } else if (p.num_splits > 1) {
      const PackedRow pr = tile_row_query(p, c, c.m0 + r);
      float* dst = p.o_accum + accum_row(p, split, c.b, pr.head, pr.query) * p.head_dim + col;
      *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
    } else {
      cutlass::Array<Element, 8> out;
      CUTE_UNROLL
      for (int e = 0; e < 8; ++e) out[e] = static_cast<Element>(acc[e]);
      *reinterpret_cast<cutlass::Array<Element, 8>*>(static_cast<Element*>(p.o) + o_off[r] + col) = out;
    }
  }
  // LSE of each row (the merged max in raw units times raw_scale, plus log L).
  if (tid < kBlockM && c.m0 + tid < c.rows) {
    const int r = tid;
    const float lse = sc.finish(merged_row(r)).lse;
    const PackedRow pr = tile_row_query(p, c, c.m0 + r);
    if (p.cluster_combine) {
      part.lse[r] = lse;
    } else if (p.num_splits > 1) {
      p.lse_accum[accum_row(p, split, c.b, pr.head, pr.query)] = lse;
    } else if (p.lse != nullptr) {
      p.lse[lse_offset(p, c.seq, c.b, pr.query, pr.head)] = lse;
    }
  }
}

// The end of a warp that computed its unit whole: its rows of O and their LSE, straight from
// registers (two elements of a row per store; a unit's O is a few hundred bytes).
template <class Traits, class AccO, int kRows>
__device__ __forceinline__ void store_warp_rows(const AttnParams& p, const CtaInfo& c, const AccO& acc_o,
                                                const SoftmaxRowState (&rows)[kRows],
                                                const ScoreScale& sc, int lane) {
  using Element = typename Traits::OutElement;
  for_each_warp_row<Traits, Traits::kHeadDim>(
      c, acc_o, rows, sc, lane, [&](int r, float lse, bool quad_leader, auto for_each_pair) {
        const PackedRow pr = tile_row_query(p, c, c.m0 + r);
        Element* dst = static_cast<Element*>(p.o) + o_offset(p, c.seq, c.b, pr.query, pr.head);
        for_each_pair([&](int col, float o0, float o1) {
          cutlass::Array<Element, 2> out;
          out[0] = static_cast<Element>(o0);
          out[1] = static_cast<Element>(o1);
          if (col < p.head_dim) *reinterpret_cast<cutlass::Array<Element, 2>*>(dst + col) = out;
        });
        if (quad_leader && p.lse != nullptr) p.lse[lse_offset(p, c.seq, c.b, pr.query, pr.head)] = lse;
      });
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
