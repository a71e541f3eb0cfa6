// The semantics of attention, written once, for host and device: sequence geometry and
// addressing, masks and visible keys, the score function, GQA, the query tiles and split-KV
// boundaries both backends share, the combine's layout and rotary. The online-softmax state and
// the LSE conventions are common/softmax_state.h; the tuning of the CUDA kernels (which kernel,
// which tile, measured on an H200) is common/tuning.h.
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
  // whole d = 256 wgmma kernel, 2-3% slower (docs/DECISIONS.md D-10).
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
// the same keys. Chosen for the CUDA split-KV kernel (docs/DECISIONS.md D-33).
// A power of two (the CUDA kernel cuts splits with shifts).
FA_HD constexpr int splitkv_block_n(int head_dim) { return head_dim <= 32 ? 128 : 64; }  // = CUDA kBlockN (kernel_traits.h)

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
