// Asynchronous global->shared copies (cp.async) and their commit groups, with an optional L2
// eviction hint.
#pragma once

#include <cstdint>

#include <cute/arch/copy_sm90_desc.hpp>  // cute::TMA::CacheHintSm90
#include <cute/tensor.hpp>

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)


// The L2 eviction priority of the lines a copy brings in: the default, or evict-first
// (Traits::kKvEvictFirst). The hinted copy carries the cache policy PTX createpolicy.fractional makes for
// evict-first (the value CuTe names for TMA; a constant, which the compiler rematerialises
// instead of holding a register pair through the mainloop). The default is the plain copy: the
// hinted copy with an evict-normal policy measured 7% slower at batch 128 decode
// (docs/DECISIONS.md D-21).
enum class L2Hint { none, evict_first };

// 16-byte global->shared async copy to the shared-window address dst that reads the first
// src_bytes (0 to 16) of the source and zero-fills the rest (0: reads nothing).
template <L2Hint kHint = L2Hint::none>
__device__ __forceinline__ void cp_async_16_bytes(uint32_t dst, const void* gmem_src, int src_bytes) {
  if constexpr (kHint == L2Hint::evict_first) {
    constexpr uint64_t kPolicy = uint64_t(cute::TMA::CacheHintSm90::EVICT_FIRST);
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(gmem_src), "r"(src_bytes), "l"(kPolicy));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
                 "r"(src_bytes));
  }
}
// ... all 16 bytes, or (valid false) none.
template <L2Hint kHint = L2Hint::none>
__device__ __forceinline__ void cp_async_16_to(uint32_t dst, const void* gmem_src, bool valid) {
  cp_async_16_bytes<kHint>(dst, gmem_src, valid ? 16 : 0);
}
template <L2Hint kHint = L2Hint::none>
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  cp_async_16_to<kHint>(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst)), gmem_src, valid);
}
// 8-byte global->shared async copy (FP8 tiles: 8 elements, tile_loads.h copy_chunk); src_bytes 0
// zero-fills. cp.async.cg moves 16 bytes only, so this one goes through the L1 (.ca).
template <L2Hint kHint = L2Hint::none>
__device__ __forceinline__ void cp_async_8(void* smem_dst, const void* gmem_src, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 8 : 0;
  if constexpr (kHint == L2Hint::evict_first) {
    constexpr uint64_t kPolicy = uint64_t(cute::TMA::CacheHintSm90::EVICT_FIRST);
    asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 8, %2, %3;\n" ::"r"(dst),
                 "l"(gmem_src), "r"(src_bytes), "l"(kPolicy));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes));
  }
}
// 4-byte global->shared async copy (one int: persistent_decode_kernel.h stages lengths so).
__device__ __forceinline__ void cp_async_4(int* smem_dst, const int* gmem_src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
               "l"(gmem_src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
