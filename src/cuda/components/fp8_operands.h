// The operands of O += P V as e4m3 wgmma (the warp-specialised kernel on FP8 products, D-75).
//
// FP8 wgmma reads A from registers or K-major shared memory and B from K-major shared memory
// only. Here K is the key: P (64 rows x keys per warpgroup) comes from registers and V must be
// stored (d, keys) with keys contiguous, while TMA lands V as (keys, d).
//
// One key order, chosen so that P needs no shuffle. Per 32-key chunk a thread holds S (the
// f32 accumulator of Q K^T) at keys 8j + 2q + e (j < 4, e < 2, q = lane % 4) of rows g and
// g + 8, and the e4m3 A operand of a 32-deep wgmma takes keys 4q + i and 16 + 4q + i (i < 4)
// of the same rows. Handing the thread's S values to its A slots in register order pairs A slot
// kk = 16h + 4q + i with key
//     kernel_key(kk) = 16h + 8(i / 2) + 2q + i % 2,
// the same map for every thread, so Vt stores key kernel_key(kk) at position kk of each chunk.
// The sum over keys is the same in any order.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "vt_transpose.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;

// Four f32 values as four e4m3 bytes (round to nearest, saturating), a in the lowest byte.
__device__ __forceinline__ uint32_t pack_e4m3x4(float a, float b, float c, float d) {
  uint32_t packed;
  asm("{\n .reg .b16 lo, hi;\n"
      " cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      " cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      " mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(packed)
      : "f"(a), "f"(b), "f"(c), "f"(d));
  return packed;
}

// P (this thread's S accumulator after the softmax: ((2, 2, kBlockN / 8), 1, 1), value
// e + 2 rr + 4 j at row g + 8 rr, key 8 j + 2 q + e) into the e4m3 A operand of P V
// (((4, 2, 2), 1, kBlockN / 32), value i + 4 rr + 8 h + 16 kc at row g + 8 rr, slot 16 h + 4 q
// + i of chunk kc), in the key order above: slot (i, rr, h, kc) takes S value
// (i % 2, rr, j = 4 kc + 2 h + i / 2).
template <class AccS, class FragP>
__device__ __forceinline__ void p_to_fp8_operand(const AccS& acc_s, FragP& tOrP) {
  constexpr int kChunks = decltype(size(acc_s))::value / 16;
  static_assert(decltype(size(tOrP))::value == 16 * kChunks, "one byte of P per f32 of S");
  Tensor words = recast<uint32_t>(tOrP);
  CUTE_UNROLL
  for (int kc = 0; kc < kChunks; ++kc) {
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      CUTE_UNROLL
      for (int rr = 0; rr < 2; ++rr) {
        const int j = 4 * kc + 2 * h;
        words(rr + 2 * h + 4 * kc) = pack_e4m3x4(acc_s(2 * rr + 4 * j), acc_s(1 + 2 * rr + 4 * j),
                                                 acc_s(2 * rr + 4 * (j + 1)), acc_s(1 + 2 * rr + 4 * (j + 1)));
      }
    }
  }
}

__device__ __forceinline__ uint32_t shared_address(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// ldmatrix.x4 (four 8 x 8 matrices of 16-bit elements, lane t giving row t % 8 of matrix t / 8)
// and stmatrix.x4.trans (the same, each matrix stored transposed), at shared-window addresses.
__device__ __forceinline__ void load_matrices_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void store_matrices_x4_transposed(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// V (kBlockN keys x kHeadDim, as loaded) at shared address v into Vt (kHeadDim x kBlockN, keys
// in kernel_key order per 32-key chunk) at vt, by kWarps warps, `warp` being this one's index
// among them: per step of 16 keys x 32 columns one ldmatrix, four byte permutes and one
// stmatrix (vt_transpose.h).
template <int kBlockN, int kHeadDim, int kWarps>
__device__ __forceinline__ void transpose_v_tile(uint32_t v, uint32_t vt, int warp, int lane) {
  using Steps = VtTransposeSteps<kBlockN, kHeadDim>;
  for (int step = warp; step < Steps::kSteps; step += kWarps) {
    uint32_t keys[4], pairs[4];
    load_matrices_x4(v + Steps::load_offset(step, lane), keys);
    pair_keys(keys[0], keys[1], pairs[0], pairs[1]);
    pair_keys(keys[2], keys[3], pairs[2], pairs[3]);
    store_matrices_x4_transposed(vt + Steps::store_offset(step, lane), pairs);
  }
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
