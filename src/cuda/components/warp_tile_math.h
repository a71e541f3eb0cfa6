// One warp's math on a decode tile (the keys-split, persistent and heads-split decode kernels).
#pragma once

#include <cute/tensor.hpp>

#include "cuda/components/kv_pipeline.h"
#include "cuda/components/mma.h"
#include "cuda/components/online_softmax.h"
#include "cuda/components/score_rules.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)

// This warp's share of a decode tile's math, as splitkeys_kernel and persistent_decode_kernel
// run it: the MMA partitions of Q (16 x d, held in registers once loaded), of the warp's keys of
// a K/V stage (or, splitting the head dim, of all the keys and its columns of O), O and the
// rows' online-softmax state; per tile (step): S = Q K_w^T, the score rules, the softmax step,
// O_w += P V_w. Stage s's partitions are stage 0's shifted by s whole K/V buffers, and a Q
// buffer's are the first one's shifted likewise (whole swizzle periods, so the swizzled offsets
// are unchanged). A local type: its members' types are those of the partitions made here.
template <class Traits, class Kv, class SmemQ>
__device__ __forceinline__ auto make_warp_tile_math(const Kv& kv, const SmemQ& sQ, int warp, int lane) {
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
    SoftmaxRowState rows[kRows];

    // A new run of tiles: O = 0, no row seen.
    __device__ __forceinline__ void start() {
      clear(acc_o);
      start_softmax_rows(rows);
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
      online_softmax_step</*kSkipUnitRescale=*/true>(s, o_rc, rows, sc.scale_log2);

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
                      {}};
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
