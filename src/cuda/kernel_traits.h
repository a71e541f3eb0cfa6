// Compile-time configuration of the forward attention kernel: one traits struct per
// (Element, kHeadDim), holding the tile shape, the thread count, the CuTe shared-memory layouts,
// the tiled MMA and the shared-memory copy atoms. Everything else is a run-time parameter.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_types.h>

#include "common/rules.h"
#include "common/tuning.h"
#include "cuda/components/cta_geometry.h"
#include "cuda/components/fp8_operand_order.h"
#include "cuda/components/warp_roles.h"

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
// decode at batch 32 measured compute-bound that way (2.5 TB/s, docs/DECISIONS.md D-12).
template <int kHeadDim>
struct ShortTileConfig {
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
  // one only, which drops the other's code (DecodeTileConfig).
  static constexpr KvLayouts kKvLayouts = KvLayouts::either;
  // Whether the K/V copies ask the L2 to evict their lines first (DecodeTraits).
  static constexpr bool kKvEvictFirst = false;
  // How Q and K/V are stored in global memory, and O's type there: as Element here; FP8 e4m3
  // (and the fp8 decode pipeline's bf16 q and O over fp16 tiles) in Fp8Storage.
  using QStorage = Element;
  using KvStorage = Element;
  using OutElement = Element;
  static constexpr bool kQFp8 = false, kKvFp8 = false, kQRescaled = false;
  static constexpr bool kFp8Pipeline = false;  // DecodePipeline::fp8 (DecodeTraits)
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

// ---- decode: the 16-row tile of the splitkeys, persistent and heads-split kernels ----------------------------------------------------------
//
// At most 16 query rows per (batch, head) — or per (batch, KV head) with GQA packing — as in
// decode (rules.h query_tile_rows). One 16-row MMA slab; each of the 4 warps takes a quarter of
// every K/V tile (kBlockN / 4 keys) with its own online softmax, and the warps merge their
// (max, sum, O) through shared memory at the end. Against the 64-row tile (4 warps x 16 rows,
// each warp all keys) this is 4x fewer tensor-core operations per K/V byte, and with kStages
// K/V buffers the next tile streams in during the whole of this one.
// How the four warps of a decode tile share its work: each a quarter of every K/V tile's keys
// (merged at the end), each a quarter of the head dim (short split walks, no merge: D-19), or
// each a unit of its own (splitheads_kernel.h, no merge: D-32).
enum class WarpSplit { keys, dims, heads };

// The K/V pipeline of a decode kernel:
//   standard:    2 stages (one tile in flight) at 3 CTAs per SM, for many CTAs (D-14);
//   deep:        5 stages (four tiles in flight) at one CTA per SM, d <= 128, for few CTAs with
//                short walks (D-16);
//   three_stage: 3 stages at 2 CTAs per SM: the persistent grid, whose producer and consumer
//                state spilled at the standard pipeline's 3 CTAs per SM (D-29), and the
//                heads-split kernel (its Q is four tiles).
//   fp8:         e4m3 K/V (Fp8Storage) in kCopyStages e4m3 stages (two tiles in flight) at 3
//                CTAs per SM, each warp copying and computing only its own keys, its MMA
//                operands widened straight from the stages: no Element K/V buffer
//                (components/fp8_warp_kv.h, D-66, D-83).
enum class DecodePipeline { standard, deep, three_stage, fp8 };

template <int kHeadDim, WarpSplit kWarps, DecodePipeline kPipeline, KvLayouts kLayout>
struct DecodeTileConfig {
  static constexpr bool kDeep = kPipeline == DecodePipeline::deep;
  static constexpr bool kThreeStage = kPipeline == DecodePipeline::three_stage;
  static constexpr bool kFp8 = kPipeline == DecodePipeline::fp8;
  static constexpr int kBlockM = 16, kBlockN = FwdTileConfig<kHeadDim>::kBlockN, kNWarps = 4;
  // Element K/V buffers (kStages each of K and V; none on the fp8 pipeline), and the stages the
  // copies stream through (the same buffers, except for the fp8 pipeline's e4m3 stages).
  static constexpr int kStages = kDeep ? 5 : kThreeStage ? 3 : kFp8 ? 1 : 2;
  static constexpr int kKvBuffers = kFp8 ? 0 : 2 * kStages;
  static constexpr int kCopyStages = kFp8 ? kFp8DecodeCopyStages : kStages;
  // (The fp8 pipeline's paged kernel holds its lanes' pages of the next tile: at 3 CTAs per SM
  // it spilled 100-120 bytes at d = 128 and ran at 0.73-0.80x our bf16 decode; at 2, D-66.)
  static constexpr int kMinBlocksPerSm = kDeep                                ? 1
                                         : kThreeStage                        ? 2
                                         : kFp8 && kLayout == KvLayouts::paged ? 2
                                         : kHeadDim <= 128                    ? 3
                                                                              : 1;
  static constexpr int kMaxSmemBytes = (kDeep ? 227 : 160) * 1024;  // sm_90 / sm_80 per-block limit
  // Compiled for one K/V layout: the contiguous kernels keep the page-table code out of their
  // mainloop (D-22). The deep pipeline reads contiguous K/V only (D-18).
  static constexpr KvLayouts kKvLayouts = kLayout;
  static_assert(kLayout != KvLayouts::either, "a decode kernel is compiled for one K/V layout");
  static_assert(!(kDeep && kLayout == KvLayouts::paged), "the deep pipeline reads contiguous K/V");
  // Splitting the head dim: d = 64 and 128 only (16 and 32 columns of O per warp; d = 192's 48
  // do not tile the swizzled V layout).
  static constexpr bool kWarpsSplitDims = kWarps == WarpSplit::dims;
  static constexpr bool kWarpsSplitHeads = kWarps == WarpSplit::heads;
  static_assert(!kWarpsSplitDims || kHeadDim == 64 || kHeadDim == 128, "dims split: d = 64 and 128");
  static_assert(!kDeep || kHeadDim <= kDeepDecodeMaxHeadDim, "the deep pipeline's head dims");
  static_assert(!kWarpsSplitHeads || (kThreeStage && kLayout == KvLayouts::contiguous && kHeadDim <= 128),
                "heads split: contiguous K/V, three stages");
  static_assert(!kFp8 || (kWarps == WarpSplit::keys && fp8_warp_kv_head_dim(kHeadDim)),
                "fp8 pipeline: keys split, whole 16-byte copies spread evenly over a warp");
};

template <typename Element_, int kHeadDim_, WarpSplit kWarps = WarpSplit::keys,
          DecodePipeline kPipeline = DecodePipeline::standard, KvLayouts kLayout = KvLayouts::contiguous>
struct DecodeTraits
    : TileTraitsBase<Element_, kHeadDim_, DecodeTileConfig<kHeadDim_, kWarps, kPipeline, kLayout>::kBlockM,
                     DecodeTileConfig<kHeadDim_, kWarps, kPipeline, kLayout>::kBlockN,
                     DecodeTileConfig<kHeadDim_, kWarps, kPipeline, kLayout>::kNWarps> {
  using Config = DecodeTileConfig<kHeadDim_, kWarps, kPipeline, kLayout>;
  using Base = TileTraitsBase<Element_, kHeadDim_, Config::kBlockM, Config::kBlockN, Config::kNWarps>;
  using Base::kBlockM, Base::kBlockN, Base::kNWarps, Base::kHeadDim;
  static constexpr int kStages = Config::kStages;
  static constexpr int kCopyStages = Config::kCopyStages;
  static constexpr int kKvBuffers = Config::kKvBuffers;
  static constexpr bool kFp8Pipeline = Config::kFp8;
  static constexpr KvLayouts kKvLayouts = Config::kKvLayouts;
  static constexpr bool kWarpsSplitDims = Config::kWarpsSplitDims;
  static constexpr bool kWarpsSplitHeads = Config::kWarpsSplitHeads;
  // The split-dims kernels copy K/V evict-first, so that their lines replace each other rather
  // than other data in the L2: measured (docs/DECISIONS.md D-20), decode calls whose
  // K/V fit the L2 gained 2-6% (batch 1 x 1k, 8 x 1k) and calls streaming ten times the L2 lost
  // 3-6%; a split-dims call walks at most tuning.h kSplitDimsMaxTiles tiles per CTA (~4 x 64
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

  // The column of O that an accumulator column c of the warps' O holds: c, except on the fp8
  // pipeline, whose P V reads each lane's V bytes in place (components/fp8_warp_kv.h, D-83).
  __host__ __device__ static constexpr int o_column(int c) {
    if constexpr (kFp8Pipeline) {
      return fwd::Fp8OperandOrder<kHeadDim>::o_column(c);
    } else {
      return c;
    }
  }

  // Merge buffers: per warp and row its max and sum, and its O slab in fp32 (rows padded by 8
  // floats against bank conflicts), laid over the K/V buffers once the mainloop is done; and
  // the CTA's split LSE per row for a combine inside a cluster (splitkeys_kernel.h
  // SplitPartial, whose O is warp 0's slab).
  static constexpr int kMergeRowFloats = kHeadDim + 8;
  static constexpr int kSmemMergeOBytes = kNWarps * kBlockM * kMergeRowFloats * int(sizeof(float));
  static constexpr int kSmemMergeStatBytes = (2 * kNWarps + 1) * kBlockM * int(sizeof(float));
  // (The fp8 pipeline's merge overlays its e4m3 stages instead: Fp8Storage.)
  static_assert(kFp8Pipeline || kSmemMergeOBytes <= kKvBuffers * Base::kSmemKVBytes, "merge fits the K/V buffers");

  // Row offset tables: int64 per Q row and O row (paged K/V is read without one: PagedRows).
  static constexpr int kSmemRowOffsetBytes = 2 * kBlockM * int(sizeof(int64_t));
  // Q, kStages x (K, V), the row offset tables, the merge statistics (the CTA geometry stays in
  // registers: this kernel has registers to spare).
  static constexpr int kSmemBytes = Base::kSmemQBytes + kKvBuffers * Base::kSmemKVBytes +
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


template <int kHeadDim, WgmmaTile kTile>
struct WgmmaTileConfig {
  static constexpr bool kTwoPerSm = kTile != WgmmaTile::wide;
  static constexpr int kBlockN = kTile == WgmmaTile::narrow96 ? 96 : (kTwoPerSm || kHeadDim > 128) ? 64 : 128;
  static constexpr int kMinBlocksPerSm = kTwoPerSm ? 2 : 1;
  // K/V stages: one tile in flight while one is computed (three stages at d = 64, two tiles in
  // flight, measured no faster: docs/DECISIONS.md D-4).
  static constexpr int kStages = 2;
  static_assert(kTile != WgmmaTile::automatic, "a compiled tile");
  static_assert(kTile != WgmmaTile::narrow96 || kHeadDim == 64, "96-key narrow tile: d = 64 only");
};

// The two products of a 128-row tile by two warpgroups stacked along M (64 rows each): S = Q K^T
// from shared memory, O += P V with P from registers and V as kMajorV (MN: V as loaded; K: the
// FP8 products' transposed Vt).
template <typename Element, int kBlockN, int kHeadDim, cute::GMMA::Major kMajorV>
struct TwoWarpgroupMmas {
  using S = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kBlockN>, cute::Int<kHeadDim>>>(),
      cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));
  using O = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kHeadDim>, cute::Int<kBlockN>>,
                                 cute::GMMA::Major::K, kMajorV>(),
      cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));
};

// The shared-memory layouts and warpgroup MMAs of a kBlockM x kBlockN tile computed by two
// warpgroups stacked along M (64 rows each): the wgmma kernel and the warp-specialised one.
template <typename Element, int kBlockM, int kBlockN, int kHeadDim>
struct WgmmaTileLayouts {
  static_assert(kHeadDim % 64 == 0, "rows of whole 128-byte swizzle atoms");
  static_assert(kBlockM == 128, "two warpgroups of 64 rows");
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

  using TiledMmaS = typename TwoWarpgroupMmas<Element, kBlockN, kHeadDim, cute::GMMA::Major::MN>::S;
  using TiledMmaO = typename TwoWarpgroupMmas<Element, kBlockN, kHeadDim, cute::GMMA::Major::MN>::O;

  static constexpr int kQElems = int(cute::cosize_v<SmemLayoutQ>);
  static constexpr int kKVElems = int(cute::cosize_v<SmemLayoutKV>);
};

// What the two kernels of two-warpgroup tiles share: the tile base (its copy partition for 8
// warps) and the layouts above, with their names in one scope.
template <typename Element_, int kHeadDim_, int kBlockN_>
struct TwoWarpgroupTileTraits : TileTraitsBase<Element_, kHeadDim_, 128, kBlockN_, 8>,
                                WgmmaTileLayouts<Element_, 128, kBlockN_, kHeadDim_> {
  using Base = TileTraitsBase<Element_, kHeadDim_, 128, kBlockN_, 8>;
  using Layouts = WgmmaTileLayouts<Element_, 128, kBlockN_, kHeadDim_>;
  using Base::kBlockM, Base::kBlockN, Base::kHeadDim;
  using Element = Element_;
  using typename Layouts::SmemLayoutAtom, typename Layouts::SmemLayoutQ, typename Layouts::SmemLayoutKV,
      typename Layouts::SmemLayoutVt;
  using Layouts::kQElems, Layouts::kKVElems;
};

template <typename Element_, int kHeadDim_, WgmmaTile kTile = WgmmaTile::wide>
struct WgmmaTraits : TwoWarpgroupTileTraits<Element_, kHeadDim_, WgmmaTileConfig<kHeadDim_, kTile>::kBlockN> {
  using Config = WgmmaTileConfig<kHeadDim_, kTile>;
  using Shared = TwoWarpgroupTileTraits<Element_, kHeadDim_, Config::kBlockN>;
  using Shared::kBlockM, Shared::kBlockN, Shared::kQElems, Shared::kKVElems;
  using typename Shared::Element;
  static constexpr int kMinBlocksPerSm = Config::kMinBlocksPerSm;
  static constexpr int kStages = Config::kStages;

  // Row offset tables: int64 per Q row and O row, (K, V) int64 pairs per stage.
  static constexpr int kSmemRowOffsetBytes = (2 * kBlockM + 2 * kStages * kBlockN) * int(sizeof(int64_t));
  static constexpr int kSmemBytes =
      (kQElems + 2 * kStages * kKVElems) * int(sizeof(Element)) + kSmemRowOffsetBytes;
  static_assert(kSmemBytes <= 227 * 1024, "fits the SM90 per-block shared memory limit");
};

// The warp-specialised kernel (warpspec_kernel.h): a 128-row tile computed by two consumer
// warpgroups, its K/V tiles loaded by a producer warpgroup through TMA into kStages stages.
// 128 keys per tile up to d = 128, 64 above (so that O, S and P fit in a consumer's registers).
template <int kHeadDim>
struct WarpSpecTileConfig {
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : 64;
  static constexpr int kStages = 2;
};

template <typename Element_, int kHeadDim_>
struct WarpSpecTraits : TwoWarpgroupTileTraits<Element_, kHeadDim_, WarpSpecTileConfig<kHeadDim_>::kBlockN> {
  using Config = WarpSpecTileConfig<kHeadDim_>;
  using Shared = TwoWarpgroupTileTraits<Element_, kHeadDim_, Config::kBlockN>;
  using Shared::kBlockM, Shared::kQElems, Shared::kKVElems;
  using typename Shared::Element;
  static constexpr int kStages = Config::kStages;
  // The launch: a producer warpgroup besides the 8 consumer warps of the base (whose count the O
  // store's copy partition keeps).
  static constexpr int kNThreads = fwd::kWarpSpecThreads;
  static constexpr int kMinBlocksPerSm = 1;
  static constexpr int kTileBytesQ = kQElems * int(sizeof(Element));
  static constexpr int kTileBytesKV = kKVElems * int(sizeof(Element));
  // Shared memory past Q's buffers: kStages x (K, V), the O row offsets of two query tiles, and
  // 1 KB for the barriers (warpspec_kernel.h WarpSpecSmem, whose size is checked against this).
  static constexpr int kSmemBesideQ = 2 * kStages * kTileBytesKV + 2 * kBlockM * 8 + 1024;
  static constexpr int kSmemLimit = 227 * 1024;  // per block on sm_90
  // Two Q buffers where they fit (d <= 192), so that the next query tile's Q loads while O is
  // staged through the current one (D-71).
  static constexpr int kQBuffers = 2 * kTileBytesQ + kSmemBesideQ <= kSmemLimit ? 2 : 1;
  static constexpr int kSmemBytes = kQBuffers * kTileBytesQ + kSmemBesideQ;
  static_assert(kSmemBytes <= kSmemLimit, "fits the SM90 per-block shared memory limit");
  static constexpr bool kFp8Products = false;  // WarpSpecFp8Traits
  using SmemLayoutO = typename Shared::SmemLayoutQ;  // O is staged in Q's buffer (not the base's layout)
};

// The warp-specialised kernel on e4m3 Q, K and V with both products in FP8 (docs/DECISIONS.md
// D-75): the tiles stay e4m3 in shared memory, S = Q K^T and O += P V run as e4m3 wgmma, and O
// (bf16) is staged in a buffer of its own. FP8 wgmma reads only K-major operands, so V (keys x d,
// d contiguous, as TMA lands it) is transposed by the producer warpgroup into Vt (d x keys, keys
// contiguous; components/fp8_operands.h). d = 128 and 256 (whole 128-byte rows of e4m3); 128 keys
// per tile at d = 128, 64 at d = 256 (O's 128 registers per thread leave no room for a wider S).
template <int kHeadDim>
struct WarpSpecFp8TileConfig {
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : 64;
  static constexpr int kStages = 2;
};

template <int kHeadDim_>
struct WarpSpecFp8Traits {
  using Element = cutlass::float_e4m3_t;     // Q, K, V and P
  using OutElement = cutlass::bfloat16_t;    // O (an e4m3 q computes in bf16: api/validate.cpp)
  using ElementAccum = float;
  using Config = WarpSpecFp8TileConfig<kHeadDim_>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = Config::kBlockN;
  static constexpr int kStages = Config::kStages;
  static_assert(kHeadDim % 128 == 0, "rows of whole 128-byte swizzle atoms of e4m3");
  static constexpr bool kFp8Products = true;
  static constexpr bool kQFp8 = true, kKvFp8 = true;
  // O's staging layout and its row stores: those of the bf16 kernel of the same tile.
  using OutTraits = TwoWarpgroupTileTraits<OutElement, kHeadDim, kBlockN>;
  using SmemLayoutAtom = cute::GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  // Vt: (d, keys), keys contiguous (K-major for P V), rows of kBlockN bytes.
  using SmemLayoutAtomVt = std::conditional_t<kBlockN % 128 == 0, cute::GMMA::Layout_K_SW128_Atom<Element>,
                                              cute::GMMA::Layout_K_SW64_Atom<Element>>;
  using SmemLayoutVt = decltype(cute::tile_to_shape(
      SmemLayoutAtomVt{}, cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{}));
  using SmemLayoutO = typename OutTraits::SmemLayoutQ;
  using TiledMmaS = typename TwoWarpgroupMmas<Element, kBlockN, kHeadDim, cute::GMMA::Major::K>::S;
  using TiledMmaO = typename TwoWarpgroupMmas<Element, kBlockN, kHeadDim, cute::GMMA::Major::K>::O;

  static constexpr int kQElems = int(cute::cosize_v<SmemLayoutQ>);
  static constexpr int kKVElems = int(cute::cosize_v<SmemLayoutKV>);
  static constexpr int kVtElems = int(cute::cosize_v<SmemLayoutVt>);
  static constexpr int kOElems = int(cute::cosize_v<SmemLayoutO>);
  static constexpr int kNThreads = fwd::kWarpSpecThreads;
  static constexpr int kMinBlocksPerSm = 1;
  static constexpr int kDefaultSmemLimit = 48 * 1024;
  static constexpr int kTileBytesQ = kQElems;  // one byte per element
  static constexpr int kTileBytesKV = kKVElems;
  // Shared memory past Q's buffers: kStages x (K, V as loaded, Vt), O's staging buffer, the O
  // row offsets of two query tiles, and 1 KB for the barriers.
  static constexpr int kSmemBesideQ = kStages * (2 * kTileBytesKV + kVtElems) +
                                      kOElems * int(sizeof(OutElement)) + 2 * kBlockM * 8 + 1024;
  static constexpr int kSmemLimit = 227 * 1024;
  static constexpr int kQBuffers = 2 * kTileBytesQ + kSmemBesideQ <= kSmemLimit ? 2 : 1;
  static constexpr int kSmemBytes = kQBuffers * kTileBytesQ + kSmemBesideQ;
  static_assert(kSmemBytes <= kSmemLimit, "fits the SM90 per-block shared memory limit");
};

// The base's kMinBlocksPerSm, 1 where it has none (FwdTraits: fwd_kernel launches with 1).
template <class T, class = void>
struct MinBlocksPerSm {
  static constexpr int value = 1;
};
template <class T>
struct MinBlocksPerSm<T, std::void_t<decltype(T::kMinBlocksPerSm)>> {
  static constexpr int value = T::kMinBlocksPerSm;
};

// ---- FP8 storage (docs/DECISIONS.md D-64) ---------------------------------------------------
//
// The kernel of Base reading K/V (and, kQFp8, Q) stored as e4m3 bytes. The tiles stay Element
// tiles in the base's layouts, so the MMAs, the softmax and the epilogue are the base's: each
// 16-byte Element chunk of a tile has an 8-byte e4m3 twin in a mirror buffer after the base's
// shared memory (byte e of the mirror <-> element e of the tile, swizzle included), which an
// 8-byte cp.async fills; after its copies land, each thread widens its own chunks into the tile
// (tile_loads.h convert_tile), exactly (every e4m3 value is a bf16 and an fp16 value). The
// descales join the softmax scale and the output factor (score_rules.h ScoreScale).
// The decode kernel's fp8 pipeline (DecodePipeline::fp8) streams K/V through kMirrorStages
// e4m3 stages of its own layout (row-major, pieces swapped per line: components/fp8_warp_kv.h),
// whose bytes widen straight into MMA operands; its warps' merge overlays the e4m3 stages once
// the mainloop is done.
// kMirrorStages: the e4m3 K and V stages (the base's stages, or its kCopyStages).
// OutElement: O's type, and q's when q is not e4m3: the base's Element, or bf16 over the fp8
// pipeline's fp16 tiles (kQRescaled: Q is converted into its tile times a power of two,
// fp8_warp_kv.h rescale_q_into_fp16).
template <class Base, bool kQFp8_, int kMirrorStages_, class OutElement_ = typename Base::Element>
struct Fp8Storage : Base {
  using OutElement = OutElement_;
  using QStorage = std::conditional_t<kQFp8_, uint8_t, OutElement>;
  using KvStorage = uint8_t;
  static constexpr bool kQFp8 = kQFp8_, kKvFp8 = true;
  static constexpr bool kQRescaled = !kQFp8 && !std::is_same_v<QStorage, typename Base::Element>;
  static_assert(!kQRescaled || (Base::kFp8Pipeline && sizeof(QStorage) == 2 &&
                                std::is_same_v<typename Base::Element, cutlass::half_t>),
                "a 16-bit q of another type: the fp8 pipeline's fp16 tiles only");
  static constexpr int kMirrorStages = kMirrorStages_;
  static constexpr int kMirrorOffset = (Base::kSmemBytes + 127) / 128 * 128;
  static constexpr int kQMirrorBytes = kQFp8 ? Base::kSmemQBytes / 2 : 0;
  static constexpr int kKvMirrorBytes = Base::kSmemKVBytes / 2;
  static constexpr int kSmemBytes = kMirrorOffset + kQMirrorBytes + 2 * kMirrorStages * kKvMirrorBytes;
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 per-block shared memory limit");
  // The CTAs per SM the mirrors leave room for (228 KB per SM, 1 KB reserved per CTA), at most
  // the base's: the register cap of __launch_bounds__ follows it, so that registers are not
  // capped for CTAs that cannot be resident (the cap of 3 spilled 88/136 bytes at d = 128,
  // D-65).
  static constexpr int kSmemBlocksPerSm = (228 * 1024) / (kSmemBytes + 1024);  // >= 1 by the assert
  static constexpr int kMinBlocksPerSm =
      kSmemBlocksPerSm < MinBlocksPerSm<Base>::value ? kSmemBlocksPerSm : MinBlocksPerSm<Base>::value;
  // The mirrors in the kernel's shared memory: Q's, then the K stages, then the V stages.
  __device__ __forceinline__ static uint8_t* q_mirror(char* smem) {
    return reinterpret_cast<uint8_t*>(smem + kMirrorOffset);
  }
  __device__ __forceinline__ static uint8_t* k_mirror(char* smem, int stage) {
    return reinterpret_cast<uint8_t*>(smem + kMirrorOffset + kQMirrorBytes + stage * kKvMirrorBytes);
  }
  __device__ __forceinline__ static uint8_t* v_mirror(char* smem, int stage) {
    return k_mirror(smem, kMirrorStages + stage);
  }
};

// Where a decode kernel's warps merge their O (merge_warps_and_store): over the K/V buffers,
// or, on the fp8 pipeline (whose one K/V buffer is too small), over its e4m3 stages.
template <class Traits>
struct WarpsMergeOver {
  __device__ __forceinline__ static float* buffer(char* smem, void* kv_buffers) {
    if constexpr (Traits::kFp8Pipeline) {
      static_assert(2 * Traits::kMirrorStages * Traits::kKvMirrorBytes >= Traits::kSmemMergeOBytes,
                    "the merge fits the e4m3 stages");
      return reinterpret_cast<float*>(Traits::k_mirror(smem, 0));
    } else {
      (void)smem;
      return static_cast<float*>(kv_buffers);
    }
  }
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
