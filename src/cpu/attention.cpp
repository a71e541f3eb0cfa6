// CPU attention: the FlashAttention-2 forward pass, tile by tile, mirroring the GPU walk.
//
// Work item = (batch b, unit, query tile, split), where unit is the KV head with pack_gqa
// (tile rows are (query, head) pairs, rules.h unpack_row) and the query head without it.
// Each item walks the key tiles (splitkv_block_n(d) keys each) visible to its rows, cut by
// split_tiles when num_splits > 1, with the online softmax of SoftmaxRowState (one state per
// row) and a rescaled fp32 accumulator. The products and the softmax row passes are the tile
// kernels of kernels.h (AVX-512, AVX2 or portable, chosen at run time; for bf16 the AMX or
// AVX512-BF16 set where the CPU has one). Nothing proportional to
// seqlen_q x seqlen_k is ever allocated: the scratch of one worker is a few tiles.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "api/backend.h"
#include "common/rules.h"
#include "common/softmax_state.h"
#include "cpu/aligned.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/storage.h"

namespace flashattn {
namespace cpu {
namespace {

// Most query rows per tile (pack_gqa: (query, head) rows); the call's tile height is
// rules.h query_tile_rows (16, 64 or 128), as in the CUDA kernels, because a tile's visible
// key range, and so its split-KV boundaries, depend on it. It is also the leading dimension of
// the transposed query and score tiles. One worker's scratch (128 x d queries, 128 x 128
// scores, 128 x d accumulator, one K and one V tile) stays within L2.
constexpr int kBlockM = kQueryTileRows;
static_assert(kBlockM % kRowLanes == 0, "tile rows pad to whole row vectors");

// Leading dimension of the transposed query tile qt: one row vector past kBlockM, so that its
// rows (head-dim columns) do not lie a multiple of 512 bytes apart. At 512 bytes, a 32-row
// strip of qt (what the AVX-512 scores block streams over the head dim, 16 KB at d = 128)
// falls into 16 of L1's 64 sets, 12 KB of capacity, and is read from L2 for every key block
// (D-76: scores on one hot tile 179-186 -> 191-200 GFLOP/s).
constexpr int kQtLd = kBlockM + kRowLanes;

constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
constexpr int round_up(int a, int b) { return ceil_div(a, b) * b; }

struct WorkItem {
  int b;
  int unit;     // KV head (pack_gqa) or query head
  int m_block;  // query tile
  int split;
};

// One row of a query tile.
struct TileRow {
  int query;      // row i within the sequence
  int head;       // query head
  KeyRange keys;  // keys this row sees
  float slope;    // ALiBi slope of the head (0 without ALiBi)
};

// How scores become softmax exponents. Plain scores (no softcap, no ALiBi, a positive scale)
// stay raw q.k and the scale goes into the exponent, as on the GPU; otherwise the scores are
// turned into logits (rules.h score_transform, alibi_bias) first.
struct ScoreUnits {
  bool logits;       // scores are transformed into logits before the softmax
  float scale_log2;  // exp(logit - max) == exp2((x - max) * scale_log2)
  float raw_scale;   // logit = x * raw_scale (lse = max * raw_scale + log(sum))
};

ScoreUnits score_units(const AttnParams& p) {
  const bool plain = p.softcap <= 0.0f && p.alibi_slopes == nullptr && p.softmax_scale > 0.0f;
  if (plain) return ScoreUnits{false, p.softmax_scale * kLog2e, p.softmax_scale};
  return ScoreUnits{true, kLog2e, 1.0f};
}

// Sizes of a tile, fixed for the whole call.
struct TileShape {
  int d;      // head dim
  int d_pad;  // d rounded up to kRowLanes (the PV kernel's column step)
  int n;      // keys per tile (splitkv_block_n)
};

TileShape tile_shape(const AttnParams& p) {
  return TileShape{p.head_dim, round_up(p.head_dim, kRowLanes), splitkv_block_n(p.head_dim)};
}

// The fp32 K and V tiles as the kernel set reads them (kernels.h): K in blocks of k_block keys,
// column by column; V in strips of v_cols columns, key by key (a set that reads rows: one strip
// of d_pad columns, which is one key per row).
struct KvLayout {
  int d_pad;
  int k_block;      // keys per K block
  int v_cols;       // columns per V strip
  int ld_v;         // the kernels' ld_v: strips n * v_cols apart, or rows d_pad apart
  size_t k_elems;   // one K tile: n keys (a multiple of k_block) x d_pad
  size_t v_elems;   // one V tile: its strips

  size_t k_offset(int j) const { return size_t(j) * d_pad; }  // key j (a multiple of k_block)
  size_t v_offset(int j) const { return size_t(j) * v_cols; }  // key j in every strip
  // The K block of keys [j0, j0 + k_block) from their rows (k_block rows of ld_rows, d_pad
  // floats each, zero past d), written in order.
  void put_k_block(const float* rows, int ld_rows, int j0, float* k_tile) const {
    float* at = k_tile + size_t(j0) * d_pad;
    for (int c = 0; c < d_pad; ++c) {
      for (int i = 0; i < k_block; ++i) at[size_t(c) * k_block + i] = rows[size_t(i) * ld_rows + c];
    }
  }
  // Columns [c0, c0 + v_cols) of key j's d values (storage S, times descale) into their V strip,
  // zero past d.
  template <typename S>
  void put_v(const typename S::Element* src, int d, float descale, int j, int c0, float* v_tile) const {
    float* dst = v_tile + size_t(c0 / v_cols) * ld_v + v_offset(j);
    const int width = std::min(v_cols, d_pad - c0), real = std::max(0, std::min(width, d - c0));
    load_row<S>(src + c0, real, dst, descale);
    std::fill(dst + real, dst + width, 0.0f);
  }
};

KvLayout kv_layout(const TileKernels& kern, const TileShape& t) {
  KvLayout l;
  l.d_pad = t.d_pad;
  l.k_block = kern.k_block;
  l.v_cols = kern.v_cols > 0 ? kern.v_cols : t.d_pad;
  l.ld_v = kern.v_cols > 0 ? t.n * kern.v_cols : t.d_pad;
  l.k_elems = size_t(round_up(t.n, l.k_block)) * t.d_pad;
  l.v_elems = size_t(t.n) * round_up(t.d_pad, l.v_cols);
  return l;
}

// Scratch of one worker, reused across its work items and, through the pool below, across
// calls. Allocated for one tile shape, the fp32 tiles or the bf16 ones as the call needs.
struct Scratch {
  int d = 0, n = 0;                    // the tile shape allocated for (0: none yet)
  bool fp32_tiles = false, bf16_tiles = false;
  std::vector<TileRow> rows;           // (kBlockM)
  AlignedVector<float> o;                // (kBlockM, d_pad)  unnormalised output accumulator
  std::vector<SoftmaxRowState> state;  // (kBlockM)
  AlignedVector<float> tile_max, offset, tile_sum, correction;  // (kBlockM) per-row passes
  // fp32 tiles (kernels.h layouts):
  AlignedVector<float> q_rows;           // (kBlockM, d)      query rows
  AlignedVector<float> qt;               // (d, kQtLd)        query rows transposed
  AlignedVector<float> k;                // KvLayout k_elems  key tile
  AlignedVector<float> v;                // KvLayout v_elems  value tile, zero past column d
  AlignedVector<float> st;               // (n, kBlockM)      scores, then probabilities
  // bf16 tiles (AMX or AVX512-BF16):
  AlignedVector<uint16_t> q16;             // (kBlockM, d)  query rows
  std::vector<const uint16_t*> k_rows, v_rows;  // (n) a tile's K / V rows (zero_row past the last key)
  std::vector<uint16_t> zero_row;        // (d)
  AlignedVector<uint16_t> k_vnni, v_vnni;  // blocks of (d/2, n, 2) / (n/2, d, 2), a step's tiles
  AlignedVector<float> s;                  // (kBlockM, step keys)  scores, row-major
  AlignedVector<uint16_t> p16;             // (kBlockM, step keys)  probabilities
  // decode walk (D-72), sized for (heads, d) by allocate_decode:
  int decode_heads = 0, decode_d = 0, decode_heads_k = 0;
  AlignedVector<float> dq;                  // (heads, d)  query rows, fp32
  AlignedVector<uint16_t> dq16;             // (heads, d)  query rows as stored (bf16 scores)
  AlignedVector<float> dout;                // (heads, d)  unnormalised output rows
  std::vector<SoftmaxRowState> dstate;      // (heads)
  AlignedVector<float> ds;                  // (heads per KV head, kDecodeKeys)  scores / probabilities
  std::vector<const void*> dk_rows, dv_rows;  // (kDecodeKeys) the rows of one KV head
};

// The bf16 walk takes up to kBf16TilesPerStep key tiles per online-softmax step (D-53, AMX):
// bf16 1 x 2048 x 4 x 128 causal, 1 thread: 1 tile 128, 2 tiles 140, 4 tiles 145, 8 tiles
// level with 4 (GFLOP/s, best of 6 alternating calls).
constexpr int kBf16TilesPerStep = 4;

void allocate(Scratch& ws, const TileShape& t, const KvLayout& kv, bool bf16) {
  if (ws.d != t.d || ws.n != t.n) {
    ws = Scratch{};
    ws.d = t.d;
    ws.n = t.n;
    ws.rows.resize(kBlockM);
    ws.o.assign(size_t(kBlockM) * t.d_pad, 0.0f);
    ws.state.assign(kBlockM, SoftmaxRowState::empty());
    for (auto* row_vector : {&ws.tile_max, &ws.offset, &ws.tile_sum, &ws.correction}) {
      row_vector->assign(kBlockM, 0.0f);
    }
  }
  if (!bf16 && (!ws.fp32_tiles || ws.k.size() != kv.k_elems || ws.v.size() != kv.v_elems)) {
    ws.q_rows.assign(size_t(kBlockM) * t.d, 0.0f);
    ws.qt.assign(size_t(t.d) * kQtLd, 0.0f);
    ws.k.assign(kv.k_elems, 0.0f);
    ws.v.assign(kv.v_elems, 0.0f);
    ws.st.assign(size_t(t.n) * kBlockM, 0.0f);
    ws.fp32_tiles = true;
  }
  if (bf16 && !ws.bf16_tiles) {
    const int step = kBf16TilesPerStep * t.n;
    ws.q16.assign(size_t(kBlockM) * t.d, 0);
    for (auto* tile : {&ws.k_vnni, &ws.v_vnni}) tile->assign(size_t(step) * t.d, 0);
    ws.k_rows.assign(t.n, nullptr);
    ws.v_rows.assign(t.n, nullptr);
    ws.zero_row.assign(t.d, 0);
    ws.s.assign(size_t(kBlockM) * step, 0.0f);
    ws.p16.assign(size_t(kBlockM) * step, 0);
    ws.bf16_tiles = true;
  }
}

// Worker scratch kept between calls, so that calls in a steady state (decode after decode)
// allocate none: a call's workers take one each and give it back when the call ends.
class ScratchPool {
 public:
  std::unique_ptr<Scratch> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) return std::make_unique<Scratch>();
    std::unique_ptr<Scratch> ws = std::move(free_.back());
    free_.pop_back();
    return ws;
  }
  void give(std::unique_ptr<Scratch> ws) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(ws));
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<Scratch>> free_;
};

ScratchPool& scratch_pool() {
  static ScratchPool pool;
  return pool;
}

// The scratch of one call's workers: taken from the pool on a worker's first item (each worker
// touches only its own slot), all given back however the call ends.
class CallScratch {
 public:
  explicit CallScratch(int workers) : held_(workers) {}
  ~CallScratch() {
    for (auto& ws : held_) {
      if (ws) scratch_pool().give(std::move(ws));
    }
  }
  Scratch& of(int worker) {
    if (!held_[worker]) held_[worker] = scratch_pool().take();
    return *held_[worker];
  }

 private:
  std::vector<std::unique_ptr<Scratch>> held_;
};

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

// The key tiles [lo, hi) of block_n keys that split `split` walks of the visible keys `keys`
// (split_tiles: the GPU's boundaries).
KeyRange split_key_tiles(const AttnParams& p, const KeyRange& keys, int block_n, int split) {
  const int tile_lo = keys.lo / block_n;
  const int tile_hi = keys.hi > keys.lo ? ceil_div(keys.hi, block_n) : tile_lo;
  if (p.num_splits > 1) return split_tiles(split, p.num_splits, tile_lo, tile_hi);
  return KeyRange{tile_lo, tile_hi};
}

// The key tiles [lo, hi) this work item walks.
KeyRange tile_range(const AttnParams& p, const SeqInfo& seq, const WorkItem& w,
                    const Scratch& ws, int rows, int block_n) {
  const KeyRange keys = visible_keys_of_rows(p, ws.rows[0].query, ws.rows[rows - 1].query + 1,
                                             seq.seqlen_q, seq.seqlen_k);
  return split_key_tiles(p, keys, block_n, w.split);
}

// The prefetch helpers below are always inlined: GCC's IPA pure-const analysis takes a function
// whose only effects are __builtin_prefetch for one without effects and drops its calls (g++ 12
// -O2 left none of the K/V prefetches of D-56 in the library; D-72).
#define FA_PREFETCH_HELPER [[gnu::always_inline]] inline

// Asks the caches for `bytes` bytes from `row`, for reading (write = false) or writing: the rows
// of a query tile lie one (b, s, h, d) stride apart, where the hardware prefetchers do not look
// ahead, so that a pass over them waits on memory row after row without this (D-69).
FA_PREFETCH_HELPER void prefetch_row(const void* row, size_t bytes, bool write) {
  const char* at = static_cast<const char*>(row);
  for (size_t byte = 0; byte < bytes; byte += kCacheLineBytes) {
    if (write) {
      __builtin_prefetch(at + byte, 1, 3);
    } else {
      __builtin_prefetch(at + byte, 0, 3);
    }
  }
}

// The tile's query rows into ws.qt (transposed, fp32, times the FP8 q descale): converted row
// by row into ws.q_rows, then transposed by the kernel set (D-68); the padding rows up to
// rows_pad (whole row vectors) are zero, so that their scores are finite. QS: q's storage.
template <typename QS>
void load_q(const AttnParams& p, const TileKernels& kern, const SeqInfo& seq, const WorkItem& w, int rows,
            int rows_pad, const TileShape& t, Scratch& ws) {
  using T = typename QS::Element;
  const T* q = static_cast<const T*>(p.q);
  const float descale = q_descale(p, w.b, kv_head_of(p, w));
  for (int r = 0; r < rows; ++r) {
    prefetch_row(q + q_offset(p, seq, w.b, ws.rows[r].query, ws.rows[r].head), t.d * sizeof(T), false);
  }
  for (int r = 0; r < rows; ++r) {
    const TileRow& row = ws.rows[r];
    load_row<QS>(q + q_offset(p, seq, w.b, row.query, row.head), t.d, &ws.q_rows[size_t(r) * t.d], descale);
  }
  std::fill(ws.q_rows.begin() + size_t(rows) * t.d, ws.q_rows.begin() + size_t(rows_pad) * t.d, 0.0f);
  kern.transpose(ws.q_rows.data(), t.d, rows_pad, t.d, ws.qt.data(), kQtLd);
}

void init_state(int rows, const TileShape& t, Scratch& ws) {
  std::fill(ws.o.begin(), ws.o.begin() + size_t(rows) * t.d_pad, 0.0f);
  std::fill(ws.state.begin(), ws.state.begin() + rows, SoftmaxRowState::empty());
}

// Keys [n0, n0 + keys) of KV head hk into k_dst and v_dst in the kernels' layout (fp32, times
// the FP8 k / v descale; columns past d zero, and the keys that fill up K's last block zero),
// each key's row found through the page table when K/V are paged: pages are read in place. KS:
// the storage of k and v.
template <typename KS>
void load_kv_tile(const AttnParams& p, const SeqInfo& seq, int b, int hk, int n0, int keys,
                  const TileShape& t, const KvLayout& kv, float* k_dst, float* v_dst) {
  using T = typename KS::Element;
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const float k_scale = k_descale(p, b, hk), v_scale = v_descale(p, b, hk);
  // K a block of keys at a time: its rows converted into a buffer (zero past d, and zero rows for
  // the keys that fill up the last block), then written in order, block column by block column
  // (D-76: the pack with each row scattered at a stride of k_block took 6.3% of a 1-thread fp32
  // call's samples, this 4.4%).
  constexpr int kRowLength = round_up(kMaxHeadDim, kRowLanes);
  float rows[kMaxKeyBlock * kRowLength] = {};
  for (int j0 = 0; j0 < keys; j0 += kv.k_block) {
    for (int i = 0; i < kv.k_block; ++i) {
      float* row = rows + size_t(i) * kRowLength;
      if (j0 + i < keys) {
        const T* k_row =
            k + kv_row_offset(p, seq, b, n0 + j0 + i, p.k_batch_stride, p.k_row_stride, p.k_head_stride, hk);
        load_row<KS>(k_row, t.d, row, k_scale);
      } else {
        std::fill_n(row, t.d, 0.0f);
      }
    }
    kv.put_k_block(rows, kRowLength, j0, k_dst);
  }
  // V strip by strip, so that the stores run through one strip at a time.
  for (int c0 = 0; c0 < t.d_pad; c0 += kv.v_cols) {
    for (int j = 0; j < keys; ++j) {
      const T* v_row =
          v + kv_row_offset(p, seq, b, n0 + j, p.v_batch_stride, p.v_row_stride, p.v_head_stride, hk);
      kv.put_v<KS>(v_row, t.d, v_scale, j, c0, v_dst);
    }
  }
}

// ---- K/V packed once per call ------------------------------------------------------------------

// The K/V tiles of the whole call in the kernels' layout (fp32 rows, or the bf16 pair blocks), made
// once when several query tiles read each key tile (prefill): tile (b, hk, n_block) at block
// first_tile[b] + hk * tiles[b] + n_block of tile_elems elements. Empty when every key tile is
// read once (decode): each work item then converts its own tiles.
//
// Its storage is kept for the calling thread's next call, up to kKeptPackBytes per buffer
// (D-74): a new buffer's pages are faulted in and zeroed by the kernel at their first touch,
// which took about a tenth of a single-thread fp32 prefill.
constexpr size_t kKeptPackBytes = size_t(64) << 20;

template <typename T>
struct KeptPack {
  AlignedVector<T> k, v;
};
template <typename T>
KeptPack<T>& kept_pack() {
  thread_local KeptPack<T> kept;
  return kept;
}

template <typename T>
struct PackedKV {
  AlignedVector<T> k, v;
  std::vector<int64_t> first_tile;  // (batch)
  std::vector<int> tiles;           // (batch) key tiles of sequence b
  size_t tile_elems = 0;

  PackedKV() = default;
  PackedKV(PackedKV&&) = default;
  PackedKV& operator=(PackedKV&&) = delete;
  ~PackedKV() {  // the storage goes back to the thread (a moved-from one holds none)
    KeptPack<T>& kept = kept_pack<T>();
    if (k.capacity() * sizeof(T) <= kKeptPackBytes && k.capacity() > kept.k.capacity()) kept.k.swap(k);
    if (v.capacity() * sizeof(T) <= kKeptPackBytes && v.capacity() > kept.v.capacity()) kept.v.swap(v);
  }
  // Takes the thread's kept storage and sizes it to `elems` per buffer (left uninitialised).
  void allocate(size_t elems) {
    KeptPack<T>& kept = kept_pack<T>();
    k.swap(kept.k);
    v.swap(kept.v);
    k.clear();  // a larger size then reallocates without copying the old contents
    v.clear();
    k.resize(elems);
    v.resize(elems);
  }

  bool empty() const { return k.empty(); }
  size_t offset(int b, int hk, int n_block) const {
    return size_t(first_tile[b] + int64_t(hk) * tiles[b] + n_block) * tile_elems;
  }
};

// Query tiles that read one key tile of a KV head: the query heads sharing it (unless packed
// into the tile) times the query tiles of the longest sequence.
int key_tile_reuse(const AttnParams& p) {
  int m_blocks = 0;
  for (int b = 0; b < p.batch; ++b) {
    m_blocks = std::max(m_blocks, ceil_div(tile_row_count(p, seq_info(p, b)), query_tile_rows(p)));
  }
  return units_per_sequence(p) / p.num_heads_k * m_blocks;
}

// Lays the tiles out and fills each with pack_tile(b, hk, n_block, k_dst, v_dst, worker), on the
// call's threads; empty where no key tile is read twice.
template <typename T, typename PackTile>
PackedKV<T> pack_all_kv(const AttnParams& p, const TileShape& t, size_t tile_elems, PackTile pack_tile) {
  PackedKV<T> packed;
  if (key_tile_reuse(p) < 2) return packed;
  int64_t total = 0;
  for (int b = 0; b < p.batch; ++b) {
    packed.first_tile.push_back(total);
    packed.tiles.push_back(ceil_div(seq_info(p, b).seqlen_k, t.n));
    total += int64_t(p.num_heads_k) * packed.tiles.back();
  }
  if (total == 0) return packed;
  packed.tile_elems = tile_elems;
  // Left uninitialised (aligned.h): pack_tile writes every element that the kernels read.
  packed.allocate(size_t(total) * tile_elems);
  parallel_for(total, resolve_threads(p.num_threads, total), [&](int64_t item, int worker) {
    // The sequence whose tiles hold `item` (sequences without keys hold none).
    const int b = int(std::upper_bound(packed.first_tile.begin(), packed.first_tile.end(), item) -
                      packed.first_tile.begin()) - 1;
    const int64_t in_batch = item - packed.first_tile[b];
    const int hk = int(in_batch / packed.tiles[b]), n_block = int(in_batch % packed.tiles[b]);
    const size_t at = packed.offset(b, hk, n_block);
    pack_tile(b, hk, n_block, &packed.k[at], &packed.v[at], worker);
  });
  return packed;
}

template <typename KS>
PackedKV<float> pack_all_kv_fp32(const AttnParams& p, const TileShape& t, const KvLayout& kv) {
  return pack_all_kv<float>(p, t, std::max(kv.k_elems, kv.v_elems),
                            [&](int b, int hk, int n_block, float* k_dst, float* v_dst, int) {
    const SeqInfo seq = seq_info(p, b);
    const int n0 = n_block * t.n;
    load_kv_tile<KS>(p, seq, b, hk, n0, std::min(t.n, seq.seqlen_k - n0), t, kv, k_dst, v_dst);
  });
}

// A tile of scores in either layout: score (row r, key j) at s[r * row_step + j * key_step].
struct ScoreView {
  float* s;
  int row_step;
  int key_step;
  float& at(int r, int j) const { return s[size_t(r) * row_step + size_t(j) * key_step]; }
};

ScoreView transposed_scores(Scratch& ws) { return ScoreView{ws.st.data(), 1, kBlockM}; }
ScoreView row_major_scores(Scratch& ws, int width) { return ScoreView{ws.s.data(), width, 1}; }

// Asks the caches for keys [n0, n0 + keys) of KV head hk ahead of their use. One head of each
// key row is a short piece of a long stride (or of a page anywhere), which the hardware
// prefetchers follow late; decode, which reads each key once, waits on memory without this.
template <typename T>
FA_PREFETCH_HELPER void prefetch_kv_tile(const AttnParams& p, const SeqInfo& seq, int b, int hk, int n0, int keys,
                      const TileShape& t) {
  constexpr int kCacheLine = 64;
  const char* k = static_cast<const char*>(p.k);
  const char* v = static_cast<const char*>(p.v);
  const int row_bytes = t.d * int(sizeof(T));
  for (int j = 0; j < keys; ++j) {
    const char* k_row = k + sizeof(T) * kv_row_offset(p, seq, b, n0 + j, p.k_batch_stride, p.k_row_stride,
                                                      p.k_head_stride, hk);
    const char* v_row = v + sizeof(T) * kv_row_offset(p, seq, b, n0 + j, p.v_batch_stride, p.v_row_stride,
                                                      p.v_head_stride, hk);
    for (int byte = 0; byte < row_bytes; byte += kCacheLine) {
      __builtin_prefetch(k_row + byte, 0, 2);
      __builtin_prefetch(v_row + byte, 0, 2);
    }
  }
}

// A later key tile of the walk (kPrefetchTiles ahead) into the caches, while this one is
// computed.
constexpr int kPrefetchTiles = 4;
template <typename T>
FA_PREFETCH_HELPER void prefetch_next_tile(const AttnParams& p, const SeqInfo& seq, int b, int hk, int n_block,
                        const KeyRange& tiles, const TileShape& t) {
  if (n_block + kPrefetchTiles >= tiles.hi) return;
  const int n0 = (n_block + kPrefetchTiles) * t.n;
  prefetch_kv_tile<T>(p, seq, b, hk, n0, std::min(t.n, seq.seqlen_k - n0), t);
}

// Scores -> logits where the units ask for it: softcap, scale, ALiBi (rules.h), for rows
// [r0, r1) and keys [n0, n0 + keys) (view.at(r, j) is key n0 + j).
void to_logits(const AttnParams& p, const SeqInfo& seq, int r0, int r1, int n0, int keys,
               const Scratch& ws, const ScoreView& view) {
  const bool alibi = p.alibi_slopes != nullptr;
  for (int r = r0; r < r1; ++r) {
    const TileRow& row = ws.rows[r];
    for (int j = 0; j < keys; ++j) {
      float& x = view.at(r, j);
      x = score_transform(p, x);
      if (alibi) x += alibi_bias(row.slope, row.query, n0 + j, seq.seqlen_q, seq.seqlen_k);
    }
  }
}

// -inf for the keys [n0, n0 + keys) that a row of [r0, r1) does not see (only rows whose
// visible range does not cover them all have any).
void mask(int r0, int r1, int n0, int keys, const Scratch& ws, const ScoreView& view) {
  for (int r = r0; r < r1; ++r) {
    const KeyRange& visible = ws.rows[r].keys;
    const int lo = std::min(std::max(visible.lo - n0, 0), keys);
    const int hi = std::max(std::min(visible.hi - n0, keys), lo);
    for (int j = 0; j < lo; ++j) view.at(r, j) = -INFINITY;
    for (int j = hi; j < keys; ++j) view.at(r, j) = -INFINITY;
  }
}

// One online-softmax step over the tile for rows [r0, r1) (r0 a multiple of the set's
// row_lanes): each row's state takes the tile's max (raise_max), the scores become
// probabilities exp2(x * scale_log2 - offset) and add to the state's sum. Returns whether any
// accumulator row must be rescaled (by ws.correction) where its max moved, which the caller
// does. A row with a NaN score gets a NaN sum (and so a NaN output); a row without a visible
// key keeps max -inf and sum 0. exp2_sum(offsets, sums) is the layout's probability pass (the
// row arrays whole: rows [r0, r1) at their own index).
template <typename Exp2Sum>
bool online_softmax(const TileKernels& kern, const ScoreUnits& units, int r0, int r1, Scratch& ws,
                    Exp2Sum exp2_sum) {
  const int pad_end = round_up(r1, kern.row_lanes);
  bool rescale = false;
  for (int r = r0; r < r1; ++r) {
    SoftmaxRowState& state = ws.state[r];
    ws.correction[r] = state.raise_max(std::max(state.max, ws.tile_max[r]), units.scale_log2);
    ws.offset[r] = state.exp2_offset(units.scale_log2);
    rescale = rescale || ws.correction[r] != 1.0f;
  }
  std::fill(ws.offset.begin() + r1, ws.offset.begin() + pad_end, 0.0f);
  exp2_sum(ws.offset.data(), ws.tile_sum.data());
  for (int r = r0; r < r1; ++r) ws.state[r].sum += ws.tile_sum[r];
  return rescale;
}

// One finished row: o_row / sum into out (storage dtype) and lse, or into the split partials of
// `split` (SoftmaxRowState finish: a row that saw no key gets output 0 and lse -inf, a NaN row
// NaN). o_row (d fp32) may be overwritten.
template <typename S>
void store_row_result(const AttnParams& p, const TileKernels& kern, const SeqInfo& seq, int b, int split,
                      int query, int head, const SoftmaxResult& result, float* o_row, int d) {
  using T = typename S::Element;
  if (std::is_same<S, Storage<DType::bf16>>::value && p.num_splits <= 1) {
    uint16_t* out = static_cast<uint16_t*>(p.o) + o_offset(p, seq, b, query, head);
    kern.scaled_to_bf16(o_row, d, result.out_scale, out);
    if (p.lse) p.lse[lse_offset(p, seq, b, query, head)] = result.lse;
    return;
  }
  for (int c = 0; c < d; ++c) o_row[c] *= result.out_scale;
  if (p.num_splits > 1) {
    const int64_t acc = accum_row(p, split, b, head, query);
    std::copy(o_row, o_row + d, p.o_accum + acc * d);
    p.lse_accum[acc] = result.lse;
  } else {
    T* out = static_cast<T*>(p.o) + o_offset(p, seq, b, query, head);
    store_row<S>(o_row, d, out);
    if (p.lse) p.lse[lse_offset(p, seq, b, query, head)] = result.lse;
  }
}

// The tile's rows into out and lse, or into the split partials (store_row_result).
template <typename S>
void store(const AttnParams& p, const TileKernels& kern, const SeqInfo& seq, const WorkItem& w,
           const ScoreUnits& units, int rows, const TileShape& t, Scratch& ws) {
  using T = typename S::Element;
  if (p.num_splits <= 1) {
    for (int r = 0; r < rows; ++r) {
      prefetch_row(static_cast<T*>(p.o) + o_offset(p, seq, w.b, ws.rows[r].query, ws.rows[r].head), t.d * sizeof(T), true);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const TileRow& row = ws.rows[r];
    store_row_result<S>(p, kern, seq, w.b, w.split, row.query, row.head, ws.state[r].finish(units.raw_scale),
                        &ws.o[size_t(r) * t.d_pad], t.d);
  }
}

// Rows [r0, r1) of a query tile against keys [k0, k1) of a key tile (tile-relative): the part
// of a tile that one pass of the products covers.
struct TileBlock {
  int r0, r1, k0, k1;
};

// Rows per block of a key tile that some rows see only in part (a causal diagonal tile): a whole
// row strip of the AVX-512 scores (two vectors), a multiple of every set's row_lanes.
constexpr int kMaskedRowGroup = 32;
static_assert(kMaskedRowGroup % kRowLanes == 0, "row groups start on whole row vectors");

// The blocks of key tile [n0, n0 + keys) that the tile's rows see: the whole tile where every
// row sees every key; otherwise, per group of kMaskedRowGroup rows, the keys that some row of the
// group sees (none: no block). A causal diagonal tile's upper triangle is left out at the
// group's grain, instead of computed and masked to -inf: the rows and keys left out would add
// exp2(-inf) = 0 to the sums and 0 x V to the accumulators, so the result is the same. Returns
// the number of blocks written to `blocks` (at most kBlockM / kMaskedRowGroup). A block's first
// key is a multiple of key_block (the K layout's blocks); keys before a row's range are masked.
int visible_blocks(int rows, int n0, int keys, int key_block, const Scratch& ws, TileBlock* blocks) {
  bool whole = true;
  for (int r = 0; r < rows && whole; ++r) whole = ws.rows[r].keys.lo <= n0 && ws.rows[r].keys.hi >= n0 + keys;
  if (whole) {
    blocks[0] = TileBlock{0, rows, 0, keys};
    return 1;
  }
  int count = 0;
  for (int r0 = 0; r0 < rows; r0 += kMaskedRowGroup) {
    const int r1 = std::min(r0 + kMaskedRowGroup, rows);
    int k0 = keys, k1 = 0;
    for (int r = r0; r < r1; ++r) {
      const KeyRange& visible = ws.rows[r].keys;
      const int lo = std::max(visible.lo - n0, 0), hi = std::min(visible.hi - n0, keys);
      if (lo >= hi) continue;
      k0 = std::min(k0, lo);
      k1 = std::max(k1, hi);
    }
    if (k0 < k1) blocks[count++] = TileBlock{r0, r1, k0 / key_block * key_block, k1};
  }
  return count;
}

// One online-softmax step of the fp32 walk over a block of the tile (k_tile, v_tile: the whole
// key tile, keys [n0, ...)): scores, logits, mask, tile max, exp2 and sums, rescale and P.V for
// the block's rows. The score tile keeps the rows at their index and the block's keys from its
// first row.
void fp32_block_step(const AttnParams& p, const TileKernels& kern, const SeqInfo& seq, const ScoreUnits& units,
                     const TileBlock& b, int n0, const float* k_tile, const float* v_tile, const TileShape& t,
                     const KvLayout& kv, Scratch& ws) {
  const int keys = b.k1 - b.k0;
  const int vector_rows = round_up(b.r1, kern.row_lanes) - b.r0;
  float* st = ws.st.data() + b.r0;
  kern.scores(ws.qt.data() + b.r0, kQtLd, k_tile + kv.k_offset(b.k0), t.d_pad, t.d, vector_rows, keys, st, kBlockM);
  const ScoreView view = transposed_scores(ws);
  if (units.logits) to_logits(p, seq, b.r0, b.r1, n0 + b.k0, keys, ws, view);
  mask(b.r0, b.r1, n0 + b.k0, keys, ws, view);
  kern.tile_max(st, kBlockM, vector_rows, keys, ws.tile_max.data() + b.r0);
  const bool rescale = online_softmax(kern, units, b.r0, b.r1, ws, [&](const float* offset, float* tile_sum) {
    kern.exp2_sum(st, kBlockM, vector_rows, keys, units.scale_log2, offset + b.r0, tile_sum + b.r0);
  });
  kern.pv(st, kBlockM, v_tile + kv.v_offset(b.k0), kv.ld_v, b.r1 - b.r0, keys, t.d_pad,
          rescale ? ws.correction.data() + b.r0 : nullptr, ws.o.data() + size_t(b.r0) * t.d_pad, t.d_pad);
}

// S: the compute and output storage; QS, KS: the storage of q and of k, v (S, or E4m3).
template <typename S, typename QS, typename KS>
void run_work_item(const AttnParams& p, const TileKernels& kern, const PackedKV<float>& packed,
                   const ScoreUnits& units, const WorkItem& w, const TileShape& t, const KvLayout& kv,
                   Scratch& ws) {
  const SeqInfo seq = seq_info(p, w.b);
  const int rows = tile_rows(p, seq, w, ws);
  const int rows_pad = round_up(rows, kern.row_lanes);
  const int hk = kv_head_of(p, w);
  const KeyRange tiles = tile_range(p, seq, w, ws, rows, t.n);
  load_q<QS>(p, kern, seq, w, rows, rows_pad, t, ws);
  init_state(rows, t, ws);
  for (int n_block = tiles.lo; n_block < tiles.hi; ++n_block) {
    const int n0 = n_block * t.n;
    const int keys = std::min(t.n, seq.seqlen_k - n0);
    const float* k_tile = ws.k.data();
    const float* v_tile = ws.v.data();
    if (packed.empty()) {
      load_kv_tile<KS>(p, seq, w.b, hk, n0, keys, t, kv, ws.k.data(), ws.v.data());
      prefetch_next_tile<typename KS::Element>(p, seq, w.b, hk, n_block, tiles, t);
    } else {
      k_tile = &packed.k[packed.offset(w.b, hk, n_block)];
      v_tile = &packed.v[packed.offset(w.b, hk, n_block)];
    }
    TileBlock blocks[kBlockM / kMaskedRowGroup];
    const int count = visible_blocks(rows, n0, keys, kv.k_block, ws, blocks);
    for (int i = 0; i < count; ++i) fp32_block_step(p, kern, seq, units, blocks[i], n0, k_tile, v_tile, t, kv, ws);
  }
  store<S>(p, kern, seq, w, units, rows, t, ws);
}

// ---- bf16 on AMX tiles ----------------------------------------------------------------------

using Bf16 = Storage<DType::bf16>;

bool use_bf16_kernels(const AttnParams& p) {
  const bool bf16_storage = p.q_storage == DType::bf16 && p.kv_storage == DType::bf16;
  return p.dtype == DType::bf16 && bf16_storage && p.head_dim % kBf16Pair == 0 && bf16_kernels() != nullptr;
}

// The tile's query rows as stored (bf16), zero rows up to rows_pad (the set's row_pad).
void load_q_bf16(const AttnParams& p, const SeqInfo& seq, const WorkItem& w, int rows, int rows_pad,
                 const TileShape& t, Scratch& ws) {
  const uint16_t* q = static_cast<const uint16_t*>(p.q);
  for (int r = 0; r < rows; ++r) {
    const TileRow& row = ws.rows[r];
    std::copy_n(q + q_offset(p, seq, w.b, row.query, row.head), t.d, &ws.q16[size_t(r) * t.d]);
  }
  std::fill(ws.q16.begin() + size_t(rows) * t.d, ws.q16.begin() + size_t(rows_pad) * t.d, 0);
}

// Key tile n_block of KV head hk packed into the pair layouts (k_vnni / v_vnni blocks of t.n keys,
// zero keys past the sequence's last) straight from where the keys are stored (pages read in
// place). rows and zero_row are the caller's scratch (t.n pointers, d zeros).
void pack_kv_tile_bf16(const Bf16Kernels& bf16, const AttnParams& p, const SeqInfo& seq, int b, int hk,
                       int n_block, const TileShape& t, std::vector<const uint16_t*>& k_rows,
                       std::vector<const uint16_t*>& v_rows, const uint16_t* zero_row, uint16_t* k_vnni,
                       uint16_t* v_vnni) {
  const uint16_t* k = static_cast<const uint16_t*>(p.k);
  const uint16_t* v = static_cast<const uint16_t*>(p.v);
  const int n0 = n_block * t.n;
  const int keys = std::min(t.n, seq.seqlen_k - n0);
  for (int j = 0; j < t.n; ++j) {
    if (j < keys) {
      k_rows[j] = k + kv_row_offset(p, seq, b, n0 + j, p.k_batch_stride, p.k_row_stride, p.k_head_stride, hk);
      v_rows[j] = v + kv_row_offset(p, seq, b, n0 + j, p.v_batch_stride, p.v_row_stride, p.v_head_stride, hk);
    } else {
      k_rows[j] = v_rows[j] = zero_row;
    }
  }
  bf16.pack_k(k_rows.data(), t.n, t.d, k_vnni);
  bf16.pack_v(v_rows.data(), t.n, t.d, v_vnni);
}

PackedKV<uint16_t> pack_all_kv_bf16(const Bf16Kernels& bf16, const AttnParams& p, const TileShape& t) {
  // As many row-pointer scratches as pack_all_kv can use workers, whatever its tile count.
  const int workers = resolve_threads(p.num_threads, std::numeric_limits<int64_t>::max());
  std::vector<std::vector<const uint16_t*>> k_rows(workers, std::vector<const uint16_t*>(t.n));
  std::vector<std::vector<const uint16_t*>> v_rows = k_rows;
  const std::vector<uint16_t> zero_row(t.d, 0);
  return pack_all_kv<uint16_t>(p, t, size_t(t.n) * t.d,
                               [&](int b, int hk, int n_block, uint16_t* k_dst, uint16_t* v_dst, int worker) {
    pack_kv_tile_bf16(bf16, p, seq_info(p, b), b, hk, n_block, t, k_rows[worker], v_rows[worker],
                      zero_row.data(), k_dst, v_dst);
  });
}

// run_work_item's walk with both products on bf16 operands (AMX or AVX512-BF16) and row-major
// scores. It walks the same key tiles, inside the same split boundaries, but takes up to
// kBf16TilesPerStep of them per online-softmax step, so that the accumulators of P.V are loaded
// and stored once per kBf16TilesPerStep tiles (D-53).
void run_work_item_bf16(const AttnParams& p, const TileKernels& kern, const Bf16Kernels& bf16,
                       const PackedKV<uint16_t>& packed, const ScoreUnits& units, const WorkItem& w,
                       const TileShape& t, Scratch& ws) {
  const SeqInfo seq = seq_info(p, w.b);
  const int rows = tile_rows(p, seq, w, ws);
  const int rows_pad = round_up(rows, bf16.row_pad);
  const int hk = kv_head_of(p, w);
  const KeyRange tiles = tile_range(p, seq, w, ws, rows, t.n);
  load_q_bf16(p, seq, w, rows, rows_pad, t, ws);
  init_state(rows, t, ws);
  bf16.begin();
  for (int n_block = tiles.lo; n_block < tiles.hi; n_block += kBf16TilesPerStep) {
    const int step_tiles = std::min(kBf16TilesPerStep, tiles.hi - n_block);
    const int n0 = n_block * t.n;
    const int keys = std::min(step_tiles * t.n, seq.seqlen_k - n0);
    const int width = round_up(keys, kBf16Pair);
    const uint16_t* k_vnni = ws.k_vnni.data();
    const uint16_t* v_vnni = ws.v_vnni.data();
    if (packed.empty()) {
      for (int i = 0; i < step_tiles; ++i) {
        const size_t at = size_t(i) * t.n * t.d;
        pack_kv_tile_bf16(bf16, p, seq, w.b, hk, n_block + i, t, ws.k_rows, ws.v_rows, ws.zero_row.data(),
                          &ws.k_vnni[at], &ws.v_vnni[at]);
        prefetch_next_tile<uint16_t>(p, seq, w.b, hk, n_block + i, tiles, t);
      }
    } else {
      k_vnni = &packed.k[packed.offset(w.b, hk, n_block)];
      v_vnni = &packed.v[packed.offset(w.b, hk, n_block)];
    }
    bf16.scores(ws.q16.data(), rows_pad, t.d, k_vnni, t.n, width, ws.s.data());
    if (units.logits) to_logits(p, seq, 0, rows, n0, keys, ws, row_major_scores(ws, width));
    mask(0, rows, n0, keys, ws, row_major_scores(ws, width));
    bf16.row_max(ws.s.data(), width, rows, keys, ws.tile_max.data());
    const bool rescale = online_softmax(kern, units, 0, rows, ws, [&](const float* offset, float* tile_sum) {
      bf16.row_exp2_sum(ws.s.data(), width, rows, rows_pad, keys, units.scale_log2, offset, tile_sum, ws.p16.data());
    });
    if (rescale) kern.scale_rows(ws.o.data(), t.d_pad, rows, t.d_pad, ws.correction.data());
    bf16.pv(ws.p16.data(), rows_pad, width, v_vnni, t.d, ws.o.data(), t.d_pad);
  }
  bf16.end();
  store<Bf16>(p, kern, seq, w, units, rows, t, ws);
}

// ---- decode walk (D-72) ---------------------------------------------------------------------
//
// One query row per sequence: a work item is (sequence b, split) over all KV heads. It walks the
// split's keys in blocks of kDecodeKeys, and for each block and KV head runs the decode kernels
// (kernels.h) on the K and V rows where they are stored, for all the query heads of that KV head
// at once: each K and V row is read once per call, and a block's rows of all KV heads (in a
// (b, s, h, d) cache one contiguous run per key, in a paged one runs within a page) are read
// together. The splits are the tile walk's: split_tiles over the key tiles (splitkv_block_n) that
// the row sees, so that the partials merge as the GPU's do.

// The walk serves one query row per sequence with K/V stored in the compute type or as e4m3
// (D-87: the kernels widen e4m3 rows in registers; the k descale joins q, the v descale the
// output rows), q in the compute type (or e4m3 with e4m3 K/V), and plain q.k scores (no softcap,
// no ALiBi: ScoreUnits::logits false).
bool use_decode_walk(const AttnParams& p, const ScoreUnits& units) {
  const bool kv_fp8 = p.kv_storage == DType::e4m3;
  const bool q_read = p.q_storage == p.dtype || (kv_fp8 && p.q_storage == DType::e4m3);
  return p.seqlen_q == 1 && !units.logits && q_read && (kv_fp8 || p.kv_storage == p.dtype);
}

void allocate_decode(Scratch& ws, const AttnParams& p) {
  const int heads = p.num_heads, d = p.head_dim;
  if (ws.decode_heads == heads && ws.decode_d == d && ws.decode_heads_k == p.num_heads_k) return;
  ws.decode_heads = heads, ws.decode_d = d, ws.decode_heads_k = p.num_heads_k;
  ws.dq.assign(size_t(heads) * d, 0.0f);
  ws.dq16.assign(size_t(heads) * d, 0);
  ws.dout.assign(size_t(heads) * d, 0.0f);
  ws.dstate.assign(heads, SoftmaxRowState::empty());
  ws.ds.assign(size_t(heads_per_kv_head(p)) * kDecodeKeys, 0.0f);
  for (auto* v : {&ws.tile_max, &ws.offset, &ws.tile_sum, &ws.correction}) {
    if (int(v->size()) < heads) v->assign(heads, 0.0f);
  }
  ws.dk_rows.assign(kDecodeKeys, nullptr);
  ws.dv_rows.assign(kDecodeKeys, nullptr);
}

// The keys [lo, hi) of split `split` of sequence b: the key tiles of its visible range cut by
// split_tiles, clipped to the visible range (one query row: every head sees the same keys).
KeyRange decode_keys(const AttnParams& p, const SeqInfo& seq, int split) {
  const int n = splitkv_block_n(p.head_dim);
  const KeyRange visible = visible_keys(p, 0, seq.seqlen_q, seq.seqlen_k);
  const KeyRange tiles = split_key_tiles(p, visible, n, split);
  const int lo = std::max(tiles.lo * n, visible.lo);
  return KeyRange{lo, std::max(std::min(tiles.hi * n, visible.hi), lo)};
}

// The query rows of sequence b, as the decode kernels take them: fp32 (e4m3 q times its descale;
// with e4m3 K/V, times the k descale of the row's KV head, D-87), or the stored bf16 bits. QS,
// KS: the storage of q and of k and v.
template <typename QS, typename KS>
void load_decode_q(const AttnParams& p, const SeqInfo& seq, int b, const DecodeKernels& dk, Scratch& ws) {
  using T = typename QS::Element;
  const T* q = static_cast<const T*>(p.q);
  const int d = p.head_dim, g = heads_per_kv_head(p);
  for (int head = 0; head < p.num_heads; ++head) {
    const T* row = q + q_offset(p, seq, b, 0, head);
    if constexpr (std::is_same_v<QS, Bf16>) {
      if (dk.bf16_query) {
        std::copy_n(row, d, &ws.dq16[size_t(head) * d]);
        continue;
      }
    }
    float* dst = &ws.dq[size_t(head) * d];
    load_row<QS>(row, d, dst, q_descale(p, b, head / g));
    if constexpr (std::is_same_v<KS, E4m3>) {
      const float k_scale = k_descale(p, b, head / g);
      for (int c = 0; c < d; ++c) dst[c] *= k_scale;
    }
  }
}

// Byte address of key j's K or V row of KV head 0 (pages read in place).
const char* decode_row(const AttnParams& p, const SeqInfo& seq, int b, int j, const void* base, int64_t batch_stride,
                       int64_t row_stride, int64_t head_stride, size_t elem) {
  return static_cast<const char*>(base) + elem * kv_row_offset(p, seq, b, j, batch_stride, row_stride, head_stride, 0);
}

// The K and V rows of KV head 0 of a block of keys (byte addresses; pages read in place): KV
// head hk's rows lie hk head strides further.
struct DecodeBlockRows {
  int keys = 0;
  const char* k[kDecodeKeys];
  const char* v[kDecodeKeys];
};

// Keys [j0, min(j0 + kDecodeKeys, j_end)) of sequence b (none where j0 >= j_end).
void block_rows(const AttnParams& p, const SeqInfo& seq, int b, int j0, int j_end, size_t elem,
                DecodeBlockRows& rows) {
  rows.keys = std::max(0, std::min(kDecodeKeys, j_end - j0));
  for (int j = 0; j < rows.keys; ++j) {
    rows.k[j] = decode_row(p, seq, b, j0 + j, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, elem);
    rows.v[j] = decode_row(p, seq, b, j0 + j, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, elem);
  }
}

// KV head hk's K and V rows of a block into L1, issued one KV head step before the kernels read
// them (docs/DECISIONS.md D-85: the next step's rows with PREFETCHT0, where D-72 prefetched the
// next block's rows of the same KV head into L2, 8 steps ahead).
FA_PREFETCH_HELPER void prefetch_head_rows(const AttnParams& p, const DecodeBlockRows& rows, int hk, size_t elem) {
  const size_t row_bytes = size_t(p.head_dim) * elem;
  for (int j = 0; j < rows.keys; ++j) {
    const char* k = rows.k[j] + elem * hk * p.k_head_stride;
    const char* v = rows.v[j] + elem * hk * p.v_head_stride;
    for (size_t byte = 0; byte < row_bytes; byte += kCacheLineBytes) {
      __builtin_prefetch(k + byte, 0, 3);
      __builtin_prefetch(v + byte, 0, 3);
    }
  }
}

// One block of `keys` keys for the g query heads of KV head hk (rows in ws.dk_rows / dv_rows):
// scores, the online-softmax step of each head's SoftmaxRowState, P.V into the heads' rows.
void decode_block_step(const AttnParams& p, const DecodeKernels& dk, const ScoreUnits& units, int hk, int keys,
                       Scratch& ws) {
  const int g = heads_per_kv_head(p), d = p.head_dim, h0 = hk * g;
  const void* q = dk.bf16_query ? static_cast<const void*>(&ws.dq16[size_t(h0) * d])
                                : static_cast<const void*>(&ws.dq[size_t(h0) * d]);
  dk.scores(q, g, d, ws.dk_rows.data(), keys, ws.ds.data());
  dk.row_max(ws.ds.data(), g, keys, ws.tile_max.data());
  for (int h = 0; h < g; ++h) {
    SoftmaxRowState& state = ws.dstate[h0 + h];
    ws.correction[h] = state.raise_max(std::max(state.max, ws.tile_max[h]), units.scale_log2);
    ws.offset[h] = state.exp2_offset(units.scale_log2);
  }
  dk.exp2_sum(ws.ds.data(), g, keys, units.scale_log2, ws.offset.data(), ws.tile_sum.data());
  for (int h = 0; h < g; ++h) ws.dstate[h0 + h].sum += ws.tile_sum[h];
  dk.pv(ws.ds.data(), g, ws.dv_rows.data(), keys, d, ws.correction.data(), &ws.dout[size_t(h0) * d]);
}

template <typename S, typename QS, typename KS>
void run_decode_item(const AttnParams& p, const TileKernels& kern, const DecodeKernels& dk, const ScoreUnits& units,
                     int b, int split, Scratch& ws) {
  constexpr size_t elem = sizeof(typename KS::Element);
  const SeqInfo seq = seq_info(p, b);
  if (seq.seqlen_q < 1) return;  // varlen: a sequence without a query row
  const KeyRange keys = decode_keys(p, seq, split);
  const int d = p.head_dim;
  load_decode_q<QS, KS>(p, seq, b, dk, ws);
  std::fill(ws.dout.begin(), ws.dout.end(), 0.0f);
  std::fill(ws.dstate.begin(), ws.dstate.end(), SoftmaxRowState::empty());
  DecodeBlockRows rows, next;
  block_rows(p, seq, b, keys.lo, keys.hi, elem, next);
  prefetch_head_rows(p, next, 0, elem);
  for (int j0 = keys.lo; j0 < keys.hi; j0 += kDecodeKeys) {
    rows = next;
    block_rows(p, seq, b, j0 + kDecodeKeys, keys.hi, elem, next);
    for (int hk = 0; hk < p.num_heads_k; ++hk) {
      // the next step's rows: KV head hk + 1 of this block, or KV head 0 of the next (D-85)
      if (hk + 1 < p.num_heads_k) {
        prefetch_head_rows(p, rows, hk + 1, elem);
      } else {
        prefetch_head_rows(p, next, 0, elem);
      }
      for (int j = 0; j < rows.keys; ++j) {
        ws.dk_rows[j] = rows.k[j] + elem * hk * p.k_head_stride;
        ws.dv_rows[j] = rows.v[j] + elem * hk * p.v_head_stride;
      }
      decode_block_step(p, dk, units, hk, rows.keys, ws);
    }
  }
  for (int head = 0; head < p.num_heads; ++head) {
    SoftmaxResult result = ws.dstate[head].finish(units.raw_scale);
    if constexpr (std::is_same_v<KS, E4m3>) result.out_scale *= v_descale(p, b, head / heads_per_kv_head(p));  // D-87
    store_row_result<S>(p, kern, seq, b, split, 0, head, result, &ws.dout[size_t(head) * d], d);
  }
}

template <typename S, typename QS, typename KS>
void run_decode(const AttnParams& p, const ScoreUnits& units) {
  const TileKernels& kern = tile_kernels();
  const DecodeKernels& dk = decode_kernels(p.kv_storage, p.head_dim);  // (use_decode_walk: e4m3 or dtype)
  const int splits = std::max(p.num_splits, 1);
  const int64_t items = int64_t(p.batch) * splits;
  const int workers = resolve_threads(p.num_threads, items);
  CallScratch scratch(workers);
  parallel_for(items, workers, [&](int64_t item, int worker) {
    Scratch& ws = scratch.of(worker);
    allocate_decode(ws, p);
    run_decode_item<S, QS, KS>(p, kern, dk, units, int(item / splits), int(item % splits), ws);
  });
}

// Every (b, unit, query tile, split) with at least one row; varlen sequences differ in length.
// The items of one (b, unit) are consecutive, so that its K and V stay in L2 from one query
// tile to the next, and within it the last query tiles come first: under a causal mask they
// see the most keys, and the threads' dynamic scheduling balances best when the short items
// come last.
std::vector<WorkItem> work_items(const AttnParams& p) {
  std::vector<WorkItem> items;
  const int units = units_per_sequence(p);
  const int splits = std::max(p.num_splits, 1);
  for (int b = 0; b < p.batch; ++b) {
    const SeqInfo seq = seq_info(p, b);
    const int m_blocks = ceil_div(tile_row_count(p, seq), query_tile_rows(p));
    for (int unit = 0; unit < units; ++unit) {
      for (int m_block = m_blocks - 1; m_block >= 0; --m_block) {
        for (int split = 0; split < splits; ++split) items.push_back({b, unit, m_block, split});
      }
    }
  }
  return items;
}

// ---- combine ----------------------------------------------------------------------------------

// Merges the split partials of every real row of (b, head) with merge_states, one split at a
// time: each finished split is a state of its LSE (state_of_lse), and enters the output with
// weight exp(lse_s - lse). No visible key in any split: out 0, lse -inf; a NaN split: NaN.
template <typename S>
void combine_rows(const AttnParams& p, int b, int head, std::vector<float>& o_row) {
  using T = typename S::Element;
  const SeqInfo seq = seq_info(p, b);
  const int d = p.head_dim;
  for (int i = 0; i < seq.seqlen_q; ++i) {
    SoftmaxRowState merged = SoftmaxRowState::empty();
    for (int split = 0; split < p.num_splits; ++split) {
      const SoftmaxRowState part = state_of_lse(p.lse_accum[accum_row(p, split, b, head, i)]);
      merged = merge_states<2>([&](int k) { return k == 0 ? merged : part; }, kLog2e);
    }
    const SoftmaxResult result = merged.finish(1.0f);
    std::fill(o_row.begin(), o_row.end(), 0.0f);
    for (int split = 0; split < p.num_splits; ++split) {
      const int64_t acc = accum_row(p, split, b, head, i);
      const float weight = state_of_lse(p.lse_accum[acc]).weight_in(merged, kLog2e);  // exp(lse_s - lse)
      if (weight == 0.0f) continue;  // also skips the (zero) partials of empty splits
      const float* partial = p.o_accum + acc * d;
      for (int c = 0; c < d; ++c) o_row[c] += weight * partial[c];
    }
    store_row<S>(o_row.data(), d, static_cast<T*>(p.o) + o_offset(p, seq, b, i, head));
    if (p.lse) p.lse[lse_offset(p, seq, b, i, head)] = result.lse;
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

// The tile walk: every work item's query tile against its key tiles.
template <typename S, typename QS, typename KS>
void run_tiles(const AttnParams& p, const ScoreUnits& units) {
  const TileKernels& kern = tile_kernels();
  const TileShape shape = tile_shape(p);
  const std::vector<WorkItem> items = work_items(p);
  const int workers = resolve_threads(p.num_threads, int64_t(items.size()));
  CallScratch scratch(workers);
  const Bf16Kernels* bf16 = use_bf16_kernels(p) ? bf16_kernels() : nullptr;
  const PackedKV<uint16_t> packed_bf16 = bf16 != nullptr ? pack_all_kv_bf16(*bf16, p, shape) : PackedKV<uint16_t>{};
  const KvLayout kv = kv_layout(kern, shape);
  const PackedKV<float> packed = bf16 == nullptr ? pack_all_kv_fp32<KS>(p, shape, kv) : PackedKV<float>{};
  parallel_for(int64_t(items.size()), workers, [&](int64_t item, int worker) {
    Scratch& ws = scratch.of(worker);
    allocate(ws, shape, kv, bf16 != nullptr);
    if (bf16 != nullptr) {
      run_work_item_bf16(p, kern, *bf16, packed_bf16, units, items[item], shape, ws);
    } else {
      run_work_item<S, QS, KS>(p, kern, packed, units, items[item], shape, kv, ws);
    }
  });
}

template <typename S, typename QS, typename KS>
void run(const AttnParams& p) {
  const ScoreUnits units = score_units(p);
  if (use_decode_walk(p, units)) {
    run_decode<S, QS, KS>(p, units);
  } else {
    run_tiles<S, QS, KS>(p, units);
  }
  if (p.num_splits > 1) combine<S>(p);
}

}  // namespace

void run_attention(const AttnParams& params) {
  dispatch_dtype(params.dtype, [&](auto compute) {
    dispatch_storage(params.q_storage, compute, [&](auto q) {
      dispatch_storage(params.kv_storage, compute, [&](auto kv) {
        run<decltype(compute), decltype(q), decltype(kv)>(params);
      });
    });
  });
}

}  // namespace cpu
}  // namespace flashattn
