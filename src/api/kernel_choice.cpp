#include "api/kernel_choice.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/rules.h"
#include "common/tuning.h"

namespace flashattn {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The shape of the call's work: units (a unit is one (batch, head), or (batch, KV head) with
// pack_gqa), their query rows and tiles, and the key tiles of the split-KV walk.
struct Work {
  int units_per_sequence = 0;
  int64_t units = 0;
  int rows = 0;           // query rows of a unit (GQA-packed rows included)
  int tile_rows = 0;      // rules.h query_tile_rows
  int64_t query_tiles = 0;  // per unit
  int64_t work_tiles = 0;   // CTAs without splitting
  int key_tiles = 0;        // splitkv_block_n tiles of the longest sequence
  bool decode_tile() const { return tile_rows == kQueryTileRowsDecode; }
};

Work work_of(const Problem& p, bool pack_gqa) {
  Work w;
  const int group = pack_gqa ? p.heads / p.heads_k : 1;
  w.units_per_sequence = pack_gqa ? p.heads_k : p.heads;
  w.units = int64_t(p.batch) * w.units_per_sequence;
  w.rows = p.seqlen_q * group;
  w.tile_rows = query_tile_rows_for(w.rows);
  w.query_tiles = ceil_div(std::max(w.rows, 1), w.tile_rows);
  w.work_tiles = w.units * w.query_tiles;
  w.key_tiles = int(ceil_div(std::max(p.seqlen_k, 1), splitkv_block_n(p.head_dim)));
  return w;
}

int planned_splits(const Problem& p, const Work& w, int requested, int processors) {
  if (p.seqlen_q == 0 || p.batch == 0) return 1;
  if (requested > 0) return std::min(requested, kMaxSplits);
  if (p.device == Device::cpu && p.seqlen_q == 1) return cpu_decode_splits(p.batch, processors, w.key_tiles, kMaxSplits);
  return num_splits_heuristic(int(std::min<int64_t>(w.work_tiles, 1 << 30)), processors, w.key_tiles, kMaxSplits);
}

// ---- what each CUDA kernel can serve -------------------------------------------------------------

bool wide_decode_dims(int served_head_dim) { return served_head_dim == 64 || served_head_dim == 128; }

bool serves_wgmma(const DeviceFacts& d, const Work& w, int splits) {
  return d.sm90 && w.tile_rows == kQueryTileRows && splits == 1 && d.served_head_dim % 64 == 0;
}
// Dense, unpacked rows (one TMA box of Q rows per tile), tensors TMA can describe.
bool serves_warpspec(const Problem& p, const DeviceFacts& d, const Work& w, const KernelChoice& c) {
  return serves_wgmma(d, w, c.num_splits) && p.tma_describable && !c.pack_gqa;
}
bool serves_deep(const Problem& p, const DeviceFacts& d) {
  return d.sm90 && d.served_head_dim <= kDeepDecodeMaxHeadDim && !p.paged;
}
bool serves_dims(const DeviceFacts& d, int splits) { return wide_decode_dims(d.served_head_dim) && splits >= 2; }
// Unsplit, with a unit's rows equally spaced in Q (one query of packed GQA rows, or unpacked).
bool unsplit_strided_rows(const Problem& p, const KernelChoice& c) {
  return c.num_splits == 1 && !(c.pack_gqa && p.seqlen_q != 1);
}
bool serves_persistent(const Problem& p, const DeviceFacts& d, const KernelChoice& c) {
  return !c.deep_pipeline && wide_decode_dims(d.served_head_dim) && unsplit_strided_rows(p, c) &&
         d.persistent_slots > 0;
}
constexpr int kHeadsSplitWarps = 4;  // units per CTA of the heads-split kernel (its warps)
bool serves_heads(const Problem& p, const DeviceFacts& d, const Work& w, const KernelChoice& c) {
  const bool own_kv_head = c.pack_gqa ? p.seqlen_q == 1 : p.heads == p.heads_k;
  return !c.deep_pipeline && !p.paged && wide_decode_dims(d.served_head_dim) && c.num_splits == 1 && own_kv_head &&
         w.units_per_sequence % kHeadsSplitWarps == 0 && d.heads_slots > 0;
}

// ---- decode ------------------------------------------------------------------------------------

// The split count over the SMs (FlashAttention-2's heuristic, one CTA each; D-16, D-84) of few
// units whose walks at the current count `splits` are at most max_tiles, where no split count
// was asked for; 0 where this does not apply.
int few_unit_splits(const DeviceFacts& d, const Work& w, int requested, int max_tiles, int splits) {
  const bool few_units = double(w.work_tiles) < kFewUnitsFraction * d.sms;
  if (requested != 0 || !d.sm90 || !few_units || splits <= 1 || ceil_div(w.key_tiles, splits) > max_tiles) return 0;
  return num_splits_heuristic(int(w.work_tiles), d.sms, w.key_tiles, kMaxSplits);
}

// The deep pipeline's plan (D-16, D-17): few units with short walks get their split count above,
// and the deep pipeline where the walks stay >= 3 tiles.
void plan_deep_pipeline(const Problem& p, const DeviceFacts& d, const Work& w, int requested, KernelChoice& c) {
  const int splits = few_unit_splits(d, w, requested, kFewUnitsMaxTiles, c.num_splits);
  if (!serves_deep(p, d) || splits == 0) return;
  c.num_splits = splits;
  c.deep_pipeline = ceil_div(w.key_tiles, c.num_splits) >= kDeepDecodeMinTiles;
}

// The decode kernel `forced` (automatic: the tuned choice) into c; false where that kernel does
// not serve the call.
bool choose_decode_kernel(const Problem& p, const DeviceFacts& d, const Work& w, int requested, Kernel forced,
                          KernelChoice& c) {
  if (p.fp8) {  // the splitkeys kernel reads e4m3 (launch_template.h run_fwd_fp8)
    // D-84: the count over the SMs where the walks are short under both counts
    const int splits = few_unit_splits(d, w, requested, kFp8FewUnitsMaxTiles, c.num_splits);
    if (splits > 0 && ceil_div(w.key_tiles, splits) <= kFp8FewUnitsMaxTiles) c.num_splits = splits;
    c.kernel = Kernel::splitkeys;
    return forced == Kernel::automatic || forced == Kernel::splitkeys;
  }
  switch (forced) {
    case Kernel::automatic: {
      plan_deep_pipeline(p, d, w, requested, c);
      if (serves_dims(d, c.num_splits) && decode_warps_split_dims(c.num_splits, p.seqlen_k, p.head_dim)) {  // D-19
        c.kernel = Kernel::dims;
      } else if (c.deep_pipeline) {
        c.kernel = Kernel::deep;
      } else if (serves_heads(p, d, w, c) &&
                 decode_warps_split_heads(w.units, w.units / kHeadsSplitWarps, d.splitkeys_slots, d.heads_slots,
                                          d.sms)) {  // D-32
        c.kernel = Kernel::heads;
      } else if (serves_persistent(p, d, c) &&
                 (c.persistent_ctas = persistent_decode_ctas(w.units, d.splitkeys_slots, d.persistent_slots,
                                                             /*forced=*/false, p.paged)) > 0) {  // D-28
        c.kernel = Kernel::persistent;
      } else {
        c.kernel = Kernel::splitkeys;
      }
      return true;
    }
    case Kernel::splitkeys:
      c.kernel = Kernel::splitkeys;
      return true;
    case Kernel::deep:
      if (!serves_deep(p, d)) return false;
      plan_deep_pipeline(p, d, w, requested, c);  // its split count where its plan applies
      c.deep_pipeline = true;
      c.kernel = Kernel::deep;
      return true;
    case Kernel::dims:
      plan_deep_pipeline(p, d, w, requested, c);
      c.kernel = Kernel::dims;
      return serves_dims(d, c.num_splits);
    case Kernel::heads:
      c.kernel = Kernel::heads;
      return serves_heads(p, d, w, c);
    case Kernel::persistent:
      c.kernel = Kernel::persistent;
      c.persistent_ctas = persistent_decode_ctas(w.units, d.splitkeys_slots, d.persistent_slots, /*forced=*/true,
                                                 p.paged);
      return serves_persistent(p, d, c) && c.persistent_ctas > 0;
    default:  // a prefill kernel
      return false;
  }
}

void choose_decode(const Problem& p, const DeviceFacts& d, const Work& w, int requested, Kernel forced,
                   KernelChoice& c) {
  KernelChoice trial = c;
  if (forced != Kernel::automatic && choose_decode_kernel(p, d, w, requested, forced, trial)) {
    c = trial;
    return;
  }
  choose_decode_kernel(p, d, w, requested, Kernel::automatic, c);
}

// ---- prefill -----------------------------------------------------------------------------------

WgmmaTile wgmma_tile_for(const Problem& p, int served_head_dim, WgmmaTile forced) {
  const bool narrow96_compiled = served_head_dim == 64;
  const bool narrow_compiled = served_head_dim <= 128;
  if (forced == WgmmaTile::narrow96 && narrow96_compiled) return WgmmaTile::narrow96;
  if (forced == WgmmaTile::narrow && narrow_compiled) return WgmmaTile::narrow;
  if (forced == WgmmaTile::wide) return WgmmaTile::wide;
  if (narrow96_compiled && keys_suit_96_key_tile(p.seqlen_k)) return WgmmaTile::narrow96;  // D-5
  return narrow_compiled ? WgmmaTile::narrow : WgmmaTile::wide;                             // D-2
}

// The persistent warpspec grid's causal tiles unit by unit where that loads its rounds about as
// evenly as heavy first (tuning.h kUnitOrderImbalanceSlack, D-89).
bool unit_order_balances(const Problem& p, const Work& w, const KernelChoice& c, int window_right) {
  // (warpspec rows are unpacked and, past one tile, kQueryTileRows to a tile: w.query_tiles)
  const int64_t tiles = w.work_tiles;
  if (tiles > kUnitOrderMaxModelledTiles) return false;
  const int ctas = int(std::min(c.persistent_ctas, tiles));
  auto imbalance = [&](bool unit_by_unit) {
    return persistent_round_imbalance(w.units, w.query_tiles, ctas, unit_by_unit, p.seqlen_q, p.seqlen_k, window_right);
  };
  return imbalance(true) <= imbalance(false) + kUnitOrderImbalanceSlack;
}

void choose_prefill(const Problem& p, const AttentionOptions& options, const DeviceFacts& d, const Work& w,
                    const KernelOverride& o, KernelChoice& c) {
  // e4m3 runs on the mma kernel (launch_template.h run_fwd_fp8), or with q, k and v all e4m3 at
  // d = 128 and 256 on the warpspec kernel's FP8 products (D-75).
  const bool wgmma = serves_wgmma(d, w, c.num_splits) && o.kernel != Kernel::mma && !p.fp8;  // D-1
  c.kernel = wgmma ? Kernel::wgmma : Kernel::mma;
  if (wgmma) c.wgmma_tile = wgmma_tile_for(p, d.served_head_dim, o.wgmma_tile);
  const int window_right = options.causal ? 0 : options.window_right;  // causal: right window 0
  const bool walk_grows = walk_grows_with_rows(options.window_left, window_right);
  const bool warpspec_wanted =
      o.kernel == Kernel::warpspec ||
      (o.kernel == Kernel::automatic && warpspec_pays(d.served_head_dim, p.varlen, p.fp8, walk_grows, p.seqlen_k));  // D-62, D-79, D-90
  const bool warpspec_reads_it = !p.fp8 || (p.fp8_qkv && fp8_products_head_dim(d.served_head_dim));
  if (warpspec_wanted && serves_warpspec(p, d, w, c) && warpspec_reads_it) c.kernel = Kernel::warpspec;
  if (c.kernel == Kernel::warpspec) {
    c.persistent_ctas = o.prefill_ctas < 0 ? 0 : o.prefill_ctas > 0 ? o.prefill_ctas : warpspec_persistent_ctas(d.sms, p.varlen);  // D-71, D-79
  }
  constexpr int64_t kMaxGridYZ = 65535;  // heavy first puts the query tiles in grid z
  bool heavy = false;
  switch (o.tile_order) {
    case TileOrder::heavy_first: heavy = w.query_tiles > 1; break;
    case TileOrder::per_unit: heavy = false; break;
    default: {
      heavy = heavy_tiles_first(options.window_left, window_right, w.query_tiles);  // D-6
      if (heavy && c.kernel == Kernel::warpspec && c.persistent_ctas > 0) heavy = !unit_order_balances(p, w, c, window_right);  // D-89
    }
  }
  c.heavy_tiles_first = heavy && w.query_tiles <= kMaxGridYZ;
}

}  // namespace

double persistent_round_imbalance(int64_t units, int64_t query_tiles, int ctas, bool unit_by_unit, int seqlen_q,
                                  int seqlen_k, int window_right) {
  if (units <= 0 || query_tiles <= 0 || ctas <= 0) return 1.0;
  // Query tile m of a unit counted from the heaviest (cta_geometry.h cta_info_at): its rows end
  // at (query_tiles - m) x kQueryTileRows, capped at seqlen_q; its last row's keys are the mask's
  // (rules.h visible_keys; no left window: the walks grow with their rows).
  AttnParams mask;
  mask.window_right = window_right;
  std::vector<double> cost(query_tiles);
  for (int64_t m = 0; m < query_tiles; ++m) {
    const int last_row = int(std::min<int64_t>((query_tiles - m) * kQueryTileRows, seqlen_q));
    const KeyRange keys = visible_keys(mask, last_row - 1, seqlen_q, seqlen_k);
    cost[m] = double(keys.hi - keys.lo + kQueryTileRows);
  }
  // The tiles in make_tile_info's order: m advances every tile (unit by unit) or every `units`
  // tiles (heavy first); the CTAs take them in tile_of_round's snake rounds. No divisions: this
  // runs on the host for every causal call it decides.
  const int64_t tiles = units * query_tiles, tiles_per_m = unit_by_unit ? 1 : units;
  std::vector<double> load(ctas, 0.0);
  int64_t t = 0, m = 0, at_m = 0;
  for (int64_t round = 0; t < tiles; ++round) {
    for (int64_t i = 0; i < ctas && t < tiles; ++i, ++t) {
      load[(round & 1) ? ctas - 1 - i : i] += cost[m];
      if (++at_m == tiles_per_m) {
        at_m = 0;
        if (++m == query_tiles) m = 0;
      }
    }
  }
  const double total = std::accumulate(load.begin(), load.end(), 0.0);
  return *std::max_element(load.begin(), load.end()) / (total / ctas);
}

// How full the last of the rounds is when `items` items run `processors` at a time (1 when they
// come out even): the fraction of the rounds' slots that hold an item.
double wave_efficiency(double items, int processors) {
  const double waves = items / processors;
  return waves / std::ceil(waves);
}

int cpu_decode_splits(int sequences, int threads, int key_tiles, int max_splits) {
  if (sequences <= 0 || threads <= 0 || key_tiles <= 1) return 1;
  max_splits = std::min(max_splits, key_tiles);
  auto efficiency = [&](int s) { return wave_efficiency(double(sequences) * s, threads); };
  int best = 1;
  for (int s = 1; s <= max_splits; ++s) {
    if (efficiency(s) >= kSplitEfficiencyFraction) return s;
    if (efficiency(s) > efficiency(best)) best = s;
  }
  return best;
}

int num_splits_heuristic(int work_tiles, int processors, int key_tiles, int max_splits) {
  if (work_tiles <= 0 || processors <= 0 || key_tiles <= 1) return 1;
  if (work_tiles >= kSplitFillFraction * processors) return 1;
  max_splits = std::min({max_splits, processors, key_tiles});
  // A split count is worth considering only if it changes the tiles per split.
  auto eligible = [&](int s) { return s == 1 || ceil_div(key_tiles, s) != ceil_div(key_tiles, s - 1); };
  auto efficiency = [&](int s) { return wave_efficiency(double(work_tiles) * s, processors); };
  double best = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    if (eligible(s)) best = std::max(best, efficiency(s));
  }
  for (int s = 1; s <= max_splits; ++s) {
    if (eligible(s) && efficiency(s) >= kSplitEfficiencyFraction * best) return s;
  }
  return 1;
}

namespace {
// One tensor of a TMA descriptor (tma_tiles.h): a 16-byte aligned base, strides in elements of
// its storage type (e4m3: one byte) that are positive multiples of 16 bytes below 2^40, extents
// in [1, 2^31).
constexpr int64_t kTmaMaxExtent = int64_t(1) << 31;
bool tma_extent_ok(int64_t n) { return n >= 1 && n < kTmaMaxExtent; }
bool tma_tensor_ok(const void* base, DType storage, const TmaRows& rows, int64_t row, int64_t head) {
  constexpr int64_t kAlign = 16, kMaxStrideBytes = int64_t(1) << 40;
  const int64_t elem = dtype_size(storage);
  auto stride_ok = [&](int64_t s) { return s > 0 && (s * elem) % kAlign == 0 && s * elem < kMaxStrideBytes; };
  return reinterpret_cast<uintptr_t>(base) % kAlign == 0 && tma_extent_ok(rows.rows) && tma_extent_ok(rows.batches) &&
         stride_ok(row) && stride_ok(head) && stride_ok(rows.batch_stride);
}
}  // namespace

bool tma_describable(const AttnParams& a) {
  // Pages of whole slabs (params.h kTmaPageSlabRows); a left pad would shift keys off the slabs.
  if (a.block_table != nullptr && (a.page_size % kTmaPageSlabRows != 0 || a.leftpad_k != nullptr)) return false;
  return tma_extent_ok(a.num_heads) && tma_extent_ok(a.num_heads_k) && tma_extent_ok(a.head_dim) &&
         tma_extent_ok(a.seqlen_k) &&
         tma_tensor_ok(a.q, a.q_storage, tma_q_rows(a), a.q_row_stride, a.q_head_stride) &&
         tma_tensor_ok(a.k, a.kv_storage, tma_kv_rows(a, a.k_batch_stride, a.k_row_stride), a.k_row_stride,
                       a.k_head_stride) &&
         tma_tensor_ok(a.v, a.kv_storage, tma_kv_rows(a, a.v_batch_stride, a.v_row_stride), a.v_row_stride,
                       a.v_head_stride);
}

bool tma_stores_o(const AttnParams& a) {
  if (a.cu_seqlens_q != nullptr) return false;  // packed rows: a tile's last rows are the next sequence's
  return tma_extent_ok(a.seqlen_q) && tma_extent_ok(a.batch) &&
         tma_tensor_ok(a.o, a.dtype, TmaRows{a.seqlen_q, a.batch, a.o_batch_stride, false}, a.o_row_stride,
                       a.o_head_stride);
}

bool should_pack_gqa(int seqlen_q, int heads, int heads_k) {
  return heads > heads_k && seqlen_q <= kPackGqaMaxSeqlenQ;
}

KernelChoice choose_kernel(const Problem& p, const AttentionOptions& options, int requested_splits,
                           const DeviceFacts& device, const KernelOverride& override_) {
  KernelChoice c;
  c.pack_gqa = should_pack_gqa(p.seqlen_q, p.heads, p.heads_k);
  const Work w = work_of(p, c.pack_gqa);
  c.num_splits = planned_splits(p, w, requested_splits, device.processors);
  c.programmatic_launch = override_.programmatic_launch;
  if (device.device == Device::cpu) {
    c.kernel = Kernel::cpu;
    return c;
  }
  if (w.decode_tile()) {
    choose_decode(p, device, w, requested_splits, override_.kernel, c);
    c.cluster_combine = device.sm90 && override_.cluster_combine && c.num_splits >= 2 &&
                        c.num_splits <= kMaxClusterSplits;  // D-34
  } else {
    choose_prefill(p, options, device, w, override_, c);
    // The split count was planned for the gathering kernels; unsplit, warpspec may serve (D-81).
    if (requested_splits == 0 && c.num_splits > 1 && warpspec_fills_sms(w.work_tiles, device.sms)) {
      KernelChoice unsplit = c;
      unsplit.num_splits = 1;
      choose_prefill(p, options, device, w, override_, unsplit);
      if (unsplit.kernel == Kernel::warpspec) c = unsplit;
    }
  }
  return c;
}

}  // namespace flashattn
