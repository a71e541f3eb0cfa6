// What a CTA (or a decode unit) computes: its batch, heads and query rows, the sequence's
// lengths (rules.h SeqInfo) and the key tiles it visits.
#pragma once

#include <cute/tensor.hpp>

#include "common/params.h"
#include "common/rules.h"
#include "cuda/components/index_checks.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)

// ---- per-CTA geometry ----------------------------------------------------------------------

struct CtaInfo {
  int b;           // batch
  int head;        // query head (unpacked) or KV head (pack_gqa)
  int hk;          // KV head
  int g;           // rows per query (h / hk with pack_gqa, else 1)
  int m0;          // first tile row
  int rows;        // tile rows of this sequence: seqlen_q * g
  SeqInfo seq;
};

// Query index and head of tile row r (absolute row within the sequence's packed rows).
__device__ __forceinline__ PackedRow tile_row_query(const AttnParams& p, const CtaInfo& c, int r) {
  if (p.pack_gqa) return unpack_row(p, r, c.hk);
  return PackedRow{r, c.head};
}

// The batch and heads of unit (batch x heads, or batch x KV heads with pack_gqa); heads:
// units_per_sequence(p).
__device__ __forceinline__ void set_unit_heads(const AttnParams& p, int unit, int heads, CtaInfo& c) {
  c.b = int(unsigned(unit) / unsigned(heads));
  c.head = unit - c.b * heads;
  c.g = p.pack_gqa ? heads_per_kv_head(p) : 1;
  c.hk = p.pack_gqa ? c.head : int(unsigned(c.head) / unsigned(heads_per_kv_head(p)));
}
__device__ __forceinline__ void set_unit_heads(const AttnParams& p, int unit, CtaInfo& c) {
  set_unit_heads(p, unit, units_per_sequence(p), c);
}

// The geometry of decode unit `unit` of sequence seq: one query tile per unit, so its first
// row is 0 (the persistent and heads-split decode kernels).
__device__ __forceinline__ CtaInfo decode_unit_info(const AttnParams& p, int unit, const SeqInfo& seq) {
  CtaInfo c;
  set_unit_heads(p, unit, c);
  c.seq = seq;
  c.rows = seq.seqlen_q * c.g;
  c.m0 = 0;
  return c;
}

// The geometry of query tile m_block (counted from the heaviest, the last rows) of unit `unit`;
// false when this query tile lies past the end of its sequence (varlen: shorter than
// max_seqlen_q).
template <int kBlockM>
__device__ __forceinline__ bool cta_info_at(const AttnParams& p, int unit, int heads, int m_block, int m_blocks,
                                            CtaInfo& c) {
  set_unit_heads(p, unit, heads, c);
  c.seq = seq_info_checked(p, c.b);  // a sequence with an index fault comes back empty
  c.rows = c.seq.seqlen_q * c.g;
  // Heavy (late, causal) query tiles first: better tail balance.
  c.m0 = (m_blocks - 1 - m_block) * kBlockM;
  return c.m0 < c.rows;
}

// The CTA's (batch, head, first row) from its block index (launch_tile_grid's grid).
template <int kBlockM>
__device__ __forceinline__ bool make_cta_info(const AttnParams& p, CtaInfo& c) {
  // Read before the block indices are chosen, and seq_info's reads as rules.h has them: the
  // order docs/DECISIONS.md D-10 measured. In another order ptxas rescheduled the whole d = 256
  // wgmma kernel, 2-3% slower (docs/DECISIONS.md D-10).
  const int heads = units_per_sequence(p);
  // The decode tile (one query tile per unit) is always launched unit by unit.
  const bool heavy_first = kBlockM != kQueryTileRowsDecode && p.heavy_tiles_first;
  const int unit = heavy_first ? blockIdx.x : blockIdx.z;
  const int m_block = heavy_first ? blockIdx.z : blockIdx.x;
  const int m_blocks = heavy_first ? gridDim.z : gridDim.x;
  return cta_info_at<kBlockM>(p, unit, heads, m_block, m_blocks, c);
}

// Query tiles of a unit (unpacked rows: seqlen_q of the longest sequence).
template <int kBlockM>
__device__ __forceinline__ int query_tiles_per_unit(const AttnParams& p) {
  return int((int64_t(p.seqlen_q) + kBlockM - 1) / kBlockM);
}

// The geometry of tile `tile` of a tile-loop grid (launch_tile_loop): the tiles in the order of
// launch_tile_grid's grid, heaviest query tile first across units (p.heavy_tiles_first) or unit
// by unit (a unit's query tiles side by side, sharing its K/V in L2).
template <int kBlockM>
__device__ __forceinline__ bool make_tile_info(const AttnParams& p, int tile, int m_blocks, CtaInfo& c) {
  const int heads = units_per_sequence(p);
  const int fast_count = p.heavy_tiles_first ? p.batch * heads : m_blocks;  // tiles < 2^31
  const int slow = tile / fast_count;
  const int fast = tile - slow * fast_count;
  const int unit = p.heavy_tiles_first ? fast : slow;
  const int m_block = p.heavy_tiles_first ? slow : fast;
  return cta_info_at<kBlockM>(p, unit, heads, m_block, m_blocks, c);
}

// The tile this CTA takes in round `round` of a tile-loop grid (launch_tile_loop): the CTAs take
// the tiles in rounds of gridDim.x, in block order in even rounds and in reverse in odd ones (a
// snake), so that with the tiles heaviest first every CTA's sum of work stays level (plain
// rounds left the CTAs of low index up to 14% more work under causal masks; D-71).
__device__ __forceinline__ int tile_of_round(int round) {
  const int in_round = (round & 1) ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);
  return round * int(gridDim.x) + in_round;
}

// The key tiles [lo, hi) this CTA visits (its rows' visible keys, cut to its split), and the
// keys [mask_free_lo, mask_free_hi) visible to every one of its rows: a tile inside that range
// needs no element mask.
struct CtaKeyTiles {
  int lo, hi;
  int mask_free_lo, mask_free_hi;
};

template <int kBlockM, int kBlockN>
__device__ __forceinline__ CtaKeyTiles cta_key_tiles(const AttnParams& p, const CtaInfo& c, int split) {
  const int q_first = tile_row_query(p, c, c.m0).query;
  const int q_last = tile_row_query(p, c, min(c.m0 + kBlockM, c.rows) - 1).query;
  const KeyRange keys = visible_keys_of_rows(p, q_first, q_last + 1, c.seq.seqlen_q, c.seq.seqlen_k);
  CtaKeyTiles t;
  t.lo = keys.lo / kBlockN;
  t.hi = keys.hi > keys.lo ? (keys.hi + kBlockN - 1) / kBlockN : t.lo;
  if (p.num_splits > 1) {
    // Splits are cut at whole splitkv_block_n(head_dim)-key units, as the CPU backend cuts
    // them; a unit is a whole number of this kernel's tiles (launch_tile_grid checks), also when a
    // larger compiled head dim serves this one.
    // The unit is a power of two: shifts instead of divisions (keys are never negative).
    const int unit = splitkv_block_n(p.head_dim);
    const int unit_log2 = __ffs(unit) - 1;
    const int tiles_per_unit = unit / kBlockN;
    const int unit_lo = keys.lo >> unit_log2;
    const int unit_hi = keys.hi > keys.lo ? (keys.hi + unit - 1) >> unit_log2 : unit_lo;
    const KeyRange cut = split_tiles(split, p.num_splits, unit_lo, unit_hi);
    t.lo = max(t.lo, cut.lo * tiles_per_unit);
    t.hi = min(t.hi, cut.hi * tiles_per_unit);
    if (t.hi < t.lo) t.hi = t.lo;
  }
  // First row's range ends earliest and the last row's starts latest.
  t.mask_free_lo = visible_keys(p, q_last, c.seq.seqlen_q, c.seq.seqlen_k).lo;
  t.mask_free_hi = visible_keys(p, q_first, c.seq.seqlen_q, c.seq.seqlen_k).hi;
  return t;
}

// A unit as the persistent kernel walks it: its geometry and key tiles.
struct DecodeUnit {
  CtaInfo c;
  CtaKeyTiles tiles;
};

// The items of a unit: one per key tile, or one empty item.
__device__ __forceinline__ int unit_items(const CtaKeyTiles& t) { return t.hi > t.lo ? t.hi - t.lo : 1; }

template <int kBlockM, int kBlockN>
__device__ __forceinline__ DecodeUnit make_decode_unit(const AttnParams& p, int unit, const SeqInfo& seq) {
  DecodeUnit u;
  u.c = decode_unit_info(p, unit, seq);
  u.tiles = cta_key_tiles<kBlockM, kBlockN>(p, u.c, /*split=*/0);
  return u;
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
