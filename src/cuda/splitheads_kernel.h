// The decode kernel whose warps split the heads: a CTA takes kNWarps consecutive units of one
// sequence (KV heads with pack_gqa, else heads of an MHA call: each unit its own KV head), and
// warp w computes unit w whole, over all of its keys.
//
// The keys-split kernels (splitkeys_kernel.h, persistent_decode_kernel.h) give each warp a
// quarter of every key tile of one unit, so a unit ends with the warps merging (max, sum, O)
// through shared memory: two barriers and a round of shared-memory traffic per unit. Where a
// call has many short units (batch 128 x 1k: 1,024 units of 16 tiles), a persistent CTA walks
// four of them and merges four times, ~5 us of a 136 us call (docs/DECISIONS.md D-32).
// Here a stage holds kKeysPerWarp keys of each of the CTA's kNWarps units (the same
// 64-row K and V tiles, warp w's rows being unit w's keys), so a CTA walks its four units side
// by side, as long as one of them, and each warp ends by writing its own rows from registers,
// with no merge. Its rows of a key share one contiguous run of the cache row (kNWarps heads x d).
// Per step n (kKeysPerWarp keys of every unit, walked from the last down), one barrier:
//   wait step n; barrier | issue step n-kStages+1 | per warp: S = Q_w K_w^T, rules, softmax, O_w += P V_w
//
// Served (api/kernel_choice.cpp serves_heads): contiguous K/V, unsplit, one decode tile per unit
// with its rows equally spaced in Q (tile_loads.h q_tile_rows), units of distinct KV heads in
// whole groups.
#pragma once

#include "common/params.h"
#include "cuda/components/cta_geometry.h"
#include "cuda/components/epilogue.h"
#include "cuda/components/kv_pipeline.h"
#include "cuda/components/tile_loads.h"
#include "cuda/components/warp_tile_math.h"
#include "cuda/grid_dependence.h"
#include "cuda/kernel_traits.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    splitheads_kernel(const __grid_constant__ AttnParams p) {
  wait_for_previous_grid();  // first, as in splitkeys_kernel: a grid this one lets in may read what the last one wrote
  allow_dependent_launch();
  static_assert(Traits::kWarpsSplitHeads && Traits::kKvLayouts == KvLayouts::contiguous,
                "the heads-split kernel reads contiguous K/V");
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kKeys = Traits::kKeysPerWarp;  // keys of each unit per step
  constexpr int kStages = Traits::kStages;
  constexpr int kNWarps = Traits::kNWarps;
  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  // ---- geometry: unit first_unit + w is warp w's; every unit of the CTA is one sequence's
  // (launch_splitheads: the units per sequence are whole groups of kNWarps), so the lengths
  // and the key steps are the CTA's.
  const int first_unit = blockIdx.x * kNWarps;
  CtaInfo first;
  set_unit_heads(p, first_unit, first);  // its batch is the CTA's
  const CtaInfo c = decode_unit_info(p, first_unit + warp, seq_info_checked(p, first.b));
  if (c.rows == 0) return;  // varlen: a sequence without queries (the whole CTA's)
  const CtaKeyTiles steps = cta_key_tiles<kBlockM, kKeys>(p, c, /*split=*/0);

  // ---- shared memory: Q [kNWarps] | K stages | V stages
  constexpr int kQElems = int(cute::cosize_v<typename Traits::SmemLayoutQ>);
  constexpr int kKVElems = int(cute::cosize_v<typename Traits::SmemLayoutKV>);
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_k = smem_q + kNWarps * kQElems;
  Element* smem_v = smem_k + kStages * kKVElems;
  const KvStages<Traits> kv{smem_k, smem_v, nullptr};
  auto q_buffer = [&](int w) {  // a whole number of swizzle periods apart
    return make_tensor(make_smem_ptr(smem_q + w * kQElems), typename Traits::SmemLayoutQ{});
  };

  // ---- copies. Unit w's keys of step n are rows [w * kKeys, (w + 1) * kKeys) of the stage's
  // K and V tiles; its K/V head lies head_stride on from the first unit's.
  const Element* q_base = static_cast<const Element*>(p.q);
  auto issue_q = [&] {
    for (int w = 0; w < kNWarps; ++w) {
      // strided rows (launch_splitheads)
      const StridedRows q_rows = q_tile_rows(p, decode_unit_info(p, first_unit + w, c.seq));
      auto sQ = q_buffer(w);
      load_strided_rows<Traits, kBlockM>(sQ, q_base, q_base + q_rows.first, q_rows.stride, q_rows.rows, p.head_dim,
                                         tid);
    }
  };
  auto issue_kv = [&](auto stage_tile, const Element* base, int64_t batch_stride, int64_t row_stride,
                      int64_t head_stride, int j0) {
    const int64_t row0 = kv_row_offset(p, c.seq, c.b, j0, batch_stride, row_stride, head_stride, first.hk);
    CUTE_UNROLL
    for (int w = 0; w < kNWarps; ++w) {
      auto rows = local_tile(stage_tile, Shape<Int<kKeys>, Int<Traits::kHeadDim>>{}, make_coord(w, 0));
      load_strided_rows<Traits, kKeys>(rows, base, base + row0 + w * head_stride, row_stride, c.seq.seqlen_k - j0,
                                       p.head_dim, tid);
    }
  };
  // Step n's K and V copies into its stage, one commit group (empty before the first step).
  auto issue_step = [&](int n) {
    if (n >= steps.lo) {
      const int stage = int(unsigned(n) % kStages);  // n >= 0
      issue_kv(kv.k_tile(stage), static_cast<const Element*>(p.k), p.k_batch_stride, p.k_row_stride,
               p.k_head_stride, n * kKeys);
      issue_kv(kv.v_tile(stage), static_cast<const Element*>(p.v), p.v_batch_stride, p.v_row_stride,
               p.v_head_stride, n * kKeys);
    }
    cp_async_commit();
  };

  // ---- prologue: the Q tiles join the first step's commit group
  const bool any_step = steps.hi > steps.lo;
  if (any_step) issue_q();
  for (int i = 1; i < kStages; ++i) issue_step(steps.hi - i);

  auto math = make_warp_tile_math<Traits>(kv, q_buffer(0), warp, lane);
  math.start();
  const ScoreScale sc(p, c.b, c.hk, Traits::kKvFp8);

  // ---- mainloop over the steps, last first
  for (int n = steps.hi - 1; n >= steps.lo; --n) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // step n landed; every warp is done with step n+1's stage
    issue_step(n - (kStages - 1));  // into step n+1's stage
    if (n == steps.hi - 1) math.load_q(warp * kQElems);  // Q landed with the first step: keep it in registers
    math.step(p, c, steps, sc, n, /*stage=*/int(unsigned(n) % kStages));
  }
  cp_async_wait<0>();
  store_warp_rows<Traits>(p, c, math.acc_o, math.rows, sc, lane);
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
