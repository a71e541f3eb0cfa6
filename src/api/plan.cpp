#include "api/plan.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "api/backend.h"
#include "common/rules.h"

namespace flashattn {

namespace {
int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }
size_t align_up(size_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }
// Query rows of one tile unit: one (batch, head), or one (batch, KV head) with GQA packing.
int rows_per_unit(const Problem& p, bool pack_gqa) {
  return pack_gqa ? p.seqlen_q * (p.heads / p.heads_k) : p.seqlen_q;
}
}  // namespace

int num_splits_heuristic(int work_tiles, int processors, int key_tiles, int max_splits) {
  if (work_tiles <= 0 || processors <= 0 || key_tiles <= 1) return 1;
  if (work_tiles >= kSplitFillFraction * processors) return 1;
  max_splits = std::min({max_splits, processors, key_tiles});
  // A split count is worth considering only if it changes the tiles per split.
  auto eligible = [&](int s) {
    return s == 1 || ceil_div(key_tiles, s) != ceil_div(key_tiles, s - 1);
  };
  auto efficiency = [&](int s) {
    const double waves = double(work_tiles) * s / processors;
    return waves / std::ceil(waves);
  };
  double best = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    if (eligible(s)) best = std::max(best, efficiency(s));
  }
  for (int s = 1; s <= max_splits; ++s) {
    if (eligible(s) && efficiency(s) >= kSplitEfficiencyFraction * best) return s;
  }
  return 1;
}

bool should_pack_gqa(int seqlen_q, int heads, int heads_k) {
  return heads > heads_k && seqlen_q <= kPackGqaMaxSeqlenQ;
}

Workspace workspace_layout(const Problem& p, int num_splits) {
  Workspace w;
  size_t offset = 0;
  if (num_splits > 1) {
    const size_t rows = size_t(num_splits) * p.batch * p.heads * p.seqlen_q;
    w.o_accum_offset = offset;
    offset = align_up(offset + rows * p.head_dim * sizeof(float));
    w.lse_accum_offset = offset;
    offset = align_up(offset + rows * sizeof(float));
  }
  if (p.rotary_dim > 0) {
    w.q_rot_offset = offset;
    offset = align_up(offset + size_t(p.batch) * p.seqlen_q * p.heads * p.head_dim * dtype_size(p.dtype));
  }
  w.bytes = offset;
  return w;
}

int processors_of(const Problem& p, int num_threads) {
  // Two split-KV CTAs per SM, as in FlashAttention-2's heuristic call. (Counting the decode
  // kernel's three resident CTAs, which gives more splits at batch 8, measured no faster:
  // docs/PERF.md, session 2 run 3.)
  if (p.device == Device::cuda) return kCtasPerSm * cuda::num_sms(p.device_index);
  if (num_threads > 0) return num_threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

int deep_decode_sms_of(const Problem& p) {
  return p.device == Device::cuda ? cuda::deep_decode_sms(p.device_index, p.dtype, p.head_dim) : 0;
}

Plan make_plan(const Problem& p, int requested_splits, int processors, int deep_decode_sms) {
  Plan plan;
  plan.pack_gqa = should_pack_gqa(p.seqlen_q, p.heads, p.heads_k);
  const int rows = rows_per_unit(p, plan.pack_gqa);
  const int heads = plan.pack_gqa ? p.heads_k : p.heads;
  const int64_t work_tiles =
      int64_t(p.batch) * heads * ceil_div(std::max(rows, 1), query_tile_rows_for(rows));
  const int key_tiles = ceil_div(std::max(p.seqlen_k, 1), splitkv_block_n(p.head_dim));
  if (requested_splits > 0) {
    plan.num_splits = std::min(requested_splits, kMaxSplits);
  } else {
    plan.num_splits = num_splits_heuristic(int(std::min<int64_t>(work_tiles, 1 << 30)),
                                           processors, key_tiles, kMaxSplits);
  }
  if (p.seqlen_q == 0 || p.batch == 0) plan.num_splits = 1;
  const bool decode_tile = query_tile_rows_for(rows) == kQueryTileRowsDecode;
  const bool few_units = work_tiles < kDeepFewUnitsFraction * deep_decode_sms;
  if (requested_splits == 0 && deep_decode_sms > 0 && decode_tile && !p.paged && few_units &&
      plan.num_splits > 1 && ceil_div(key_tiles, plan.num_splits) <= kDeepDecodeMaxTiles) {
    plan.num_splits = num_splits_heuristic(int(work_tiles), deep_decode_sms, key_tiles, kMaxSplits);
    plan.deep_decode = ceil_div(key_tiles, plan.num_splits) >= kDeepDecodeMinTiles;
  }
  plan.workspace_bytes = workspace_layout(p, plan.num_splits).bytes;
  return plan;
}

}  // namespace flashattn
