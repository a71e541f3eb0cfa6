// Host side of the forward kernel: grid, shared-memory limit, launch. Included only by the
// generated instance files (src/cuda/instances/fwd_<dtype>_hdim<D>.cu).
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "common/rules.h"
#include "cuda/fwd_kernel.h"
#include "cuda/kernel_traits.h"
#include "cuda/launch.h"
#include "flashattn/flashattn.h"

namespace flashattn {
namespace cuda {

template <class Traits>
void launch_fwd(const AttnParams& p, cudaStream_t stream) {
  if (p.num_splits > 1 && splitkv_block_n(p.head_dim) != Traits::kBlockN) {
    // The CPU backend cuts splits at splitkv_block_n-row tiles; both must cut at the same keys.
    throw Error(Error::Kind::runtime,
                "flashattn fwd: split-KV tile rows splitkv_block_n(" + std::to_string(p.head_dim) +
                    ") = " + std::to_string(splitkv_block_n(p.head_dim)) +
                    " differ from the kernel's kBlockN = " + std::to_string(Traits::kBlockN));
  }
  const int rows_per_query = p.pack_gqa ? p.num_heads / p.num_heads_k : 1;
  const int heads = p.pack_gqa ? p.num_heads_k : p.num_heads;
  const int64_t rows = int64_t(p.seqlen_q) * rows_per_query;
  const int64_t m_blocks = (rows + Traits::kBlockM - 1) / Traits::kBlockM;
  const int64_t ctas_z = int64_t(p.batch) * heads;
  if (m_blocks == 0 || ctas_z == 0 || p.num_splits < 1) return;  // nothing to compute
  constexpr int kMaxGridYZ = 65535;
  if (ctas_z > kMaxGridYZ || p.num_splits > kMaxGridYZ) {
    throw Error(Error::Kind::unsupported,
                "flashattn fwd: batch * heads = " + std::to_string(ctas_z) + " exceeds " +
                    std::to_string(kMaxGridYZ));
  }
  const dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(p.num_splits),
                  static_cast<unsigned>(ctas_z));
  auto kernel = &fwd::fwd_kernel<Traits>;
  constexpr int kSmem = Traits::kSmemBytes;
  if (kSmem > Traits::kDefaultSmemLimit) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
               "cudaFuncSetAttribute(fwd_kernel, max dynamic smem)");
  }
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(p);
  check_launch("flashattn fwd_kernel");
}

// rules.h query_tile_rows picks the tile height; the CPU backend walks the same tiles.
template <typename Element, int kHeadDim>
void run_fwd(const AttnParams& params, cudaStream_t stream) {
  using Decode = FwdTraits<Element, kHeadDim, DecodeTileConfig<kHeadDim>>;
  using Default = FwdTraits<Element, kHeadDim>;
  static_assert(Decode::kBlockM == kQueryTileRowsShort && Default::kBlockM == kQueryTileRows,
                "tile heights follow rules.h query_tile_rows");
  if (query_tile_rows(params) == kQueryTileRowsShort) {
    launch_fwd<Decode>(params, stream);
  } else {
    launch_fwd<Default>(params, stream);
  }
}

}  // namespace cuda
}  // namespace flashattn
