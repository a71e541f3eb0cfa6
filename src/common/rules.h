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

FA_HD constexpr int min_of(int a, int b) { return a < b ? a : b; }

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

// Entries b and b + 1 of a packed (cu_seqlens) array: read(cu, b), then read(cu, b + 1), in
// that order (one read per statement).
struct PackedRange {
  int first, next;
};
template <class Read>
FA_HD PackedRange packed_range(const int* cu_seqlens, int b, Read&& read) {
  const int first = read(cu_seqlens, b);
  return PackedRange{first, read(cu_seqlens, b + 1)};
}

// ---- index checks: the one definition of the range of every length and index read from
// memory (common/index_faults.h). The host checks the same values where it can read them; a
// kernel checks them here, once per sequence, so that a bad value never addresses memory
// outside the tensors passed in. A sequence with a fault is run as a sequence with no keys (its
// rows get output 0 and LSE -inf), or with no query rows when cu_seqlens_q is at fault (its
// rows are unknown: nothing is written).

// value in [lo, hi]. 32-bit: the checks run where a persistent decode CTA holds a whole
// accumulator in registers, and 64-bit arithmetic there spilled.
FA_HD bool in_bounds(int value, int lo, int hi) { return value >= lo && value <= hi; }
// next - first of two entries of a packed array, wrapping instead of overflowing (a decrease of
// more than 2^31 comes out positive but stays beyond every bound the checks use).
FA_HD int difference(int next, int first) { return int(unsigned(next) - unsigned(first)); }

FA_HD IndexFault index_fault(IndexArg arg, int b, int value, int lo, int hi) {
  return IndexFault{int32_t(arg), b, value, lo, hi};
}

// A block_table entry names a page of the cache (the kernels check it as they look it up).
FA_HD bool valid_page(const AttnParams& p, int page) { return unsigned(page) < unsigned(p.num_pages); }

// The values seq_info_read read for sequence b, before they are checked.
struct SeqValues {
  PackedRange q;  // cu_seqlens_q[b], [b + 1] (dense: 0, seqlen_q)
  PackedRange k;  // cu_seqlens_k[b], [b + 1] (read when cu_seqlens_k is set)
  int used;       // seqused_k[b] (kv-cache: cache_seqlens[b])
  int leftpad;
  int kv_batch;
};

// The first of the index rules that sequence b's values break (arg none: they break none), in
// the order the values are used: the query rows, the key rows, the keys used, the left pad, the
// cache row. Each rule is one range; the bounds come from AttnParams (filled by the host from the
// tensors' shapes) or from values already checked.
FA_HD IndexFault first_index_fault(const AttnParams& p, int b, const SeqValues& v) {
  const bool packed_k = p.cu_seqlens_k && !p.block_table;  // K rows packed by cu_seqlens_k
  const int k_len = difference(v.k.next, v.k.first);
  // The keys a sequence may use: its packed rows, else its cache row or page-table row.
  const int keys_cap = p.cu_seqlens_k ? k_len : p.key_capacity;
  if (p.cu_seqlens_q && !in_bounds(v.q.first, 0, p.total_q)) {
    return index_fault(IndexArg::cu_seqlens_q, b, v.q.first, 0, p.total_q);
  }
  // no longer than max_seqlen_q: the grid and the split partials have that many rows
  const int q_last = v.q.first + min_of(p.total_q - v.q.first, p.seqlen_q);
  if (p.cu_seqlens_q && !in_bounds(v.q.next, v.q.first, q_last)) {
    return index_fault(IndexArg::cu_seqlens_q, b, v.q.next, v.q.first, q_last);
  }
  if (packed_k && !in_bounds(v.k.first, 0, p.total_k)) return index_fault(IndexArg::cu_seqlens_k, b, v.k.first, 0, p.total_k);
  if (packed_k && !in_bounds(v.k.next, v.k.first, p.total_k)) {
    return index_fault(IndexArg::cu_seqlens_k, b, v.k.next, v.k.first, p.total_k);
  }
  if (p.cu_seqlens_k && !packed_k && !in_bounds(k_len, 0, p.key_capacity)) {  // paged: only the length counts
    return index_fault(IndexArg::cu_seqlens_k, b, k_len, 0, p.key_capacity);
  }
  const IndexArg used_arg = p.kv_cache ? IndexArg::cache_seqlens : IndexArg::seqused_k;
  if (p.seqused_k && !in_bounds(v.used, 0, keys_cap - p.seqused_k_added)) {
    return index_fault(used_arg, b, v.used, 0, keys_cap - p.seqused_k_added);
  }
  const int leftpad_hi = p.seqused_k ? v.used : keys_cap;  // within the keys used
  const IndexArg leftpad_arg = p.kv_cache ? IndexArg::cache_leftpad : IndexArg::leftpad_k;
  if (p.leftpad_k && !in_bounds(v.leftpad, 0, leftpad_hi)) return index_fault(leftpad_arg, b, v.leftpad, 0, leftpad_hi);
  if (p.cache_batch_idx && !in_bounds(v.kv_batch, 0, p.cache_batches - 1)) {
    return index_fault(IndexArg::cache_batch_idx, b, v.kv_batch, 0, p.cache_batches - 1);
  }
  return IndexFault{int32_t(IndexArg::none), b, 0, 0, 0};
}

template <class Read, class Report>
FA_HD SeqInfo seq_info_read(const AttnParams& p, int b, Read&& read, Report&& report) {
  SeqValues v{{0, p.seqlen_q}, {0, 0}, 0, 0, b};
  // cu_seqlens_q[b] is read again for the length rather than reused: reusing it rescheduled the
  // whole d = 256 wgmma kernel, 2-3% slower (docs/DECISIONS.md D-10).
  const int q_row_offset = p.cu_seqlens_q ? read(p.cu_seqlens_q, b) : 0;
  if (p.cu_seqlens_q) v.q = packed_range(p.cu_seqlens_q, b, read);
  if (p.leftpad_k) v.leftpad = read(p.leftpad_k, b);
  const bool packed_k = p.cu_seqlens_k && !p.block_table;  // K rows packed by cu_seqlens_k
  if (packed_k) v.k.first = read(p.cu_seqlens_k, b);
  if (p.seqused_k) {
    v.used = read(p.seqused_k, b);
    if (packed_k) v.k.next = read(p.cu_seqlens_k, b + 1);  // the bound of seqused_k[b]
    else if (p.cu_seqlens_k) v.k = packed_range(p.cu_seqlens_k, b, read);
  } else if (p.cu_seqlens_k) {
    v.k = packed_range(p.cu_seqlens_k, b, read);
  }
  if (p.cache_batch_idx) v.kv_batch = read(p.cache_batch_idx, b);

  SeqInfo s;
  s.q_row_offset = q_row_offset;
  s.seqlen_q = difference(v.q.next, v.q.first);
  s.leftpad = v.leftpad;
  s.k_row_offset = packed_k ? v.k.first : 0;
  s.kv_batch = v.kv_batch;
  // one past the last key (wrapping where a bad value would overflow: replaced below)
  int keys_end = p.seqused_k ? difference(v.used, -p.seqused_k_added)
                             : p.cu_seqlens_k ? difference(v.k.next, v.k.first) : p.seqlen_k;
  const IndexFault fault = first_index_fault(p, b, v);
  if (fault.arg != int32_t(IndexArg::none)) {
    report(fault);
    // No keys: nothing of K/V is addressed, and every row gets output 0 and LSE -inf. With
    // cu_seqlens_q at fault the rows are unknown too: none.
    keys_end = 0, s.leftpad = 0, s.k_row_offset = 0, s.kv_batch = 0;
    if (fault.arg == int32_t(IndexArg::cu_seqlens_q)) s.q_row_offset = 0, s.seqlen_q = 0;
  }
  s.seqlen_k = keys_end - s.leftpad;
  if (s.seqlen_k < 0) s.seqlen_k = 0;
  return s;
}

// Reports nothing (the CPU backend, whose index values the host checked; the combine, whose
// attention grid reported them).
struct IgnoreIndexFaults {
  FA_HD void operator()(const IndexFault&) const {}
};

template <class Read>
FA_HD SeqInfo seq_info_read(const AttnParams& p, int b, Read&& read) {
  return seq_info_read(p, b, read, IgnoreIndexFaults{});
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

// FP8 (params.h): the descale factor of q, k or v for (batch b, KV head hk), 1 where none is
// given; Params is AttnParams (q, k, v) or AppendParams (k, v). The product q_descale *
// k_descale multiplies the softmax scale, v_descale the output.
FA_HD float descale_at(const float* descale, int64_t batch_stride, int64_t head_stride, int b, int hk) {
  return descale ? descale[b * batch_stride + hk * head_stride] : 1.0f;
}
template <class Params>
FA_HD float q_descale(const Params& p, int b, int hk) {
  return descale_at(p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride, b, hk);
}
template <class Params>
FA_HD float k_descale(const Params& p, int b, int hk) {
  return descale_at(p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride, b, hk);
}
template <class Params>
FA_HD float v_descale(const Params& p, int b, int hk) {
  return descale_at(p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride, b, hk);
}
FA_HD float qk_descale(const AttnParams& p, int b, int hk) { return q_descale(p, b, hk) * k_descale(p, b, hk); }

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

// Query rows of one unit (units_per_sequence): its queries, times the heads packed with GQA.
FA_HD int64_t unit_query_rows(const AttnParams& p) {
  return int64_t(p.seqlen_q) * (p.pack_gqa ? heads_per_kv_head(p) : 1);
}

FA_HD int query_tile_rows(const AttnParams& p) { return query_tile_rows_for(unit_query_rows(p)); }

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
