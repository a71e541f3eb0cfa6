// The Hopper (sm_90a) forward kernel: the FlashAttention-2 walk of fwd_kernel.h with its two
// products on warpgroup MMAs (wgmma) instead of mma.sync.
//
// A CTA of two warpgroups owns 128 query rows (64 per warpgroup) of one (batch, head) and walks
// the visible key tiles from the last down. Q, K and V are gathered row by row with cp.async
// exactly as in fwd_kernel.h (components/tile_loads.h: paging, varlen, leftpad, packed GQA and arbitrary strides stay one
// code path), into the swizzled 128-byte layouts that wgmma reads straight from shared memory.
//
// kStages K/V buffers let tiles n-1 ... n-kStages+1 stream in during tile n. Per tile n, one
// barrier:
//   wait tile n; fence to the async proxy; barrier | issue tile n-kStages+1 |
//   S = Q K^T (wgmma, smem x smem) | rules, online softmax | O += P V (wgmma, P from registers)
// The narrow tile (two CTAs per SM) lets one CTA's softmax run under the other's MMAs.
// FlashAttention-3's intra-warpgroup pipelining (S of tile n-1 issued before the softmax of tile
// n) was measured no faster here on top of that (docs/DECISIONS.md D-3) and is not used.
// Used for the 128-row tile when the device is sm_90 and there is one split (D-1,
// api/kernel_choice.cpp).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/params.h"
#include "cuda/components/cta_geometry.h"
#include "cuda/components/epilogue.h"
#include "cuda/components/fragments.h"
#include "cuda/components/kv_pipeline.h"
#include "cuda/components/mma.h"
#include "cuda/components/online_softmax.h"
#include "cuda/components/score_rules.h"
#include "cuda/components/tile_loads.h"
#include "cuda/kernel_traits.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm) wgmma_kernel(const __grid_constant__ AttnParams p) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kKVElems = Traits::kKVElems;
  extern __shared__ __align__(1024) char smem[];  // 128-byte swizzle atoms want 1024-byte alignment
  const int tid = threadIdx.x;

  // ---- geometry (one split: the launcher sends num_splits > 1 to fwd_kernel)
  CtaInfo c;
  if (!make_cta_info<kBlockM>(p, c)) return;
  const CtaKeyTiles tiles = cta_key_tiles<kBlockM, kBlockN>(p, c, 0);

  // ---- shared memory: Q | K stages | V stages | row offsets
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_k = smem_q + Traits::kQElems;
  Element* smem_v = smem_k + kStages * kKVElems;
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
  int64_t* q_off = reinterpret_cast<int64_t*>(smem_v + kStages * kKVElems);
  int64_t* o_off = q_off + kBlockM;
  KvRowOffsets* kv_off_buf = reinterpret_cast<KvRowOffsets*>(o_off + kBlockM);  // [kStages][kBlockN]
  const KvStages<Traits> kv{smem_k, smem_v, kv_off_buf};
  const ContiguousKvCopies<Traits> contiguous(p, c, smem_k, tid);
  const bool paged = reads_page_table<Traits>(p);
  auto issue_tile = [&](int n) {
    if (paged) {
      kv.issue(p, c, tiles, n, tid);
    } else {
      contiguous.issue(p, c, tiles, n);
    }
  };
  auto offsets_of_tile = [&](int n) { kv.prepare(p, c, tiles, n, tid); };

  // ---- prologue: Q and tiles hi-1 ... hi-(kStages-1) in flight; the offsets of those and of
  // the tile the first iteration issues
  compute_q_o_offsets<Traits>(p, c, q_off, o_off, tid);
  CUTE_UNROLL
  for (int i = 1; i <= kStages; ++i) offsets_of_tile(tiles.hi - i);
  __syncthreads();
  if (tiles.hi > tiles.lo) load_q<Traits>(p, q_off, sQ, tid);
  CUTE_UNROLL
  for (int i = 1; i < kStages; ++i) issue_tile(tiles.hi - i);

  // ---- MMA partitions (thread slices of the two-warpgroup tiled MMAs)
  typename Traits::TiledMmaS mma_s;
  typename Traits::TiledMmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor tSrQ = thr_s.partition_fragment_A(sQ);  // smem descriptors
  Tensor acc_o = partition_fragment_C(mma_o, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  clear(acc_o);

  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS = thr_s.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), gmma_acc_to_rowcol(tScS.layout()));  // (rows, cols)
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;

  const ScoreScale sc(p, c.b, c.hk, Traits::kKvFp8);
  SoftmaxRowState rows[kRows];
  start_softmax_rows(rows);

  Tensor o_rc = make_tensor(acc_o.data(), gmma_acc_to_rowcol(acc_o.layout()));  // (kRows, d)

  // ---- mainloop over key tiles, last first (the scores and P are local to the tile, which
  // keeps the narrow d = 128 tile within its 128 registers)
  for (int n = tiles.hi - 1; n >= tiles.lo; --n) {
    cp_async_wait<kStages - 2>();
    cutlass::arch::fence_view_async_shared();  // this thread's cp.async data, to wgmma's proxy
    __syncthreads();  // tile n landed for all; every warpgroup is done with tile n+1's stage
    issue_tile(n - (kStages - 1));  // into tile n+1's stage
    offsets_of_tile(n - kStages);   // into tile n's table (its copies are issued)

    const int stage = unsigned(n) % kStages;  // n >= tiles.lo >= 0
    Tensor tSrK = thr_s.partition_fragment_B(kv.k_tile(stage));
    Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{});
    wgmma_issue<true>(mma_s, tSrQ, tSrK, acc_s);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_s);

    Tensor s = make_tensor(acc_s.data(), gmma_acc_to_rowcol(acc_s.layout()));  // (kRows, kBlockN)
    const int j0 = n * kBlockN;
    const bool need_mask = !(j0 >= tiles.mask_free_lo && j0 + kBlockN <= tiles.mask_free_hi);
    apply_score_rules(p, c, sc, s, tScS_rc, j0, need_mask);
    online_softmax_step(s, o_rc, rows, sc.scale_log2);

    Tensor rP = convert_fragment<Element>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), gmma_acc_to_a_operand(rP.layout()));
    Tensor tOrV = thr_o.partition_fragment_B(kv.vt_tile(stage));
    wgmma_issue<false>(mma_o, tOrP, tOrV, acc_o);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_o);
  }

  // ---- epilogue: normalise, LSE, O through shared memory (Q's buffer) to 16-byte row stores
  cp_async_wait<0>();
  __syncthreads();  // every warpgroup is done with sQ
  Tensor sO = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
  stage_wgmma_o(p, c, sc, thr_o, acc_o, rows, sO);
  __syncthreads();

  store_o_rows<Traits>(p, sO, o_off, tid);
#endif
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
