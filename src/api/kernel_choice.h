// The kernel choice: which kernel runs a call, with which tile, over how many splits. One pure
// host function of the problem, the device's properties and the override (tests and timing),
// unit-tested on the CPU (tests/cpu/test_kernel_choice.cpp). The rules it applies are
// common/tuning.h; docs/ARCHITECTURE.md has them as a table.
#pragma once

#include <cstdint>
#include <string>

#include "api/validate.h"
#include "common/params.h"
#include "flashattn/flashattn.h"

namespace flashattn {

// What the choice needs to know of the device that runs the call (api/plan.cpp device_facts).
struct DeviceFacts {
  Device device = Device::cpu;
  int processors = 1;        // what the split heuristic counts: CPU threads, or SMs x kCtasPerSm
  int sms = 0;               // CUDA multiprocessors
  bool sm90 = false;         // compute capability 9.0 with the sm_90a kernels compiled in
  int served_head_dim = 0;   // CUDA: the compiled instance that runs this head dim (>= it)
  // CUDA: CTAs resident at once of the decode kernels of that instance, for the call's K/V
  // layout (0: the kernel is not compiled for it).
  int64_t splitkeys_slots = 0, persistent_slots = 0, heads_slots = 0;
};

struct KernelChoice {
  Kernel kernel = Kernel::cpu;
  bool deep_pipeline = false;     // splitkeys/dims: the deep K/V pipeline (Kernel::deep is its keys split)
  WgmmaTile wgmma_tile = WgmmaTile::automatic;  // wgmma: wide, narrow or narrow96
  int num_splits = 1;
  bool pack_gqa = false;
  bool heavy_tiles_first = false;  // prefill grid: query tiles heaviest first across units
  bool cluster_combine = false;    // split decode: merge the splits inside a cluster (where it fits)
  int64_t persistent_ctas = 0;     // persistent: the grid's CTAs
  bool programmatic_launch = true; // decode, combine, append: launch as programmatic dependents
};

// FlashAttention-2's wave-efficiency heuristic. work_tiles: CTAs without splitting;
// processors: DeviceFacts::processors; key_tiles: K/V tiles of the longest sequence.
int num_splits_heuristic(int work_tiles, int processors, int key_tiles, int max_splits);

// The CPU decode walk's split count (D-72): its work items are (sequence, split) pairs, each
// over all KV heads of its keys, taken by `threads` threads; the fewest splits (the longest
// contiguous key ranges) whose items fill the threads' rounds to kSplitEfficiencyFraction, else
// the split count that fills them best (at most max_splits and key_tiles).
int cpu_decode_splits(int sequences, int threads, int key_tiles, int max_splits);

bool should_pack_gqa(int seqlen_q, int heads, int heads_k);

// Whether TMA descriptors can describe q, k and v of a dense, varlen or KV-cache call (paged
// K/V: pages of whole slabs, no left pad) as (rows, d, heads, batch) tensors (params.h
// TmaRows): 16-byte aligned bases, strides that are positive multiples of 16 bytes below 2^40,
// extents in [1, 2^31) (the hardware's rules for cuTensorMapEncodeTiled;
// src/cuda/components/tma_tiles.h).
bool tma_describable(const AttnParams& a);

// Whether the warpspec kernel stores O through a TMA descriptor (tma_tiles.h TmaQkv::o, D-82):
// a dense or KV-cache call (not varlen, whose tiles end past their sequence's rows) whose O meets
// the rules above as a (seqlen_q, d, heads, batch) tensor.
bool tma_stores_o(const AttnParams& a);

// The warpspec kernel's persistent grid (D-71, D-89): `ctas` CTAs take `units` x `query_tiles`
// query tiles of kQueryTileRows rows in snake rounds (cta_geometry.h tile_of_round), unit by unit
// or heaviest first across units (cta_geometry.h make_tile_info). The busiest CTA's modelled load
// over the mean (1 = even), a tile costing its last row's visible keys (bottom-right aligned,
// under a right window of window_right keys: 0 is causal) plus one key tile of fixed cost.
double persistent_round_imbalance(int64_t units, int64_t query_tiles, int ctas, bool unit_by_unit, int seqlen_q,
                                  int seqlen_k, int window_right = 0);

// A FLASHATTN_KERNEL value as kernel_override_from_env reads it (api/kernel_override.cpp).
KernelOverride parse_kernel_override(const std::string& value);

// options: the call's mask (causal, window) orders the prefill tiles; requested_splits: 0 = the
// heuristic, n = n splits (at most kMaxSplits).
KernelChoice choose_kernel(const Problem& p, const AttentionOptions& options, int requested_splits,
                           const DeviceFacts& device, const KernelOverride& override_);

}  // namespace flashattn
