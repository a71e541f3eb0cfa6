// The Hopper (sm_90a) forward kernel: the FlashAttention-2 walk of fwd_kernel.h with its two
// products on warpgroup MMAs (wgmma) instead of mma.sync.
//
// A CTA of two warpgroups owns 128 query rows (64 per warpgroup) of one (batch, head) and walks
// the visible key tiles from the last down. Q, K and V are gathered row by row with cp.async
// exactly as in fwd_kernel.h (paging, varlen, leftpad, packed GQA and arbitrary strides stay one
// code path), into the swizzled 128-byte layouts that wgmma reads straight from shared memory.
//
// kStages K/V buffers let tiles n-1 ... n-kStages+1 stream in during tile n. Per tile n, one
// barrier:
//   wait tile n; fence to the async proxy; barrier | issue tile n-kStages+1 |
//   S = Q K^T (wgmma, smem x smem) | rules, online softmax | O += P V (wgmma, P from registers)
// The narrow tile (two CTAs per SM) lets one CTA's softmax run under the other's MMAs.
// FlashAttention-3's intra-warpgroup pipelining (S of tile n-1 issued before the softmax of tile
// n) was measured no faster here on top of that (docs/PERF.md, session 2 run 4) and is not used.
// Used for the 128-row tile when the device is sm_90 and there is one split (fwd_launch_template.h).
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/fwd_kernel.h"

namespace flashattn {
namespace cuda {

// Tiles of the wgmma kernel (head dims 64, 128, 192, 256: rows of whole 128-byte swizzle
// atoms). Wide: kBlockN 128 (64 for d > 128, so that O and S fit in registers), one CTA per SM.
// Narrow: kBlockN 64 and two CTAs per SM (<= 128 registers; smem 48 KB at d = 64, 100 KB at
// d = 128), so that one CTA's softmax and prologue overlap the other's tensor-core work.
// Narrow96: the narrow tile with 96 keys, for d = 64 (O needs 32 registers there, so a 96-key S
// still fits 128 registers; 128 keys spill): fewer barriers and K/V tiles per key.
enum class WgmmaTile { wide, narrow, narrow96 };

template <int kHeadDim, WgmmaTile kTile>
struct WgmmaTileConfig {
  static constexpr bool kTwoPerSm = kTile != WgmmaTile::wide;
  static constexpr int kBlockN = kTile == WgmmaTile::narrow96 ? 96 : (kTwoPerSm || kHeadDim > 128) ? 64 : 128;
  static constexpr int kMinBlocksPerSm = kTwoPerSm ? 2 : 1;
  // K/V stages: one tile in flight while one is computed (three stages at d = 64, two tiles in
  // flight, measured no faster: docs/PERF.md, session 4 run 8).
  static constexpr int kStages = 2;
  static_assert(kTile != WgmmaTile::narrow96 || kHeadDim == 64, "96-key narrow tile: d = 64 only");
};

template <typename Element_, int kHeadDim_, WgmmaTile kTile = WgmmaTile::wide>
struct WgmmaTraits
    : TileTraitsBase<Element_, kHeadDim_, 128, WgmmaTileConfig<kHeadDim_, kTile>::kBlockN, 8> {
  using Config = WgmmaTileConfig<kHeadDim_, kTile>;
  using Base = TileTraitsBase<Element_, kHeadDim_, 128, Config::kBlockN, 8>;
  using Base::kBlockM, Base::kBlockN, Base::kHeadDim;
  using Element = Element_;
  static constexpr int kMinBlocksPerSm = Config::kMinBlocksPerSm;
  static constexpr int kStages = Config::kStages;
  static_assert(kHeadDim % 64 == 0, "rows of whole 128-byte swizzle atoms");

  // K-major 128-byte swizzled layouts, as wgmma's shared-memory descriptors expect them.
  using SmemLayoutAtom = cute::GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  // V seen as (d, n): the B operand of P V, MN-major (d contiguous).
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{},
                                        cute::GenRowMajor{})));

  // Two warpgroups stacked along M, 64 rows each.
  using TiledMmaS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kBlockN>, cute::Int<kHeadDim>>>(),
      cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));
  using TiledMmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kHeadDim>, cute::Int<kBlockN>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));

  static constexpr int kQElems = int(cute::cosize_v<SmemLayoutQ>);
  static constexpr int kKVElems = int(cute::cosize_v<SmemLayoutKV>);
  // Row offset tables: int64 per Q row and O row, (K, V) int64 pairs per stage.
  static constexpr int kSmemRowOffsetBytes = (2 * kBlockM + 2 * kStages * kBlockN) * int(sizeof(int64_t));
  static constexpr int kSmemBytes =
      (kQElems + 2 * kStages * kKVElems) * int(sizeof(Element)) + kSmemRowOffsetBytes;
  static_assert(kSmemBytes <= 227 * 1024, "fits the SM90 per-block shared memory limit");
};

namespace fwd {

// wgmma accumulator ((2, 2, N/8), MMA_M, MMA_N) — (column pair, row + 8, 8-column block) —
// viewed as (rows = (2, MMA_M), cols = (2, N/8, MMA_N)).
template <class Layout>
__device__ __forceinline__ auto gmma_acc_to_rowcol(Layout acc) {
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

// The same accumulator as the register A operand of a 64xNx16 wgmma: ((2, 2, 2), MMA_M, N/16),
// two adjacent 8-column blocks forming one 16-wide K step.
template <class Layout>
__device__ __forceinline__ auto gmma_acc_to_a_operand(Layout acc) {
  auto l = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});  // (2, 2, (2, N/16))
  return make_layout(make_layout(get<0>(l), get<1>(l), get<2, 0>(l)), get<1>(acc),
                     coalesce(make_layout(get<2, 1>(l), get<2>(acc))));
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

// This thread's copies of contiguous K/V tiles, with everything but the tile's key offset
// worked out once per CTA. A tile's rows are kv_row_offset(j0) + r * row_stride (rules.h), so
// a thread's source is its key-0 address plus j0 * row_stride. Its destinations are the
// swizzled shared address of its first chunk plus compile-time offsets: the copy partition
// steps by kGmemRowsPerPass rows (a multiple of the swizzle's 8-row period) and by 64 columns
// (whole 128-byte atoms), so each step adds a multiple of 1024 bytes to the unswizzled offset,
// which the swizzle (on address bits 4-9) leaves alone. Through KvStages::issue
// (load_strided_rows) a d = 64 tile cost ~75 instructions per K or V tile and thread, most of
// them 64-bit generic-address and swizzle arithmetic redone per tile (SASS, docs/PERF.md
// session 6). The decode kernels keep KvStages::issue: no gain there (session 6 run 3).
template <class Traits>
struct ContiguousKvCopies {
  using Element = typename Traits::Element;
  static constexpr int kRowStep = Traits::kGmemRowsPerPass;
  static constexpr int kCopyRows = Traits::kBlockN / kRowStep;
  static constexpr int kCopyCols = Traits::kHeadDim / 64;
  static constexpr int kStageBytes = Traits::kKVElems * int(sizeof(Element));
  static_assert(kRowStep % 8 == 0 && Traits::kBlockKSmem == 64 && Traits::kGmemThreads == Traits::kNThreads,
                "partition steps are whole swizzle periods; every thread copies");
  // A K/V stage's layout as a tensor over a shared pointer holds the unswizzled offsets (a
  // GMMA layout's swizzle moves into the pointer).
  using PlainLayoutKV = decltype(make_tensor(make_smem_ptr(static_cast<Element*>(nullptr)),
                                             typename Traits::SmemLayoutKV{}).layout());

  uint32_t k_dst = 0;           // shared address of this thread's first chunk in K stage 0
  const Element* k0 = nullptr;  // its first chunk's source at key 0
  const Element* v0 = nullptr;
  int row = 0, col = 0;         // its first chunk's row within a tile, and column

  // The unswizzled element offset of copy (m, kk) from the thread's first chunk.
  __device__ __forceinline__ static int step_elems(int m, int kk) {
    return int(PlainLayoutKV{}(m * kRowStep, kk * 64));
  }

  __device__ __forceinline__ ContiguousKvCopies(const AttnParams& p, const CtaInfo& c, Element* smem_k, int tid) {
    if (reads_page_table<Traits>(p)) return;
    auto sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});
    auto part = copy_partition<Traits, Traits::kBlockN>(sK, tid);
    row = get<0>(get<1>(part)(0, 0, 0));
    col = get<1>(get<1>(part)(0, 0, 0));
    k_dst = static_cast<uint32_t>(__cvta_generic_to_shared(&get<0>(part)(0, 0, 0)));
    const int64_t k_key0 = kv_row_offset(p, c.seq, c.b, 0, p.k_batch_stride, p.k_row_stride, p.k_head_stride, c.hk);
    const int64_t v_key0 = kv_row_offset(p, c.seq, c.b, 0, p.v_batch_stride, p.v_row_stride, p.v_head_stride, c.hk);
    k0 = static_cast<const Element*>(p.k) + k_key0 + row * p.k_row_stride + col;
    v0 = static_cast<const Element*>(p.v) + v_key0 + row * p.v_row_stride + col;
  }

  // K and V of tile n into stage n % kStages, one commit group (possibly empty), as KvStages::issue.
  __device__ __forceinline__ void issue(const AttnParams& p, const CtaInfo& c, const CtaKeyTiles& tiles,
                                        int n) const {
    if (n >= tiles.lo) {
      const int j0 = n * Traits::kBlockN;
      const int rows_valid = c.seq.seqlen_k - j0;
      const uint32_t k_stage = k_dst + (unsigned(n) % Traits::kStages) * kStageBytes;
      const uint32_t v_stage = k_stage + Traits::kStages * kStageBytes;  // V's stages follow K's
      const Element* k = k0 + j0 * p.k_row_stride;
      const Element* v = v0 + j0 * p.v_row_stride;
      CUTE_UNROLL
      for (int m = 0; m < kCopyRows; ++m) {
        const bool row_ok = row + m * kRowStep < rows_valid;
        CUTE_UNROLL
        for (int kk = 0; kk < kCopyCols; ++kk) {
          const bool valid = row_ok && col + kk * 64 < p.head_dim;
          const uint32_t delta = uint32_t(step_elems(m, kk)) * uint32_t(sizeof(Element));
          // An invalid copy reads no byte (src-size 0), so its source address is never used.
          cp_async_16_to(k_stage + delta, k + m * kRowStep * p.k_row_stride + kk * 64, valid);
          cp_async_16_to(v_stage + delta, v + m * kRowStep * p.v_row_stride + kk * 64, valid);
        }
      }
    }
    cp_async_commit();
  }
};

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

  const ScoreScale sc(p);
  float row_max[kRows], row_sum[kRows];
  start_softmax_rows(row_max, row_sum);

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
    online_softmax_step(s, o_rc, row_max, row_sum, sc.scale_log2);

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
  Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});
  Tensor tOcO = thr_o.partition_C(cO);
  Tensor tOcO_rc = make_tensor(tOcO.data(), gmma_acc_to_rowcol(tOcO.layout()));
  const bool owns_row_lse = get<1>(tOcO_rc(0, 0)) == 0;  // one thread of each quad
  Tensor sO = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
  // O staged in Q's buffer two adjacent columns at a time: one 32-bit shared store (the swizzle
  // moves whole 16-byte chunks, so columns 2k and 2k+1 stay adjacent) at the address the CuTe
  // tensor gives (its swizzle acts on the address bits). Written through the tensor, these
  // were element-wise generic stores: 388 of a d = 64 s = 512 CTA's 4,726 instructions per
  // warp (docs/PERF.md, session 5 run 10).
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    const float sum = quad_allreduce_sum(row_sum[i]);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // no visible key: O = 0, LSE = -inf
    const int r = get<0>(tOcO_rc(i, 0));
    CUTE_UNROLL
    for (int d = 0; d < size<1>(o_rc); d += 2) {
      cutlass::Array<Element, 2> pair;
      pair[0] = static_cast<Element>(o_rc(i, d) * inv);
      pair[1] = static_cast<Element>(o_rc(i, d + 1) * inv);
      const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(&sO(r, get<1>(tOcO_rc(i, d)))));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(reinterpret_cast<const uint32_t&>(pair))
                   : "memory");
    }
    if (p.lse != nullptr && owns_row_lse && c.m0 + r < c.rows) {
      const PackedRow pr = tile_row_query(p, c, c.m0 + r);
      p.lse[lse_offset(p, c.seq, c.b, pr.query, pr.head)] =
          sum > 0.0f ? row_max[i] * sc.raw_scale + logf(sum) : -INFINITY;
    }
  }
  __syncthreads();

  store_o_rows<Traits>(p, sO, o_off, tid);
#endif
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
