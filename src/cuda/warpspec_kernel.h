// The warp-specialised Hopper (sm_90a) prefill kernel, in the FlashAttention-3 design.
//
// A CTA owns 128 query rows of one (batch, head) and walks its visible key tiles from the last
// down, as wgmma_kernel.h does, with the work split by role (components/warp_roles.h):
//   producer warpgroup   one thread issues the TMA loads (components/tma_tiles.h): Q once, then
//                        K and V of each tile into kStages stages, each stage guarded by a
//                        "full" mbarrier (bytes landed) and an "empty" one (consumers done);
//   consumer warpgroups  64 rows each: S = Q K^T (wgmma, both operands in shared memory), the
//                        score rules and the online softmax in registers, O += P V (wgmma, P
//                        from registers).
// Two overlaps hide the softmax:
//   - within a warpgroup, S of tile n is issued together with P V of tile n+1, and the softmax
//     of tile n runs while P V of tile n+1 is still on the tensor cores;
//   - between the warpgroups, the turns of TensorCoreTurns: one issues its two products while
//     the other runs its softmax (ping-pong).
// Dense calls only (one K/V row range per (batch, head), TMA-describable strides: the kernel
// choice checks both); the other layouts run on wgmma_kernel.h.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/params.h"
#include "cuda/components/cta_geometry.h"
#include "cuda/components/epilogue.h"
#include "cuda/components/fragments.h"
#include "cuda/components/mma.h"
#include "cuda/components/online_softmax.h"
#include "cuda/components/score_rules.h"
#include "cuda/components/tma_tiles.h"
#include "cuda/components/warp_roles.h"
#include "cuda/kernel_traits.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;

// The kernel's shared memory: Q (O is staged there at the end), the K and V stages, the O row
// offsets and the barriers.
template <class Traits>
struct WarpSpecSmem {
  using Element = typename Traits::Element;
  using Pipeline = cutlass::PipelineTmaAsync<Traits::kStages>;
  cute::array_aligned<Element, Traits::kQElems, 1024> q;
  cute::array_aligned<Element, Traits::kStages * Traits::kKVElems, 1024> k;
  cute::array_aligned<Element, Traits::kStages * Traits::kKVElems, 1024> v;
  int64_t o_off[Traits::kBlockM];
  typename Pipeline::SharedStorage k_stages, v_stages;
  cutlass::arch::ClusterTransactionBarrier q_full;
};

template <class Traits>
constexpr bool warpspec_smem_fits() {
  return int(sizeof(WarpSpecSmem<Traits>)) <= Traits::kSmemBytes;
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    warpspec_kernel(const __grid_constant__ AttnParams p, const __grid_constant__ TmaQkv<Traits> tma) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
  using Element = typename Traits::Element;
  using Smem = WarpSpecSmem<Traits>;
  static_assert(warpspec_smem_fits<Traits>(), "Traits::kSmemBytes holds the kernel's shared memory");
  using Pipeline = typename Smem::Pipeline;
  using Stage = typename Pipeline::PipelineState;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  extern __shared__ __align__(1024) char smem_bytes[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_bytes);

  // ---- geometry (one split; dense K/V)
  CtaInfo c;
  if (!make_cta_info<kBlockM>(p, c)) return;
  const CtaKeyTiles tiles = cta_key_tiles<kBlockM, kBlockN>(p, c, 0);
  const int key_tiles = tiles.hi - tiles.lo;
  const int warpgroup = warpgroup_index();

  // ---- barriers: the K and V stages (full: the producer's bytes landed; empty: every consumer
  // thread is done with the stage), and Q's
  typename Pipeline::Params stages;
  stages.transaction_bytes = Traits::kTileBytesKV;
  stages.role = warpgroup == kProducerWarpgroup ? Pipeline::ThreadCategory::Producer
                                                : Pipeline::ThreadCategory::Consumer;
  stages.is_leader = threadIdx.x == 0;
  stages.num_consumers = kConsumerThreads;
  Pipeline k_pipe(smem.k_stages, stages, Shape<_1, _1, _1>{});
  Pipeline v_pipe(smem.v_stages, stages, Shape<_1, _1, _1>{});
  if (threadIdx.x == 0) smem.q_full.init(1);
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  auto k_stage = [&](int s) { return make_tensor(make_smem_ptr(smem.k.data() + s * Traits::kKVElems), typename Traits::SmemLayoutKV{}); };
  auto v_stage = [&](int s) { return make_tensor(make_smem_ptr(smem.v.data() + s * Traits::kKVElems), typename Traits::SmemLayoutKV{}); };
  auto vt_stage = [&](int s) { return make_tensor(make_smem_ptr(smem.v.data() + s * Traits::kKVElems), typename Traits::SmemLayoutVt{}); };
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});

  if (warpgroup == kProducerWarpgroup) {
    // ---- producer: one thread issues every load
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if (threadIdx.x != 0 || key_tiles <= 0) return;
    Tensor gQ = tma_rows(tma.q, p.seqlen_q, p, p.num_heads, c.head, c.b);
    Tensor gK = tma_rows(tma.k, p.seqlen_k, p, p.num_heads_k, c.hk, c.b);
    Tensor gV = tma_rows(tma.v, p.seqlen_k, p, p.num_heads_k, c.hk, c.b);
    smem.q_full.arrive_and_expect_tx(Traits::kTileBytesQ);
    tma_load_tile(tma.q, reinterpret_cast<uint64_t&>(smem.q_full), gQ, c.m0 / kBlockM, sQ);
    Stage k_write = cutlass::make_producer_start_state<Pipeline>();
    Stage v_write = k_write;
    for (int n = tiles.hi - 1; n >= tiles.lo; --n) {
      k_pipe.producer_acquire(k_write);
      tma_load_tile(tma.k, *k_pipe.producer_get_barrier(k_write), gK, n, k_stage(k_write.index()));
      ++k_write;
      v_pipe.producer_acquire(v_write);
      tma_load_tile(tma.v, *v_pipe.producer_get_barrier(v_write), gV, n, v_stage(v_write.index()));
      ++v_write;
    }
    return;
  }

  // ---- consumers: warpgroups 1 and 2, threads 0..255 of the two-warpgroup MMAs
  cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
  const int tid = threadIdx.x - kWarpgroupThreads;
  for (int r = tid; r < kBlockM; r += kConsumerThreads) {
    const int row = c.m0 + r;
    const PackedRow pr = tile_row_query(p, c, row);
    smem.o_off[r] = row < c.rows ? o_offset(p, c.seq, c.b, pr.query, pr.head) : kNoRow;
  }

  typename Traits::TiledMmaS mma_s;
  typename Traits::TiledMmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor tSrQ = thr_s.partition_fragment_A(sQ);
  Tensor acc_o = partition_fragment_C(mma_o, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  clear(acc_o);
  Tensor o_rc = make_tensor(acc_o.data(), gmma_acc_to_rowcol(acc_o.layout()));
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS = thr_s.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), gmma_acc_to_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;

  const ScoreScale sc(p, c.b, c.hk, Traits::kKvFp8);
  SoftmaxRowState rows[kRows];
  start_softmax_rows(rows);
  float correction[kRows];

  // The score rules and the softmax half of the online step on tile n's scores; P (the A
  // operand of P V) from them.
  auto softmax_of_tile = [&](auto& acc_s, int n) {
    Tensor s = make_tensor(acc_s.data(), gmma_acc_to_rowcol(acc_s.layout()));
    const int j0 = n * kBlockN;
    const bool need_mask = !(j0 >= tiles.mask_free_lo && j0 + kBlockN <= tiles.mask_free_hi);
    apply_score_rules(p, c, sc, s, tScS_rc, j0, need_mask);
    softmax_update(s, rows, sc.scale_log2, correction);
  };
  auto s_tile = [&]() { return partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{}); };
  // P in S's accumulator layout, so that converting is element by element; tOrP views it as
  // the A operand of P V.
  Tensor rP = make_tensor<Element>(s_tile().layout());
  Tensor tOrP = make_tensor(rP.data(), gmma_acc_to_a_operand(rP.layout()));
  auto set_p = [&](const auto& acc_s) {
    CUTE_UNROLL
    for (int e = 0; e < size(acc_s); ++e) rP(e) = static_cast<Element>(acc_s(e));
  };

  if (key_tiles > 0) {
    TensorCoreTurns turns(warpgroup - 1, key_tiles);
    Stage k_read, v_read;  // consumers start at phase 0
    smem.q_full.wait(0);

    // first tile: S only
    int n = tiles.hi - 1;
    k_pipe.consumer_wait(k_read);
    Tensor acc_s = s_tile();
    turns.take();
    wgmma_issue<true>(mma_s, tSrQ, thr_s.partition_fragment_B(k_stage(k_read.index())), acc_s);
    turns.pass();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_s);
    k_pipe.consumer_release(k_read);
    ++k_read;
    softmax_of_tile(acc_s, n);
    set_p(acc_s);

    // then S of tile n with P V of tile n+1 on the tensor cores, the softmax of tile n under P V
    for (--n; n >= tiles.lo; --n) {
      k_pipe.consumer_wait(k_read);
      Tensor acc_s_next = s_tile();
      turns.take();
      wgmma_issue<true>(mma_s, tSrQ, thr_s.partition_fragment_B(k_stage(k_read.index())), acc_s_next);
      v_pipe.consumer_wait(v_read);
      wgmma_issue<false>(mma_o, tOrP, thr_o.partition_fragment_B(vt_stage(v_read.index())), acc_o);
      turns.pass();
      warpgroup_wait<1>();  // S of tile n
      warpgroup_fence_operand(acc_s_next);
      k_pipe.consumer_release(k_read);
      ++k_read;
      softmax_of_tile(acc_s_next, n);
      warpgroup_wait<0>();  // P V of tile n+1
      warpgroup_fence_operand(acc_o);
      v_pipe.consumer_release(v_read);
      ++v_read;
      rescale_rows(o_rc, correction);
      set_p(acc_s_next);
    }

    // last P V
    v_pipe.consumer_wait(v_read);
    wgmma_issue<false>(mma_o, tOrP, thr_o.partition_fragment_B(vt_stage(v_read.index())), acc_o);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_o);
    v_pipe.consumer_release(v_read);
  }

  // ---- epilogue: O normalised into Q's buffer (each warpgroup over its own 64 rows, which only
  // its own products read), then 16-byte row stores by both consumer warpgroups
  stage_wgmma_o(p, c, sc, thr_o, acc_o, rows, sQ);
  consumers_sync();
  store_o_rows<Traits>(p, sQ, smem.o_off, tid);
#endif
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
