// Host side of the forward kernel: grid, shared-memory limit, launch. Included only by the
// generated instance files (src/cuda/instances/fwd_<dtype>_hdim<D>.cu).
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "common/rules.h"
#include "cuda/fwd_kernel.h"
#include "cuda/persistent_decode_kernel.h"
#include "cuda/splitheads_kernel.h"
#include "cuda/splitkeys_kernel.h"
#include "cuda/wgmma_kernel.h"
#include "api/backend.h"
#include "cuda/kernel_traits.h"
#include "cuda/launch.h"
#include "flashattn/flashattn.h"

namespace flashattn {
namespace cuda {

// The query tile order of a launch with m_blocks query tiles per unit: FLASHATTN_TILE_ORDER
// where set, else rules.h heavy_tiles_first.
inline bool launch_heavy_tiles_first(const AttnParams& p, int64_t m_blocks) {
  switch (tile_order_env()) {
    case TileOrderEnv::heavy_first: return m_blocks > 1;
    case TileOrderEnv::per_unit: return false;
    default: return heavy_tiles_first(p.window_left, p.window_right, m_blocks);
  }
}

// Launches kernel (fwd_kernel, splitkeys_kernel or wgmma_kernel, instantiated for Traits) over
// the grid (query tiles, splits, batch x heads), or (batch x heads, splits, query tiles) with
// the query tiles heaviest first (AttnParams::heavy_tiles_first).
template <class Traits, class Kernel>
void launch_fwd(const AttnParams& p, cudaStream_t stream, Kernel kernel, const char* name) {
  if (p.num_splits > 1 && splitkv_block_n(p.head_dim) % Traits::kBlockN != 0) {
    // Splits are cut at splitkv_block_n-key units (as on the CPU backend), whole kernel tiles.
    throw Error(Error::Kind::runtime,
                "flashattn fwd: split-KV unit splitkv_block_n(" + std::to_string(p.head_dim) +
                    ") = " + std::to_string(splitkv_block_n(p.head_dim)) +
                    " is not a multiple of the kernel's kBlockN = " + std::to_string(Traits::kBlockN));
  }
  const int rows_per_query = p.pack_gqa ? p.num_heads / p.num_heads_k : 1;
  const int heads = units_per_sequence(p);
  const int64_t rows = int64_t(p.seqlen_q) * rows_per_query;
  const int64_t m_blocks = (rows + Traits::kBlockM - 1) / Traits::kBlockM;
  const int64_t ctas_z = int64_t(p.batch) * heads;
  if (m_blocks == 0 || ctas_z == 0 || p.num_splits < 1) return;  // nothing to compute
  constexpr int kMaxGridYZ = 65535;
  AttnParams kp = p;
  kp.heavy_tiles_first = Traits::kBlockM != kQueryTileRowsDecode && m_blocks <= kMaxGridYZ &&
                         launch_heavy_tiles_first(p, m_blocks);
  const int64_t grid_z = kp.heavy_tiles_first ? m_blocks : ctas_z;  // heavy first: <= kMaxGridYZ
  if (grid_z > kMaxGridYZ || p.num_splits > kMaxGridYZ) {
    throw Error(Error::Kind::unsupported,
                "flashattn fwd: batch * heads = " + std::to_string(grid_z) + " exceeds " +
                    std::to_string(kMaxGridYZ));
  }
  const int64_t grid_x = kp.heavy_tiles_first ? ctas_z : m_blocks;
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(p.num_splits),
                  static_cast<unsigned>(grid_z));
  constexpr int kSmem = Traits::kSmemBytes;
  if (kSmem > Traits::kDefaultSmemLimit) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
               "cudaFuncSetAttribute(max dynamic smem)");
  }
  // The decode tile's splits of each unit as one cluster along y, merged there
  // (splitkeys_kernel.h combine_in_cluster); else the combine kernel merges them afterwards.
  const dim3 unit_splits(1, static_cast<unsigned>(p.num_splits), 1);
  kp.cluster_combine = Traits::kBlockM == kQueryTileRowsDecode && may_combine_splits_in_cluster(p) &&
                       cluster_fits(reinterpret_cast<const void*>(kernel), p.device_index, unit_splits,
                                    Traits::kNThreads, kSmem);
  if constexpr (Traits::kBlockM == kQueryTileRowsDecode) {  // splitkeys_kernel
    KernelLaunch launch(grid, Traits::kNThreads, kSmem, stream);
    if (kp.cluster_combine) launch.in_clusters(unit_splits);
    launch.as_programmatic_dependent(reinterpret_cast<const void*>(kernel), p.device_index);
    check_cuda(cudaLaunchKernelEx(&launch.config, kernel, kp), name);
  } else {
    kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(kp);
  }
  check_launch(name);
  if (kp.num_splits > 1 && !kp.cluster_combine) run_combine(kp, stream);
}

#if defined(FLASHATTN_HAS_SM90A)
// The wgmma kernel: two CTAs per SM up to d = 128 (fit 128 registers; measured faster than wide
// at d = 64 and 128, docs/PERF.md), with 96-key tiles at d = 64 where they suit the keys; else
// wide. FLASHATTN_WGMMA_TILE=wide|narrow|narrow96 forces a tile where it is compiled.
template <typename Element, int kHeadDim>
void launch_wgmma(const AttnParams& params, cudaStream_t stream) {
  const WgmmaTileEnv forced = wgmma_tile_env();
  if constexpr (kHeadDim == 64) {
    if (forced == WgmmaTileEnv::narrow96 ||
        (forced == WgmmaTileEnv::automatic && keys_suit_96_key_tile(params.seqlen_k))) {
      using Narrow96 = WgmmaTraits<Element, kHeadDim, WgmmaTile::narrow96>;
      launch_fwd<Narrow96>(params, stream, &fwd::wgmma_kernel<Narrow96>, "flashattn wgmma_kernel (narrow, 96 keys)");
      return;
    }
  }
  if constexpr (kHeadDim <= 128) {
    if (forced != WgmmaTileEnv::wide) {
      using Narrow = WgmmaTraits<Element, kHeadDim, WgmmaTile::narrow>;
      launch_fwd<Narrow>(params, stream, &fwd::wgmma_kernel<Narrow>, "flashattn wgmma_kernel (narrow)");
      return;
    }
  }
  using Wide = WgmmaTraits<Element, kHeadDim, WgmmaTile::wide>;
  launch_fwd<Wide>(params, stream, &fwd::wgmma_kernel<Wide>, "flashattn wgmma_kernel");
}
#endif

// The decode tile on a persistent grid (persistent_decode_kernel.h, Traits) instead of the
// default kernel's (Default) where rules.h persistent_decode_ctas gives it CTAs; false
// (nothing launched) where the call is not one it serves: split, or packed GQA rows of several
// queries (not equally spaced in Q).
template <class Traits, class Default>
bool launch_persistent_decode(const AttnParams& p, cudaStream_t stream) {
  if (p.num_splits != 1 || (p.pack_gqa && p.seqlen_q != 1)) return false;
  const PersistentDecode mode = persistent_decode_env();
  if (mode == PersistentDecode::off) return false;
  const auto kernel = &fwd::persistent_decode_kernel<Traits>;
  constexpr int kSmem = persistent_decode_smem_bytes<Traits>();
  static_assert(kSmem <= Traits::Config::kMaxSmemBytes, "fits the per-block shared memory limit");
  const auto default_kernel = &fwd::splitkeys_kernel<Default>;
  const int64_t units = int64_t(p.batch) * units_per_sequence(p);
  const int64_t slots = resident_ctas(reinterpret_cast<const void*>(kernel), p.device_index, Traits::kNThreads, kSmem);
  const int64_t ctas = persistent_decode_ctas(
      units,
      resident_ctas(reinterpret_cast<const void*>(default_kernel), p.device_index, Default::kNThreads,
                    Default::kSmemBytes),
      slots, mode, Traits::kKvLayouts == KvLayouts::paged);
  if (ctas == 0) return false;
  AttnParams kp = p;
  kp.heavy_tiles_first = false;
  kp.cluster_combine = false;
  KernelLaunch launch(dim3(static_cast<unsigned>(ctas)), Traits::kNThreads, kSmem, stream);
  // In clusters where rules.h persistent_decode_in_clusters says so and they fit (placement
  // only: the CTAs share nothing).
  const dim3 cluster(kPersistentDecodeClusterCtas, 1, 1);
  if (persistent_decode_in_clusters(ctas, slots) &&
      cluster_fits(reinterpret_cast<const void*>(kernel), p.device_index, cluster, Traits::kNThreads, kSmem)) {
    launch.in_clusters(cluster);
  }
  launch.as_programmatic_dependent(reinterpret_cast<const void*>(kernel), p.device_index);
  check_cuda(cudaLaunchKernelEx(&launch.config, kernel, kp), "flashattn persistent_decode_kernel");
  check_launch("flashattn persistent_decode_kernel");
  return true;
}

// The decode tile on the heads-split kernel (splitheads_kernel.h, Traits) instead of the
// keys-split ones (Default: the default keys-split kernel, whose waves rules.h
// decode_warps_split_heads weighs) where that rule says so; false (nothing launched) where the call
// is not one it serves: split, packed GQA rows of several queries (not equally spaced in Q), units
// sharing a KV head (unpacked GQA), or a sequence's units not whole groups of the CTA's warps.
template <class Traits, class Default>
bool launch_splitheads(const AttnParams& p, cudaStream_t stream) {
  const int heads = units_per_sequence(p);
  const bool served = p.num_splits == 1 && (p.pack_gqa ? p.seqlen_q == 1 : p.num_heads == p.num_heads_k) &&
                      heads % Traits::kNWarps == 0;
  const SplitHeads mode = split_heads_env();
  if (!served || mode == SplitHeads::off) return false;
  const auto kernel = &fwd::splitheads_kernel<Traits>;
  constexpr int kSmem = splitheads_smem_bytes<Traits>();
  static_assert(kSmem <= Traits::Config::kMaxSmemBytes, "fits the per-block shared memory limit");
  const int64_t units = int64_t(p.batch) * heads;
  const int64_t ctas = units / Traits::kNWarps;
  const int64_t slots = resident_ctas(reinterpret_cast<const void*>(kernel), p.device_index, Traits::kNThreads, kSmem);
  const int64_t default_slots = resident_ctas(reinterpret_cast<const void*>(&fwd::splitkeys_kernel<Default>),
                                              p.device_index, Default::kNThreads, Default::kSmemBytes);
  if (!decode_warps_split_heads(units, ctas, default_slots, slots, num_sms(p.device_index), mode)) return false;
  AttnParams kp = p;
  kp.heavy_tiles_first = false;
  kp.cluster_combine = false;
  KernelLaunch launch(dim3(static_cast<unsigned>(ctas)), Traits::kNThreads, kSmem, stream);
  launch.as_programmatic_dependent(reinterpret_cast<const void*>(kernel), p.device_index);
  check_cuda(cudaLaunchKernelEx(&launch.config, kernel, kp), "flashattn splitheads_kernel");
  check_launch("flashattn splitheads_kernel");
  return true;
}

// The decode tile's kernel on the pipeline kDeep, for paged K/V or contiguous (kPaged), its
// warps splitting the head dim where rules.h decode_warps_split_dims says so and the head dim
// allows, else the keys.
template <typename Element, int kHeadDim, bool kDeep, bool kPaged>
void launch_splitkeys(const AttnParams& params, cudaStream_t stream, const char* name) {
  using DimsSplit = SplitKeysTraits<Element, kHeadDim, kDeep, true, kPaged>;
  if constexpr (DimsSplit::kWarpsSplitDims) {
    static_assert(DimsSplit::kBlockN == splitkv_block_n(kHeadDim), "rules.h splitkv_block_n counts its tiles");
    if (decode_warps_split_dims(params.num_splits, params.seqlen_k, params.head_dim)) {
      launch_fwd<DimsSplit>(params, stream, &fwd::splitkeys_kernel<DimsSplit>, name);
      return;
    }
  }
  using KeysSplit = SplitKeysTraits<Element, kHeadDim, kDeep, false, kPaged>;
  if constexpr (!kDeep && !kPaged && (kHeadDim == 64 || kHeadDim == 128)) {
    using HeadsSplit = SplitKeysTraits<Element, kHeadDim, false, false, false, false, true>;
    if (launch_splitheads<HeadsSplit, KeysSplit>(params, stream)) return;
  }
  if constexpr (!kDeep && (kHeadDim == 64 || kHeadDim == 128)) {
    using Persistent = SplitKeysTraits<Element, kHeadDim, false, false, kPaged, true>;
    if (launch_persistent_decode<Persistent, KeysSplit>(params, stream)) return;
  }
  launch_fwd<KeysSplit>(params, stream, &fwd::splitkeys_kernel<KeysSplit>, name);
}

// rules.h query_tile_rows picks the tile height; the CPU backend walks the same tiles.
template <typename Element, int kHeadDim>
void run_fwd(const AttnParams& params, cudaStream_t stream) {
  using SplitKeys = SplitKeysTraits<Element, kHeadDim>;
  using Short = FwdTraits<Element, kHeadDim, DecodeTileConfig<kHeadDim>>;
  using Default = FwdTraits<Element, kHeadDim>;
  static_assert(SplitKeys::kBlockM == kQueryTileRowsDecode &&
                    Short::kBlockM == kQueryTileRowsShort && Default::kBlockM == kQueryTileRows,
                "tile heights follow rules.h query_tile_rows");
  const int tile_rows = query_tile_rows(params);
  if (tile_rows == kQueryTileRowsDecode) {
    if (params.deep_decode) {  // make_plan: few CTAs with short key walks, contiguous K/V, sm_90
      if (params.block_table != nullptr) {
        throw Error(Error::Kind::runtime, "flashattn: the deep decode pipeline reads contiguous K/V only");
      }
      if constexpr (kHeadDim <= kDeepDecodeMaxHeadDim) {
        launch_splitkeys<Element, kHeadDim, true, false>(params, stream, "flashattn splitkeys_kernel (deep)");
        return;
      }
      throw Error(Error::Kind::runtime, "flashattn: no deep decode pipeline above d = " +
                                            std::to_string(kDeepDecodeMaxHeadDim));
    }
    if (params.block_table != nullptr) {
      launch_splitkeys<Element, kHeadDim, false, true>(params, stream, "flashattn splitkeys_kernel (paged)");
    } else {
      launch_splitkeys<Element, kHeadDim, false, false>(params, stream, "flashattn splitkeys_kernel");
    }
  } else if (tile_rows == kQueryTileRowsShort) {
    launch_fwd<Short>(params, stream, &fwd::fwd_kernel<Short>, "flashattn fwd_kernel (64 rows)");
  } else {
#if defined(FLASHATTN_HAS_SM90A)
    // Hopper: the wgmma kernel, for head dims of whole 128-byte rows and one split (its kBlockN
    // is not rules.h splitkv_block_n, so split-KV stays on fwd_kernel).
    if constexpr (kHeadDim % 64 == 0) {
      if (params.num_splits == 1 && device_has_wgmma(params.device_index)) {
        launch_wgmma<Element, kHeadDim>(params, stream);
        return;
      }
    }
#endif
    launch_fwd<Default>(params, stream, &fwd::fwd_kernel<Default>, "flashattn fwd_kernel");
  }
}

}  // namespace cuda
}  // namespace flashattn
