// The semantics of attention, written once, for host and device.
//
// Both backends call these; the float64 test oracle (tests/reference) does not: it re-states
// the rules plainly so that a mistake here cannot hide in both the kernel and its check.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/params.h"

#if defined(__CUDACC__)
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD inline
#endif

namespace flashattn {

constexpr float kLog2e = 1.4426950408889634f;  // log2(e): exp(x) == exp2(x * kLog2e)
constexpr float kLn2 = 0.6931471805599453f;    // ln(2)

// ---- per-sequence geometry ---------------------------------------------------------------

struct SeqInfo {
  int seqlen_q;        // queries of this sequence
  int seqlen_k;        // visible keys of this sequence (after leftpad)
  int64_t q_row_offset;  // varlen packing offset of the first query row
  int64_t k_row_offset;  // varlen packing offset of the first key row (contiguous K only)
  int leftpad;         // absolute position of key 0
  int kv_batch;        // batch index into the (contiguous) cache
};

// seq_info with every length read through read(array, index) (cuda/persistent_decode_kernel.h
// stages the reads of a later unit in shared memory with it). Which arrays are read, and in
// what order, depends only on which are set, never on a value read: at most kSeqInfoReads.
constexpr int kSeqInfoReads = 8;

// The length of sequence b of a packed (cu_seqlens) array: read(cu, b), then read(cu, b + 1),
// in that order (one read per statement).
template <class Read>
FA_HD int packed_length(const int* cu_seqlens, int b, Read&& read) {
  const int first = read(cu_seqlens, b);
  return read(cu_seqlens, b + 1) - first;
}

template <class Read>
FA_HD SeqInfo seq_info_read(const AttnParams& p, int b, Read&& read) {
  SeqInfo s;
  // cu_seqlens_q[b] is read again for the length rather than reused: reusing it rescheduled the
  // whole d = 256 wgmma kernel, 2-3% slower (docs/PERF.md session 19 runs 7-8).
  s.q_row_offset = p.cu_seqlens_q ? read(p.cu_seqlens_q, b) : 0;
  s.seqlen_q = p.cu_seqlens_q ? packed_length(p.cu_seqlens_q, b, read) : p.seqlen_q;
  s.leftpad = p.leftpad_k ? read(p.leftpad_k, b) : 0;
  s.k_row_offset = (p.cu_seqlens_k && !p.block_table) ? read(p.cu_seqlens_k, b) : 0;
  int keys_end;  // absolute position one past the last key
  if (p.seqused_k) {
    keys_end = read(p.seqused_k, b) + p.seqused_k_added;
  } else if (p.cu_seqlens_k) {
    keys_end = packed_length(p.cu_seqlens_k, b, read);
  } else {
    keys_end = p.seqlen_k;
  }
  s.seqlen_k = keys_end - s.leftpad;
  if (s.seqlen_k < 0) s.seqlen_k = 0;
  s.kv_batch = p.cache_batch_idx ? read(p.cache_batch_idx, b) : b;
  return s;
}

FA_HD SeqInfo seq_info(const AttnParams& p, int b) {
  return seq_info_read(p, b, [](const int* array, int i) { return array[i]; });
}

// Paged K/V: the page holding key j (0-based visible key) of sequence b.
FA_HD int kv_page(const AttnParams& p, const SeqInfo& s, int b, int j) {
  return p.block_table[b * p.block_table_batch_stride + (s.leftpad + j) / p.page_size];
}

// Paged K/V: element offset of key j in its page (kv_page) for KV head hk.
FA_HD int64_t kv_paged_row_offset(const AttnParams& p, const SeqInfo& s, int page, int j,
                                  int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                                  int hk) {
  return page * batch_stride + int64_t((s.leftpad + j) % p.page_size) * row_stride + hk * head_stride;
}

// Element offset of key/value row j (0-based visible key) for KV head hk.
FA_HD int64_t kv_row_offset(const AttnParams& p, const SeqInfo& s, int b, int j,
                            int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                            int hk) {
  if (p.block_table) {
    return kv_paged_row_offset(p, s, kv_page(p, s, b, j), j, batch_stride, row_stride, head_stride, hk);
  }
  return s.kv_batch * batch_stride + (s.k_row_offset + s.leftpad + j) * row_stride + hk * head_stride;
}

// ---- masks -------------------------------------------------------------------------------

// The visible keys of query row i form one interval [lo, hi) (possibly empty).
struct KeyRange {
  int lo, hi;
};

FA_HD KeyRange visible_keys(const AttnParams& p, int i, int seqlen_q, int seqlen_k) {
  const int diag = i + seqlen_k - seqlen_q;  // the key aligned with query i (bottom-right)
  KeyRange r{0, seqlen_k};
  if (p.window_right >= 0 && diag + p.window_right + 1 < r.hi) r.hi = diag + p.window_right + 1;
  if (p.window_left >= 0 && diag - p.window_left > r.lo) r.lo = diag - p.window_left;
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

// Keys visible to at least one query in rows [i0, i1): [lo of row i0, hi of row i1 - 1).
FA_HD KeyRange visible_keys_of_rows(const AttnParams& p, int i0, int i1, int seqlen_q,
                                    int seqlen_k) {
  KeyRange first = visible_keys(p, i0, seqlen_q, seqlen_k);
  KeyRange last = visible_keys(p, i1 - 1, seqlen_q, seqlen_k);
  KeyRange r{first.lo, last.hi};
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

// ---- score -------------------------------------------------------------------------------

// The logit of (query i, key j) from the raw dot product q·k, before masking.
FA_HD float score_transform(const AttnParams& p, float qk) {
  if (p.softcap > 0.0f) return p.softcap * tanhf(qk * (p.softmax_scale / p.softcap));
  return qk * p.softmax_scale;
}

FA_HD float alibi_slope(const AttnParams& p, int b, int head) {
  return p.alibi_slopes ? p.alibi_slopes[b * p.alibi_batch_stride + head] : 0.0f;
}

FA_HD float alibi_bias(float slope, int i, int j, int seqlen_q, int seqlen_k) {
  const int dist = i + seqlen_k - seqlen_q - j;
  return -slope * float(dist < 0 ? -dist : dist);
}

// ---- GQA ---------------------------------------------------------------------------------

// (Unsigned divisions here and below: the operands are never negative, and a GPU divides
// unsigned integers in about half the instructions.)
FA_HD int heads_per_kv_head(const AttnParams& p) { return int(unsigned(p.num_heads) / unsigned(p.num_heads_k)); }

// The units of one sequence, each a tile walk of its own: its heads, or its KV heads with pack_gqa.
FA_HD int units_per_sequence(const AttnParams& p) { return p.pack_gqa ? p.num_heads_k : p.num_heads; }

// With pack_gqa a tile row r of KV head hk stands for query (r / g, head hk*g + r % g).
struct PackedRow {
  int query;  // row i within the sequence
  int head;   // query head
};

FA_HD PackedRow unpack_row(const AttnParams& p, int r, int hk) {
  const unsigned g = unsigned(heads_per_kv_head(p));
  const unsigned query = unsigned(r) / g;
  return PackedRow{int(query), hk * int(g) + int(unsigned(r) - query * g)};
}

// ---- query tiles -------------------------------------------------------------------------

// Query rows per tile of the forward walk, the same on both backends (a tile's visible key
// range, and so its split-KV boundaries, depend on it): decode — at most 16 rows, GQA-packed
// rows included — uses 16-row tiles (the CUDA kernel whose warps split the keys), other short
// query blocks 64-row tiles, everything else 128 (src/cuda/kernel_traits.h).
constexpr int kQueryTileRowsDecode = 16;
constexpr int kQueryTileRowsShort = 64;
constexpr int kQueryTileRows = 128;

// rows: query rows of one (batch, head) — or (batch, KV head) with pack_gqa — at most.
FA_HD int query_tile_rows_for(int64_t rows) {
  if (rows <= kQueryTileRowsDecode) return kQueryTileRowsDecode;
  return rows <= kQueryTileRowsShort ? kQueryTileRowsShort : kQueryTileRows;
}

FA_HD int query_tile_rows(const AttnParams& p) {
  return query_tile_rows_for(int64_t(p.seqlen_q) * (p.pack_gqa ? p.num_heads / p.num_heads_k : 1));
}

// ---- split-KV ----------------------------------------------------------------------------

// Rows of one K/V tile of the split-KV walk, shared by both backends so that they split at
// the same keys. Chosen for the CUDA split-KV kernel; see docs/PERF.md.
// A power of two (the CUDA kernel cuts splits with shifts).
FA_HD constexpr int splitkv_block_n(int head_dim) { return head_dim <= 32 ? 128 : 64; }  // = CUDA kBlockN (kernel_traits.h)

// CUDA sm_90, d = 64 prefill: the 96-key wgmma tile unless it pads the keys by over 5% more
// than the 64-key tile does (512 keys: 576 against 512, measured 3% slower; 1024 keys and up:
// 4-12% faster; docs/PERF.md, session 3 run 5).
inline bool keys_suit_96_key_tile(int seqlen_k) {
  const int64_t padded96 = (int64_t(seqlen_k) + 95) / 96 * 96;
  const int64_t padded64 = (int64_t(seqlen_k) + 63) / 64 * 64;
  return padded96 * 100 <= padded64 * 105;
}

// CUDA: query tiles start heaviest first across all (batch, head) units (AttnParams::
// heavy_tiles_first; grid z = query tiles) rather than unit by unit, where a tile's walk grows
// with its rows (a causal mask, or a right window without a left one): the longest walks then
// start first and the short ones fill the tail. Measured (docs/PERF.md, session 4 runs 1-2):
// causal +3-10% at s = 512-8192 for d = 128 and 256, within noise at d = 64; without a mask
// the unit-by-unit order is kept (heavy first lost 5-11% at s = 512-1024 there: each unit's
// concurrent tiles share its K/V in L2).
inline bool heavy_tiles_first(int window_left, int window_right, int64_t query_tiles) {
  const bool walk_grows_with_rows = window_right >= 0 && window_left < 0;
  return walk_grows_with_rows && query_tiles > 1;
}

// CUDA: the warps of a split decode tile split the head dim instead of the keys (kernel_traits.h
// SplitKeysTileConfig::kWarpsSplitDims) where each split walks at most this many key tiles:
// the merge it saves is a large share of a short walk, while the 4x Q K^T work it costs shows
// on long ones. Measured (docs/PERF.md, session 5 runs 4-5), against cuDNN's time: batch 1 x 1k
// (1 tile per split) 0.90 -> 0.97, 1 x 4k (4 tiles) 0.99 -> 1.06, 8 x 1k (4 tiles, default
// pipeline) 0.93 -> 0.98; 1 x 16k (16 tiles) 0.96 -> 0.91, so it keeps the keys split.
// Tiles are counted as make_plan counts them, in splitkv_block_n(head_dim)-key units.
constexpr int kSplitDimsMaxTiles = 4;

// CUDA, sm_90: split decode calls with at most this many splits merge them inside a
// thread-block cluster (AttnParams::cluster_combine) where the device can hold such a cluster
// of the kernel (cuda/launch.h cluster_fits). Larger clusters measured slower than the combine
// kernel: they constrain where CTAs may run (docs/PERF.md, session 8 run 3: 16 splits at 1 x 16k
// 49 against 33 us, 6 splits at 8 x 16k 181 against 142; session 16 run 1, with load-balanced
// placement: 16 splits at 1 x 1k 12.8-13.2 against 10.9-11.9 us, at 1 x 16k 48.8-49.6 against
// 33.0-33.1).
constexpr int kMaxClusterSplits = 4;
inline bool decode_warps_split_dims(int num_splits, int seqlen_k, int head_dim) {
  if (num_splits < 2) return false;  // the split-dims kernel writes split partials only
  const int unit = splitkv_block_n(head_dim);
  const int64_t key_tiles = seqlen_k > 0 ? (int64_t(seqlen_k) + unit - 1) / unit : 1;
  const int64_t tiles_per_split = (key_tiles + num_splits - 1) / num_splits;
  return tiles_per_split <= kSplitDimsMaxTiles;
}

// CUDA: the CTAs of an unsplit decode-tile call on a persistent grid (cuda/persistent_decode_kernel.h:
// each CTA walks several units with one K/V pipeline through them), or 0 for the default
// kernel's grid of one CTA per unit. default_slots and persistent_slots: the CTAs of each kernel
// resident at once. The default grid runs in waves of default_slots CTAs; the persistent grid
// has persistent_slots CTAs (fewer, with more stages each) taking units in turn, in rounds.
// automatic: the persistent grid where the default needs more than one wave and the persistent
// grid's rounds are fuller than the default's waves by at least kPersistentDecodeMinFillGain
// (contiguous K/V) or kPersistentDecodeMinFillGainPaged. Measured (docs/PERF.md session 12, H200
// d = 128, 396 default and 264 persistent slots): batch 50-64 x 1k-4k, fills 0.51-0.65 ->
// 0.76-0.97, 2-10% faster, contiguous and page 16; batch 128, 0.86 -> 0.97: contiguous 5.5%
// faster on one kind of H200 (where the default grid runs 7-8% behind cuDNN) and within 1.4%
// either way on the other, page 16 4.5-6.8% slower on the other kind; batch 96, 0.97 -> 0.97,
// 1.5% slower.
// always (FLASHATTN_PERSISTENT_DECODE=always, for the tests): about three units per CTA
// whatever the grid, at most persistent_slots CTAs.
enum class PersistentDecode { automatic, off, always };
constexpr double kPersistentDecodeMinFillGain = 0.1;
constexpr double kPersistentDecodeMinFillGainPaged = 0.2;
// Where the persistent grid's last round would be at most this full, its units are spread over
// fewer CTAs so that every round is full (measured, docs/PERF.md session 13 run 14: batch 50 x
// 1k, 400 units, 264 -> 200 CTAs, 3.5% faster; 1,024 and 512 units, last rounds 0.88 and 0.94
// full, 264 -> 256 CTAs: level to 0.7% slower).
constexpr double kPersistentDecodeBalanceBelow = 0.75;
// The share of slots x waves (or rounds) that units fill.
inline double wave_fill(int64_t units, int64_t slots) {
  const int64_t waves = (units + slots - 1) / slots;
  return double(units) / double(waves * slots);
}
inline int64_t persistent_decode_ctas(int64_t units, int64_t default_slots, int64_t persistent_slots,
                                      PersistentDecode mode, bool paged) {
  if (mode == PersistentDecode::off || units <= 0 || default_slots <= 0 || persistent_slots <= 0) return 0;
  if (mode == PersistentDecode::always) {
    const int64_t ctas = (units + 2) / 3;
    return ctas < persistent_slots ? ctas : persistent_slots;
  }
  if (units <= default_slots) return 0;  // one wave: every unit runs at once either way
  const double min_gain = paged ? kPersistentDecodeMinFillGainPaged : kPersistentDecodeMinFillGain;
  const bool fuller = wave_fill(units, persistent_slots) >= wave_fill(units, default_slots) + min_gain;
  if (!fuller) return 0;
  // A last round at most kPersistentDecodeBalanceBelow full: as many rounds over as few CTAs as
  // take the units in them, every CTA walking the same number of units within one.
  const int64_t rounds = (units + persistent_slots - 1) / persistent_slots;
  const int64_t last_round = units - (rounds - 1) * persistent_slots;
  if (double(last_round) > kPersistentDecodeBalanceBelow * double(persistent_slots)) {
    return units < persistent_slots ? units : persistent_slots;
  }
  return (units + rounds - 1) / rounds;
}

// CUDA: whether an unsplit decode-tile call whose units (batch x heads, or x KV heads with
// pack_gqa) each have their own KV head runs on the heads-split kernel (cuda/splitheads_kernel.h:
// a CTA of four units computes them side by side, one per warp, and ends with no merge) rather
// than the keys-split ones (a CTA per unit, or several in turn on the persistent grid, each unit
// ending in the warps' merge). ctas: units / 4; default_slots and heads_slots: the CTAs of the
// default keys-split kernel and of the heads-split kernel resident at once; sms: the device's.
// automatic: where the default grid needs more than one wave and the heads-split grid is one
// wave that lies evenly on the SMs: one layer of at most one CTA per SM, or CTAs filling at least
// kSplitHeadsMinLayerFill of as many such layers as they take. Measured (docs/PERF.md, session 18
// runs 1-5; H200, d = 128, 396 default and 264 heads-split slots, 132 SMs), against the kernel the
// rule took before (the persistent grid, or the default at batch 96): one layer, batch 50 x 1k
// (100 CTAs, fill 0.76) 4.5% faster, 56 x 1k (0.85) 6%, 58 x 1k (0.88) 2.7%, 60 x 1k (0.91) 2.0%,
// 64 x 1k (0.97) 1.5%, 64 x 4k 0.4%; two layers, batch 116 x 1k (232 CTAs, 0.88) 2.2%, 120 x 1k
// (0.91) 2.6%, 128 x 1k (0.97) 1.7%, 128 x 4k 1.4%, 128 x 16k 1.6%, but 96 x 1k (192 CTAs, 0.73:
// 60 SMs hold two, 72 one) 6.5% slower. The threshold sits about where a straight line through
// the two-layer results crosses zero. Beyond one wave it is not taken: batch 256 x 1k (two waves,
// the last 248 of 264) measured 0.6% faster, 256 x 4k 0.5% slower, 192 x 1k (a last wave of 120)
// 6.4% slower.
// always (FLASHATTN_SPLIT_HEADS=always, for the tests): every call it serves.
enum class SplitHeads { automatic, off, always };
constexpr double kSplitHeadsMinLayerFill = 0.84;
inline bool decode_warps_split_heads(int64_t units, int64_t ctas, int64_t default_slots, int64_t heads_slots,
                                     int64_t sms, SplitHeads mode) {
  if (mode == SplitHeads::off || ctas <= 0 || heads_slots <= 0) return false;
  if (mode == SplitHeads::always) return true;
  if (units <= default_slots || ctas > heads_slots || sms <= 0) return false;
  const int64_t layers = (ctas + sms - 1) / sms;
  return layers == 1 || double(ctas) >= kSplitHeadsMinLayerFill * double(layers * sms);
}

// CUDA: the persistent decode grid of `ctas` CTAs (of `slots` resident at once) launches in
// clusters of kPersistentDecodeClusterCtas consecutive CTAs (so consecutive units: KV heads of
// one sequence) where the grid takes every slot and they tile it. Placement only: the CTAs share
// nothing. Measured against the plain grid (docs/PERF.md, session 15 runs 8-9): batch 128 x 1k
// 1.0-2.0 us faster, 128 x 4k 1%, 64 x 1k level; a grid of fewer CTAs than slots (50 x 1k: 200 of
// 264) lost 1.5% in clusters, so such grids launch plainly (presumably a cluster's CTAs packed
// onto one SM leave others idle; not measured).
constexpr int kPersistentDecodeClusterCtas = 2;
inline bool persistent_decode_in_clusters(int64_t ctas, int64_t slots) {
  return ctas > 0 && ctas == slots && ctas % kPersistentDecodeClusterCtas == 0;
}

// CUDA: the deep decode pipeline (kernel_traits.h SplitKeysTileConfig) is compiled for the head
// dim instances up to this one (its five K/V stages fit sm_90's shared memory there).
constexpr int kDeepDecodeMaxHeadDim = 128;

// The key tiles [tile_lo, tile_hi) that a query tile must visit (from its visible key range)
// are cut into num_splits nearly equal runs; split `split` owns run number `split` (possibly
// empty). Cutting the visible range of this sequence, not the cache capacity as
// FlashAttention-2 does, keeps every split busy for short sequences in a long cache and for
// sliding windows.
FA_HD KeyRange split_tiles(int split, int num_splits, int tile_lo, int tile_hi) {
  const int tiles = tile_hi - tile_lo;
  const int per_split = int(unsigned(tiles + num_splits - 1) / unsigned(num_splits));
  int first = tile_lo + split * per_split;
  int last = first + per_split;
  if (last > tile_hi) last = tile_hi;
  if (first > last) first = last;
  return KeyRange{first, last};
}

// ---- combine -----------------------------------------------------------------------------

// Row index of (split, b, head, i) in the split partials: o_accum holds head_dim floats per row,
// lse_accum one. seqlen_q here is AttnParams::seqlen_q (the maximum over sequences).
FA_HD int64_t accum_row(const AttnParams& p, int split, int b, int head, int i) {
  return ((int64_t(split) * p.batch + b) * p.num_heads + head) * p.seqlen_q + i;
}

// Element offset of query row i of sequence b, head h, in q / out (see params.h).
FA_HD int64_t q_offset(const AttnParams& p, const SeqInfo& s, int b, int i, int head) {
  return b * p.q_batch_stride + (s.q_row_offset + i) * p.q_row_stride + head * p.q_head_stride;
}
FA_HD int64_t o_offset(const AttnParams& p, const SeqInfo& s, int b, int i, int head) {
  return b * p.o_batch_stride + (s.q_row_offset + i) * p.o_row_stride + head * p.o_head_stride;
}
FA_HD int64_t lse_offset(const AttnParams& p, const SeqInfo& s, int b, int i, int head) {
  return b * p.lse_batch_stride + head * p.lse_head_stride + s.q_row_offset + i;
}

// Running merge of partial results: (m, l) are the max logit and sum of exp(logit - m).
// lse of a partial = m + log(l); an empty partial has lse = -inf.
FA_HD float lse_from_ml(float m, float l) {
  return (l > 0.0f) ? m + logf(l) : -INFINITY;
}

// ---- rotary ------------------------------------------------------------------------------

// Index of the partner of element `c` (c < rotary_dim) and the cos/sin column it uses.
struct RotaryPair {
  int partner;
  int col;      // column of cos/sin
  float sign;   // x'[c] = x[c]*cos + sign*x[partner]*sin
};

FA_HD RotaryPair rotary_pair(int c, int rotary_dim, bool interleaved) {
  const int half = rotary_dim / 2;
  if (interleaved) {
    const bool even = (c % 2) == 0;
    return RotaryPair{even ? c + 1 : c - 1, c / 2, even ? -1.0f : 1.0f};
  }
  const bool first = c < half;
  return RotaryPair{first ? c + half : c - half, first ? c : c - half, first ? -1.0f : 1.0f};
}

}  // namespace flashattn
