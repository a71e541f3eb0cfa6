// The kernel choice (src/api/kernel_choice.cpp) and the tuning rules it applies
// (src/common/tuning.h), with an H200's facts passed in so that it runs on the CPU: one test per
// rule, restated with the shapes it was measured on (docs/DECISIONS.md), and the override.
#include <gtest/gtest.h>

#include "api/kernel_choice.h"
#include "common/rules.h"
#include "common/tuning.h"

namespace {

using flashattn::Kernel;
using flashattn::KernelChoice;
using flashattn::Problem;
using Plan = flashattn::KernelChoice;

constexpr int kSms = 132;                 // H200
constexpr int kProcessors = 2 * kSms;     // the default plan counts two CTAs per SM

// An H200 running the bf16 instance of head dim `served` (d = 128: 396 default decode slots, 3
// per SM; 264 persistent and heads-split slots, 2 per SM).
flashattn::DeviceFacts h200(int served = 128, bool sm90 = true) {
  flashattn::DeviceFacts d;
  d.device = flashattn::Device::cuda;
  d.sms = kSms;
  d.processors = kProcessors;
  d.sm90 = sm90;
  d.served_head_dim = served;
  d.splitkeys_slots = 3 * kSms;
  d.persistent_slots = 2 * kSms;
  d.heads_slots = 2 * kSms;
  return d;
}

KernelChoice choose(const Problem& p, flashattn::KernelOverride o = {}, int requested = 0,
                    flashattn::DeviceFacts d = h200(), flashattn::AttentionOptions options = {}) {
  return flashattn::choose_kernel(p, options, requested, d, o);
}

// Decode: batch b, 32 query heads over 8 KV heads (GQA packing: 4 rows per unit), d = 128,
// 64-key tiles.
Problem decode(int b, int context) {
  Problem p;
  p.device = flashattn::Device::cuda;
  p.batch = b;
  p.seqlen_q = 1;
  p.seqlen_k = context;
  p.heads = 32;
  p.heads_k = 8;
  p.head_dim = 128;
  p.kvcache = true;
  return p;
}

Plan plan_of(const Problem& p, int requested = 0, int deep_sms = kSms) {
  return choose(p, {}, requested, h200(128, /*sm90=*/deep_sms > 0));
}

TEST(PlanDeepDecode, FewUnitsSplitToFillTheSms) {
  // 8 units: the default plan takes 16 / 32 / 29 splits (1 / 2 / 9 tiles each); the deep plan
  // fills the 132 SMs with one CTA each.
  const Plan plan = plan_of(decode(1, 4096));
  EXPECT_TRUE(plan.deep_pipeline);
  EXPECT_EQ(plan.num_splits, 16);  // 4 tiles each
  const Plan long_walks = plan_of(decode(1, 16384));
  EXPECT_TRUE(long_walks.deep_pipeline);
  EXPECT_EQ(long_walks.num_splits, 14);  // 112 CTAs of 19 tiles: within 85% of the best waves
}

TEST(PlanDeepDecode, WalksOfOneOrTwoTilesKeepTheDefaultPipelineAtTheDeepSplitCount) {
  const Plan one_tile = plan_of(decode(1, 1024));  // 16 splits of 1 tile
  EXPECT_FALSE(one_tile.deep_pipeline);
  EXPECT_EQ(one_tile.num_splits, 16);
  const Plan two_tiles = plan_of(decode(1, 2048));  // the default plan alone would take 32
  EXPECT_FALSE(two_tiles.deep_pipeline);
  EXPECT_EQ(two_tiles.num_splits, 16);
  const Plan batch2 = plan_of(decode(2, 1024));  // 16 units: 8 splits of 2 tiles
  EXPECT_FALSE(batch2.deep_pipeline);
  EXPECT_EQ(batch2.num_splits, 8);
}

// The GPU sweep's cases that reach the deep pipeline (tests/common/cases.cpp): 8 units of up to
// 8191 keys (15 splits of 9 tiles: the warps split the keys) and 6 units of up to 3000 (16 splits
// of 3 tiles: the warps split the head dim).
TEST(PlanDeepDecode, TheSweepReachesBothDeepKernels) {
  struct SweepCase {
    int batch, capacity, heads, heads_k;
    int splits;
    bool warps_split_dims;
  };
  for (const SweepCase& c : {SweepCase{2, 8191, 8, 4, 15, false}, SweepCase{3, 3000, 4, 2, 16, true}}) {
    Problem p = decode(c.batch, c.capacity);
    p.heads = c.heads;
    p.heads_k = c.heads_k;
    const Plan plan = plan_of(p);
    EXPECT_TRUE(plan.deep_pipeline) << c.capacity;
    EXPECT_EQ(plan.num_splits, c.splits) << c.capacity;
    EXPECT_EQ(flashattn::decode_warps_split_dims(plan.num_splits, p.seqlen_k, p.head_dim), c.warps_split_dims)
        << c.capacity;
  }
}

TEST(PlanDeepDecode, UnitsForAQuarterOfTheSmsOrPagedKeepTheDefaultPipeline) {
  const Plan batch8 = plan_of(decode(8, 1024));  // 64 units >= 132 / 4
  EXPECT_FALSE(batch8.deep_pipeline);
  EXPECT_EQ(batch8.num_splits, 4);
  Problem paged = decode(1, 4096);
  paged.paged = true;
  paged.page_size = 16;
  const Plan paged_plan = plan_of(paged);
  EXPECT_FALSE(paged_plan.deep_pipeline);
  EXPECT_EQ(paged_plan.num_splits, 32);
  const Plan batch4 = plan_of(decode(4, 1024));  // 32 units < 33: deep, 4 splits fill 128 SMs
  EXPECT_TRUE(batch4.deep_pipeline);
  EXPECT_EQ(batch4.num_splits, 4);
}

TEST(PlanDeepDecode, LongWalksAndFullBatchesKeepTheDefaultPipeline) {
  const Plan long_walks = plan_of(decode(8, 16384));  // default: 4 splits of 64 tiles
  EXPECT_FALSE(long_walks.deep_pipeline);
  EXPECT_EQ(long_walks.num_splits, 4);
  const Plan very_long = plan_of(decode(1, 65536));  // default: 28 splits of 37 tiles
  EXPECT_FALSE(very_long.deep_pipeline);
  const Plan full = plan_of(decode(128, 1024));  // 1024 units: no split at all
  EXPECT_FALSE(full.deep_pipeline);
  EXPECT_EQ(full.num_splits, 1);
}

TEST(PlanDeepDecode, OnlyHeuristicDecodeTilesWhereAvailable) {
  const Plan explicit_splits = plan_of(decode(1, 4096), 3);
  EXPECT_FALSE(explicit_splits.deep_pipeline);
  EXPECT_EQ(explicit_splits.num_splits, 3);
  const Plan unavailable = plan_of(decode(1, 4096), 0, 0);
  EXPECT_FALSE(unavailable.deep_pipeline);
  EXPECT_EQ(unavailable.num_splits, 32);
  Problem tall = decode(1, 4096);
  tall.seqlen_q = 64;  // 64 x 4 packed rows: a 128-row tile
  EXPECT_FALSE(plan_of(tall).deep_pipeline);
}

}  // namespace

namespace {

// tuning.h keys_suit_96_key_tile (d = 64 prefill on sm_90): the 96-key tile unless its padding
// of the keys exceeds the 64-key tile's by more than 5%.
// FP8 caches (D-84): few units with walks of at most 4 tiles under both counts take the deep plan's
// split count on the splitkeys kernel, paged or not; other calls keep the default plan.
TEST(PlanFp8Decode, FewUnitsWithShortWalksSplitOverTheSms) {
  Problem p = decode(1, 4096);  // 8 units, 64 tiles: 32 splits by default, 16 over the SMs
  p.fp8 = true;
  const Plan fp8 = plan_of(p);
  EXPECT_EQ(fp8.kernel, Kernel::splitkeys);
  EXPECT_FALSE(fp8.deep_pipeline);
  EXPECT_EQ(fp8.num_splits, 16);
  EXPECT_EQ(plan_of(decode(1, 4096)).num_splits, 16);  // the bf16 plan's count, on the dims kernel
  p.paged = true;
  EXPECT_EQ(plan_of(p).num_splits, 16);
  EXPECT_EQ(plan_of(p, /*requested=*/32).num_splits, 32);
  EXPECT_EQ(plan_of(p, 0, /*deep_sms=*/0).num_splits, 32);  // not sm_90: the default plan
  Problem batch8 = decode(8, 1024);  // 64 units: not few
  batch8.fp8 = true;
  EXPECT_EQ(plan_of(batch8).num_splits, flashattn::num_splits_heuristic(64, kProcessors, 16, flashattn::kMaxSplits));
  Problem longer_walks = decode(2, 4096);  // 16 splits of 4 tiles, but 7 of 10 over the SMs
  longer_walks.fp8 = true;
  EXPECT_EQ(plan_of(longer_walks).num_splits, 16);
  Problem long_walks = decode(1, 16384);  // 29 splits of 9 tiles: walks too long
  long_walks.fp8 = true;
  EXPECT_EQ(plan_of(long_walks).num_splits, 29);
  EXPECT_EQ(plan_of(decode(1, 16384)).num_splits, 14);  // the bf16 plan's, on the deep pipeline
}

TEST(WgmmaTileRule, NinetySixKeysWhereTheyDoNotPadTheKeys) {
  EXPECT_FALSE(flashattn::keys_suit_96_key_tile(512));   // 576 against 512 keys of work
  EXPECT_TRUE(flashattn::keys_suit_96_key_tile(1024));   // 1056 against 1024: 3%
  EXPECT_TRUE(flashattn::keys_suit_96_key_tile(2048));
  EXPECT_TRUE(flashattn::keys_suit_96_key_tile(16384));
  EXPECT_TRUE(flashattn::keys_suit_96_key_tile(96));     // one whole tile
  EXPECT_FALSE(flashattn::keys_suit_96_key_tile(64));    // 96 against 64
  EXPECT_TRUE(flashattn::keys_suit_96_key_tile(640));    // 672 against 640: exactly 5%
  EXPECT_FALSE(flashattn::keys_suit_96_key_tile(200));   // 288 against 256: 12.5%
}

}  // namespace

namespace {

// tuning.h heavy_tiles_first (CUDA launch order): heaviest query tiles first across units where
// a tile's walk grows with its rows.
TEST(TileOrderRule, HeavyFirstWhereWalksGrowWithTheRows) {
  EXPECT_TRUE(flashattn::heavy_tiles_first(-1, 0, 4));     // causal, s = 512 at 128 rows
  EXPECT_TRUE(flashattn::heavy_tiles_first(-1, 0, 128));   // causal, s = 16k
  EXPECT_FALSE(flashattn::heavy_tiles_first(-1, 0, 1));    // one tile: nothing to order
  EXPECT_FALSE(flashattn::heavy_tiles_first(-1, -1, 4));   // no mask: equal walks
  EXPECT_FALSE(flashattn::heavy_tiles_first(64, 0, 4));    // sliding window: equal walks
  EXPECT_TRUE(flashattn::heavy_tiles_first(-1, 16, 4));    // right window only: growing walks
}

// kernel_choice.h persistent_round_imbalance (D-89): the model that picks the persistent grid's
// causal tile order. Heavy first loads the snake rounds evenly; unit by unit does where a round
// spans many units, and not where a unit's tiles nearly fill a round (16 units of 128 tiles on
// 132 CTAs: each CTA meets the same place in every unit's heavy-to-light run).
TEST(TileOrderRule, PersistentRoundImbalanceModel) {
  using flashattn::persistent_round_imbalance;
  EXPECT_LT(persistent_round_imbalance(16, 128, 132, false, 16384, 16384), 1.01);
  EXPECT_GT(persistent_round_imbalance(16, 128, 132, true, 16384, 16384), 1.4);
  EXPECT_LT(persistent_round_imbalance(512, 4, 132, true, 512, 512), 1.05);
  EXPECT_LT(persistent_round_imbalance(64, 32, 132, true, 4096, 4096), 1.05);
  // equal walks (a chunk over a long cache, one tile per unit) are even either way
  EXPECT_DOUBLE_EQ(persistent_round_imbalance(132, 1, 132, true, 128, 8192), 1.0);
  // one CTA takes everything: no imbalance
  EXPECT_DOUBLE_EQ(persistent_round_imbalance(3, 7, 1, true, 896, 896), 1.0);
}

}  // namespace

namespace {

// tuning.h decode_warps_split_dims: the warps of a split decode tile split the head dim only for
// split walks of at most kSplitDimsMaxTiles key tiles.
TEST(SplitDimsRule, ShortSplitWalksOnly) {
  using flashattn::decode_warps_split_dims;
  EXPECT_TRUE(decode_warps_split_dims(16, 1024, 128));    // batch 1 x 1k: one tile per split
  EXPECT_TRUE(decode_warps_split_dims(16, 4096, 128));    // batch 1 x 4k: four tiles
  EXPECT_FALSE(decode_warps_split_dims(16, 16384, 128));  // batch 1 x 16k: sixteen tiles
  EXPECT_FALSE(decode_warps_split_dims(1, 64, 128));      // unsplit: the merge path writes O
  EXPECT_TRUE(decode_warps_split_dims(4, 13 * 64, 128));  // 4 tiles per split, the last 1
  EXPECT_FALSE(decode_warps_split_dims(4, 17 * 64, 128)); // 5 tiles per split
  EXPECT_TRUE(decode_warps_split_dims(4, 4 * 4 * 128, 32));   // d = 32: 128-key tiles, 4 per split
  EXPECT_FALSE(decode_warps_split_dims(4, 4 * 4 * 128 + 1, 32));
  EXPECT_TRUE(decode_warps_split_dims(4, 0, 128));        // empty cache: one (masked) tile
}

}  // namespace

// tuning.h persistent_decode_ctas: the persistent grid only where the default grid needs more
// than one wave and the persistent grid's rounds are clearly fuller (paged: more so); forced:
// about three units per CTA. H200, d = 128: 396 default slots (3 per SM), 264 persistent slots
// (2 per SM).
TEST(PersistentDecodeRule, WhereItsRoundsAreFullerThanTheDefaultWaves) {
  using flashattn::persistent_decode_ctas;
  using flashattn::wave_fill;
  constexpr bool kAuto = false, kForced = true;
  auto contiguous = [](int64_t units, int64_t d, int64_t s, bool forced) {
    return persistent_decode_ctas(units, d, s, forced, /*paged=*/false);
  };
  auto paged = [](int64_t units, int64_t d, int64_t s, bool forced) {
    return persistent_decode_ctas(units, d, s, forced, /*paged=*/true);
  };
  EXPECT_DOUBLE_EQ(wave_fill(512, 396), 512.0 / 792.0);
  EXPECT_DOUBLE_EQ(wave_fill(396, 396), 1.0);
  EXPECT_EQ(contiguous(512, 396, 264, kAuto), 264);   // batch 64 x 8 KV heads: 0.65 -> 0.97
  EXPECT_EQ(paged(512, 396, 264, kAuto), 264);
  EXPECT_EQ(contiguous(400, 396, 264, kAuto), 200);   // 0.51 -> 0.76; a last round of 136 of 264: balanced
  EXPECT_EQ(contiguous(1024, 396, 264, kAuto), 264);  // batch 128: 0.86 -> 0.97 (last round 232 of 264)
  EXPECT_EQ(contiguous(450, 396, 264, kAuto), 225);   // a last round of 186 of 264: two rounds of 225
  EXPECT_EQ(contiguous(1000, 396, 264, kAuto), 264);  // a last round of 208 of 264 (0.79): kept
  EXPECT_EQ(paged(1024, 396, 264, kAuto), 0);         // not enough for paged K/V
  EXPECT_EQ(contiguous(768, 396, 264, kAuto), 0);     // batch 96: 0.97 -> 0.97
  EXPECT_EQ(contiguous(800, 396, 264, kAuto), 0);     // 0.67 -> 0.76: not enough
  EXPECT_EQ(contiguous(396, 396, 264, kAuto), 0);     // one wave
  EXPECT_EQ(contiguous(256, 396, 264, kAuto), 0);
  EXPECT_EQ(contiguous(7, 396, 264, kForced), 3);
  EXPECT_EQ(paged(7, 396, 264, kForced), 3);
  EXPECT_EQ(contiguous(1, 396, 264, kForced), 1);
  EXPECT_EQ(contiguous(3000, 396, 264, kForced), 264);
  EXPECT_EQ(contiguous(0, 396, 264, kForced), 0);
  EXPECT_EQ(contiguous(512, 0, 264, kAuto), 0);       // an occupancy query failed
  EXPECT_EQ(contiguous(512, 396, 0, kAuto), 0);
}

// tuning.h persistent_decode_in_clusters: clusters of two only for a grid that takes every slot
// (batch 64-128 on an H200: 264 of 264), never for a balanced grid of fewer CTAs (50 x 1k: 200).
TEST(PersistentDecodeRule, ClustersOnlyForAGridThatTakesEverySlot) {
  using flashattn::persistent_decode_ctas;
  using flashattn::persistent_decode_in_clusters;
  constexpr bool kAuto = false;
  EXPECT_TRUE(persistent_decode_in_clusters(persistent_decode_ctas(1024, 396, 264, kAuto, false), 264));
  EXPECT_TRUE(persistent_decode_in_clusters(persistent_decode_ctas(512, 396, 264, kAuto, false), 264));
  EXPECT_FALSE(persistent_decode_in_clusters(persistent_decode_ctas(400, 396, 264, kAuto, false), 264));  // 200
  EXPECT_FALSE(persistent_decode_in_clusters(persistent_decode_ctas(450, 396, 264, kAuto, false), 264));  // 225
  EXPECT_FALSE(persistent_decode_in_clusters(263, 263));  // pairs do not tile an odd grid
  EXPECT_TRUE(persistent_decode_in_clusters(132, 132));
  EXPECT_FALSE(persistent_decode_in_clusters(0, 0));
}

// tuning.h decode_warps_split_heads: the heads-split kernel only where the default grid needs
// more than one wave and its own grid (units / 4 CTAs) is one wave lying evenly on the SMs: one
// layer of at most a CTA per SM, or layers filled to 0.84.
// H200, d = 128: 396 default slots, 264 heads-split slots, 132 SMs.
TEST(SplitHeadsRule, WhereItsOneWaveLiesEvenlyOnTheSms) {
  auto rule = [](int64_t units, bool) { return flashattn::decode_warps_split_heads(units, units / 4, 396, 264, 132); };
  constexpr bool kAuto = false;
  EXPECT_TRUE(rule(1024, kAuto));   // batch 128 x 8 KV heads: 256 CTAs, 0.97 of two layers
  EXPECT_TRUE(rule(512, kAuto));    // batch 64: 128 CTAs, 0.97 of one layer
  EXPECT_TRUE(rule(528, kAuto));    // batch 66: 132 CTAs, one whole layer
  EXPECT_FALSE(rule(768, kAuto));   // batch 96: 192 CTAs, 0.73 of two layers
  EXPECT_TRUE(rule(400, kAuto));    // batch 50: 100 CTAs, one layer (0.76)
  EXPECT_TRUE(rule(928, kAuto));    // batch 116: 232 CTAs, 0.88 of two layers
  EXPECT_TRUE(rule(888, kAuto));    // 222 CTAs: 0.841
  EXPECT_FALSE(rule(884, kAuto));   // 221 CTAs: 0.837
  EXPECT_TRUE(rule(448, kAuto));    // batch 56: 112 CTAs, one layer
  EXPECT_FALSE(rule(1064, kAuto));  // 266 CTAs: more than one wave
  EXPECT_FALSE(rule(2048, kAuto));  // batch 256: two waves
  EXPECT_FALSE(rule(396, kAuto));   // the default grid is one wave
  EXPECT_FALSE(flashattn::decode_warps_split_heads(1024, 256, 396, 0, 132));  // an occupancy query failed
  EXPECT_FALSE(flashattn::decode_warps_split_heads(1024, 256, 396, 264, 0));
}

namespace {

// ---- choose_kernel: one test per rule -----------------------------------------------------------

Problem prefill(int s, int d = 128) {
  Problem p;
  p.device = flashattn::Device::cuda;
  p.batch = 8;  // enough units that the heuristic does not split
  p.seqlen_q = s;
  p.seqlen_k = s;
  p.heads = 16;
  p.heads_k = 16;
  p.head_dim = d;
  return p;
}

TEST(KernelChoice, TheCpuBackendRunsEveryCallOnTheCpu) {
  Problem p = prefill(1024);
  p.device = flashattn::Device::cpu;
  flashattn::DeviceFacts cpu;
  cpu.processors = 16;
  EXPECT_EQ(choose(p, {}, 0, cpu).kernel, Kernel::cpu);
  flashattn::KernelOverride forced;
  forced.kernel = Kernel::wgmma;
  EXPECT_EQ(choose(p, forced, 0, cpu).kernel, Kernel::cpu);
}

TEST(KernelChoice, WarpspecServesDenseTmaDescribableUnpackedUnsplitPrefillOnly) {
  flashattn::KernelOverride forced;
  forced.kernel = Kernel::warpspec;
  Problem dense = prefill(1024);
  dense.tma_describable = true;
  EXPECT_EQ(choose(dense, forced).kernel, Kernel::warpspec);
  EXPECT_EQ(choose(dense).kernel, Kernel::warpspec);  // D-62: from d = 128 up
  EXPECT_EQ(choose(dense, {}, 0, h200(256)).kernel, Kernel::warpspec);
  Problem dense64 = prefill(1024, 64);
  dense64.tma_describable = true;
  EXPECT_EQ(choose(dense64, {}, 0, h200(64)).kernel, Kernel::wgmma);  // the 96-key wgmma tile stays
  flashattn::AttentionOptions causal;
  causal.causal = true;
  EXPECT_EQ(choose(dense64, {}, 0, h200(64), causal).kernel, Kernel::warpspec);  // D-90: short causal walks
  Problem long64 = prefill(4096, 64);
  long64.tma_describable = true;
  EXPECT_EQ(choose(long64, {}, 0, h200(64), causal).kernel, Kernel::wgmma);  // past 2k keys: wgmma
  EXPECT_EQ(choose(dense64, forced, 0, h200(64)).kernel, Kernel::warpspec);
  flashattn::KernelOverride wgmma;
  wgmma.kernel = Kernel::wgmma;
  EXPECT_EQ(choose(dense, wgmma).kernel, Kernel::wgmma);
  Problem strided = prefill(1024);  // tma_describable false: a layout TMA cannot describe
  EXPECT_EQ(choose(strided, forced).kernel, Kernel::wgmma);
  EXPECT_EQ(choose(dense, forced, /*requested=*/2).kernel, Kernel::mma);  // split-KV prefill
  EXPECT_EQ(choose(dense, forced, 0, h200(128, /*sm90=*/false)).kernel, Kernel::mma);
  Problem packed = prefill(16);  // 16 queries x 8 heads per KV head: one packed 128-row tile
  packed.heads = 64;
  packed.heads_k = 8;
  packed.tma_describable = true;
  EXPECT_NE(choose(packed, forced).kernel, Kernel::warpspec);
}

TEST(KernelChoice, ChunkedPrefillFillingTheSmsRunsUnsplitOnWarpspec) {  // D-81
  // 512 queries x 32 heads over 8 KV heads (4 query tiles x 32 units = 128 tiles, 0.97 of the
  // SMs) over 8k cached keys: the heuristic's 264 slots would split it in two on mma.
  Problem chunk = prefill(512);
  chunk.batch = 1;
  chunk.seqlen_k = 8704;
  chunk.heads = 32;
  chunk.heads_k = 8;
  chunk.kvcache = true;
  Problem gathered = chunk;  // (tma_describable false: rows TMA cannot describe)
  EXPECT_EQ(choose(gathered).kernel, Kernel::mma);
  EXPECT_EQ(choose(gathered).num_splits, 2);
  chunk.tma_describable = true;
  EXPECT_EQ(choose(chunk).kernel, Kernel::warpspec);
  EXPECT_EQ(choose(chunk).num_splits, 1);
  EXPECT_EQ(choose(chunk, {}, /*requested=*/2).num_splits, 2);  // asked for: kept
  Problem few = chunk;  // 2 query tiles x 32 units = 64 tiles: under 0.8 of the SMs
  few.seqlen_q = 256;
  EXPECT_EQ(choose(few).kernel, Kernel::mma);
  EXPECT_GT(choose(few).num_splits, 1);
  flashattn::KernelOverride wgmma;
  wgmma.kernel = Kernel::wgmma;
  EXPECT_EQ(choose(chunk, wgmma).kernel, Kernel::mma);  // no warpspec under another override
}

TEST(KernelChoice, Fp8ProductsRunOnWarpspecForE4m3QkvAtHeadDims128And256) {  // D-75
  Problem fp8 = prefill(1024);
  fp8.tma_describable = true;
  fp8.fp8 = fp8.fp8_qkv = true;
  EXPECT_EQ(choose(fp8).kernel, Kernel::warpspec);
  EXPECT_EQ(choose(fp8, {}, 0, h200(256)).kernel, Kernel::warpspec);
  EXPECT_EQ(choose(fp8, {}, 0, h200(192)).kernel, Kernel::mma);  // no FP8 products at d = 192
  flashattn::KernelOverride mma;
  mma.kernel = Kernel::mma;
  EXPECT_EQ(choose(fp8, mma).kernel, Kernel::mma);
  Problem kv_only = fp8;  // e4m3 K/V under a bf16 q: the widening path
  kv_only.fp8_qkv = false;
  EXPECT_EQ(choose(kv_only).kernel, Kernel::mma);
  Problem strided = fp8;
  strided.tma_describable = false;
  EXPECT_EQ(choose(strided).kernel, Kernel::mma);
}

TEST(KernelChoice, WarpspecRunsOnOnePersistentCtaPerSm) {  // D-71
  Problem dense = prefill(4096);
  dense.tma_describable = true;
  const KernelChoice persistent = choose(dense);
  EXPECT_EQ(persistent.kernel, Kernel::warpspec);
  EXPECT_EQ(persistent.persistent_ctas, kSms);
  flashattn::KernelOverride tiles;
  tiles.prefill_ctas = -1;
  EXPECT_EQ(choose(dense, tiles).persistent_ctas, 0);  // one CTA per query tile
  tiles.prefill_ctas = 3;
  EXPECT_EQ(choose(dense, tiles).persistent_ctas, 3);
  // D-79: varlen bf16 stays on the wgmma kernel; forced onto warpspec (as varlen e4m3 goes),
  // its tiles of unequal cost get one CTA each
  Problem varlen = dense;
  varlen.varlen = true;
  EXPECT_EQ(choose(varlen).kernel, Kernel::wgmma);
  flashattn::KernelOverride forced;
  forced.kernel = Kernel::warpspec;
  EXPECT_EQ(choose(varlen, forced).kernel, Kernel::warpspec);
  EXPECT_EQ(choose(varlen, forced).persistent_ctas, 0);
  forced.prefill_ctas = 3;
  EXPECT_EQ(choose(varlen, forced).persistent_ctas, 3);  // the override still forces a persistent grid
  Problem varlen_fp8 = varlen;
  varlen_fp8.fp8 = varlen_fp8.fp8_qkv = true;
  EXPECT_EQ(choose(varlen_fp8).kernel, Kernel::warpspec);
  EXPECT_EQ(choose(varlen_fp8).persistent_ctas, 0);
  flashattn::KernelOverride wgmma;
  wgmma.kernel = Kernel::wgmma;
  EXPECT_EQ(choose(dense, wgmma).persistent_ctas, 0);
}

TEST(KernelChoice, TmaDescribableFollowsTheHardwareRules) {
  alignas(16) static char buffer[64];
  flashattn::AttnParams a;
  a.dtype = flashattn::DType::bf16;
  a.batch = 2, a.seqlen_q = 100, a.seqlen_k = 300, a.num_heads = 8, a.num_heads_k = 2, a.head_dim = 128;
  a.q = a.k = a.v = buffer;
  a.q_row_stride = 8 * 128, a.q_head_stride = 128, a.q_batch_stride = 100 * 8 * 128;
  a.k_row_stride = 2 * 128, a.k_head_stride = 128, a.k_batch_stride = 300 * 2 * 128;
  a.v_row_stride = a.k_row_stride, a.v_head_stride = a.k_head_stride, a.v_batch_stride = a.k_batch_stride;
  EXPECT_TRUE(flashattn::tma_describable(a));
  flashattn::AttnParams b = a;
  b.k = buffer + 2;  // base not 16-byte aligned
  EXPECT_FALSE(flashattn::tma_describable(b));
  b = a;
  b.v_row_stride = 2 * 128 + 4;  // 264 bytes: not a multiple of 16
  EXPECT_FALSE(flashattn::tma_describable(b));
  b = a;
  b.q_batch_stride = 0;  // broadcast batch
  EXPECT_FALSE(flashattn::tma_describable(b));
  b = a;
  b.k_head_stride = -128;  // reversed heads
  EXPECT_FALSE(flashattn::tma_describable(b));
  b = a;
  b.seqlen_k = 0;  // no keys: no tensor to describe
  EXPECT_FALSE(flashattn::tma_describable(b));
  // varlen: packed rows, one batch entry spanning them (batch strides unused)
  static const int cu[3] = {0, 60, 100};
  flashattn::AttnParams packed = a;
  packed.cu_seqlens_q = packed.cu_seqlens_k = cu;
  packed.total_q = 100, packed.total_k = 300;
  packed.q_batch_stride = packed.k_batch_stride = packed.v_batch_stride = 0;
  EXPECT_TRUE(flashattn::tma_describable(packed));
  EXPECT_EQ(flashattn::tma_q_rows(packed).rows, 100);
  EXPECT_EQ(flashattn::tma_q_rows(packed).batches, 1);
  EXPECT_EQ(flashattn::tma_kv_rows(packed, 0, packed.k_row_stride).rows, 300);
  b = packed;
  b.total_k = 0;  // no key rows
  EXPECT_FALSE(flashattn::tma_describable(b));
  // a contiguous cache: one entry per cache row (cache_batch_idx picks among them)
  b = a;
  b.kv_cache = true, b.cache_batches = 5;
  EXPECT_TRUE(flashattn::tma_describable(b));
  EXPECT_EQ(flashattn::tma_kv_rows(b, b.k_batch_stride, b.k_row_stride).batches, 5);
  EXPECT_EQ(flashattn::tma_kv_rows(b, b.k_batch_stride, b.k_row_stride).rows, 300);
  // pages: one entry per page, a page's rows each; pages of whole 16-row slabs, no left pad
  flashattn::AttnParams paged = a;
  paged.block_table = cu;
  paged.page_size = 32, paged.num_pages = 40;
  paged.k_batch_stride = paged.v_batch_stride = 32 * 2 * 128;  // page stride
  EXPECT_TRUE(flashattn::tma_describable(paged));
  const flashattn::TmaRows page_rows = flashattn::tma_kv_rows(paged, paged.k_batch_stride, paged.k_row_stride);
  EXPECT_EQ(page_rows.rows, 32);
  EXPECT_EQ(page_rows.batches, 40);
  EXPECT_EQ(page_rows.batch_stride, 32 * 2 * 128);
  EXPECT_FALSE(page_rows.packed);
  b = paged;
  b.page_size = 8;  // below a slab
  EXPECT_FALSE(flashattn::tma_describable(b));
  b.page_size = 24;  // not whole slabs
  EXPECT_FALSE(flashattn::tma_describable(b));
  b = paged;
  b.leftpad_k = cu;  // keys shifted off the slabs
  EXPECT_FALSE(flashattn::tma_describable(b));
  b = paged;
  b.cu_seqlens_k = cu, b.total_k = 0;  // varlen over pages: the pages, not the packed rows
  EXPECT_TRUE(flashattn::tma_describable(b));
}

TEST(KernelChoice, TmaStoresOOfDenseCallsWhoseOTmaDescribes) {  // D-82
  alignas(16) static char buffer[64];
  flashattn::AttnParams a;
  a.dtype = flashattn::DType::bf16;
  a.batch = 2, a.seqlen_q = 100, a.num_heads = 8, a.head_dim = 128;
  a.o = buffer;
  a.o_row_stride = 8 * 128, a.o_head_stride = 128, a.o_batch_stride = 100 * 8 * 128;
  EXPECT_TRUE(flashattn::tma_stores_o(a));
  flashattn::AttnParams b = a;
  b.o = buffer + 8;  // base not 16-byte aligned
  EXPECT_FALSE(flashattn::tma_stores_o(b));
  b = a;
  b.head_dim = 100, b.o_row_stride = 8 * 100 + 4, b.o_head_stride = 100;  // 1608-byte rows
  EXPECT_FALSE(flashattn::tma_stores_o(b));
  b = a;
  b.o_batch_stride = 0;
  EXPECT_FALSE(flashattn::tma_stores_o(b));
  b = a;
  b.dtype = flashattn::DType::f32, b.o_row_stride = 8 * 128 + 2;  // 4104 bytes: not a multiple of 16
  EXPECT_FALSE(flashattn::tma_stores_o(b));
  b.o_row_stride = 8 * 128 + 4;  // 4112 bytes
  EXPECT_TRUE(flashattn::tma_stores_o(b));
  static const int cu[3] = {0, 60, 100};
  b = a;
  b.cu_seqlens_q = cu, b.total_q = 100;  // varlen: a tile's last rows would be the next sequence's
  EXPECT_FALSE(flashattn::tma_stores_o(b));
  b = a;
  b.seqlen_q = 0;
  EXPECT_FALSE(flashattn::tma_stores_o(b));
}

TEST(KernelChoice, PrefillRunsWgmmaOnSm90WithOneSplitElseMma) {  // D-1
  EXPECT_EQ(choose(prefill(1024)).kernel, Kernel::wgmma);
  EXPECT_EQ(choose(prefill(1024), {}, 0, h200(128, /*sm90=*/false)).kernel, Kernel::mma);
  EXPECT_EQ(choose(prefill(1024), {}, /*requested=*/2).kernel, Kernel::mma);  // split-KV prefill
  EXPECT_EQ(choose(prefill(1024, 96), {}, 0, h200(96)).kernel, Kernel::mma);  // not whole 128-byte rows
  EXPECT_EQ(choose(prefill(48)).kernel, Kernel::mma);  // a 64-row tile: mma.sync only
}

TEST(KernelChoice, WgmmaTilesPerHeadDim) {  // D-2, D-5
  EXPECT_EQ(choose(prefill(1024, 64), {}, 0, h200(64)).wgmma_tile, flashattn::WgmmaTile::narrow96);
  EXPECT_EQ(choose(prefill(512, 64), {}, 0, h200(64)).wgmma_tile, flashattn::WgmmaTile::narrow);
  EXPECT_EQ(choose(prefill(4096, 128)).wgmma_tile, flashattn::WgmmaTile::narrow);
  EXPECT_EQ(choose(prefill(4096, 256), {}, 0, h200(256)).wgmma_tile, flashattn::WgmmaTile::wide);
  flashattn::KernelOverride o;
  o.wgmma_tile = flashattn::WgmmaTile::wide;
  EXPECT_EQ(choose(prefill(4096, 128), o).wgmma_tile, flashattn::WgmmaTile::wide);
  o.wgmma_tile = flashattn::WgmmaTile::narrow96;  // not compiled at d = 128: the rule's tile
  EXPECT_EQ(choose(prefill(4096, 128), o).wgmma_tile, flashattn::WgmmaTile::narrow);
  o.wgmma_tile = flashattn::WgmmaTile::narrow;  // not compiled at d = 256
  EXPECT_EQ(choose(prefill(4096, 256), o, 0, h200(256)).wgmma_tile, flashattn::WgmmaTile::wide);
}

TEST(KernelChoice, CausalPrefillStartsItsHeaviestTilesFirst) {  // D-6, D-89
  flashattn::AttentionOptions causal;
  causal.causal = true;
  Problem dense = prefill(1024);
  dense.tma_describable = true;
  const KernelChoice persistent = choose(dense, {}, 0, h200(), causal);
  ASSERT_EQ(persistent.kernel, Kernel::warpspec);
  ASSERT_GT(persistent.persistent_ctas, 0);
  EXPECT_FALSE(persistent.heavy_tiles_first);  // the persistent grid walks unit by unit (D-89)
  Problem few_long_units = dense;  // 16 units of 128 tiles: unit by unit would load the rounds unevenly
  few_long_units.batch = 1;
  few_long_units.seqlen_q = few_long_units.seqlen_k = 16384;
  EXPECT_TRUE(choose(few_long_units, {}, 0, h200(), causal).heavy_tiles_first);
  flashattn::KernelOverride tiles;
  tiles.prefill_ctas = -1;  // grid=tiles: one CTA per query tile
  EXPECT_TRUE(choose(dense, tiles, 0, h200(), causal).heavy_tiles_first);
  EXPECT_TRUE(choose(prefill(1024), {}, 0, h200(), causal).heavy_tiles_first);  // the wgmma kernel
  EXPECT_FALSE(choose(prefill(1024)).heavy_tiles_first);
  EXPECT_FALSE(choose(prefill(128), {}, 0, h200(), causal).heavy_tiles_first);  // one tile
  flashattn::KernelOverride order;
  order.tile_order = flashattn::TileOrder::per_unit;
  EXPECT_FALSE(choose(prefill(1024), order, 0, h200(), causal).heavy_tiles_first);
  order.tile_order = flashattn::TileOrder::heavy_first;
  EXPECT_TRUE(choose(prefill(1024), order).heavy_tiles_first);
}

TEST(KernelChoice, ShortSplitWalksSplitTheHeadDim) {  // D-19
  const KernelChoice one_by_1k = choose(decode(1, 1024));  // 16 splits of one tile
  EXPECT_EQ(one_by_1k.kernel, Kernel::dims);
  EXPECT_FALSE(one_by_1k.deep_pipeline);
  const KernelChoice deep_dims = choose(decode(1, 4096));  // deep pipeline, 16 splits of 4 tiles
  EXPECT_EQ(deep_dims.kernel, Kernel::dims);
  EXPECT_TRUE(deep_dims.deep_pipeline);
  EXPECT_EQ(choose(decode(1, 16384)).kernel, Kernel::deep);  // 14 splits of 19 tiles
  EXPECT_EQ(choose(decode(8, 16384)).kernel, Kernel::splitkeys);  // 4 splits of 64 tiles
  EXPECT_EQ(choose(decode(1, 1024), {}, 0, h200(256)).kernel, Kernel::splitkeys);  // not compiled at d = 256
}

TEST(KernelChoice, SplitDecodeMergesInAClusterOfAtMostFourSplits) {  // D-34
  EXPECT_TRUE(choose(decode(8, 16384)).cluster_combine);    // 4 splits
  EXPECT_FALSE(choose(decode(1, 1024)).cluster_combine);    // 16 splits: the combine kernel
  EXPECT_FALSE(choose(decode(128, 1024)).cluster_combine);  // unsplit
  EXPECT_FALSE(choose(decode(8, 16384), {}, 0, h200(128, false)).cluster_combine);  // no clusters
  flashattn::KernelOverride o;
  o.cluster_combine = false;
  EXPECT_FALSE(choose(decode(8, 16384), o).cluster_combine);
}

TEST(KernelChoice, OneEvenWaveOfKvHeadsRunsTheHeadsSplitKernel) {  // D-32
  EXPECT_EQ(choose(decode(128, 1024)).kernel, Kernel::heads);  // 1024 units: 256 CTAs, 0.97 of two layers
  EXPECT_EQ(choose(decode(64, 1024)).kernel, Kernel::heads);
  Problem paged = decode(128, 1024);
  paged.paged = true;
  EXPECT_NE(choose(paged).kernel, Kernel::heads);  // contiguous K/V only
}

TEST(KernelChoice, ShortLastWavesRunOnThePersistentGrid) {  // D-28
  Problem paged = decode(64, 1024);  // 512 units: 0.65 -> 0.97 of the slots
  paged.paged = true;
  const KernelChoice c = choose(paged);
  EXPECT_EQ(c.kernel, Kernel::persistent);
  EXPECT_EQ(c.persistent_ctas, 264);
  EXPECT_EQ(choose(decode(96, 1024)).kernel, Kernel::splitkeys);  // 768 units: 0.97 either way
}

TEST(KernelOverride, AForcedKernelRunsEveryCallItServes) {
  flashattn::KernelOverride o;
  o.kernel = Kernel::mma;
  EXPECT_EQ(choose(prefill(1024), o).kernel, Kernel::mma);
  EXPECT_EQ(choose(decode(1, 1024), o).kernel, Kernel::dims);  // a decode tile: the automatic choice
  o.kernel = Kernel::splitkeys;
  const KernelChoice keys = choose(decode(1, 4096), o);
  EXPECT_EQ(keys.kernel, Kernel::splitkeys);
  EXPECT_FALSE(keys.deep_pipeline);
  o.kernel = Kernel::deep;
  const KernelChoice deep = choose(decode(8, 1024), o);  // many units: deep only when forced
  EXPECT_EQ(deep.kernel, Kernel::deep);
  EXPECT_TRUE(deep.deep_pipeline);
  Problem paged = decode(1, 4096);
  paged.paged = true;
  EXPECT_NE(choose(paged, o).kernel, Kernel::deep);  // contiguous K/V only
  o.kernel = Kernel::dims;
  EXPECT_EQ(choose(decode(8, 16384), o).kernel, Kernel::dims);   // 64 tiles per split
  EXPECT_NE(choose(decode(128, 1024), o).kernel, Kernel::dims);  // unsplit: not served
  o.kernel = Kernel::heads;
  EXPECT_EQ(choose(decode(2, 100), o, /*requested=*/1).kernel, Kernel::heads);
  EXPECT_NE(choose(decode(2, 4096), o).kernel, Kernel::heads);  // split: not served
  o.kernel = Kernel::persistent;
  const KernelChoice persistent = choose(decode(2, 100), o, 1);  // 16 units: about three per CTA
  EXPECT_EQ(persistent.kernel, Kernel::persistent);
  EXPECT_EQ(persistent.persistent_ctas, 6);
  o.kernel = Kernel::wgmma;
  EXPECT_EQ(choose(prefill(1024), o, 0, h200(128, false)).kernel, Kernel::mma);  // no sm_90: automatic
}

TEST(KernelOverride, ParsesOneEnvironmentVariable) {
  const flashattn::KernelOverride none = flashattn::parse_kernel_override("");
  EXPECT_EQ(none.kernel, Kernel::automatic);
  EXPECT_TRUE(none.cluster_combine);
  const flashattn::KernelOverride all =
      flashattn::parse_kernel_override("persistent,tile=narrow96,order=heavy_first,combine=kernel,pdl=off");
  EXPECT_EQ(all.kernel, Kernel::persistent);
  EXPECT_EQ(all.wgmma_tile, flashattn::WgmmaTile::narrow96);
  EXPECT_EQ(all.tile_order, flashattn::TileOrder::heavy_first);
  EXPECT_FALSE(all.cluster_combine);
  EXPECT_FALSE(all.programmatic_launch);
  EXPECT_EQ(flashattn::parse_kernel_override("tile=wide").wgmma_tile, flashattn::WgmmaTile::wide);
  EXPECT_EQ(none.prefill_ctas, 0);
  EXPECT_EQ(flashattn::parse_kernel_override("warpspec,grid=tiles").prefill_ctas, -1);
  EXPECT_EQ(flashattn::parse_kernel_override("warpspec,grid=3").prefill_ctas, 3);
  EXPECT_THROW(flashattn::parse_kernel_override("warpspec,grid=some"), flashattn::Error);
  EXPECT_THROW(flashattn::parse_kernel_override("warpspec,grid=0"), flashattn::Error);
  EXPECT_THROW(flashattn::parse_kernel_override("fastest"), flashattn::Error);
  EXPECT_THROW(flashattn::parse_kernel_override("mma,tile=huge"), flashattn::Error);
  EXPECT_THROW(flashattn::parse_kernel_override("cpu"), flashattn::Error);
  EXPECT_STREQ(flashattn::kernel_name(Kernel::heads), "heads");
}

TEST(KernelOverride, ParsesCpuKernelCaps) {
  using flashattn::CpuKernels;
  using flashattn::parse_kernel_override;
  EXPECT_EQ(parse_kernel_override("").cpu_kernels, CpuKernels::automatic);
  EXPECT_EQ(parse_kernel_override("automatic,cpu=portable").cpu_kernels, CpuKernels::portable);
  EXPECT_EQ(parse_kernel_override("automatic,cpu=neon").cpu_kernels, CpuKernels::neon);
  EXPECT_EQ(parse_kernel_override("automatic,cpu=avx2").cpu_kernels, CpuKernels::avx2);
  EXPECT_EQ(parse_kernel_override("automatic,cpu=avx512").cpu_kernels, CpuKernels::avx512);
  EXPECT_EQ(parse_kernel_override("automatic,cpu=avx512bf16").cpu_kernels, CpuKernels::avx512bf16);
  EXPECT_EQ(parse_kernel_override("automatic,cpu=amx").cpu_kernels, CpuKernels::amx);
  EXPECT_THROW(parse_kernel_override("automatic,cpu=sse2"), flashattn::Error);
  // The caps are ordered as the kernel sets, from the most portable up.
  EXPECT_LT(int(CpuKernels::portable), int(CpuKernels::neon));
  EXPECT_LT(int(CpuKernels::neon), int(CpuKernels::avx2));
  EXPECT_LT(int(CpuKernels::avx2), int(CpuKernels::avx512));
  EXPECT_LT(int(CpuKernels::avx512), int(CpuKernels::avx512bf16));
  EXPECT_LT(int(CpuKernels::avx512bf16), int(CpuKernels::amx));
}

}  // namespace
