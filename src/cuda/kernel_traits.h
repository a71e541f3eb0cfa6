// Compile-time configuration of the forward attention kernel: one traits struct per
// (Element, kHeadDim), holding the tile shape, the thread count, the CuTe shared-memory layouts,
// the tiled MMA and the shared-memory copy atoms. Everything else is a run-time parameter.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_types.h>

#include "common/rules.h"
#include "cuda/components/cta_geometry.h"

namespace flashattn {
namespace cuda {

// The K/V cache layouts a kernel is compiled to read (TileTraitsBase::kKvLayouts).
enum class KvLayouts { either, contiguous, paged };

// ---- tile shape per head dim ---------------------------------------------------------------
//
// FlashAttention-2's Hopper (non-sm8x) choices for its SM80 mainloop. kBlockN must divide
// rules.h splitkv_block_n(head_dim) for every head dim this instance serves, since the split-KV
// path cuts at splitkv_block_n-key units exactly as the CPU backend does.
template <int kHeadDim>
struct FwdTileConfig;

// d = 32: the 128x128 S tile keeps 4 warps busy with little per-tile overhead (254 regs, no spill).
template <> struct FwdTileConfig<32> { static constexpr int kBlockM = 128, kBlockN = 128, kNWarps = 4; };
// d = 64: 128x128 (FA2's choice) spills ~800 bytes with nvcc 13.0; 128x64 uses 228 registers.
template <> struct FwdTileConfig<64> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4; };
// d = 96, 128: 128x64 with 4 warps: 64 KB (d=128) of smem, <= 255 registers, 2 CTAs per SM.
template <> struct FwdTileConfig<96> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4; };
template <> struct FwdTileConfig<128> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4; };
// d = 192, 256: 8 warps so the O accumulator (kBlockM x d fp32) fits in registers; 96 / 128 KB smem.
template <> struct FwdTileConfig<192> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 8; };
template <> struct FwdTileConfig<256> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 8; };

// Decode and short query blocks (rules.h query_tile_rows: at most 64 rows per (batch, head),
// GQA-packed rows included): 64-row tiles, 16 rows per warp, as FlashAttention-2's split-KV kernel. A 128-row
// tile holding 4 packed rows spends twice the tensor-core time per K/V tile on empty rows, and
// decode at batch 32 measured compute-bound that way (2.5 TB/s, docs/PERF.md).
template <int kHeadDim>
struct DecodeTileConfig {
  static constexpr int kBlockM = 64, kBlockN = FwdTileConfig<kHeadDim>::kBlockN, kNWarps = 4;
};

template <typename Element>
struct MmaAtomFor;
template <>
struct MmaAtomFor<cutlass::half_t> {
  using type = cute::SM80_16x8x16_F32F16F16F32_TN;
};
template <>
struct MmaAtomFor<cutlass::bfloat16_t> {
  using type = cute::SM80_16x8x16_F32BF16BF16F32_TN;
};

// What every tile shape shares: element types, the swizzled shared-memory layouts of Q, K, V
// and O, the copy atoms, and the global->shared copy partition.
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_>
struct TileTraitsBase {
  using Element = Element_;
  using ElementAccum = float;
  using index_t = int64_t;

  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per CTA
  static constexpr int kBlockN = kBlockN_;  // key rows per K/V tile
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;

  // One cp.async moves 16 bytes = 8 elements ("a chunk") of one row.
  static constexpr int kChunkBytes = 16;
  static constexpr int kElemsPerChunk = kChunkBytes / int(sizeof(Element));

  static_assert(kHeadDim % 32 == 0, "head dim instances are multiples of 32");
  static_assert(kBlockN % 16 == 0, "K/V tiles are whole MMA K steps");

  // ---- shared memory: rows of 64 (or 32) elements swizzled in 8-row atoms so that both the
  // 16-byte cp.async writes and the ldmatrix reads are bank-conflict free.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kBlockKSmem == 32 ? 2 : 3;
  using SmemLayoutAtom = decltype(cute::composition(
      cute::Swizzle<kSwizzleBits, 3, 3>{},
      cute::Layout<cute::Shape<cute::_8, cute::Int<kBlockKSmem>>,
                   cute::Stride<cute::Int<kBlockKSmem>, cute::_1>>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  // V seen as (d, n) for the P·V product (B operand, K-major = n).
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{},
                                        cute::GenRowMajor{})));
  using SmemLayoutVtNoSwizzle = decltype(cute::get_nonswizzle_portion(SmemLayoutVt{}));
  using SmemLayoutO = SmemLayoutQ;  // O is staged in Q's buffer

  // ---- global <-> shared copies: each thread moves 16-byte chunks; a row of kBlockKSmem
  // elements is spread over kGmemThreadsPerRow threads, other threads take other rows, at most
  // kBlockM rows per pass (threads past kGmemThreads sit the copies out).
  // Only used to partition smem (static per-thread offsets); the global side is gathered per row.
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / kElemsPerChunk;
  static_assert(kNThreads % kGmemThreadsPerRow == 0, "whole rows per pass");
  static constexpr int kGmemRowsPerPass =
      cute::min(kNThreads / kGmemThreadsPerRow, kBlockM);
  static constexpr int kGmemThreads = kGmemRowsPerPass * kGmemThreadsPerRow;
  static_assert(kBlockM % kGmemRowsPerPass == 0 && kBlockN % kGmemRowsPerPass == 0,
                "tiles are whole passes");
  using GmemLayoutAtom =
      cute::Layout<cute::Shape<cute::Int<kGmemRowsPerPass>, cute::Int<kGmemThreadsPerRow>>,
                   cute::Stride<cute::Int<kGmemThreadsPerRow>, cute::_1>>;
  using GmemTiledCopy = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, Element>{}, GmemLayoutAtom{},
      cute::Layout<cute::Shape<cute::_1, cute::Int<kElemsPerChunk>>>{}));

  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomO = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<128>, Element>;

  static constexpr int kSmemQBytes = int(cute::cosize_v<SmemLayoutQ>) * int(sizeof(Element));
  static constexpr int kSmemKVBytes = int(cute::cosize_v<SmemLayoutKV>) * int(sizeof(Element));
  // The CTA's geometry (fwd_kernel.h CtaInfo), re-read from smem inside the mainloop.
  static constexpr int kSmemCtaInfoBytes = 128;
  static constexpr int kDefaultSmemLimit = 48 * 1024;
  // The K/V layouts the kernel is compiled for: either (p.block_table decides at run time), or
  // one only, which drops the other's code (SplitKeysTileConfig).
  static constexpr KvLayouts kKvLayouts = KvLayouts::either;
  // Whether the K/V copies ask the L2 to evict their lines first (SplitKeysTraits).
  static constexpr bool kKvEvictFirst = false;
};

template <typename Element_, int kHeadDim_, class TileConfig = FwdTileConfig<kHeadDim_>>
struct FwdTraits : TileTraitsBase<Element_, kHeadDim_, TileConfig::kBlockM, TileConfig::kBlockN,
                                  TileConfig::kNWarps> {
  using Base = TileTraitsBase<Element_, kHeadDim_, TileConfig::kBlockM, TileConfig::kBlockN,
                              TileConfig::kNWarps>;
  using Base::kBlockM, Base::kBlockN, Base::kNWarps;
  static_assert(kBlockM % (16 * kNWarps) == 0, "each warp owns whole 16-row MMA slabs");

  // ---- MMA: kNWarps warps stacked along M, each a 16-row slab; N/K tiled by 16 so that
  // ldmatrix.x4 feeds whole 16x16 B fragments.
  using TiledMma = cute::TiledMMA<cute::MMA_Atom<typename MmaAtomFor<Element_>::type>,
                                  cute::Layout<cute::Shape<cute::Int<kNWarps>, cute::_1, cute::_1>>,
                                  cute::Tile<cute::Int<16 * kNWarps>, cute::_16, cute::_16>>;

  // Row offset tables: int64 per Q row and O row, (K, V) int64 pairs for two key tiles.
  static constexpr int kSmemRowOffsetBytes = (2 * kBlockM + 2 * 2 * kBlockN) * int(sizeof(int64_t));
  // Q, K, V (one buffer each), then the row offset tables, then the CTA geometry.
  static constexpr int kSmemBytes = Base::kSmemQBytes + 2 * Base::kSmemKVBytes +
                                    kSmemRowOffsetBytes + Base::kSmemCtaInfoBytes;
  static_assert(kSmemBytes <= 160 * 1024, "fits the SM80 per-block shared memory limit");
};

// ---- decode: warps split the keys ----------------------------------------------------------
//
// At most 16 query rows per (batch, head) — or per (batch, KV head) with GQA packing — as in
// decode (rules.h query_tile_rows). One 16-row MMA slab; each of the 4 warps takes a quarter of
// every K/V tile (kBlockN / 4 keys) with its own online softmax, and the warps merge their
// (max, sum, O) through shared memory at the end. Against the 64-row tile (4 warps x 16 rows,
// each warp all keys) this is 4x fewer tensor-core operations per K/V byte, and with kStages
// K/V buffers the next tile streams in during the whole of this one.
// Two pipelines. Default: 2 K/V stages (one tile in flight while one is computed) at 3 CTAs
// per SM, for many CTAs (3 stages at 2 CTAs per SM measured 2-4% slower at batch 8-32).
// Deep (kDeep, d <= 128, sm_90's shared memory): 5 stages (four tiles in flight) at one CTA per
// SM, for few CTAs with short key walks, where the default pipeline leaves the memory system
// waiting (make_plan's rule; docs/PERF.md, session 3).
// Persistent (kPersistent, d = 64 and 128; persistent_decode_kernel.h: each CTA walks several
// units with one pipeline through them, where that fills the waves better, rules.h
// persistent_decode_ctas): 3 stages (two tiles in flight) at 2 CTAs per SM. At the default's 2
// stages and 3 CTAs per SM its producer's and consumer's state spilled 176 bytes to local
// memory, which the L1 left beside the shared memory could not hold: 18% slower at batch 128 x
// 1k (docs/PERF.md, session 12).
// Heads split (kSplitHeads, d = 64 and 128, contiguous K/V; splitheads_kernel.h: each warp computes
// one of the CTA's kNWarps units whole, where rules.h decode_warps_split_heads says so): 3 stages
// at 2 CTAs per SM, as the persistent grid (its Q is kNWarps tiles).
template <int kHeadDim, bool kDeep, bool kSplitDims, bool kPaged, bool kPersistent = false, bool kSplitHeads = false>
struct SplitKeysTileConfig {
  static constexpr int kBlockM = 16, kBlockN = FwdTileConfig<kHeadDim>::kBlockN, kNWarps = 4;
  static constexpr int kStages = kDeep ? 5 : (kPersistent || kSplitHeads) ? 3 : 2;
  static constexpr int kMinBlocksPerSm = kDeep ? 1 : (kPersistent || kSplitHeads) ? 2 : kHeadDim <= 128 ? 3 : 1;
  static constexpr int kMaxSmemBytes = (kDeep ? 227 : 160) * 1024;  // sm_90 / sm_80 per-block limit
  // kPaged: compiled for paged K/V (PagedRows) and for it only; the contiguous kernels keep the
  // page-table code, its registers and instructions out of their mainloop (measured: a kernel
  // serving both spilled, and contiguous calls on it lost 2-3% at batch 32 x 1k; docs/PERF.md,
  // session 10). The deep pipeline serves contiguous K/V only (make_plan).
  static constexpr KvLayouts kKvLayouts = kPaged ? KvLayouts::paged : KvLayouts::contiguous;
  static_assert(!(kDeep && kPaged), "the deep pipeline reads contiguous K/V");
  // kSplitDims: the warps split the head dim instead of the keys, at d = 64 and 128 (16 and 32
  // columns of O per warp; d = 192's 48 do not tile the swizzled V layout). Every warp computes
  // the tile's whole S (4x the Q K^T tensor work, which short walks can afford: rules.h
  // decode_warps_split_dims) and its own columns of O, so the warps need no merge at the end
  // (three barriers and ~200 instructions of a one-tile CTA's ~1,400, docs/PERF.md session 5).
  static constexpr bool kWarpsSplitDims = kSplitDims && (kHeadDim == 64 || kHeadDim == 128);
  static_assert(!kDeep || kHeadDim <= kDeepDecodeMaxHeadDim, "the deep pipeline's head dims");
  static_assert(!kPersistent || (!kDeep && !kSplitDims && kHeadDim <= 128),
                "persistent: the default keys-split kernel");
  static constexpr bool kWarpsSplitHeads = kSplitHeads;
  static_assert(!kSplitHeads || (!kDeep && !kSplitDims && !kPaged && !kPersistent && kHeadDim <= 128),
                "heads split: contiguous K/V, the default pipeline's tiles");
};

template <typename Element_, int kHeadDim_, bool kDeep = false, bool kSplitDims = false, bool kPaged = false,
          bool kPersistent = false, bool kSplitHeads = false>
struct SplitKeysTraits
    : TileTraitsBase<Element_, kHeadDim_, SplitKeysTileConfig<kHeadDim_, kDeep, kSplitDims, kPaged>::kBlockM,
                     SplitKeysTileConfig<kHeadDim_, kDeep, kSplitDims, kPaged>::kBlockN,
                     SplitKeysTileConfig<kHeadDim_, kDeep, kSplitDims, kPaged>::kNWarps> {
  using Config = SplitKeysTileConfig<kHeadDim_, kDeep, kSplitDims, kPaged, kPersistent, kSplitHeads>;
  using Base = TileTraitsBase<Element_, kHeadDim_, Config::kBlockM, Config::kBlockN, Config::kNWarps>;
  using Base::kBlockM, Base::kBlockN, Base::kNWarps, Base::kHeadDim;
  static constexpr int kStages = Config::kStages;
  static constexpr KvLayouts kKvLayouts = Config::kKvLayouts;
  static constexpr bool kWarpsSplitDims = Config::kWarpsSplitDims;
  static constexpr bool kWarpsSplitHeads = Config::kWarpsSplitHeads;
  // The split-dims kernels copy K/V evict-first, so that their lines replace each other rather
  // than other data in the L2: measured (docs/PERF.md, session 5 runs 2-4), decode calls whose
  // K/V fit the L2 gained 2-6% (batch 1 x 1k, 8 x 1k) and calls streaming ten times the L2 lost
  // 3-6%; a split-dims call walks at most rules.h kSplitDimsMaxTiles tiles per CTA (~4 x 64
  // keys over a few waves of CTAs: about the L2's size). The other kernels copy plainly. (The
  // same hint on the Q copies of unsplit prefill measured nothing.)
  static constexpr bool kKvEvictFirst = kWarpsSplitDims;
  // Each warp's keys of a K/V tile and columns of O.
  static constexpr int kKeysPerWarp = kWarpsSplitDims ? kBlockN : kBlockN / kNWarps;
  static constexpr int kDimsPerWarp = kWarpsSplitDims ? kHeadDim / kNWarps : kHeadDim;
  static_assert(kBlockM == 16, "one MMA slab of rows");
  // Whole MMA K steps, so a warp's key slice also starts on a swizzle atom row (8 rows).
  static_assert(kKeysPerWarp % 16 == 0, "each warp's keys are whole MMA K steps");
  static_assert(kDimsPerWarp % 16 == 0, "each warp's O columns are whole MMA N tiles");

  // One warp's MMA: 16 rows x (its keys or its O columns), tiled by 16 for ldmatrix.x4.
  using TiledMma = cute::TiledMMA<cute::MMA_Atom<typename MmaAtomFor<Element_>::type>,
                                  cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>,
                                  cute::Tile<cute::_16, cute::_16, cute::_16>>;
  // One warp's slice of a K tile (kKeysPerWarp, d) and of V seen as (kDimsPerWarp, kKeysPerWarp).
  using WarpKeys = cute::Shape<cute::Int<kKeysPerWarp>, cute::Int<kHeadDim>>;
  using WarpKeysT = cute::Shape<cute::Int<kDimsPerWarp>, cute::Int<kKeysPerWarp>>;
  using SmemLayoutVtWarpNoSwizzle = decltype(cute::make_layout(
      WarpKeysT{}, cute::GenRowMajor{}));  // fragment shape only

  // Merge buffers: per warp and row its max and sum, and its O slab in fp32 (rows padded by 8
  // floats against bank conflicts), laid over the K/V buffers once the mainloop is done; and
  // the CTA's split LSE per row for a combine inside a cluster (splitkeys_kernel.h
  // SplitPartial, whose O is warp 0's slab).
  static constexpr int kMergeRowFloats = kHeadDim + 8;
  static constexpr int kSmemMergeOBytes = kNWarps * kBlockM * kMergeRowFloats * int(sizeof(float));
  static constexpr int kSmemMergeStatBytes = (2 * kNWarps + 1) * kBlockM * int(sizeof(float));
  static_assert(kSmemMergeOBytes <= 2 * kStages * Base::kSmemKVBytes, "merge fits the K/V buffers");

  // Row offset tables: int64 per Q row and O row (paged K/V is read without one: PagedRows).
  static constexpr int kSmemRowOffsetBytes = 2 * kBlockM * int(sizeof(int64_t));
  // Q, kStages x (K, V), the row offset tables, the merge statistics (the CTA geometry stays in
  // registers: this kernel has registers to spare).
  static constexpr int kSmemBytes = Base::kSmemQBytes + 2 * kStages * Base::kSmemKVBytes +
                                    kSmemRowOffsetBytes + kSmemMergeStatBytes;
  static_assert(kSmemBytes <= Config::kMaxSmemBytes, "fits the per-block shared memory limit");
  // CTAs per SM the kernel is compiled for (a register cap of 65536 / (that x threads)): ~71 KB
  // of smem at d = 128 lets three share an SM; above d = 128, one (~139 KB at d = 256); the deep
  // pipeline, one (~170 KB at d = 128).
  static constexpr int kMinBlocksPerSm = Config::kMinBlocksPerSm;
};

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

// ---- shared memory of the decode kernels that size it beyond their traits -------------------

// splitheads_kernel: kNWarps Q tiles, kStages x (K, V).
template <class Traits>
constexpr int splitheads_smem_bytes() {
  return Traits::kNWarps * Traits::kSmemQBytes + 2 * Traits::kStages * Traits::kSmemKVBytes;
}

// persistent_decode_kernel: kStages x (Q, K, V, unit, lengths), the Q/O row offsets, the merge
// statistics.
template <class Traits>
constexpr int persistent_decode_smem_bytes() {
  return Traits::kStages * (Traits::kSmemQBytes + 2 * Traits::kSmemKVBytes + int(sizeof(fwd::DecodeUnit)) +
                            kSeqInfoReads * int(sizeof(int))) +
         Traits::kSmemRowOffsetBytes + 2 * Traits::kNWarps * Traits::kBlockM * int(sizeof(float));
}

}  // namespace cuda
}  // namespace flashattn
