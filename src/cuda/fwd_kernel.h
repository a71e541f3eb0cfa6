// The forward attention kernel (FlashAttention-2 mainloop, SM80 mma.sync through CuTe).
//
// A CTA owns kBlockM rows of one (batch, head) — with pack_gqa of one (batch, KV head), row r
// standing for (query r / g, head hk*g + r % g) — and one split of the visible key tiles.
// Q, K and V rows are gathered row by row through rules.h (varlen, paged KV with any page size,
// cache_batch_idx, leftpad, arbitrary strides and packed GQA are one code path): each thread
// issues 16-byte cp.async copies for (row, chunk) pairs into CuTe's swizzled smem layout.
//
// Per key tile n (walked from the last visible tile down):
//   wait K[n]; issue V[n]  |  S = Q K^T  |  score transform, ALiBi, mask (edge tiles only)
//   wait V[n]  |  online softmax (exp2)  |  issue K[n-1]  |  O += P V
// so V[n] streams in under Q K^T and K[n-1] under P V and the next tile's wait (FA2's pipeline,
// with K issued after the softmax to keep the fp32 scores and the copy addresses apart).
#pragma once

#include <cute/tensor.hpp>

#include "common/params.h"
#include "cuda/components/cta_geometry.h"
#include "cuda/components/epilogue.h"
#include "cuda/components/fragments.h"
#include "cuda/components/mma.h"
#include "cuda/components/online_softmax.h"
#include "cuda/components/score_rules.h"
#include "cuda/components/tile_loads.h"
#include "cuda/grid_dependence.h"
#include "cuda/kernel_traits.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1) fwd_kernel(const __grid_constant__ AttnParams p) {
  allow_dependent_launch();
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x;

  // ---- geometry: which rows, which sequence, which split
  CtaInfo c;
  if (!make_cta_info<kBlockM>(p, c)) return;
  const int split = blockIdx.y;
  const CtaKeyTiles tiles = cta_key_tiles<kBlockM, kBlockN>(p, c, split);
  const int tile_lo = tiles.lo, tile_hi = tiles.hi;

  // ---- shared memory tensors
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)),
                          typename Traits::SmemLayoutQ{});  // (kBlockM, kHeadDim)
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});  // (kBlockN, kHeadDim)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});  // (kBlockN, kHeadDim)
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});  // (kHeadDim, kBlockN)
  Tensor sVtNoSwizzle = make_tensor(sV.data().get(), typename Traits::SmemLayoutVtNoSwizzle{});

  // Row offset tables (after sV): Q and O rows of this CTA, K/V rows of two key tiles.
  int64_t* q_off = reinterpret_cast<int64_t*>(smem + Traits::kSmemQBytes + 2 * Traits::kSmemKVBytes);
  int64_t* o_off = q_off + kBlockM;
  KvRowOffsets* kv_off_buf = reinterpret_cast<KvRowOffsets*>(o_off + kBlockM);  // [2][kBlockN]
  auto kv_off = [&](int n) { return kv_off_buf + (n & 1) * kBlockN; };

  // The CTA geometry is read from smem from here on: a value re-read after each barrier is not
  // held in registers across the mainloop (measured: fewer spills at d = 128).
  static_assert(sizeof(CtaInfo) <= Traits::kSmemCtaInfoBytes, "CTA geometry fits its smem slot");
  CtaInfo* c_smem = reinterpret_cast<CtaInfo*>(kv_off_buf + 2 * kBlockN);
  if (tid == 0) *c_smem = c;

  // ---- start the loads: Q and the first (highest) K tile
  compute_q_o_offsets<Traits>(p, c, q_off, o_off, tid);
  if (tile_hi > tile_lo && reads_page_table<Traits>(p)) compute_kv_offsets<Traits>(p, c, tile_hi - 1, kv_off(tile_hi - 1), tid);
  __syncthreads();
  const CtaInfo& cs = *c_smem;
  // FP8 storage (Traits::kKvFp8): the e4m3 mirrors of Q, K and V (kernel_traits.h Fp8Storage).
  uint8_t* const q_fp8 = q_mirror<Traits>(smem);
  uint8_t* k_fp8 = nullptr;
  uint8_t* v_fp8 = nullptr;
  if constexpr (Traits::kKvFp8) k_fp8 = Traits::k_mirror(smem, 0), v_fp8 = Traits::v_mirror(smem, 0);
  if (tile_hi > tile_lo) {
    load_q<Traits>(p, q_off, sQ, tid, q_fp8);
    load_kv<Traits, false>(p, c, kv_off(tile_hi - 1), tile_hi - 1, sK, tid, k_fp8);
    cp_async_commit();
  }

  // ---- MMA partitions
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);            // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_mma.partition_fragment_B(sK);            // (MMA, MMA_N, MMA_K)
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);  // (MMA, MMA_K=d/8, MMA_N)
  Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_K)
  clear(acc_o);

  auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_copy_q = smem_copy_q.get_thread_slice(tid);
  Tensor tSsQ = smem_thr_copy_q.partition_S(sQ);
  auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_copy_k = smem_copy_k.get_thread_slice(tid);
  Tensor tSsK = smem_thr_copy_k.partition_S(sK);
  auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto smem_thr_copy_v = smem_copy_v.get_thread_slice(tid);
  Tensor tOsVt = smem_thr_copy_v.partition_S(sVt);

  // ---- this thread's rows: visible key range, ALiBi slope, softmax state
  // Coordinates (row, col) within the S tile of each accumulator element.
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS = thr_mma.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_to_rowcol(tScS.layout()));  // (rows, cols)
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;

  const ScoreScale sc(p, c.b, c.hk, Traits::kKvFp8);

  // Per row only the softmax state lives in registers (they are the scarce resource at d = 128);
  // the query index, visible range and ALiBi slope are re-derived on the tiles that need them.
  SoftmaxRowState rows[kRows];
  start_softmax_rows(rows);

  // ---- mainloop over key tiles, last first
  for (int n = tile_hi - 1; n >= tile_lo; --n) {
    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
    clear(acc_s);
    cp_async_wait<0>();
    if constexpr (Traits::kKvFp8) {
      convert_tile<Traits, kBlockN>(sK, k_fp8, tid);
      if (Traits::kQFp8 && n == tile_hi - 1) convert_tile<Traits, kBlockM>(sQ, q_fp8, tid);
    }
    __syncthreads();  // K[n] landed; every warp is done with V[n+1]
    load_kv<Traits, true>(p, cs, kv_off(n), n, sV, tid, v_fp8);
    cp_async_commit();
    // Offsets of tile n-1 into the other table (its last reader, V[n+1], was issued before the
    // barrier above); they are read after the next barrier.
    if (n > tile_lo && reads_page_table<Traits>(p)) compute_kv_offsets<Traits>(p, cs, n - 1, kv_off(n - 1), tid);

    gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, smem_copy_q, smem_copy_k, smem_thr_copy_q,
            smem_thr_copy_k);

    // score transform, ALiBi, mask
    Tensor s = make_tensor(acc_s.data(), acc_to_rowcol(acc_s.layout()));  // (kRows, kCols)
    const int j0 = n * kBlockN;
    const bool need_mask = !(j0 >= tiles.mask_free_lo && j0 + kBlockN <= tiles.mask_free_hi);
    apply_score_rules(p, cs, sc, s, tScS_rc, j0, need_mask);

    cp_async_wait<0>();
    if constexpr (Traits::kKvFp8) convert_tile<Traits, kBlockN>(sV, v_fp8, tid);
    __syncthreads();  // V[n] landed; every warp is done with K[n]

    // online softmax: new running max, rescale O and the sum, P = exp2(...)
    Tensor o_rc = make_tensor(acc_o.data(), acc_to_rowcol(acc_o.layout()));  // (kRows, d cols)
    online_softmax_step(s, o_rc, rows, sc.scale_log2);

    // O += P V
    Tensor rP = convert_fragment<Element>(acc_s);
    // K[n-1] is issued here rather than right after the barrier: the fp32 scores are dead by now,
    // so the address work does not compete with them for registers (measured: fewer spills).
    if (n > tile_lo) {
      load_kv<Traits, false>(p, cs, kv_off(n - 1), n - 1, sK, tid, k_fp8);
      cp_async_commit();
    }
    Tensor tOrP = make_tensor(rP.data(), acc_to_a_operand(rP.layout()));  // ((2,2,2), MMA_M, kBlockN/16)
    gemm_rs(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, smem_copy_v, smem_thr_copy_v);
  }

  // ---- epilogue: normalise, LSE, store
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with sQ/sK/sV; sQ becomes the O staging buffer

  Tensor o_rc = make_tensor(acc_o.data(), acc_to_rowcol(acc_o.layout()));
  float row_lse[kRows];
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    // A row with no visible key (or an empty split) writes 0 and LSE -inf.
    const SoftmaxResult row = sc.finish(quad_row_state(rows[i]));
    row_lse[i] = row.lse;
    CUTE_UNROLL
    for (int d = 0; d < size<1>(o_rc); ++d) o_rc(i, d) *= row.out_scale;
  }

  Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});
  Tensor tOcO = thr_mma.partition_C(cO);
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_to_rowcol(tOcO.layout()));
  const bool owns_row_lse = get<1>(tOcO_rc(0, 0)) == 0;  // one thread of each quad writes LSE

  if (p.num_splits > 1) {
    // fp32 partials of this split, straight from registers (2 adjacent columns per store).
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const int r = cs.m0 + get<0>(tOcO_rc(i, 0));
      if (r >= cs.rows) continue;
      const PackedRow pr = tile_row_query(p, cs, r);
      const int64_t row = accum_row(p, split, cs.b, pr.head, pr.query);
      float* o_row = p.o_accum + row * p.head_dim;
      CUTE_UNROLL
      for (int d = 0; d < size<1>(o_rc); d += 2) {
        const int col = get<1>(tOcO_rc(i, d));
        if (col < p.head_dim) {
          *reinterpret_cast<float2*>(o_row + col) = make_float2(o_rc(i, d), o_rc(i, d + 1));
        }
      }
      if (owns_row_lse) p.lse_accum[row] = row_lse[i];
    }
    return;
  }

  if (p.lse != nullptr && owns_row_lse) {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const int r = cs.m0 + get<0>(tOcO_rc(i, 0));
      if (r >= cs.rows) continue;
      const PackedRow pr = tile_row_query(p, cs, r);
      p.lse[lse_offset(p, cs.seq, cs.b, pr.query, pr.head)] = row_lse[i];
    }
  }

  // O: registers -> swizzled smem (Element) -> 16-byte coalesced stores per row.
  Tensor rO = convert_fragment<Element>(acc_o);
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});  // (kBlockM, kHeadDim)
  auto smem_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_copy_o = smem_copy_o.get_thread_slice(tid);
  Tensor taccOrO = smem_thr_copy_o.retile_S(rO);
  Tensor taccOsO = smem_thr_copy_o.partition_D(sO);
  copy(smem_copy_o, taccOrO, taccOsO);
  __syncthreads();

  store_o_rows<Traits>(p, sO, o_off, tid);
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
