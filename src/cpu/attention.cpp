// CPU attention: the FlashAttention-2 forward pass, tile by tile, mirroring the GPU walk.
//
// Work item = (batch b, unit, query tile, split), where unit is the KV head with pack_gqa
// (tile rows are (query, head) pairs, rules.h unpack_row) and the query head without it.
// Each item walks the key tiles (splitkv_block_n(d) keys each) visible to its rows, cut by
// split_tiles when num_splits > 1, with an online softmax (running max m, sum l, rescaled
// fp32 accumulator). Nothing proportional to seqlen_q x seqlen_k is ever allocated: the
// scratch of one worker is a few tiles.
#include <algorithm>
#include <cmath>
#include <vector>

#include "api/backend.h"
#include "common/rules.h"
#include "common/softmax_state.h"
#include "cpu/parallel.h"
#include "cpu/storage.h"

namespace flashattn {
namespace cpu {
namespace {

// Most query rows per tile (pack_gqa: (query, head) rows); the call's tile height is
// rules.h query_tile_rows (16, 64 or 128), as in the CUDA kernels, because a tile's visible key range,
// and so its split-KV boundaries, depend on it. One worker's scratch (128 x 128 scores,
// 128 x d accumulator, one K/V tile) stays within L2.
constexpr int kBlockM = kQueryTileRows;
// Width of the register tiles of the two products (keys for q·k, columns for p·v). 16 fp32
// fill four SSE / two AVX registers, so an accumulator row stays in registers over the loop
// (measured: 800x800, d=256, b=2, h=4 bf16 runs at ~40 GFLOP/s on 2 cores).
constexpr int kVec = 16;

constexpr float kNegInf = -INFINITY;

int ceil_div(int a, int b) { return (a + b - 1) / b; }
int round_up(int a, int b) { return ceil_div(a, b) * b; }

struct WorkItem {
  int b;
  int unit;     // KV head (pack_gqa) or query head
  int m_block;  // query tile
  int split;
};

// One row of a query tile.
struct TileRow {
  int query;    // row i within the sequence
  int head;     // query head
  KeyRange keys;  // keys this row sees
  float slope;  // ALiBi slope of the head (0 without ALiBi)
};

// Scratch of one worker, reused across its work items.
struct Scratch {
  std::vector<TileRow> rows;  // (kBlockM)
  std::vector<float> q;       // (kBlockM, d_pad)  query rows, fp32
  std::vector<float> kt;      // (d, n_pad)        key tile transposed, zero past the last key
  std::vector<float> v;       // (n_pad, d_pad)    value tile, zero past the last key / column
  std::vector<float> s;       // (kBlockM, n_pad)  scores, then probabilities
  std::vector<float> o;       // (kBlockM, d_pad)  unnormalised output accumulator
  std::vector<float> m, l;    // (kBlockM)         running max and sum
  std::vector<char> active;   // (kBlockM)         row has a visible key in the current tile
};

// Sizes of a tile, fixed for the whole call.
struct TileShape {
  int d;      // head dim
  int d_pad;  // d rounded up to kVec
  int n;      // keys per tile (splitkv_block_n)
  int n_pad;  // n rounded up to kVec
};

TileShape tile_shape(const AttnParams& p) {
  TileShape t;
  t.d = p.head_dim;
  t.d_pad = round_up(p.head_dim, kVec);
  t.n = splitkv_block_n(p.head_dim);
  t.n_pad = round_up(t.n, kVec);
  return t;
}

void allocate(Scratch& ws, const TileShape& t) {
  ws.rows.resize(kBlockM);
  ws.q.assign(size_t(kBlockM) * t.d_pad, 0.0f);
  ws.kt.assign(size_t(t.d) * t.n_pad, 0.0f);
  ws.v.assign(size_t(t.n_pad) * t.d_pad, 0.0f);
  ws.s.assign(size_t(kBlockM) * t.n_pad, 0.0f);
  ws.o.assign(size_t(kBlockM) * t.d_pad, 0.0f);
  ws.m.assign(kBlockM, kNegInf);
  ws.l.assign(kBlockM, 0.0f);
  ws.active.assign(kBlockM, 0);
}

int tile_row_count(const AttnParams& p, const SeqInfo& seq) {
  return p.pack_gqa ? seq.seqlen_q * heads_per_kv_head(p) : seq.seqlen_q;
}

int kv_head_of(const AttnParams& p, const WorkItem& w) {
  return p.pack_gqa ? w.unit : w.unit / heads_per_kv_head(p);
}

// ---- steps of one work item -------------------------------------------------------------

// Fills ws.rows for the tile's rows and returns how many there are.
int tile_rows(const AttnParams& p, const SeqInfo& seq, const WorkItem& w, Scratch& ws) {
  const int block_m = query_tile_rows(p);
  const int first = w.m_block * block_m;
  const int count = std::min(block_m, tile_row_count(p, seq) - first);
  const int hk = kv_head_of(p, w);
  for (int r = 0; r < count; ++r) {
    TileRow& row = ws.rows[r];
    if (p.pack_gqa) {
      const PackedRow packed = unpack_row(p, first + r, hk);
      row.query = packed.query;
      row.head = packed.head;
    } else {
      row.query = first + r;
      row.head = w.unit;
    }
    row.keys = visible_keys(p, row.query, seq.seqlen_q, seq.seqlen_k);
    row.slope = alibi_slope(p, w.b, row.head);
  }
  return count;
}

// The key tiles [lo, hi) this work item walks.
KeyRange tile_range(const AttnParams& p, const SeqInfo& seq, const WorkItem& w,
                    const Scratch& ws, int rows, int block_n) {
  const KeyRange keys = visible_keys_of_rows(p, ws.rows[0].query, ws.rows[rows - 1].query + 1,
                                             seq.seqlen_q, seq.seqlen_k);
  const int tile_lo = keys.lo / block_n;
  const int tile_hi = keys.hi > keys.lo ? ceil_div(keys.hi, block_n) : tile_lo;
  if (p.num_splits > 1) return split_tiles(w.split, p.num_splits, tile_lo, tile_hi);
  return KeyRange{tile_lo, tile_hi};
}

template <typename S>
void load_q(const AttnParams& p, const SeqInfo& seq, const WorkItem& w, int rows,
            const TileShape& t, Scratch& ws) {
  using T = typename S::Element;
  const T* q = static_cast<const T*>(p.q);
  for (int r = 0; r < rows; ++r) {
    const TileRow& row = ws.rows[r];
    load_row<S>(q + q_offset(p, seq, w.b, row.query, row.head), t.d, &ws.q[size_t(r) * t.d_pad]);
  }
}

void init_state(int rows, const TileShape& t, Scratch& ws) {
  std::fill(ws.o.begin(), ws.o.begin() + size_t(rows) * t.d_pad, 0.0f);
  std::fill(ws.m.begin(), ws.m.begin() + rows, kNegInf);
  std::fill(ws.l.begin(), ws.l.begin() + rows, 0.0f);
}

// Keys [n0, n0 + keys) of KV head hk: K transposed into ws.kt, V into ws.v, both fp32.
template <typename S>
void load_kv_tile(const AttnParams& p, const SeqInfo& seq, int b, int hk, int n0, int keys,
                  const TileShape& t, Scratch& ws) {
  using T = typename S::Element;
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  for (int j = 0; j < keys; ++j) {
    const T* k_row =
        k + kv_row_offset(p, seq, b, n0 + j, p.k_batch_stride, p.k_row_stride, p.k_head_stride, hk);
    const T* v_row =
        v + kv_row_offset(p, seq, b, n0 + j, p.v_batch_stride, p.v_row_stride, p.v_head_stride, hk);
    for (int c = 0; c < t.d; ++c) ws.kt[size_t(c) * t.n_pad + j] = S::load(k_row[c]);
    load_row<S>(v_row, t.d, &ws.v[size_t(j) * t.d_pad]);
  }
  // A short last tile: zero the rest so that the register tiles below read finite numbers.
  const int keys_pad = round_up(keys, kVec);
  for (int j = keys; j < keys_pad; ++j) {
    for (int c = 0; c < t.d; ++c) ws.kt[size_t(c) * t.n_pad + j] = 0.0f;
    std::fill_n(&ws.v[size_t(j) * t.d_pad], t.d_pad, 0.0f);
  }
}

// s[r][j] = q_r · k_j for the tile, kVec keys at a time kept in registers.
void qk(int rows, int keys, const TileShape& t, Scratch& ws) {
  const int keys_pad = round_up(keys, kVec);
  for (int r = 0; r < rows; ++r) {
    const float* q_row = &ws.q[size_t(r) * t.d_pad];
    float* s_row = &ws.s[size_t(r) * t.n_pad];
    for (int j0 = 0; j0 < keys_pad; j0 += kVec) {
      float acc[kVec] = {};
      for (int c = 0; c < t.d; ++c) {
        const float qc = q_row[c];
        const float* k_col = &ws.kt[size_t(c) * t.n_pad + j0];
        for (int jj = 0; jj < kVec; ++jj) acc[jj] += qc * k_col[jj];
      }
      for (int jj = 0; jj < kVec; ++jj) s_row[j0 + jj] = acc[jj];
    }
  }
}

// Scores -> logits: scale / softcap, ALiBi, and the mask for rows whose visible range does not
// cover the whole tile (the others skip the mask).
void score(const AttnParams& p, const SeqInfo& seq, int rows, int n0, int keys,
           const TileShape& t, Scratch& ws) {
  const bool softcap = p.softcap > 0.0f;
  const bool alibi = p.alibi_slopes != nullptr;
  for (int r = 0; r < rows; ++r) {
    const TileRow& row = ws.rows[r];
    float* s_row = &ws.s[size_t(r) * t.n_pad];
    if (softcap) {
      for (int j = 0; j < keys; ++j) s_row[j] = score_transform(p, s_row[j]);
    } else {
      const float scale = p.softmax_scale;
      for (int j = 0; j < keys; ++j) s_row[j] *= scale;
    }
    if (alibi) {
      for (int j = 0; j < keys; ++j) {
        s_row[j] += alibi_bias(row.slope, row.query, n0 + j, seq.seqlen_q, seq.seqlen_k);
      }
    }
    const bool needs_mask = row.keys.lo > n0 || row.keys.hi < n0 + keys;
    if (needs_mask) {
      const int lo = std::max(row.keys.lo - n0, 0);
      const int hi = std::min(std::max(row.keys.hi - n0, 0), keys);
      for (int j = 0; j < keys; ++j) {
        if (j < lo || j >= hi) s_row[j] = kNegInf;
      }
    }
  }
}

// Online softmax: new running max, rescale of l and o, probabilities in place of the logits.
// A row with no visible key in this tile keeps its state and is marked inactive.
void online_softmax(int rows, int keys, const TileShape& t, Scratch& ws) {
  for (int r = 0; r < rows; ++r) {
    float* s_row = &ws.s[size_t(r) * t.n_pad];
    float tile_max = kNegInf;
    for (int j = 0; j < keys; ++j) tile_max = std::max(tile_max, s_row[j]);
    ws.active[r] = tile_max != kNegInf;
    if (!ws.active[r]) continue;
    const float m_new = std::max(ws.m[r], tile_max);
    const float correction = std::exp(ws.m[r] - m_new);  // 0 on the first visible tile
    float sum = 0.0f;
    for (int j = 0; j < keys; ++j) {
      s_row[j] = std::exp(s_row[j] - m_new);
      sum += s_row[j];
    }
    ws.m[r] = m_new;
    ws.l[r] = ws.l[r] * correction + sum;
    if (correction != 1.0f) {
      float* o_row = &ws.o[size_t(r) * t.d_pad];
      for (int c = 0; c < t.d_pad; ++c) o_row[c] *= correction;
    }
  }
}

// o[r] += sum_j p[r][j] v_j, kVec columns at a time kept in registers.
void pv(int rows, int keys, const TileShape& t, Scratch& ws) {
  for (int r = 0; r < rows; ++r) {
    if (!ws.active[r]) continue;
    const float* p_row = &ws.s[size_t(r) * t.n_pad];
    float* o_row = &ws.o[size_t(r) * t.d_pad];
    for (int c0 = 0; c0 < t.d_pad; c0 += kVec) {
      float acc[kVec];
      for (int cc = 0; cc < kVec; ++cc) acc[cc] = o_row[c0 + cc];
      for (int j = 0; j < keys; ++j) {
        const float pj = p_row[j];
        const float* v_row = &ws.v[size_t(j) * t.d_pad + c0];
        for (int cc = 0; cc < kVec; ++cc) acc[cc] += pj * v_row[cc];
      }
      for (int cc = 0; cc < kVec; ++cc) o_row[c0 + cc] = acc[cc];
    }
  }
}

// o / l into out (storage dtype) and lse, or into the split partials. A row that saw no key
// (l == 0) gets output 0 and lse -inf.
template <typename S>
void store(const AttnParams& p, const SeqInfo& seq, const WorkItem& w, int rows,
           const TileShape& t, Scratch& ws) {
  using T = typename S::Element;
  for (int r = 0; r < rows; ++r) {
    const TileRow& row = ws.rows[r];
    float* o_row = &ws.o[size_t(r) * t.d_pad];
    const SoftmaxResult finished = SoftmaxRowState{ws.m[r], ws.l[r]}.finish(1.0f);  // m in logits
    for (int c = 0; c < t.d; ++c) o_row[c] *= finished.out_scale;
    const float lse = finished.lse;
    if (p.num_splits > 1) {
      const int64_t acc = accum_row(p, w.split, w.b, row.head, row.query);
      std::copy(o_row, o_row + t.d, p.o_accum + acc * t.d);
      p.lse_accum[acc] = lse;
    } else {
      T* out = static_cast<T*>(p.o) + o_offset(p, seq, w.b, row.query, row.head);
      store_row<S>(o_row, t.d, out);
      if (p.lse) p.lse[lse_offset(p, seq, w.b, row.query, row.head)] = lse;
    }
  }
}

template <typename S>
void run_work_item(const AttnParams& p, const WorkItem& w, const TileShape& t, Scratch& ws) {
  const SeqInfo seq = seq_info(p, w.b);
  const int rows = tile_rows(p, seq, w, ws);
  const int hk = kv_head_of(p, w);
  const KeyRange tiles = tile_range(p, seq, w, ws, rows, t.n);
  load_q<S>(p, seq, w, rows, t, ws);
  init_state(rows, t, ws);
  for (int n_block = tiles.lo; n_block < tiles.hi; ++n_block) {
    const int n0 = n_block * t.n;
    const int keys = std::min(t.n, seq.seqlen_k - n0);
    load_kv_tile<S>(p, seq, w.b, hk, n0, keys, t, ws);
    qk(rows, keys, t, ws);
    score(p, seq, rows, n0, keys, t, ws);
    online_softmax(rows, keys, t, ws);
    pv(rows, keys, t, ws);
  }
  store<S>(p, seq, w, rows, t, ws);
}

// Every (b, unit, query tile, split) with at least one row; varlen sequences differ in length.
std::vector<WorkItem> work_items(const AttnParams& p) {
  std::vector<WorkItem> items;
  const int units = units_per_sequence(p);
  const int splits = std::max(p.num_splits, 1);
  for (int b = 0; b < p.batch; ++b) {
    const SeqInfo seq = seq_info(p, b);
    const int m_blocks = ceil_div(tile_row_count(p, seq), query_tile_rows(p));
    for (int unit = 0; unit < units; ++unit) {
      for (int m_block = 0; m_block < m_blocks; ++m_block) {
        for (int split = 0; split < splits; ++split) items.push_back({b, unit, m_block, split});
      }
    }
  }
  return items;
}

// ---- combine ----------------------------------------------------------------------------------

// Merges the split partials of every real row of (b, head): lse = log sum_s exp(lse_s),
// out = sum_s exp(lse_s - lse) o_s. No visible key in any split: out 0, lse -inf.
template <typename S>
void combine_rows(const AttnParams& p, int b, int head, std::vector<float>& o_row) {
  using T = typename S::Element;
  const SeqInfo seq = seq_info(p, b);
  const int d = p.head_dim;
  for (int i = 0; i < seq.seqlen_q; ++i) {
    float lse_max = kNegInf;
    for (int split = 0; split < p.num_splits; ++split) {
      lse_max = std::max(lse_max, p.lse_accum[accum_row(p, split, b, head, i)]);
    }
    std::fill(o_row.begin(), o_row.end(), 0.0f);
    float lse = kNegInf;
    if (lse_max != kNegInf) {
      float sum = 0.0f;
      for (int split = 0; split < p.num_splits; ++split) {
        sum += std::exp(p.lse_accum[accum_row(p, split, b, head, i)] - lse_max);
      }
      lse = lse_max + std::log(sum);
      for (int split = 0; split < p.num_splits; ++split) {
        const int64_t acc = accum_row(p, split, b, head, i);
        const float weight = std::exp(p.lse_accum[acc] - lse);
        if (weight == 0.0f) continue;  // also skips the (zero) partials of empty splits
        const float* partial = p.o_accum + acc * d;
        for (int c = 0; c < d; ++c) o_row[c] += weight * partial[c];
      }
    }
    store_row<S>(o_row.data(), d, static_cast<T*>(p.o) + o_offset(p, seq, b, i, head));
    if (p.lse) p.lse[lse_offset(p, seq, b, i, head)] = lse;
  }
}

template <typename S>
void combine(const AttnParams& p) {
  const int64_t pairs = int64_t(p.batch) * p.num_heads;
  const int workers = resolve_threads(p.num_threads, pairs);
  std::vector<std::vector<float>> o_rows(workers, std::vector<float>(p.head_dim));
  parallel_for(pairs, workers, [&](int64_t item, int worker) {
    combine_rows<S>(p, int(item / p.num_heads), int(item % p.num_heads), o_rows[worker]);
  });
}

template <typename S>
void run(const AttnParams& p) {
  const TileShape shape = tile_shape(p);
  const std::vector<WorkItem> items = work_items(p);
  const int workers = resolve_threads(p.num_threads, int64_t(items.size()));
  std::vector<Scratch> scratch(workers);
  for (Scratch& ws : scratch) allocate(ws, shape);
  parallel_for(int64_t(items.size()), workers, [&](int64_t item, int worker) {
    run_work_item<S>(p, items[item], shape, scratch[worker]);
  });
  if (p.num_splits > 1) combine<S>(p);
}

}  // namespace

void run_attention(const AttnParams& params) {
  dispatch_dtype(params.dtype, [&](auto storage) { run<decltype(storage)>(params); });
}

}  // namespace cpu
}  // namespace flashattn
