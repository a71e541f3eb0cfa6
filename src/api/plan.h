// Planning: how a problem is cut into work (split-KV count, GQA packing) and the scratch it
// needs. Pure host functions of shapes and device facts, unit-tested.
#pragma once

#include <cstddef>

#include "api/validate.h"

namespace flashattn {

// GQA packing pays when a query tile would otherwise be mostly empty.
constexpr int kPackGqaMaxSeqlenQ = 64;
// FlashAttention-2's rule: with work for >= 80% of the processors, do not split.
constexpr double kSplitFillFraction = 0.8;
// Take the fewest splits whose wave efficiency is within 85% of the best.
constexpr double kSplitEfficiencyFraction = 0.85;
constexpr size_t kWorkspaceAlign = 256;
// CUDA: resident split-KV CTAs per SM counted by the split heuristic.
constexpr int kCtasPerSm = 2;
// The deep decode pipeline (CUDA sm_90, one CTA per SM, four K/V tiles in flight) is planned
// for decode tiles of contiguous K/V when there are units (query tiles) for fewer than
// kDeepFewUnitsFraction of the SMs and the default plan splits them into walks of at most
// kDeepDecodeMaxTiles key tiles; its split count is FlashAttention-2's heuristic over the SMs
// (one CTA each). Measured (docs/PERF.md, session 3): batch 1 gains 3-7%; paged K/V loses
// (one CTA per SM leaves its page-table reads exposed; the deep kernel is compiled for
// contiguous K/V only); batch 8 gains nothing (session 4 run 1: 24.4 us unsplit on the deep
// pipeline against 24.3 on the default one).
// Where that split count leaves walks shorter than kDeepDecodeMinTiles tiles, the default
// pipeline runs them at the same split count: with one or two tiles per CTA there is nothing
// for the deep pipeline to keep in flight. Measured (docs/PERF.md, session 16 runs 2-4, kernel
// time after the benchmark's flush): 1 x 2k (16 splits of 2 tiles) and 2 x 1k (8 of 2) 0.3-0.5
// us faster, 1 x 1k (16 of 1) level to 0.15 us faster; 1 x 4k (16 of 4) level, so it stays deep.
constexpr int kDeepDecodeMaxTiles = 16;
constexpr int kDeepDecodeMinTiles = 3;
constexpr double kDeepFewUnitsFraction = 0.25;

// FlashAttention-2's wave-efficiency heuristic. work_tiles: CTAs without splitting;
// processors: SMs (CUDA) or threads (CPU); key_tiles: K/V tiles of the longest sequence.
int num_splits_heuristic(int work_tiles, int processors, int key_tiles, int max_splits);

bool should_pack_gqa(int seqlen_q, int heads, int heads_k);

struct Workspace {
  size_t o_accum_offset = 0, lse_accum_offset = 0, q_rot_offset = 0;
  size_t bytes = 0;
};

// Scratch layout for num_splits partials and (with rotary) the rotated q.
Workspace workspace_layout(const Problem& p, int num_splits);

// The plan of a validated problem. requested_splits: 0 = heuristic. deep_decode_sms: the SMs
// of a CUDA device that runs the deep decode pipeline, else 0 (deep_decode_sms_of).
Plan make_plan(const Problem& p, int requested_splits, int processors, int deep_decode_sms = 0);

// The processors the heuristic counts for this device (SMs or CPU threads).
int processors_of(const Problem& p, int num_threads);

// SMs of the CUDA device when it runs the deep decode pipeline, else 0.
int deep_decode_sms_of(const Problem& p);

}  // namespace flashattn
