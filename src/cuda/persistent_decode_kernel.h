// The decode kernel on a persistent grid: each CTA walks several decode units (a unit is one
// (batch, head), or (batch, KV head) with pack_gqa: one 16-row query tile) in turn, units
// blockIdx.x, blockIdx.x + gridDim.x, ..., with one K/V pipeline running through them.
//
// splitkeys_kernel.h launches one CTA per unit, in waves of the CTAs resident at once; where
// the last wave is short (batch 64 x 8 KV heads: 512 units over 396 slots, a last wave of 116),
// most of the GPU idles through it. Here fewer CTAs with more stages each (kernel_traits.h
// DecodePipeline::three_stage: 3 stages at 2 CTAs per SM) take the units in turn, in rounds
// that fill the slots better (tuning.h persistent_decode_ctas decides). A CTA issues its next
// unit's Q and first tiles while it computes the current unit's last ones, and merges the warps
// in the stage the last tile leaves free, so its copies do not stop between units.
//
// The walk is one sequence of items, a unit's key tiles from the last down (a unit with no
// visible key is one empty item, which writes O = 0 and LSE = -inf). Item i lives in K/V stage
// i % kStages. Per item, one barrier:
//   wait item i; barrier | issue item i + kStages - 1 (the next unit's Q with its first tile) |
//   per warp: S = Q K_w^T, rules, softmax, O_w += P V_w | at a unit's last item: merge, store
// The producer (the unit being issued) runs kStages - 1 items ahead of the consumer (the unit
// being computed), so at most kStages - 1 units ahead: Q, the unit's geometry and its lengths
// have a ring of kStages slots by unit.
//
// Served (api/kernel_choice.cpp serves_persistent): the default keys-split pipeline's calls, contiguous or
// paged K/V (one instance each), unsplit, d = 64 and 128, with Q rows equally spaced in Q
// (tile_loads.h q_tile_rows).
#pragma once

#include "common/params.h"
#include "cuda/components/cta_geometry.h"
#include "cuda/components/epilogue.h"
#include "cuda/components/kv_pipeline.h"
#include "cuda/components/tile_loads.h"
#include "cuda/components/warp_tile_math.h"
#include "cuda/grid_dependence.h"
#include "cuda/kernel_traits.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    persistent_decode_kernel(const __grid_constant__ AttnParams p) {
  wait_for_previous_grid();
  static_assert(!Traits::kWarpsSplitDims && Traits::kKvLayouts != KvLayouts::either,
                "the keys-split kernel, compiled for contiguous or paged K/V");
  constexpr bool kPaged = Traits::kKvLayouts == KvLayouts::paged;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kNWarps = Traits::kNWarps;
  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  // ---- shared memory: Q [kStages] | K stages | V stages | Q/O row offsets | units [kStages] |
  // lengths [kStages] | merge statistics. Q, the units and the staged lengths are rings of
  // kStages slots by unit (the producer is at most kStages - 1 units ahead of the consumer).
  constexpr int kQElems = int(cute::cosize_v<typename Traits::SmemLayoutQ>);
  constexpr int kKVElems = int(cute::cosize_v<typename Traits::SmemLayoutKV>);
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_k = smem_q + kStages * kQElems;
  Element* smem_v = smem_k + kStages * kKVElems;
  int64_t* q_off = reinterpret_cast<int64_t*>(smem_v + kStages * kKVElems);  // unused: Q rows are strided
  int64_t* o_off = q_off + kBlockM;
  // The units: the producer's, written as it starts one, and the consumer's, read from here
  // rather than held in registers through the walk.
  DecodeUnit* unit_smem = reinterpret_cast<DecodeUnit*>(o_off + kBlockM);
  static_assert(sizeof(DecodeUnit) % 8 == 0, "the lengths stay aligned");
  int* staged_lengths = reinterpret_cast<int*>(unit_smem + kStages);  // [kStages][kSeqInfoReads]
  float* merge_max = reinterpret_cast<float*>(staged_lengths + kStages * kSeqInfoReads);  // [kNWarps][16]
  float* merge_sum = merge_max + kNWarps * kBlockM;  // [kNWarps][16]
  const KvStages<Traits> kv{smem_k, smem_v, nullptr};
  auto q_buffer = [&](int slot) {  // a whole number of swizzle periods apart
    return make_tensor(make_smem_ptr(smem_q + slot * kQElems), typename Traits::SmemLayoutQ{});
  };

  // ---- the producer: the unit whose items are being issued. As it starts a unit, thread 0
  // copies the next unit's lengths into shared memory (4-byte cp.async, in that item's commit
  // group), so that the switch to the next finds them there: held in registers, they spilled,
  // and the spill waited for the read.
  const int heads = units_per_sequence(p);
  const int units = p.batch * heads;
  const int stride = gridDim.x;
  auto batch_of = [&](int unit) { return int(unsigned(unit) / unsigned(heads)); };
  // Paged K/V: the page-table row of unit's sequence into the L2 (one line per thread), so that
  // the first page reads of the unit are L2 hits.
  auto prefetch_pages = [&](int unit) {
    if (!kPaged || unit >= units || p.block_table_pages <= 0) return;
    constexpr int kPagesPerLine = 128 / sizeof(int);
    const int* row = p.block_table + batch_of(unit) * p.block_table_batch_stride;
    for (int line = tid; line <= p.block_table_pages / kPagesPerLine; line += Traits::kNThreads) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(row + min(line * kPagesPerLine, p.block_table_pages - 1)));
    }
  };
  auto stage_lengths = [&](int unit, int slot) {
    if (tid != 0 || unit >= units) return;
    int* dst = staged_lengths + slot * kSeqInfoReads;
    int k = 0;
    seq_info_read(p, batch_of(unit), [&](const int* array, int i) {
      cp_async_4(dst + k++, array + i);
      return 0;  // the values are read at the switch (staged_lengths_of)
    });
  };
  auto staged_lengths_of = [&](int unit, int slot) {
    const int* src = staged_lengths + slot * kSeqInfoReads;
    int k = 0;
    return seq_info_read(p, batch_of(unit), [&](const int*, int) { return src[k++]; },
                         [&](const IndexFault& fault) { if (tid == 0) record_index_fault(p.status, fault); });
  };
  int unit_p = blockIdx.x;  // the producer's next unit; < units (persistent_decode_ctas)
  int n_p = 0, items_left_p = 0, slot_p = kStages - 1, stage_p = 0, items_issued = 0;
  int staged_item = -1;  // the item whose commit group carries the staged lengths (-1: none)
  // Makes the next unit with queries (a varlen sequence may have none) the producer's, in
  // started and (thread 0) in unit_smem, read there after the next barrier; false when this
  // CTA has none left. Called after a barrier and the wait for every item before the one being
  // issued but the last kStages - 2: the staged lengths have landed if their item is one of
  // those; else they are read from global memory.
  auto switch_unit = [&](DecodeUnit& started) -> bool {
    if (unit_p >= units) return false;
    slot_p = ring_next<kStages>(slot_p);
    const bool landed = staged_item >= 0 && items_issued - staged_item >= kStages - 1;
    SeqInfo seq = landed ? staged_lengths_of(unit_p, slot_p) : seq_info_checked(p, batch_of(unit_p));
    while (seq.seqlen_q == 0) {
      unit_p += stride;
      if (unit_p >= units) return false;
      seq = seq_info_checked(p, batch_of(unit_p));
    }
    started = make_decode_unit<kBlockM, kBlockN>(p, unit_p, seq);
    n_p = started.tiles.hi - 1;
    items_left_p = unit_items(started.tiles);
    if (tid == 0) unit_smem[slot_p] = started;
    unit_p += stride;
    stage_lengths(unit_p, ring_next<kStages>(slot_p));  // that slot's unit has been computed
    prefetch_pages(unit_p);
    staged_item = items_issued;
    return true;
  };
  // Paged K/V: the pages of the producer's next tile, read (into registers, in flight through
  // the consumer's math) right after the tile before it was issued, within a unit; at a unit's
  // first tile they are read as it is issued.
  PagedRows<Traits> rows_next{};
  bool rows_ready = false;
  const Element* q_base = static_cast<const Element*>(p.q);
  // The producer's next item of unit pu into its stage (the unit's Q first, at its first tile).
  auto issue_item = [&](const DecodeUnit& pu) {
    if (pu.tiles.hi > pu.tiles.lo) {
      if (n_p == pu.tiles.hi - 1) {
        const StridedRows q_rows = q_tile_rows(p, pu.c);  // equally spaced (serves_persistent)
        auto sQ = q_buffer(slot_p);
        load_strided_rows<Traits, kBlockM>(sQ, q_base, q_base + q_rows.first, q_rows.stride, q_rows.rows,
                                           p.head_dim, tid);
      }
      auto k_stage = kv.k_tile(stage_p);
      auto v_stage = kv.v_tile(stage_p);
      if constexpr (kPaged) {
        const PagedRows<Traits> rows = rows_ready ? rows_next : lookup_paged_rows<Traits>(p, pu.c, n_p, tid);
        load_paged_rows<Traits, false>(p, pu.c, rows, k_stage, tid);
        load_paged_rows<Traits, true>(p, pu.c, rows, v_stage, tid);
      } else {
        load_kv<Traits, false>(p, pu.c, nullptr, n_p, k_stage, tid);
        load_kv<Traits, true>(p, pu.c, nullptr, n_p, v_stage, tid);
      }
    }
    --n_p;
    --items_left_p;
    ++items_issued;
    stage_p = ring_next<kStages>(stage_p);
    if constexpr (kPaged) {
      rows_ready = items_left_p > 0 && pu.tiles.hi > pu.tiles.lo;
      if (rows_ready) rows_next = lookup_paged_rows<Traits>(p, pu.c, n_p, tid);
    }
  };
  bool producing = true;
  // Issues the next item as one commit group, empty when nothing is left. A unit started at an
  // earlier call is read from unit_smem, so a barrier must come between two calls.
  auto produce = [&] {
    if (producing && items_left_p == 0) {
      DecodeUnit started;
      producing = switch_unit(started);
      if (producing) issue_item(started);
    } else if (producing) {
      issue_item(unit_smem[slot_p]);
    }
    cp_async_commit();
  };
  for (int i = 0; i < kStages - 1; ++i) {  // the first unit's Q and first kStages - 1 items
    produce();
    __syncthreads();
  }

  // ---- this warp's MMA partitions and softmax state (slot 0's Q buffer; slot s is s buffers on)
  auto math = make_warp_tile_math<Traits>(kv, q_buffer(0), warp, lane);
  // One scale for every unit: no FP8 descales per (batch, KV head) here (kernel_choice.cpp
  // takes the splitkeys kernel for e4m3); built per unit it spilled more (+8 bytes at d = 128).
  static_assert(!Traits::kKvFp8, "the persistent grid reads 16-bit K/V");
  const ScoreScale sc(p, /*b=*/0, /*hk=*/0, /*fp8=*/false);

  // ---- the consumer: the unit being computed (unit_smem[slot]) and the stage of its item
  int n = 0, items_left = 0, slot = kStages - 1, stage = 0, items_done = 0;
  while (items_done < items_issued) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // item landed; every warp is done with the stage produce() refills (and a merge there)
    const bool unit_start = items_left == 0;
    if (unit_start) slot = ring_next<kStages>(slot);  // the item landed is the next unit's first
    const DecodeUnit& u = unit_smem[slot];
    if (unit_start) {
      n = u.tiles.hi - 1;
      items_left = unit_items(u.tiles);
      math.start();
    }
    produce();  // into the stage computed last
    const bool any_tile = u.tiles.hi > u.tiles.lo;
    if (unit_start) {
      compute_q_o_offsets<Traits>(p, u.c, q_off, o_off, tid);  // o_off: read by the merge's store
      if (any_tile) math.load_q(slot * kQElems);  // Q landed with the unit's first tile: keep it in registers
    }
    if (any_tile) math.step(p, u.c, u.tiles, sc, n, stage);
    --n;
    --items_left;
    ++items_done;
    if (items_left == 0) {  // the unit's last item: merge in its stage, store O and LSE
      const StageMergeO<Traits> merge_o{reinterpret_cast<float*>(smem_k + stage * kKVElems),
                                        reinterpret_cast<float*>(smem_v + stage * kKVElems)};
      merge_warps_and_store<Traits>(p, u.c, /*split=*/0, math.acc_o, math.rows, sc, merge_max, merge_sum,
                                    merge_o, SplitPartial{nullptr, nullptr}, o_off, tid);
    }
    stage = ring_next<kStages>(stage);
  }
  cp_async_wait<0>();  // only empty groups are left; nothing in flight at exit
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
