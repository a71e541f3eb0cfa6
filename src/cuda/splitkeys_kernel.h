// The decode kernel: at most 16 query rows per CTA, the 4 warps split the keys.
//
// Decode reads every K/V byte once and does little arithmetic on it, so the kernel must keep
// the memory system busy rather than the tensor cores: one 16-row MMA slab (kernel_traits.h
// DecodeTraits), each warp a quarter of every K/V tile with its own online softmax, and
// kStages K/V buffers so that tile n-1 (n-kStages+1 ...) streams in during the whole of tile n.
// Per key tile n (walked from the last visible tile down), one barrier:
//   wait tile n; barrier | issue tile n-kStages+1 | per warp: S = Q K_w^T, rules, softmax, O_w += P V_w
// At the end the warps merge (max, sum, O) through shared memory, laid over the K/V buffers,
// and write O (or the split's fp32 partials) with 16-byte stores, and LSE. With
// AttnParams::cluster_combine the split's partial stays in shared memory instead and the
// unit's splits, one thread-block cluster, merge it there (combine_in_cluster).
// FP8 K/V on the fp8 pipeline (components/fp8_warp_kv.h) streams e4m3 tiles through
// kCopyStages stages, three in flight, and each warp waits for and reads its own keys only: one
// CTA barrier, for Q, before the first tile. Its MMA operands are widened from the e4m3 stages
// straight into registers (make_fp8_fragment_math).
// Short split walks at d = 64 and 128 (Traits::kWarpsSplitDims, tuning.h
// decode_warps_split_dims) split the head dim instead: every warp computes the whole S of a
// tile and its own columns of O, and writes them from registers with no merge
// (store_warp_columns).
//
// Rows, masks, paging, splits and packed GQA follow the same rules.h definitions as every other
// kernel, through the components in src/cuda/components/.
#pragma once

#include <type_traits>

#include "common/params.h"
#include "cuda/components/cluster_combine.h"
#include "cuda/components/cta_geometry.h"
#include "cuda/components/epilogue.h"
#include "cuda/components/fp8_warp_kv.h"
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
    splitkeys_kernel(const __grid_constant__ AttnParams p) {
  // The wait first: the combine grid this one lets in reads its inputs (the sequence lengths)
  // before its own wait, so they must be final when it starts, even when the grid before this
  // one wrote them.
  wait_for_previous_grid();
  allow_dependent_launch();
  prefetch_page_table_row<Traits>(p, threadIdx.x);
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kCopyStages;  // the copy pipeline's (kernel_traits.h DecodeTileConfig)
  constexpr int kNWarps = Traits::kNWarps;
  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  // ---- geometry
  CtaInfo c;
  if (!make_cta_info<kBlockM>(p, c)) return;
  const int split = blockIdx.y;
  const CtaKeyTiles tiles = cta_key_tiles<kBlockM, kBlockN>(p, c, split);

  // ---- shared memory: Q | K buffers | V buffers | Q/O row offsets | merge statistics (| FP8
  // mirrors: kernel_traits.h Fp8Storage)
  constexpr int kKVElems = int(cute::cosize_v<typename Traits::SmemLayoutKV>);
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_k = smem_q + cute::cosize_v<typename Traits::SmemLayoutQ>;
  Element* smem_v = smem_k + Traits::kKvBuffers / 2 * kKVElems;  // (none on the fp8 pipeline)
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});  // (16, d)
  int64_t* q_off = reinterpret_cast<int64_t*>(smem_k + Traits::kKvBuffers * kKVElems);
  int64_t* o_off = q_off + kBlockM;
  const auto kv = make_decode_kv<Traits>(smem_k, smem_v, smem, warp, lane);
  float* merge_max = reinterpret_cast<float*>(o_off + kBlockM);  // [kNWarps][16]
  float* merge_sum = merge_max + kNWarps * kBlockM;  // [kNWarps][16]
  // KvStages::issue, not wgmma_kernel.h's ContiguousKvCopies: measured no faster here
  // (docs/DECISIONS.md D-8), and it adds spills to the 168-register kernels.
  auto issue_tile = [&](int n, const auto& rows) { kv.issue(p, c, tiles, n, tid, rows); };

  // ---- prologue: Q and the first kStages-1 tiles in flight. Strided Q rows need no offset
  // table, so their copies and the tiles' leave before the Q/O tables and the barrier: a
  // one-tile CTA's chain starts with its memory latency rather than ending its setup first.
  // Q's copies join the first tile's commit group either way, so Q goes first.
  const bool any_tile = tiles.hi > tiles.lo;
  const StridedRows q_rows = q_tile_rows(p, c);
  const auto* q_base = static_cast<const typename Traits::QStorage*>(p.q);
  uint8_t* const q_fp8 = q_mirror<Traits>(smem);
  auto issue_q = [&] {
    if (any_tile && q_rows.strided) {
      load_strided_rows<Traits, kBlockM>(sQ, q_base, q_base + q_rows.first, q_rows.stride, q_rows.rows,
                                         p.head_dim, tid, q_fp8);
    } else if (any_tile) {
      load_q<Traits>(p, q_off, sQ, tid, q_fp8);
    }
  };
  auto issue_first_tiles = [&] {
    for (int i = 1; i < kStages; ++i) issue_tile(tiles.hi - i, kv.lookup(p, c, tiles, tiles.hi - i, tid));
  };
  const bool q_first = q_rows.strided;
  if (q_first) {
    issue_q();
    issue_first_tiles();
  }
  compute_q_o_offsets<Traits>(p, c, q_off, o_off, tid);
  int* const q_max_bits = reinterpret_cast<int*>(merge_max);  // rescale_q_into_fp16's, until the merge
  if (Traits::kQRescaled && tid == 0) *q_max_bits = 0;
  __syncthreads();
  if (!q_first) {
    issue_q();
    issue_first_tiles();
  }

  // ---- this warp's MMA partitions and softmax state
  constexpr bool kSplitDims = Traits::kWarpsSplitDims;
  auto math = [&] {
    if constexpr (Traits::kFp8Pipeline) {
      return make_fp8_fragment_math<Traits>(kv, sQ, warp, lane);
    } else {
      return make_warp_tile_math<Traits>(kv, sQ, warp, lane);
    }
  }();
  math.start();
  ScoreScale sc(p, c.b, c.hk, Traits::kKvFp8);

  // ---- mainloop over key tiles, last first. The first tile's step (first) also brings Q in.
  auto walk_tile = [&](int n, auto first) {
    // Paged: the pages of the tile issued below, read under this tile's wait.
    const auto rows_ahead = kv.lookup(p, c, tiles, n - (kStages - 1), tid);
    cp_async_wait<kStages - 2>();
    kv.widen(n, tid);  // FP8 K/V: this thread's chunks of tile n (fp8 pipeline: the warp's copies seen)
    if (Traits::kQFp8 && first) convert_tile<Traits, kBlockM>(sQ, q_fp8, tid);  // Q landed with it
    if (Traits::kQRescaled && first) sc.scale_q(rescale_q_into_fp16<Traits>(sQ, q_max_bits, tid));
    // Tile n (and, the first, Q) landed; every warp is done with tile n+1's stage. On the fp8
    // pipeline each warp copies and reads its own keys only (widen's warp barrier): the CTA
    // waits for Q alone.
    if (!Traits::kFp8Pipeline || first) __syncthreads();
    issue_tile(n - (kStages - 1), rows_ahead);  // into tile n+1's stage
    if (first) math.load_q(0);  // keep Q in registers
    math.step(p, c, tiles, sc, n, /*stage=*/unsigned(n) % Traits::kStages);  // n >= tiles.lo >= 0
  };
  if constexpr (Traits::kFp8Pipeline) {
    // The first tile apart (first: a compile-time true, then false), so that the loop carries
    // no predicated Q reads (D-83). (Peeled the same way, the other pipelines' kernels spilled.)
    if (any_tile) walk_tile(tiles.hi - 1, std::true_type{});
    for (int n = tiles.hi - 2; n >= tiles.lo; --n) walk_tile(n, std::false_type{});
  } else {
    for (int n = tiles.hi - 1; n >= tiles.lo; --n) walk_tile(n, n == tiles.hi - 1);
  }

  cp_async_wait<0>();
  // With cluster_combine the split's result stays here: O over the K/V buffers, LSE after the
  // merge statistics.
  float* const merge_o = WarpsMergeOver<Traits>::buffer(smem, smem_k);
  const SplitPartial part{merge_o, merge_sum + kNWarps * kBlockM};
  if constexpr (kSplitDims) {
    if (p.cluster_combine) __syncthreads();  // every warp is done with the K/V buffers part.o overlays
    store_warp_columns<Traits>(p, c, split, math.acc_o, math.rows, sc, part, warp, lane);
  } else {
    __syncthreads();  // every warp is done with the K/V buffers; the merge O buffer overlays them
    merge_warps_and_store<Traits>(p, c, split, math.acc_o, math.rows, sc, merge_max, merge_sum,
                                  PaddedMergeO<Traits>{merge_o}, part, o_off, tid);
  }
  if (p.cluster_combine) combine_in_cluster<Traits>(p, c, part, o_off, tid);
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
