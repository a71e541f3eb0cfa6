// The decode kernel: at most 16 query rows per CTA, the 4 warps split the keys.
//
// Decode reads every K/V byte once and does little arithmetic on it, so the kernel must keep
// the memory system busy rather than the tensor cores: one 16-row MMA slab (kernel_traits.h
// SplitKeysTraits), each warp a quarter of every K/V tile with its own online softmax, and
// kStages K/V buffers so that tile n-1 (n-kStages+1 ...) streams in during the whole of tile n.
// Per key tile n (walked from the last visible tile down), one barrier:
//   wait tile n; barrier | issue tile n-kStages+1 | per warp: S = Q K_w^T, rules, softmax, O_w += P V_w
// At the end the warps merge (max, sum, O) through shared memory, laid over the K/V buffers,
// and write O (or the split's fp32 partials) with 16-byte stores, and LSE. With
// AttnParams::cluster_combine the split's partial stays in shared memory instead and the
// unit's splits, one thread-block cluster, merge it there (combine_in_cluster).
// Short split walks at d = 64 and 128 (Traits::kWarpsSplitDims, rules.h
// decode_warps_split_dims) split the head dim instead: every warp computes the whole S of a
// tile and its own columns of O, and writes them from registers with no merge
// (store_warp_columns).
//
// Rows, masks, paging, splits and packed GQA follow the same rules.h definitions as the
// 128-row kernel (fwd_kernel.h), whose helpers this file uses.
#pragma once

#include <cooperative_groups.h>

#include "cuda/fwd_kernel.h"

namespace flashattn {
namespace cuda {
namespace fwd {

// A split's result kept in the CTA's shared memory for combine_in_cluster: O normalised by the
// split's own sum, o[row * Traits::kMergeRowFloats + col] in fp32, and lse[row] (-inf: no key).
struct SplitPartial {
  float* o;
  float* lse;
};

// The split-KV combine inside a thread-block cluster (sm_90; AttnParams::cluster_combine): the
// num_splits CTAs of a unit are one cluster along grid y (launch_fwd), each holding its split's
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
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kRowFloats = Traits::kMergeRowFloats;
  constexpr int kChunksPerRow = Traits::kHeadDim / 8;
  // A thread's tasks (row, 8-column chunk) are idx, idx + splits x threads, ...: at most
  // kMaxTasks with the two splits a cluster has at least (backend.cu may_combine_splits_in_cluster).
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
    float m = -INFINITY;
    CUTE_UNROLL
    for (int s = 0; s < kMaxClusterSplits; ++s) m = fmaxf(m, lse_s[t][s]);
    float sum = 0.0f;
    CUTE_UNROLL
    for (int s = 0; s < kMaxClusterSplits; ++s) sum += lse_s[t][s] == -INFINITY ? 0.0f : expf(lse_s[t][s] - m);
    const float lse = m == -INFINITY || sum <= 0.0f ? -INFINITY : m + logf(sum);
    float acc[8];
    CUTE_UNROLL
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
    CUTE_UNROLL
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (lse_s[t][s] == -INFINITY || lse == -INFINITY) continue;  // also s >= splits
      const float w = expf(lse_s[t][s] - lse);
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

// The end of a warp that holds its rows' statistics and O columns whole (no merge with other
// warps): for each of this thread's accumulator rows inside the tile's rows, row_fn(r, lse,
// quad_leader, for_each_pair), where for_each_pair(store) calls store(col, o0, o1) for the row's
// column pairs normalised by the row's sum (col within the warp's kDims columns), and
// quad_leader marks one thread per row. A row with no visible key (or an empty split) gets 0 and
// LSE -inf.
template <class Traits, int kDims, class AccO, int kRows, class RowFn>
__device__ __forceinline__ void for_each_warp_row(const CtaInfo& c, const AccO& acc_o, const float (&row_max)[kRows],
                                                  const float (&row_sum)[kRows], const ScoreScale& sc, int lane,
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
    const float sum = quad_allreduce_sum(row_sum[i]);
    const int r = get<0>(tOcO_rc(i, 0));
    if (c.m0 + r >= c.rows) continue;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const float lse = sum > 0.0f ? row_max[i] * sc.raw_scale + logf(sum) : -INFINITY;
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
// cluster_combine), and warp 0 writes the LSE (rules.h decode_warps_split_dims takes this
// kernel only to split).
template <class Traits, class AccO, int kRows>
__device__ __forceinline__ void store_warp_columns(const AttnParams& p, const CtaInfo& c, int split,
                                                   const AccO& acc_o, const float (&row_max)[kRows],
                                                   const float (&row_sum)[kRows], const ScoreScale& sc,
                                                   const SplitPartial& part, int warp, int lane) {
  constexpr int kDimsPerWarp = Traits::kDimsPerWarp;
  const int col0 = warp * kDimsPerWarp;
  for_each_warp_row<Traits, kDimsPerWarp>(
      c, acc_o, row_max, row_sum, sc, lane, [&](int r, float lse, bool quad_leader, auto for_each_pair) {
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
                                                      AccO& acc_o, const float (&row_max)[kRows],
                                                      const float (&row_sum)[kRows], const ScoreScale& sc,
                                                      float* merge_max, float* merge_sum, const MergeO& merge_o,
                                                      const SplitPartial& part, const int64_t* o_off,
                                                      int tid) {
  using Element = typename Traits::Element;
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
    const float sum = quad_allreduce_sum(row_sum[i]);
    if (owns_row_stat) {
      const int r = get<0>(tOcO_rc(i, 0));
      merge_max[warp * kBlockM + r] = row_max[i];
      merge_sum[warp * kBlockM + r] = sum;
    }
  }
  __syncthreads();

  // The merged (M, L) of row r: warps that saw no key (max -inf) contribute nothing.
  struct RowStat {
    float max, sum;
  };
  auto merged_row = [&](int r) {
    float m = -INFINITY;
    CUTE_UNROLL
    for (int w = 0; w < kNWarps; ++w) m = fmaxf(m, merge_max[w * kBlockM + r]);
    float l = 0.0f;
    CUTE_UNROLL
    for (int w = 0; w < kNWarps; ++w) {
      const float mw = merge_max[w * kBlockM + r];
      if (mw != -INFINITY) l += merge_sum[w * kBlockM + r] * exp2f((mw - m) * sc.scale_log2);
    }
    return RowStat{m, l};
  };

  constexpr int kRowFloats = Traits::kMergeRowFloats;
  Tensor o_rc = make_tensor(acc_o.data(), acc_to_rowcol(acc_o.layout()));
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    const int r = get<0>(tOcO_rc(i, 0));
    const RowStat row = merged_row(r);
    const float factor = (row_max[i] == -INFINITY || row.sum <= 0.0f)
                             ? 0.0f
                             : exp2f((row_max[i] - row.max) * sc.scale_log2) / row.sum;
    CUTE_UNROLL
    for (int d = 0; d < size<1>(o_rc); d += 2) {
      const int col = get<1>(tOcO_rc(i, d));
      *reinterpret_cast<float2*>(merge_o.at(warp, r, col)) =
          make_float2(o_rc(i, d) * factor, o_rc(i, d + 1) * factor);
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
    const RowStat row = merged_row(r);
    const float lse = row.sum > 0.0f ? row.max * sc.raw_scale + logf(row.sum) : -INFINITY;
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

// This warp's share of a decode tile's math, as splitkeys_kernel and persistent_decode_kernel
// run it: the MMA partitions of Q (16 x d, held in registers once loaded), of the warp's keys of
// a K/V stage (or, splitting the head dim, of all the keys and its columns of O), O and the
// rows' online-softmax state; per tile (step): S = Q K_w^T, the score rules, the softmax step,
// O_w += P V_w. Stage s's partitions are stage 0's shifted by s whole K/V buffers, and a Q
// buffer's are the first one's shifted likewise (whole swizzle periods, so the swizzled offsets
// are unchanged). A local type: its members' types are those of the partitions made here.
template <class Traits, class SmemQ>
__device__ __forceinline__ auto make_warp_tile_math(const KvStages<Traits>& kv, const SmemQ& sQ, int warp,
                                                    int lane) {
  using Element = typename Traits::Element;
  constexpr bool kSplitDims = Traits::kWarpsSplitDims;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kKeysPerWarp = Traits::kKeysPerWarp;
  constexpr int kKVElems = KvStages<Traits>::kElems;
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(lane);
  // (keys, d): this warp's keys, or all of them; (dims, keys): this warp's keys, or its O columns
  auto warp_k = local_tile(kv.k_tile(0), typename Traits::WarpKeys{}, make_coord(kSplitDims ? 0 : warp, 0));
  auto warp_vt = local_tile(kv.vt_tile(0), typename Traits::WarpKeysT{},
                            kSplitDims ? make_coord(warp, 0) : make_coord(0, warp));
  auto copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto thr_copy_q = copy_q.get_thread_slice(lane);
  auto thr_copy_k = copy_k.get_thread_slice(lane);
  auto thr_copy_v = copy_v.get_thread_slice(lane);
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kKeysPerWarp>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_to_rowcol(tScS.layout()));  // (rows, cols)
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;

  struct WarpTileMath {
    decltype(tiled_mma) mma;
    decltype(copy_q) copy_q;
    decltype(copy_k) copy_k;
    decltype(copy_v) copy_v;
    decltype(thr_copy_q) thr_copy_q;
    decltype(thr_copy_k) thr_copy_k;
    decltype(thr_copy_v) thr_copy_v;
    decltype(thr_copy_q.partition_S(sQ)) tSsQ0;                       // Q (the first buffer)
    decltype(thr_copy_k.partition_S(warp_k)) tSsK0;                   // K, stage 0
    decltype(thr_copy_v.partition_S(warp_vt)) tOsVt0;                 // V, stage 0
    decltype(thr_mma.partition_fragment_A(sQ)) tSrQ;                  // (MMA, MMA_M, MMA_K)
    decltype(thr_mma.partition_fragment_B(warp_k)) tSrK;
    decltype(thr_mma.partition_fragment_B(make_tensor(
        make_smem_ptr(kv.v), typename Traits::SmemLayoutVtWarpNoSwizzle{}))) tOrVt;
    decltype(partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<Traits::kDimsPerWarp>>{})) acc_o;
    decltype(tScS_rc) tScS_rc;
    int warp;
    float row_max[kRows], row_sum[kRows];

    // A new run of tiles: O = 0, no row seen.
    __device__ __forceinline__ void start() {
      clear(acc_o);
      start_softmax_rows(row_max, row_sum);
    }
    // Q (landed in shared memory, q_elems past the first buffer) into registers.
    __device__ __forceinline__ void load_q(int q_elems) {
      Tensor tSsQ = make_tensor(tSsQ0.data() + q_elems, tSsQ0.layout());
      Tensor tSrQ_view = thr_copy_q.retile_D(tSrQ);
      copy(copy_q, tSsQ, tSrQ_view);
    }
    // Key tile n (of the walk tiles) in K/V stage `stage`.
    __device__ __forceinline__ void step(const AttnParams& p, const CtaInfo& c, const CtaKeyTiles& tiles,
                                         const ScoreScale& sc, int n, int stage) {
      Tensor tSsK = make_tensor(tSsK0.data() + stage * kKVElems, tSsK0.layout());
      Tensor tOsVt = make_tensor(tOsVt0.data() + stage * kKVElems, tOsVt0.layout());
      Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kKeysPerWarp>>{});
      clear(acc_s);
      gemm_rs(acc_s, tSrQ, tSrK, tSsK, mma, copy_k, thr_copy_k);

      Tensor s = make_tensor(acc_s.data(), acc_to_rowcol(acc_s.layout()));  // (kRows, keys)
      // Heads split: step n is keys [n * kKeysPerWarp, ...) of every warp's own unit.
      const int key0 = Traits::kWarpsSplitHeads ? n * kKeysPerWarp
                                                : n * Traits::kBlockN + (kSplitDims ? 0 : warp * kKeysPerWarp);
      const bool need_mask = !(key0 >= tiles.mask_free_lo && key0 + kKeysPerWarp <= tiles.mask_free_hi);
      apply_score_rules(p, c, sc, s, tScS_rc, key0, need_mask);

      Tensor o_rc = make_tensor(acc_o.data(), acc_to_rowcol(acc_o.layout()));  // (kRows, dims)
      online_softmax_step</*kSkipUnitRescale=*/true>(s, o_rc, row_max, row_sum, sc.scale_log2);

      Tensor rP = convert_fragment<Element>(acc_s);
      Tensor tOrP = make_tensor(rP.data(), acc_to_a_operand(rP.layout()));
      gemm_rs(acc_o, tOrP, tOrVt, tOsVt, mma, copy_v, thr_copy_v);
    }
  };
  return WarpTileMath{tiled_mma,
                      copy_q,
                      copy_k,
                      copy_v,
                      thr_copy_q,
                      thr_copy_k,
                      thr_copy_v,
                      thr_copy_q.partition_S(sQ),
                      thr_copy_k.partition_S(warp_k),
                      thr_copy_v.partition_S(warp_vt),
                      thr_mma.partition_fragment_A(sQ),
                      thr_mma.partition_fragment_B(warp_k),
                      thr_mma.partition_fragment_B(
                          make_tensor(make_smem_ptr(kv.v), typename Traits::SmemLayoutVtWarpNoSwizzle{})),
                      partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<Traits::kDimsPerWarp>>{}),
                      tScS_rc,
                      warp,
                      {},
                      {}};
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    splitkeys_kernel(const __grid_constant__ AttnParams p) {
  // The wait first: the combine grid this one lets in reads its inputs (the sequence lengths)
  // before its own wait, so they must be final when it starts, even when the grid before this
  // one wrote them.
  wait_for_previous_grid();
  allow_dependent_launch();
  prefetch_page_table_row<Traits>(p, threadIdx.x);
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kNWarps = Traits::kNWarps;
  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  // ---- geometry
  CtaInfo c;
  if (!make_cta_info<kBlockM>(p, c)) return;
  const int split = blockIdx.y;
  const CtaKeyTiles tiles = cta_key_tiles<kBlockM, kBlockN>(p, c, split);

  // ---- shared memory: Q | K stages | V stages | Q/O row offsets | merge statistics
  constexpr int kKVElems = int(cute::cosize_v<typename Traits::SmemLayoutKV>);
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_k = smem_q + cute::cosize_v<typename Traits::SmemLayoutQ>;
  Element* smem_v = smem_k + kStages * kKVElems;
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});  // (16, d)
  int64_t* q_off = reinterpret_cast<int64_t*>(smem_v + kStages * kKVElems);
  int64_t* o_off = q_off + kBlockM;
  const KvStages<Traits> kv{smem_k, smem_v, nullptr};  // paged K/V read directly (PagedRows)
  float* merge_max = reinterpret_cast<float*>(o_off + kBlockM);  // [kNWarps][16]
  float* merge_sum = merge_max + kNWarps * kBlockM;  // [kNWarps][16]
  // KvStages::issue, not wgmma_kernel.h's ContiguousKvCopies: measured no faster here
  // (docs/PERF.md, session 6 run 3), and it adds spills to the 168-register kernels.
  auto issue_tile = [&](int n, const PagedRows<Traits>& rows) { kv.issue(p, c, tiles, n, tid, rows); };

  // ---- prologue: Q and the first kStages-1 tiles in flight. Strided Q rows need no offset
  // table, so their copies and the tiles' leave before the Q/O tables and the barrier: a
  // one-tile CTA's chain starts with its memory latency rather than ending its setup first.
  // Q's copies join the first tile's commit group either way, so Q goes first.
  const bool any_tile = tiles.hi > tiles.lo;
  const StridedRows q_rows = q_tile_rows(p, c);
  const Element* q_base = static_cast<const Element*>(p.q);
  auto issue_q = [&] {
    if (any_tile && q_rows.strided) {
      load_strided_rows<Traits, kBlockM>(sQ, q_base, q_base + q_rows.first, q_rows.stride, q_rows.rows,
                                         p.head_dim, tid);
    } else if (any_tile) {
      load_q<Traits>(p, q_off, sQ, tid);
    }
  };
  auto issue_first_tiles = [&] {
    for (int i = 1; i < kStages; ++i) issue_tile(tiles.hi - i, kv.lookup(p, c, tiles, tiles.hi - i, tid));
  };
  const bool q_first = q_rows.strided;
  if (q_first) {
    issue_q();
    issue_first_tiles();
  }
  compute_q_o_offsets<Traits>(p, c, q_off, o_off, tid);
  __syncthreads();
  if (!q_first) {
    issue_q();
    issue_first_tiles();
  }

  // ---- this warp's MMA partitions and softmax state
  constexpr bool kSplitDims = Traits::kWarpsSplitDims;
  auto math = make_warp_tile_math<Traits>(kv, sQ, warp, lane);
  math.start();
  const ScoreScale sc(p);

  // ---- mainloop over key tiles, last first
  for (int n = tiles.hi - 1; n >= tiles.lo; --n) {
    // Paged: the pages of the tile issued below, read under this tile's wait.
    const PagedRows<Traits> rows_ahead = kv.lookup(p, c, tiles, n - (kStages - 1), tid);
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile n landed; every warp is done with tile n+1's stage
    issue_tile(n - (kStages - 1), rows_ahead);  // into tile n+1's stage
    if (n == tiles.hi - 1) math.load_q(0);  // Q landed with the first tile: keep it in registers
    math.step(p, c, tiles, sc, n, /*stage=*/unsigned(n) % kStages);  // n >= tiles.lo >= 0
  }

  cp_async_wait<0>();
  // With cluster_combine the split's result stays here: O over the K/V buffers, LSE after the
  // merge statistics.
  const SplitPartial part{reinterpret_cast<float*>(smem_k), merge_sum + kNWarps * kBlockM};
  if constexpr (kSplitDims) {
    if (p.cluster_combine) __syncthreads();  // every warp is done with the K/V buffers part.o overlays
    store_warp_columns<Traits>(p, c, split, math.acc_o, math.row_max, math.row_sum, sc, part, warp, lane);
  } else {
    __syncthreads();  // every warp is done with the K/V buffers; the merge O buffer overlays them
    merge_warps_and_store<Traits>(p, c, split, math.acc_o, math.row_max, math.row_sum, sc, merge_max, merge_sum,
                                  PaddedMergeO<Traits>{reinterpret_cast<float*>(smem_k)}, part, o_off, tid);
  }
  if (p.cluster_combine) combine_in_cluster<Traits>(p, c, part, o_off, tid);
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
