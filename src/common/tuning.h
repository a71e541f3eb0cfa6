// Tuning: the measured heuristics that choose how a problem is cut into work and which CUDA
// kernel runs it. None of this changes a result (common/rules.h holds the semantics); each rule
// was measured on an H200 and cites its entry in docs/DECISIONS.md. src/api/kernel_choice.cpp is
// the one place that applies them.
#pragma once

#include <cstdint>

#include "common/rules.h"

namespace flashattn {

// ---- split-KV and GQA packing (both backends) ---------------------------------------------------

// GQA packing pays when a query tile would otherwise be mostly empty (FlashAttention-2's rule).
constexpr int kPackGqaMaxSeqlenQ = 64;
// FlashAttention-2's split heuristic: with work for >= 80% of the processors, do not split; else
// take the fewest splits whose wave efficiency is within 85% of the best.
constexpr double kSplitFillFraction = 0.8;
constexpr double kSplitEfficiencyFraction = 0.85;
// CUDA: split-KV CTAs per SM that the heuristic counts, as FlashAttention-2 (D-15: counting the
// decode kernel's three measured no faster).
constexpr int kCtasPerSm = 2;

// ---- decode (at most 16 query rows per unit) ----------------------------------------------------

// Few units with short walks: units for fewer than a quarter of the SMs whose default plan splits
// into walks of at most kFewUnitsMaxTiles key tiles take FlashAttention-2's split heuristic over
// the SMs (one CTA each) rather than over kCtasPerSm CTAs per SM: for the deep pipeline below
// (D-16), and for an FP8 cache where the walks are at most kFp8FewUnitsMaxTiles under both split
// counts: its batch-1 4k call ran 3-11% faster in 16 splits than in 32, but 1 x 16k (29 splits of
// 9 tiles, 14 of 19 over the SMs) lost 3% contiguous and 20% on pages of 16 (D-84).
constexpr int kFewUnitsMaxTiles = 16;
constexpr int kFp8FewUnitsMaxTiles = 4;
constexpr double kFewUnitsFraction = 0.25;
// The deep pipeline (five K/V stages, one CTA per SM) for contiguous decode tiles of few units
// with short walks (above): batch 1 gains 3-7% (D-16).
// ... but where that leaves walks shorter than three tiles the default pipeline runs them at the
// same split count: 0.3-0.5 us faster at 1 x 2k and 2 x 1k (D-17).
constexpr int kDeepDecodeMinTiles = 3;
// The deep pipeline is compiled for head dims up to this one (five stages fit sm_90's shared
// memory there): a capability, not a preference.
constexpr int kDeepDecodeMaxHeadDim = 128;

// FP8 (e4m3) K/V decode: the e4m3 stages of the fp8 pipeline, two tiles in flight per CTA, which
// leaves room for 3 CTAs per SM at d = 128 (D-66).
constexpr int kFp8DecodeCopyStages = 3;
// The fp8 pipeline's head dims: a warp's 16-byte copies of its keys' e4m3 rows spread evenly
// over its 32 lanes (rows of 16 x 2^k bytes, at most 512), and each lane's share of a row for
// P V is whole 4-byte words (d / 8 bytes: d >= 32; components/fp8_warp_kv.h). d = 96 and 192
// keep the standard pipeline. A capability, not a preference.
constexpr bool fp8_warp_kv_head_dim(int head_dim) { return head_dim % 32 == 0 && 32 % (head_dim / 16) == 0; }
// The head dims of the warpspec kernel's FP8 products (WarpSpecFp8Traits, D-75): whole 128-byte
// rows of e4m3.
constexpr bool fp8_products_head_dim(int served_head_dim) { return served_head_dim % 128 == 0; }

// The warps of a split decode tile split the head dim instead of the keys where each split walks
// at most this many key tiles (counted in splitkv_block_n units): the merge it saves is a large
// share of a short walk; 1 x 1k went from 0.90 to 0.97 of cuDNN's speed, 1 x 16k would lose (D-19).
constexpr int kSplitDimsMaxTiles = 4;
inline bool decode_warps_split_dims(int num_splits, int seqlen_k, int head_dim) {
  if (num_splits < 2) return false;  // the split-dims kernel writes split partials only
  const int unit = splitkv_block_n(head_dim);
  const int64_t key_tiles = seqlen_k > 0 ? (int64_t(seqlen_k) + unit - 1) / unit : 1;
  const int64_t tiles_per_split = (key_tiles + num_splits - 1) / num_splits;
  return tiles_per_split <= kSplitDimsMaxTiles;
}

// sm_90: 2..kMaxClusterSplits splits of a decode unit merge inside one thread-block cluster;
// larger clusters constrain placement and measured slower than the combine kernel (D-34).
constexpr int kMaxClusterSplits = 4;

// The share of slots x waves (or rounds) that units fill.
inline double wave_fill(int64_t units, int64_t slots) {
  const int64_t waves = (units + slots - 1) / slots;
  return double(units) / double(waves * slots);
}

// The persistent decode grid (unsplit decode tiles; persistent_decode_kernel.h) where the default
// grid needs more than one wave and the persistent rounds fill the slots better by at least
// these margins: 2-10% faster at batch 50-64 x 1k-4k (D-28).
constexpr double kPersistentDecodeMinFillGain = 0.1;
constexpr double kPersistentDecodeMinFillGainPaged = 0.2;
// A last round at most this full spreads the units over fewer CTAs: batch 50 x 1k 3.5% faster (D-30).
constexpr double kPersistentDecodeBalanceBelow = 0.75;
// The CTAs of the persistent grid, or 0 for the default grid of one CTA per unit.
// default_slots / persistent_slots: each kernel's CTAs resident at once. forced (tests and
// timing): about three units per CTA whatever the grid.
inline int64_t persistent_decode_ctas(int64_t units, int64_t default_slots, int64_t persistent_slots, bool forced,
                                      bool paged) {
  if (units <= 0 || default_slots <= 0 || persistent_slots <= 0) return 0;
  if (forced) {
    const int64_t ctas = (units + 2) / 3;
    return ctas < persistent_slots ? ctas : persistent_slots;
  }
  if (units <= default_slots) return 0;  // one wave: every unit runs at once either way
  const double min_gain = paged ? kPersistentDecodeMinFillGainPaged : kPersistentDecodeMinFillGain;
  const bool fuller = wave_fill(units, persistent_slots) >= wave_fill(units, default_slots) + min_gain;
  if (!fuller) return 0;
  const int64_t rounds = (units + persistent_slots - 1) / persistent_slots;
  const int64_t last_round = units - (rounds - 1) * persistent_slots;
  if (double(last_round) > kPersistentDecodeBalanceBelow * double(persistent_slots)) {
    return units < persistent_slots ? units : persistent_slots;
  }
  return (units + rounds - 1) / rounds;  // as many rounds over as few CTAs as take the units
}

// The persistent grid launches in clusters of two consecutive CTAs (placement only) where it
// takes every slot: batch 128 x 1k 1-2 us faster; fewer CTAs than slots lost 1.5% (D-31).
constexpr int kPersistentDecodeClusterCtas = 2;
inline bool persistent_decode_in_clusters(int64_t ctas, int64_t slots) {
  return ctas > 0 && ctas == slots && ctas % kPersistentDecodeClusterCtas == 0;
}

// The heads-split decode kernel (each warp one unit whole, no merge) where the default grid needs
// more than one wave and the heads-split grid (ctas = units / 4) is one wave lying evenly on the
// SMs: one layer of at most a CTA per SM, or layers filled to at least kSplitHeadsMinLayerFill;
// 1.5-6% faster at batch 50-66 and 111-132 x 8 KV heads, 6.5% slower at 96 (0.73 fill) (D-32).
constexpr double kSplitHeadsMinLayerFill = 0.84;
inline bool decode_warps_split_heads(int64_t units, int64_t ctas, int64_t default_slots, int64_t heads_slots,
                                     int64_t sms) {
  if (ctas <= 0 || heads_slots <= 0) return false;
  if (units <= default_slots || ctas > heads_slots || sms <= 0) return false;
  const int64_t layers = (ctas + sms - 1) / sms;
  return layers == 1 || double(ctas) >= kSplitHeadsMinLayerFill * double(layers * sms);
}

// ---- prefill (more than 64 query rows per unit) ----------------------------------------------

// sm_90, d = 64: the 96-key wgmma tile unless it pads the keys by over 5% more than the 64-key
// tile: 4-12% faster from 1024 keys, 3% slower at 512 (D-5).
inline bool keys_suit_96_key_tile(int seqlen_k) {
  const int64_t padded96 = (int64_t(seqlen_k) + 95) / 96 * 96;
  const int64_t padded64 = (int64_t(seqlen_k) + 63) / 64 * 64;
  return padded96 * 100 <= padded64 * 105;
}

// Whether a query tile's walk grows with its rows: a causal mask, or a right window alone.
inline bool walk_grows_with_rows(int window_left, int window_right) { return window_right >= 0 && window_left < 0; }

// sm_90, dense calls TMA can describe: the warp-specialised kernel from d = 128 up (d = 128 and
// 256, 1k-16k keys: 1.0-1.43x the wgmma kernel's TFLOP/s, level only at d = 128 1k causal); at
// d = 64 the wgmma kernel's 96-key tile stays (warpspec 0.91-1.02x it) (D-62), except for walks
// that grow with their rows over at most kWarpspecShortCausalKeys keys, where warpspec (its
// causal tiles unit by unit, D-89) measured 1.04-1.10x it (D-90).
// Varlen calls in bf16/fp16 stay on the wgmma kernel: warpspec measured 0.70-0.94x it there
// (random lengths, one CTA per query tile; D-79); varlen e4m3 calls take warpspec's FP8 products
// (1.7-2.1x the mma kernel that served them before, D-79).
constexpr int kWarpspecShortCausalKeys = 2048;
inline bool warpspec_pays(int served_head_dim, bool varlen, bool fp8, bool walk_grows, int seqlen_k) {
  const bool short_growing_walks = walk_grows && seqlen_k <= kWarpspecShortCausalKeys;
  return (served_head_dim >= 128 || short_growing_walks) && (!varlen || fp8);
}

// Split-KV prefill (the mma kernel) is not taken where the unsplit call runs on the warpspec
// kernel and its query tiles fill kSplitFillFraction of the SMs (one warpspec CTA per SM; the
// split heuristic counts kCtasPerSm CTAs of the gathering kernels): chunked prefill, 512 queries
// x 32 heads (128 tiles) over 8k and 32k cached keys, measured 248 and 312 TFLOP/s split in two
// on mma against 609 and 632 unsplit on warpspec (D-81).
inline bool warpspec_fills_sms(int64_t work_tiles, int sms) { return double(work_tiles) >= kSplitFillFraction * sms; }

// The warpspec kernel on a persistent grid, one CTA per SM (its shared memory holds one): a
// CTA's next query tile loads while it finishes the current one (D-71). Varlen calls get one CTA
// per query tile instead: their tiles' costs vary with each sequence's length (and tiles past a
// sequence's end cost nothing), so the persistent grid's fixed share of tiles per CTA left some
// CTAs far more work than others, while the hardware hands a tile grid's CTAs to SMs as they
// free up (D-79).
inline int64_t warpspec_persistent_ctas(int sms, bool varlen) { return varlen ? 0 : sms; }

// Query tiles start heaviest first across all units where a tile's walk grows with its rows
// (causal, or a right window alone): +3-10% at d = 128/256 causal on the one-CTA-per-tile grids;
// without a mask the unit-by-unit order keeps a unit's K/V shared in L2 (heavy first lost 5-11%
// there) (D-6).
inline bool heavy_tiles_first(int window_left, int window_right, int64_t query_tiles) {
  return walk_grows_with_rows(window_left, window_right) && query_tiles > 1;
}

// On the warpspec kernel's persistent grid, where heavy_tiles_first holds, the tiles still go
// unit by unit (each unit's heaviest first, so that the query tiles sharing a unit's K/V run side
// by side) unless that leaves the CTAs' rounds unevenly loaded: unit by unit is taken where the
// modelled load of the busiest CTA (api/kernel_choice.cpp persistent_round_imbalance) is at most
// kUnitOrderImbalanceSlack above heavy first's. Causal H100 CLI bench: unit by unit 1.13-1.45x
// heavy first at d = 128/256 with 512-4k keys; at 16 or fewer units of 64-128 tiles (model:
// 1.5-1.8) 0.60-0.72x (D-89).
constexpr double kUnitOrderImbalanceSlack = 0.05;
// Tiles past which the model is not run (heavy first kept): its cost is one step per tile.
constexpr int64_t kUnitOrderMaxModelledTiles = int64_t(1) << 18;

}  // namespace flashattn
