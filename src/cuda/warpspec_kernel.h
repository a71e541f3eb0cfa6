// The warp-specialised Hopper (sm_90a) prefill kernel, in the FlashAttention-3 design.
//
// A CTA takes query tiles of 128 rows of one (batch, head) in turn (a persistent grid of one CTA
// per SM, launch_tile_loop; D-71) and walks each tile's visible key tiles from the last down, as
// wgmma_kernel.h does, with the work split by role (components/warp_roles.h):
//   producer warpgroup   warp 0 issues the TMA loads (components/tma_tiles.h): per query
//                        tile Q, then K and V of each key tile into kStages stages, each stage
//                        guarded by a "full" mbarrier (bytes landed) and an "empty" one
//                        (consumers done); the next query tile's first K and V load while the
//                        consumers finish the current one, and its Q into the other of two
//                        Q buffers where they fit (d <= 192), else once O is out of the one;
//   consumer warpgroups  64 rows each: S = Q K^T (wgmma, both operands in shared memory), the
//                        score rules and the online softmax in registers, O += P V (wgmma, P
//                        from registers); each then stages its rows of O in shared memory and
//                        stores them, through TMA where O is a tensor TMA describes (not
//                        varlen; D-82), else with 16-byte row stores.
// Two overlaps hide the softmax:
//   - within a warpgroup, S of tile n is issued together with P V of tile n+1, and the softmax
//     of tile n runs while P V of tile n+1 is still on the tensor cores;
//   - between the warpgroups, the turns of TensorCoreTurns: one issues its two products while
//     the other runs its softmax (ping-pong).
// Dense, varlen and KV-cache calls with TMA-describable strides (the kernel choice checks them;
// tma_tiles.h: a varlen sequence's tiles start at its packed row offset, paged K/V loads a tile
// from its page, or as slabs of 16 rows each from its page where pages hold no whole tile, and
// a partial last key tile has its V rows past the keys zeroed); packed GQA runs on
// wgmma_kernel.h.
// FP8 products (WarpSpecFp8Traits, D-75): Q, K and V stay e4m3 and both products run as e4m3
// wgmma. Warp 0 of the producer warpgroup loads; warps 1-3 transpose each V stage into a Vt
// stage (components/fp8_operands.h), which the consumers read through a second pipeline
// (PipelineAsync: the transposers' writes, then the consumers' release). O (bf16) is staged in a
// buffer of its own.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/params.h"
#include "cuda/components/cta_geometry.h"
#include "cuda/components/epilogue.h"
#include "cuda/components/fp8_operands.h"
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

// FP8 products: the transposed V stages and O's staging buffer; nothing otherwise.
template <class Traits, bool = Traits::kFp8Products>
struct Fp8ProductSmem {};
template <class Traits>
struct Fp8ProductSmem<Traits, true> {
  cute::array_aligned<typename Traits::Element, Traits::kStages * Traits::kVtElems, 1024> vt;
  cute::array_aligned<typename Traits::OutElement, Traits::kOElems, 1024> o;
};

// The kernel's shared memory: Q's buffers (a query tile's O is staged in its Q's buffer, or
// with FP8 products in its own), the K and V stages (and Vt's), the O row offsets of two query
// tiles (one being stored while the next is set) and the barriers.
template <class Traits>
struct WarpSpecSmem {
  using Element = typename Traits::Element;
  using Pipeline = cutlass::PipelineTmaAsync<Traits::kStages>;
  using VtPipeline = cutlass::PipelineAsync<Traits::kStages>;  // FP8 products only
  cute::array_aligned<Element, Traits::kQBuffers * Traits::kQElems, 1024> q;
  cute::array_aligned<Element, Traits::kStages * Traits::kKVElems, 1024> k;
  cute::array_aligned<Element, Traits::kStages * Traits::kKVElems, 1024> v;
  Fp8ProductSmem<Traits> fp8;
  int64_t o_off[2][Traits::kBlockM];
  typename Pipeline::SharedStorage k_stages, v_stages;
  typename VtPipeline::SharedStorage vt_stages;
  cutlass::arch::ClusterTransactionBarrier q_full[Traits::kQBuffers];  // Q's bytes landed
  cutlass::arch::ClusterBarrier q_empty[Traits::kQBuffers];  // every consumer thread is done with the buffer
};

// The transpose's written-out offsets (vt_transpose.h k_major_offset) are the CuTe layouts' (a
// few points of each tile, at compile time).
template <class Traits>
constexpr bool transpose_offsets_match() {
  if constexpr (Traits::kFp8Products) {
    constexpr int kN = Traits::kBlockN, kD = Traits::kHeadDim;
    typename Traits::SmemLayoutKV v{};
    typename Traits::SmemLayoutVt vt{};
    for (int r : {0, 1, 7, 9, kN - 1}) {
      for (int c : {0, 8, 17, 100, kD - 8}) {
        if (int(v(r, c)) != k_major_offset<128, kN>(r, c)) return false;
      }
    }
    constexpr int kVtRowBytes = VtTransposeSteps<kN, kD>::kVtRowBytes;
    for (int r : {0, 3, 6, 13, kD - 1}) {
      for (int c : {0, 8, 24, 40, 72, kN - 8}) {
        if (c >= kN) continue;  // (72: past a 64-key tile)
        if (int(vt(r, c)) != k_major_offset<kVtRowBytes, kD>(r, c)) return false;
      }
    }
  }
  return true;
}

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
  static_assert(transpose_offsets_match<Traits>(), "vt_transpose.h k_major_offset follows the tile layouts");
  static_assert(row_units_contiguous<Element, typename Traits::SmemLayoutKV>(), "zero_tile_rows stores 16-byte units");
  using Pipeline = typename Smem::Pipeline;
  using VtPipeline = typename Smem::VtPipeline;
  using Stage = typename Pipeline::PipelineState;
  constexpr bool kFp8 = Traits::kFp8Products;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  extern __shared__ __align__(1024) char smem_bytes[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_bytes);

  // ---- the query tiles of this CTA, one per round (tile_of_round; one split, dense K/V)
  const int m_blocks = query_tiles_per_unit<kBlockM>(p);
  const int tiles_total = m_blocks * p.batch * units_per_sequence(p);  // < 2^31 (launch_tile_loop)
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
  // V: loaded for the consumers, or with FP8 products for the transposing warps, whose Vt stages
  // go to the consumers through vt_pipe.
  const bool transposer = kFp8 && warpgroup == kProducerWarpgroup && threadIdx.x >= 32;
  typename Pipeline::Params v_stages = stages;
  typename VtPipeline::Params vt_stages;
  if constexpr (kFp8) {
    v_stages.num_consumers = kVTransposeThreads;
    v_stages.role = threadIdx.x < 32 ? Pipeline::ThreadCategory::Producer  // (warp 0; its lane 0 leads)
                    : transposer     ? Pipeline::ThreadCategory::Consumer
                                     : Pipeline::ThreadCategory::NonParticipant;
    vt_stages.role = transposer ? VtPipeline::ThreadCategory::Producer
                     : warpgroup != kProducerWarpgroup ? VtPipeline::ThreadCategory::Consumer
                                                       : VtPipeline::ThreadCategory::NonParticipant;
    vt_stages.producer_arv_count = kVTransposeThreads;
    vt_stages.consumer_arv_count = kConsumerThreads;
  }
  Pipeline v_pipe(smem.v_stages, v_stages, Shape<_1, _1, _1>{});
  [[maybe_unused]] VtPipeline vt_pipe(smem.vt_stages, vt_stages);
  if (threadIdx.x == 0) {
    for (int b = 0; b < Traits::kQBuffers; ++b) {
      smem.q_full[b].init(1);
      smem.q_empty[b].init(kConsumerThreads);
    }
  }
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  auto k_stage = [&](int s) { return make_tensor(make_smem_ptr(smem.k.data() + s * Traits::kKVElems), typename Traits::SmemLayoutKV{}); };
  auto v_stage = [&](int s) { return make_tensor(make_smem_ptr(smem.v.data() + s * Traits::kKVElems), typename Traits::SmemLayoutKV{}); };
  // V as the B operand of P V: stage s of V seen as (d, keys), or with FP8 products Vt's stage s
  auto vt_stage = [&](int s) {
    if constexpr (kFp8) {
      return make_tensor(make_smem_ptr(smem.fp8.vt.data() + s * Traits::kVtElems), typename Traits::SmemLayoutVt{});
    } else {
      return make_tensor(make_smem_ptr(smem.v.data() + s * Traits::kKVElems), typename Traits::SmemLayoutVt{});
    }
  };
  // The first row of a query tile's first key tile (tiles.hi - 1) whose packed K/V row lies past
  // the sequence's keys and may hold any value (tma_tiles.h keys_end_before_their_rows), else
  // kBlockN: that stage's V rows from there are zeroed before P V reads them.
  auto first_foreign_row = [&](const CtaInfo& c, const CtaKeyTiles& tiles) {
    const int past_end = c.seq.seqlen_k - (tiles.hi - 1) * kBlockN;
    return keys_end_before_their_rows(p) && past_end < kBlockN ? past_end : kBlockN;
  };
  // Q's buffer of the i-th query tile, and the parity of the barriers' phase of its use: every
  // query tile loads its Q once (also one with no visible key, which stores zeros through the
  // buffer), so the j-th use of a buffer completes its q_full for the j-th time, and the
  // consumers release it (q_empty) for the j-th time.
  auto q_buffer = [&](int i) { return i % Traits::kQBuffers; };
  auto q_parity = [&](int i) { return uint32_t(i / Traits::kQBuffers) & 1u; };
  auto q_tile = [&](int i) {
    return make_tensor(make_smem_ptr(smem.q.data() + q_buffer(i) * Traits::kQElems), typename Traits::SmemLayoutQ{});
  };
  if (warpgroup == kProducerWarpgroup) {
    // ---- producer: warp 0 issues the loads (with FP8 products, warps 1-3 transpose V)
    cutlass::arch::warpgroup_reg_dealloc<kFp8 ? kTransposingProducerRegisters : kProducerRegisters>();
    if constexpr (kFp8) {
      if (transposer) {
        // ---- warps 1-3: each V stage into a Vt stage, in the loads' order
        Stage v_read;
        Stage vt_write = cutlass::make_producer_start_state<VtPipeline>();
        for (int round = 0, tile; (tile = tile_of_round(round)) < tiles_total; ++round) {
          CtaInfo c;
          if (!make_tile_info<kBlockM>(p, tile, m_blocks, c)) continue;
          const CtaKeyTiles tiles = cta_key_tiles<kBlockM, kBlockN>(p, c, 0);
          for (int n = tiles.hi - 1; n >= tiles.lo; --n) {
            v_pipe.consumer_wait(v_read);
            const int foreign = n == tiles.hi - 1 ? first_foreign_row(c, tiles) : kBlockN;
            if (foreign < kBlockN) {  // zeros in V's rows past the keys, then Vt's keys are zeros
              zero_tile_rows(v_stage(v_read.index()), foreign, int(threadIdx.x) - 32, kVTransposeThreads);
              transposers_sync();
            }
            vt_pipe.producer_acquire(vt_write);
            const uint32_t v_base = shared_address(smem.v.data() + v_read.index() * Traits::kKVElems);
            const uint32_t vt_base = shared_address(smem.fp8.vt.data() + vt_write.index() * Traits::kVtElems);
            transpose_v_tile<kBlockN, kHeadDim, kVTransposeWarps>(v_base, vt_base, int(threadIdx.x) / 32 - 1,
                                                                 int(threadIdx.x) % 32);
            cutlass::arch::fence_view_async_shared();  // the generic writes, before the consumers' wgmma reads
            vt_pipe.producer_commit(vt_write);
            v_pipe.consumer_release(v_read);
            ++v_read;
            ++vt_write;
          }
        }
        return;
      }
    }
    // warp 0: lane 0 issues the loads of Q and of whole K/V tiles; with paged K/V in slabs, lane
    // i loads slab i of each key tile (tma_load_page_slab). Without slabs lane 0 runs alone, as
    // the producer did before paged K/V (D-81).
    const bool paged = p.block_table != nullptr;
    const bool slabs = paged && !pages_hold_whole_tiles<Traits>(p);
    if (threadIdx.x >= (slabs ? 32 : 1)) return;
    const int lane = int(threadIdx.x);
    const bool leader = lane == 0;
    Stage k_write = cutlass::make_producer_start_state<Pipeline>();
    Stage v_write = k_write;
    int q_loads = 0;
    for (int round = 0, tile; (tile = tile_of_round(round)) < tiles_total; ++round) {
      CtaInfo c;
      if (!make_tile_info<kBlockM>(p, tile, m_blocks, c)) continue;
      const CtaKeyTiles tiles = cta_key_tiles<kBlockM, kBlockN>(p, c, 0);
      const int k_row0 = int(c.seq.k_row_offset) + c.seq.leftpad;  // key 0's row
      Tensor gQ = tma_rows(tma.q, tma.q_rows, p, p.num_heads, c.head, c.b, int(c.seq.q_row_offset));
      Tensor gK = tma_rows(tma.k, tma.kv_rows, p, p.num_heads_k, c.hk, c.seq.kv_batch, k_row0);
      Tensor gV = tma_rows(tma.v, tma.kv_rows, p, p.num_heads_k, c.hk, c.seq.kv_batch, k_row0);
      auto load_q = [&]() {  // once the buffer's previous query tile is stored
        const int b = q_buffer(q_loads);
        if (q_loads >= Traits::kQBuffers) smem.q_empty[b].wait(q_parity(q_loads - Traits::kQBuffers));
        if (leader) {
          smem.q_full[b].arrive_and_expect_tx(Traits::kTileBytesQ);
          tma_load_tile(tma.q, reinterpret_cast<uint64_t&>(smem.q_full[b]), gQ, c.m0 / kBlockM, q_tile(q_loads));
        }
        ++q_loads;
      };
      // Key tile n of K or V into a stage (the stage's barrier expects the tile's bytes: the
      // pipeline's leader, lane 0, arrived on it in producer_acquire); paged, each lane's slab
      // from `page` (tma_tiles.h: a whole tile from lane 0's where pages hold whole tiles).
      auto load_kv = [&](const auto& tile_tma, const auto& slab_tma, const auto& gRows, uint64_t& barrier, int n,
                         int page, Element* stage) {
        auto whole_tile = [&](const auto& rows, int tile) {
          tma_load_tile(tile_tma, barrier, rows, tile, make_tensor(make_smem_ptr(stage), typename Traits::SmemLayoutKV{}));
        };
        if (!paged) {
          if (leader) whole_tile(gRows, n);
        } else if (pages_hold_whole_tiles<Traits>(p)) {
          if (leader) {
            whole_tile(tma_rows(tile_tma, tma.kv_rows, p, p.num_heads_k, c.hk, page, 0),
                       n * kBlockN % p.page_size / kBlockN);
          }
        } else if (lane < kPageSlabsPerTile<Traits>) {
          tma_load_page_slab<Traits>(slab_tma, tma.kv_rows, barrier, p, c.hk, n, lane, page, stage);
        }
      };
      // With two Q buffers Q goes first (its buffer was freed a query tile ago); with one, after
      // the tile's first K, which does not wait for the previous tile's O stores.
      constexpr bool kQFirst = Traits::kQBuffers > 1;
      if (kQFirst || tiles.hi <= tiles.lo) load_q();
      // paged: this lane's block_table entry of the next tile to load, read a tile ahead
      int entry = paged ? slab_table_entry<Traits>(p, c, tiles.hi - 1, lane) : 0;
      for (int n = tiles.hi - 1; n >= tiles.lo; --n) {
        const int page = paged ? checked_slab_page(p, c, entry) : 0;
        if (paged && n > tiles.lo) entry = slab_table_entry<Traits>(p, c, n - 1, lane);
        k_pipe.producer_acquire(k_write);
        load_kv(tma.k, tma.k_slabs, gK, *k_pipe.producer_get_barrier(k_write), n, page,
                smem.k.data() + k_write.index() * Traits::kKVElems);
        ++k_write;
        if (!kQFirst && n == tiles.hi - 1) load_q();
        v_pipe.producer_acquire(v_write);
        load_kv(tma.v, tma.v_slabs, gV, *v_pipe.producer_get_barrier(v_write), n, page,
                smem.v.data() + v_write.index() * Traits::kKVElems);
        ++v_write;
      }
    }
    return;
  }

  // ---- consumers: warpgroups 1 and 2, threads 0..255 of the two-warpgroup MMAs
  cutlass::arch::warpgroup_reg_alloc<kFp8 ? kTransposingConsumerRegisters : kConsumerRegisters>();
  const int tid = threadIdx.x - kWarpgroupThreads;
  typename Traits::TiledMmaS mma_s;
  typename Traits::TiledMmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor acc_o = partition_fragment_C(mma_o, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  Tensor o_rc = make_tensor(acc_o.data(), gmma_acc_to_rowcol(acc_o.layout()));
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS = thr_s.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), gmma_acc_to_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;
  auto s_tile = [&]() { return partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{}); };
  // P, the A operand of P V: in S's accumulator layout, so that converting is element by
  // element (tOrP views it as the operand); with FP8 products, e4m3 in the operand's layout, in
  // Vt's key order (fp8_operands.h).
  auto make_p = [&]() {
    if constexpr (kFp8) {
      return make_tensor<Element>(partition_shape_A(mma_o, Shape<Int<kBlockM>, Int<kBlockN>>{}));
    } else {
      return make_tensor<Element>(s_tile().layout());
    }
  };
  Tensor rP = make_p();
  auto p_operand = [&]() {
    if constexpr (kFp8) {
      return make_tensor(rP.data(), rP.layout());
    } else {
      return make_tensor(rP.data(), gmma_acc_to_a_operand(rP.layout()));
    }
  };
  Tensor tOrP = p_operand();
  auto set_p = [&](const auto& acc_s) {
    if constexpr (kFp8) {
      p_to_fp8_operand(acc_s, rP);
    } else {
      CUTE_UNROLL
      for (int e = 0; e < size(acc_s); ++e) rP(e) = static_cast<Element>(acc_s(e));
    }
  };
  // The V stage of P V: ready, and done with.
  auto v_wait = [&](Stage s) {
    if constexpr (kFp8) {
      vt_pipe.consumer_wait(s);
    } else {
      v_pipe.consumer_wait(s);
    }
  };
  auto v_release = [&](Stage s) {
    if constexpr (kFp8) {
      vt_pipe.consumer_release(s);
    } else {
      v_pipe.consumer_release(s);
    }
  };
  Stage k_read, v_read;  // consumers start at phase 0
  int q_loads = 0;
  // Each consumer warpgroup computes, stages and stores its own 64 rows of a tile (D-80).
  const int consumer = warpgroup - 1, tid_in_warpgroup = tid % kWarpgroupThreads;
  constexpr int kOwnRows = kBlockM / kConsumerWarpgroups;
  const int own_row0 = consumer * kOwnRows;
  // O through TMA (tma.o_by_tma, D-82): thread 0 of each warpgroup issues its rows' store. Its
  // share of releasing Q's buffer (where O is staged) waits until the store has read the rows,
  // which it checks at the next query tile, after that tile's setup.
  const bool o_store_leader = tma.o_by_tma && tid_in_warpgroup == 0;
  int o_stored_q_buffer = -1;  // the Q buffer whose release o_store_leader owes, or -1
  auto release_stored_q_buffer = [&]() {
    if (o_stored_q_buffer >= 0) {
      tma_store_wait<0>();
      smem.q_empty[o_stored_q_buffer].arrive();
      o_stored_q_buffer = -1;
    }
  };

  for (int round = 0, tile; (tile = tile_of_round(round)) < tiles_total; ++round) {
    CtaInfo c;
    if (!make_tile_info<kBlockM>(p, tile, m_blocks, c)) continue;
    const CtaKeyTiles tiles = cta_key_tiles<kBlockM, kBlockN>(p, c, 0);
    const int key_tiles = tiles.hi - tiles.lo;
    // Where threads store O: the O row offsets of this warpgroup's rows of the tile, beside those
    // of the previous tile that its stores may still read (this tile's consumer_warpgroup_sync
    // ends them).
    for (int r = own_row0 + tid_in_warpgroup; !tma.o_by_tma && r < own_row0 + kOwnRows; r += kWarpgroupThreads) {
      const int row = c.m0 + r;
      const PackedRow pr = tile_row_query(p, c, row);
      smem.o_off[q_loads & 1][r] = row < c.rows ? o_offset(p, c.seq, c.b, pr.query, pr.head) : kNoRow;
    }
    clear(acc_o);
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

    Tensor tSrQ = thr_s.partition_fragment_A(q_tile(q_loads));
    if (o_store_leader) release_stored_q_buffer();  // (with one Q buffer, this tile's Q waits on it)
    smem.q_full[q_buffer(q_loads)].wait(q_parity(q_loads));
    if (key_tiles > 0) {
      TensorCoreTurns turns(warpgroup - 1, key_tiles);

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
      if constexpr (!kFp8) {  // (FP8 products: the transposing warps zero them)
        const int foreign = first_foreign_row(c, tiles);
        if (foreign < kBlockN) {  // V's rows past the keys: zeros, before either warpgroup's P V
          v_wait(v_read);
          zero_tile_rows(v_stage(v_read.index()), foreign, tid, kConsumerThreads);
          cutlass::arch::fence_view_async_shared();  // the generic writes, before wgmma reads them
          consumers_sync();
        }
      }

      // then S of tile n with P V of tile n+1 on the tensor cores, the softmax of tile n under P V
      for (--n; n >= tiles.lo; --n) {
        k_pipe.consumer_wait(k_read);
        Tensor acc_s_next = s_tile();
        turns.take();
        wgmma_issue<true>(mma_s, tSrQ, thr_s.partition_fragment_B(k_stage(k_read.index())), acc_s_next);
        v_wait(v_read);
        wgmma_issue<false>(mma_o, tOrP, thr_o.partition_fragment_B(vt_stage(v_read.index())), acc_o);
        turns.pass();
        warpgroup_wait<1>();  // S of tile n
        warpgroup_fence_operand(acc_s_next);
        k_pipe.consumer_release(k_read);
        ++k_read;
        softmax_of_tile(acc_s_next, n);
        // The wait for P V opens a basic block of its own, the rescale's skip (rows_need_rescale):
        // in one block with the softmax, ptxas scheduled the wait first and the softmax (max,
        // exp2, sums) after it, off the tensor cores' time (D-78)
        if (rows_need_rescale<kRows>(correction)) {
          warpgroup_wait<0>();  // P V of tile n+1
          warpgroup_fence_operand(acc_o);
          rescale_rows(o_rc, correction);
        } else {
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc_o);
        }
        v_release(v_read);
        ++v_read;
        set_p(acc_s_next);
      }

      // last P V
      v_wait(v_read);
      wgmma_issue<false>(mma_o, tOrP, thr_o.partition_fragment_B(vt_stage(v_read.index())), acc_o);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      v_release(v_read);
      ++v_read;
    }

    // ---- epilogue: each warpgroup normalises its own 64 rows of O into Q's buffer (which only
    // its own products read; FP8 products: O's own buffer), then stores them, through TMA or
    // with 16-byte row stores, with no wait on the other warpgroup; then Q's buffer goes back
    // to the producer (its generic-proxy accesses ordered before the next TMA write)
    auto staged_o = [&]() {
      if constexpr (kFp8) {
        return smem.fp8.o.data();
      } else {
        return smem.q.data() + q_buffer(q_loads) * Traits::kQElems;
      }
    };
    Tensor sO = make_tensor(make_smem_ptr(staged_o()), typename Traits::SmemLayoutO{});
    // O's own buffer: this warpgroup's stores of the previous query tile are done with it first
    if constexpr (kFp8) {
      if (o_store_leader) tma_store_wait<0>();
      consumer_warpgroup_sync(consumer);
    }
    stage_wgmma_o(p, c, sc, thr_o, acc_o, rows, sO);
    if (tma.o_by_tma) {
      cutlass::arch::fence_view_async_shared();  // the staged rows, before the TMA store reads them
      consumer_warpgroup_sync(consumer);
      if (o_store_leader) tma_store_o_half<Traits>(tma.o, p, c.b, c.head, c.m0 / kBlockM, consumer, staged_o());
      if (o_store_leader && !kFp8) {
        o_stored_q_buffer = q_buffer(q_loads);
      } else {
        smem.q_empty[q_buffer(q_loads)].arrive();
      }
    } else {
      consumer_warpgroup_sync(consumer);
      store_warpgroup_o_rows<kOwnRows>(p, sO, own_row0, smem.o_off[q_loads & 1], tid_in_warpgroup);
      cutlass::arch::fence_view_async_shared();
      smem.q_empty[q_buffer(q_loads)].arrive();
    }
    ++q_loads;
  }
  if (o_store_leader) {
    release_stored_q_buffer();
    tma_store_wait<0>();  // the shared memory stays until the last store has read it
  }
#endif
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
