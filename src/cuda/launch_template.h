// The launchers of one compiled (element type, head dim) instance: one launch_* per kernel
// family, run_fwd to take the planned KernelChoice to its launcher, and decode_slots for the
// choice's device facts. Included only by the generated instance files
// (src/cuda/instances/fwd_<dtype>_hdim<D>.cu); which kernel runs is decided by
// src/api/kernel_choice.cpp, never here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "api/backend.h"
#include "common/rules.h"
#include "common/tuning.h"
#include "cuda/fwd_kernel.h"
#include "cuda/kernel_traits.h"
#include "cuda/launch.h"
#include "cuda/persistent_decode_kernel.h"
#include "cuda/splitheads_kernel.h"
#include "cuda/splitkeys_kernel.h"
#include "cuda/warpspec_kernel.h"
#include "cuda/wgmma_kernel.h"
#include "flashattn/flashattn.h"

namespace flashattn {
namespace cuda {

// ---- traits of each kernel of the instance -----------------------------------------------------

template <typename Element, int kHeadDim>
struct Instance {
  // prefill (mma.sync): 128-row tiles, and 64-row tiles for short query blocks (D-12)
  using Mma = FwdTraits<Element, kHeadDim>;
  using MmaShort = FwdTraits<Element, kHeadDim, ShortTileConfig<kHeadDim>>;
  // decode
  template <WarpSplit kWarps, DecodePipeline kPipeline, KvLayouts kLayout>
  using Decode = DecodeTraits<Element, kHeadDim, kWarps, kPipeline, kLayout>;
  static constexpr bool kWideDecodeDims = kHeadDim == 64 || kHeadDim == 128;  // dims, heads, persistent
  static constexpr bool kDeepCompiled = kHeadDim <= kDeepDecodeMaxHeadDim;
  static_assert(Mma::kBlockM == kQueryTileRows && MmaShort::kBlockM == kQueryTileRowsShort,
                "tile heights follow rules.h query_tile_rows");
};

[[noreturn]] inline void not_compiled(const char* kernel, int head_dim) {
  throw Error(Error::Kind::runtime, std::string("flashattn: kernel ") + kernel + " is not compiled for head dim " +
                                        std::to_string(head_dim) + " (kernel_choice.cpp chose it)");
}

// ---- the grid of query tiles x splits x units (mma, wgmma, splitkeys, deep, dims) -----------------

// Launches kernel over (query tiles, splits, batch x units), or (batch x units, splits, query
// tiles) with the tiles heaviest first; the decode tile's splits of a unit form one cluster
// where the choice asks for it and the device holds it, else the combine kernel merges them.
// The kernel's arguments are the params and `more` (the TMA descriptors of warpspec_kernel).
template <class Traits, class Kernel, class... More>
void launch_tile_grid(const AttnParams& p, const KernelChoice& choice, cudaStream_t stream, Kernel kernel,
                      const char* name, const More&... more) {
  constexpr bool kDecodeTile = Traits::kBlockM == kQueryTileRowsDecode;
  if (p.num_splits > 1 && splitkv_block_n(p.head_dim) % Traits::kBlockN != 0) {
    // Splits are cut at splitkv_block_n-key units (as on the CPU backend), whole kernel tiles.
    throw Error(Error::Kind::runtime, std::string(name) + ": split-KV unit splitkv_block_n(" +
                                          std::to_string(p.head_dim) + ") is not a multiple of kBlockN = " +
                                          std::to_string(Traits::kBlockN));
  }
  const int64_t rows = unit_query_rows(p);
  const int64_t m_blocks = (rows + Traits::kBlockM - 1) / Traits::kBlockM;
  const int64_t units = int64_t(p.batch) * units_per_sequence(p);
  if (m_blocks == 0 || units == 0 || p.num_splits < 1) return;  // nothing to compute
  AttnParams kp = p;
  kp.heavy_tiles_first = !kDecodeTile && choice.heavy_tiles_first;
  constexpr int64_t kMaxGridYZ = 65535;
  const int64_t grid_z = kp.heavy_tiles_first ? m_blocks : units;
  if (grid_z > kMaxGridYZ || p.num_splits > kMaxGridYZ) {
    throw Error(Error::Kind::unsupported,
                std::string(name) + ": batch * heads = " + std::to_string(grid_z) + " exceeds " + std::to_string(kMaxGridYZ));
  }
  const int64_t grid_x = kp.heavy_tiles_first ? units : m_blocks;
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(p.num_splits), static_cast<unsigned>(grid_z));
  constexpr int kSmem = Traits::kSmemBytes;
  if (kSmem > Traits::kDefaultSmemLimit) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
               "cudaFuncSetAttribute(max dynamic smem)");
  }
  const dim3 unit_splits(1, static_cast<unsigned>(p.num_splits), 1);
  kp.cluster_combine = kDecodeTile && choice.cluster_combine &&
                       cluster_fits(reinterpret_cast<const void*>(kernel), p.device_index, unit_splits,
                                    Traits::kNThreads, kSmem);
  if constexpr (kDecodeTile) {
    KernelLaunch launch(grid, Traits::kNThreads, kSmem, stream);
    if (kp.cluster_combine) launch.in_clusters(unit_splits);
    launch.as_programmatic_dependent(reinterpret_cast<const void*>(kernel), p.device_index,
                                     choice.programmatic_launch);
    check_cuda(cudaLaunchKernelEx(&launch.config, kernel, kp, more...), name);
  } else {
    kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(kp, more...);
  }
  check_launch(name);
  if (kp.num_splits > 1 && !kp.cluster_combine) run_combine(kp, choice.programmatic_launch, stream);
}

// ---- a tile loop: each CTA takes tiles blockIdx.x, + gridDim.x, ... (warpspec) ----------------------

// Launches kernel over a 1-D grid of min(choice.persistent_ctas, tiles) CTAs (one per tile
// where persistent_ctas is 0), tiles numbered as make_tile_info reads them; one split, no
// GQA packing (kernel_choice.cpp serves_warpspec).
template <class Traits, class Kernel, class... More>
void launch_tile_loop(const AttnParams& p, const KernelChoice& choice, cudaStream_t stream, Kernel kernel,
                      const char* name, const More&... more) {
  const int64_t m_blocks = (int64_t(p.seqlen_q) + Traits::kBlockM - 1) / Traits::kBlockM;
  const int64_t tiles = m_blocks * p.batch * units_per_sequence(p);
  if (tiles == 0) return;  // nothing to compute
  const int64_t ctas = choice.persistent_ctas > 0 ? std::min(choice.persistent_ctas, tiles) : tiles;
  constexpr int64_t kMaxTiles = (int64_t(1) << 31) - 1;  // the kernel counts tiles and rounds in int
  if (tiles + ctas > kMaxTiles) {
    throw Error(Error::Kind::unsupported, std::string(name) + ": " + std::to_string(tiles) + " query tiles and " +
                                              std::to_string(ctas) + " CTAs exceed " + std::to_string(kMaxTiles));
  }
  AttnParams kp = p;
  kp.heavy_tiles_first = choice.heavy_tiles_first;
  constexpr int kSmem = Traits::kSmemBytes;
  if (kSmem > Traits::kDefaultSmemLimit) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
               "cudaFuncSetAttribute(max dynamic smem)");
  }
  kernel<<<static_cast<unsigned>(ctas), Traits::kNThreads, kSmem, stream>>>(kp, more...);
  check_launch(name);
}

// ---- one launcher per kernel family ------------------------------------------------------------

// mma.sync prefill (fwd_kernel.h): 64- or 128-row tiles, as rules.h query_tile_rows says.
template <typename Element, int kHeadDim>
void launch_mma(const AttnParams& p, const KernelChoice& choice, cudaStream_t stream) {
  using I = Instance<Element, kHeadDim>;
  if (query_tile_rows(p) == kQueryTileRowsShort) {
    launch_tile_grid<typename I::MmaShort>(p, choice, stream, &fwd::fwd_kernel<typename I::MmaShort>,
                                           "flashattn fwd_kernel (64 rows)");
  } else {
    launch_tile_grid<typename I::Mma>(p, choice, stream, &fwd::fwd_kernel<typename I::Mma>, "flashattn fwd_kernel");
  }
}

// wgmma prefill (wgmma_kernel.h), sm_90a, on the chosen tile.
template <typename Element, int kHeadDim>
void launch_wgmma(const AttnParams& p, const KernelChoice& choice, cudaStream_t stream) {
#if defined(FLASHATTN_HAS_SM90A)
  if constexpr (kHeadDim % 64 == 0) {
    if constexpr (kHeadDim == 64) {
      if (choice.wgmma_tile == WgmmaTile::narrow96) {
        using T = WgmmaTraits<Element, kHeadDim, WgmmaTile::narrow96>;
        return launch_tile_grid<T>(p, choice, stream, &fwd::wgmma_kernel<T>, "flashattn wgmma_kernel (narrow, 96 keys)");
      }
    }
    if constexpr (kHeadDim <= 128) {
      if (choice.wgmma_tile == WgmmaTile::narrow) {
        using T = WgmmaTraits<Element, kHeadDim, WgmmaTile::narrow>;
        return launch_tile_grid<T>(p, choice, stream, &fwd::wgmma_kernel<T>, "flashattn wgmma_kernel (narrow)");
      }
    }
    using T = WgmmaTraits<Element, kHeadDim, WgmmaTile::wide>;
    return launch_tile_grid<T>(p, choice, stream, &fwd::wgmma_kernel<T>, "flashattn wgmma_kernel");
  }
#endif
  (void)p, (void)choice, (void)stream;
  not_compiled("wgmma", kHeadDim);
}

// Warp-specialised TMA prefill (warpspec_kernel.h), sm_90a, dense calls whose tensors TMA can
// describe (api/kernel_choice.cpp serves_warpspec).
template <typename Element, int kHeadDim>
void launch_warpspec(const AttnParams& p, const KernelChoice& choice, cudaStream_t stream) {
#if defined(FLASHATTN_HAS_SM90A)
  if constexpr (kHeadDim % 64 == 0) {
    using T = WarpSpecTraits<Element, kHeadDim>;
    return launch_tile_loop<T>(p, choice, stream, &fwd::warpspec_kernel<T>, "flashattn warpspec_kernel",
                               fwd::make_tma_qkv<T>(p));
  }
#endif
  (void)p, (void)choice, (void)stream;
  not_compiled("warpspec", kHeadDim);
}

// The decode tile's keys- or dims-split kernel (splitkeys_kernel.h) on the chosen pipeline, for
// contiguous or paged K/V.
template <typename Element, int kHeadDim, WarpSplit kWarps, DecodePipeline kPipeline>
void launch_splitkeys_on(const AttnParams& p, const KernelChoice& choice, cudaStream_t stream, const char* name) {
  using I = Instance<Element, kHeadDim>;
  if (p.block_table != nullptr) {
    if constexpr (kPipeline == DecodePipeline::deep) {
      throw Error(Error::Kind::runtime, "flashattn: the deep decode pipeline reads contiguous K/V only (D-18)");
    } else {
      using T = typename I::template Decode<kWarps, kPipeline, KvLayouts::paged>;
      return launch_tile_grid<T>(p, choice, stream, &fwd::splitkeys_kernel<T>, name);
    }
  }
  using T = typename I::template Decode<kWarps, kPipeline, KvLayouts::contiguous>;
  launch_tile_grid<T>(p, choice, stream, &fwd::splitkeys_kernel<T>, name);
}

template <typename Element, int kHeadDim>
void launch_splitkeys(const AttnParams& p, const KernelChoice& choice, cudaStream_t stream) {
  using I = Instance<Element, kHeadDim>;
  const bool deep = choice.deep_pipeline;
  if (deep && !I::kDeepCompiled) not_compiled("deep", kHeadDim);
  if (choice.kernel == Kernel::dims) {
    if constexpr (I::kWideDecodeDims) {
      if (deep) {
        return launch_splitkeys_on<Element, kHeadDim, WarpSplit::dims, DecodePipeline::deep>(
            p, choice, stream, "flashattn splitkeys_kernel (deep, dims split)");
      }
      return launch_splitkeys_on<Element, kHeadDim, WarpSplit::dims, DecodePipeline::standard>(
          p, choice, stream, "flashattn splitkeys_kernel (dims split)");
    }
    not_compiled("dims", kHeadDim);
  }
  if constexpr (I::kDeepCompiled) {
    if (deep) {
      return launch_splitkeys_on<Element, kHeadDim, WarpSplit::keys, DecodePipeline::deep>(
          p, choice, stream, "flashattn splitkeys_kernel (deep)");
    }
  }
  launch_splitkeys_on<Element, kHeadDim, WarpSplit::keys, DecodePipeline::standard>(p, choice, stream,
                                                                                    "flashattn splitkeys_kernel");
}

// The decode tile on a persistent grid of choice.persistent_ctas CTAs (persistent_decode_kernel.h).
template <class Traits>
void launch_persistent_grid(const AttnParams& p, const KernelChoice& choice, cudaStream_t stream) {
  const auto kernel = &fwd::persistent_decode_kernel<Traits>;
  constexpr int kSmem = persistent_decode_smem_bytes<Traits>();
  static_assert(kSmem <= Traits::Config::kMaxSmemBytes, "fits the per-block shared memory limit");
  const int64_t ctas = choice.persistent_ctas;
  const int64_t slots = resident_ctas(reinterpret_cast<const void*>(kernel), p.device_index, Traits::kNThreads, kSmem);
  AttnParams kp = p;
  kp.heavy_tiles_first = false;
  kp.cluster_combine = false;
  KernelLaunch launch(dim3(static_cast<unsigned>(ctas)), Traits::kNThreads, kSmem, stream);
  const dim3 cluster(kPersistentDecodeClusterCtas, 1, 1);  // placement only (D-31)
  if (persistent_decode_in_clusters(ctas, slots) &&
      cluster_fits(reinterpret_cast<const void*>(kernel), p.device_index, cluster, Traits::kNThreads, kSmem)) {
    launch.in_clusters(cluster);
  }
  launch.as_programmatic_dependent(reinterpret_cast<const void*>(kernel), p.device_index, choice.programmatic_launch);
  check_cuda(cudaLaunchKernelEx(&launch.config, kernel, kp), "flashattn persistent_decode_kernel");
  check_launch("flashattn persistent_decode_kernel");
}

template <typename Element, int kHeadDim>
void launch_persistent(const AttnParams& p, const KernelChoice& choice, cudaStream_t stream) {
  using I = Instance<Element, kHeadDim>;
  if constexpr (I::kWideDecodeDims) {
    if (p.block_table != nullptr) {
      return launch_persistent_grid<typename I::template Decode<WarpSplit::keys, DecodePipeline::three_stage,
                                                                KvLayouts::paged>>(p, choice, stream);
    }
    return launch_persistent_grid<typename I::template Decode<WarpSplit::keys, DecodePipeline::three_stage,
                                                              KvLayouts::contiguous>>(p, choice, stream);
  }
  (void)p, (void)choice, (void)stream;
  not_compiled("persistent", kHeadDim);
}

// The decode tile on the heads-split kernel (splitheads_kernel.h): a CTA per kNWarps units.
template <typename Element, int kHeadDim>
void launch_splitheads(const AttnParams& p, const KernelChoice& choice, cudaStream_t stream) {
  using I = Instance<Element, kHeadDim>;
  if constexpr (I::kWideDecodeDims) {
    using T = typename I::template Decode<WarpSplit::heads, DecodePipeline::three_stage, KvLayouts::contiguous>;
    const auto kernel = &fwd::splitheads_kernel<T>;
    constexpr int kSmem = splitheads_smem_bytes<T>();
    static_assert(kSmem <= T::Config::kMaxSmemBytes, "fits the per-block shared memory limit");
    const int64_t ctas = int64_t(p.batch) * units_per_sequence(p) / T::kNWarps;
    if (ctas == 0) return;
    AttnParams kp = p;
    kp.heavy_tiles_first = false;
    kp.cluster_combine = false;
    KernelLaunch launch(dim3(static_cast<unsigned>(ctas)), T::kNThreads, kSmem, stream);
    if (kSmem > T::kDefaultSmemLimit) {
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                 "cudaFuncSetAttribute(max dynamic smem)");
    }
    launch.as_programmatic_dependent(reinterpret_cast<const void*>(kernel), p.device_index, choice.programmatic_launch);
    check_cuda(cudaLaunchKernelEx(&launch.config, kernel, kp), "flashattn splitheads_kernel");
    check_launch("flashattn splitheads_kernel");
    return;
  }
  (void)p, (void)choice, (void)stream;
  not_compiled("heads", kHeadDim);
}

// ---- the instance's entry points (api/backend.h through backend.cu) -----------------------------

// Whether every e4m3 K/V row starts at a 16-byte boundary (the fp8 decode pipeline's copies):
// the base addresses and every stride, in bytes.
inline bool kv_rows_16_byte_aligned(const AttnParams& p) {
  const int64_t bits = int64_t(reinterpret_cast<uintptr_t>(p.k) | reinterpret_cast<uintptr_t>(p.v)) |
                       p.k_batch_stride | p.k_row_stride | p.k_head_stride | p.v_batch_stride | p.v_row_stride |
                       p.v_head_stride;
  return bits % 16 == 0;
}

// FP8 storage (kernel_traits.h Fp8Storage, D-64): e4m3 K/V, and with kQFp8 e4m3 Q, on the
// mma prefill kernel and the splitkeys decode kernel (fp8 or standard pipeline), which serve every
// call; e4m3 Q, K and V also on the warpspec kernel's FP8 products (WarpSpecFp8Traits, D-75) for
// the dense calls it serves (api/kernel_choice.cpp takes no other kernel for e4m3).
template <typename Element, int kHeadDim, bool kQFp8>
void run_fwd_fp8(const AttnParams& p, const KernelChoice& choice, cudaStream_t stream) {
  using I = Instance<Element, kHeadDim>;
#if defined(FLASHATTN_HAS_SM90A)
  if constexpr (kQFp8 && std::is_same_v<Element, cutlass::bfloat16_t> && fp8_products_head_dim(kHeadDim)) {
    if (choice.kernel == Kernel::warpspec) {
      using T = WarpSpecFp8Traits<kHeadDim>;
      return launch_tile_loop<T>(p, choice, stream, &fwd::warpspec_kernel<T>,
                                 "flashattn warpspec_kernel (e4m3 products)", fwd::make_tma_qkv<T>(p));
    }
  }
#endif
  if (choice.kernel == Kernel::mma) {
    if (query_tile_rows(p) == kQueryTileRowsShort) {
      using T = Fp8Storage<typename I::MmaShort, kQFp8, 1>;
      return launch_tile_grid<T>(p, choice, stream, &fwd::fwd_kernel<T>, "flashattn fwd_kernel (64 rows, e4m3)");
    }
    using T = Fp8Storage<typename I::Mma, kQFp8, 1>;
    return launch_tile_grid<T>(p, choice, stream, &fwd::fwd_kernel<T>, "flashattn fwd_kernel (e4m3)");
  }
  if (choice.kernel == Kernel::splitkeys && !choice.deep_pipeline) {
    // The fp8 pipeline computes in fp16 whatever q and O are (D-66: e4m3 widens into fp16 in
    // one instruction); the standard one in the instance's type.
    auto launch = [&](auto layout, auto pipeline, const char* name) {
      constexpr DecodePipeline kPipeline = decltype(pipeline)::value;
      using Compute = std::conditional_t<kPipeline == DecodePipeline::fp8, cutlass::half_t, Element>;
      using Decode = DecodeTraits<Compute, kHeadDim, WarpSplit::keys, kPipeline, decltype(layout)::value>;
      using T = Fp8Storage<Decode, kQFp8, Decode::kCopyStages, Element>;
      launch_tile_grid<T>(p, choice, stream, &fwd::splitkeys_kernel<T>, name);
    };
    using Paged = std::integral_constant<KvLayouts, KvLayouts::paged>;
    using Contiguous = std::integral_constant<KvLayouts, KvLayouts::contiguous>;
    // The fp8 pipeline's 16-byte copies need K/V rows at 16-byte boundaries (the API's rule is
    // 8: api/staging.h); other head dims and rows take the standard pipeline.
    if constexpr (fp8_warp_kv_head_dim(kHeadDim)) {
      if (kv_rows_16_byte_aligned(p)) {
        using Fp8 = std::integral_constant<DecodePipeline, DecodePipeline::fp8>;
        if (p.block_table != nullptr) return launch(Paged{}, Fp8{}, "flashattn splitkeys_kernel (paged, e4m3 pipeline)");
        return launch(Contiguous{}, Fp8{}, "flashattn splitkeys_kernel (e4m3 pipeline)");
      }
    }
    using Standard = std::integral_constant<DecodePipeline, DecodePipeline::standard>;
    if (p.block_table != nullptr) return launch(Paged{}, Standard{}, "flashattn splitkeys_kernel (paged, e4m3)");
    return launch(Contiguous{}, Standard{}, "flashattn splitkeys_kernel (e4m3)");
  }
  throw Error(Error::Kind::runtime, std::string("flashattn: kernel ") + kernel_name(choice.kernel) +
                                        " does not read e4m3 (kernel_choice.cpp chose it)");
}

template <typename Element, int kHeadDim>
void run_fwd(const AttnParams& params, const KernelChoice& choice, cudaStream_t stream) {
  switch (choice.kernel) {
    case Kernel::mma: return launch_mma<Element, kHeadDim>(params, choice, stream);
    case Kernel::wgmma: return launch_wgmma<Element, kHeadDim>(params, choice, stream);
    case Kernel::warpspec: return launch_warpspec<Element, kHeadDim>(params, choice, stream);
    case Kernel::splitkeys:
    case Kernel::deep:
    case Kernel::dims: return launch_splitkeys<Element, kHeadDim>(params, choice, stream);
    case Kernel::persistent: return launch_persistent<Element, kHeadDim>(params, choice, stream);
    case Kernel::heads: return launch_splitheads<Element, kHeadDim>(params, choice, stream);
    default:
      throw Error(Error::Kind::runtime, std::string("flashattn: no CUDA kernel named ") + kernel_name(choice.kernel));
  }
}

// The CTAs of this instance's decode kernels resident at once on the device, for contiguous or
// paged K/V (the choice weighs the persistent and heads-split grids by them).
template <typename Element, int kHeadDim>
DecodeSlots decode_slots(int device_index, bool paged) {
  using I = Instance<Element, kHeadDim>;
  auto slots = [&](auto kernel, int threads, int smem) {
    return int64_t(resident_ctas(reinterpret_cast<const void*>(kernel), device_index, threads, smem));
  };
  DecodeSlots s;
  auto count = [&](auto layout) {
    constexpr KvLayouts kLayout = decltype(layout)::value;
    using Keys = typename I::template Decode<WarpSplit::keys, DecodePipeline::standard, kLayout>;
    s.splitkeys = slots(&fwd::splitkeys_kernel<Keys>, Keys::kNThreads, Keys::kSmemBytes);
    if constexpr (I::kWideDecodeDims) {
      using Persistent = typename I::template Decode<WarpSplit::keys, DecodePipeline::three_stage, kLayout>;
      s.persistent = slots(&fwd::persistent_decode_kernel<Persistent>, Persistent::kNThreads,
                           persistent_decode_smem_bytes<Persistent>());
      if constexpr (kLayout == KvLayouts::contiguous) {
        using Heads = typename I::template Decode<WarpSplit::heads, DecodePipeline::three_stage, kLayout>;
        s.heads = slots(&fwd::splitheads_kernel<Heads>, Heads::kNThreads, splitheads_smem_bytes<Heads>());
      }
    }
  };
  if (paged) {
    count(std::integral_constant<KvLayouts, KvLayouts::paged>{});
  } else {
    count(std::integral_constant<KvLayouts, KvLayouts::contiguous>{});
  }
  return s;
}

}  // namespace cuda
}  // namespace flashattn
