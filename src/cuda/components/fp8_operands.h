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

// 32 bits of shared memory at the element (row, col) of a swizzled tile (the swizzles move
// 16-byte chunks, so 4 bytes from a column divisible by 4 stay together).
template <class STile>
__device__ __forceinline__ uint32_t* smem_word(const STile& s, int row, int col) {
  return (uint32_t*)(&s(row, col));  // NOLINT: a view's element, written through the view
}

// Byte transpose of a 4 x 4 block: out[c] byte r = in[r] byte c.
__device__ __forceinline__ void transpose_4x4_bytes(const uint32_t (&in)[4], uint32_t (&out)[4]) {
  const uint32_t lo01 = __byte_perm(in[0], in[1], 0x5140), hi01 = __byte_perm(in[0], in[1], 0x7362);
  const uint32_t lo23 = __byte_perm(in[2], in[3], 0x5140), hi23 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(lo01, lo23, 0x5410);
  out[1] = __byte_perm(lo01, lo23, 0x7632);
  out[2] = __byte_perm(hi01, hi23, 0x5410);
  out[3] = __byte_perm(hi01, hi23, 0x7632);
}

// V (kBlockN keys x kHeadDim, as loaded) into Vt (kHeadDim x kBlockN, keys in kernel_key order
// per 32-key chunk) by kWarps warps; `warp` and `lane` of this thread among them. A warp step
// is one 32-key chunk x 16 columns: lane (m = lane % 8, d4 = lane / 8) reads the 4 keys of Vt
// word m (kernel_key of slots 4m..4m+3: 16h + 2q + {0, 1, 8, 9}, h = m / 4, q = m % 4) at 4
// columns and writes them as 4 words of Vt rows.
template <int kBlockN, int kHeadDim, int kWarps, class SV, class SVt>
__device__ __forceinline__ void transpose_v_tile(const SV& sV, const SVt& sVt, int warp, int lane) {
  constexpr int kChunks = kBlockN / 32;
  constexpr int kSteps = kChunks * (kHeadDim / 16);
  const int m = lane % 8;
  const int key_in_chunk = 16 * (m / 4) + 2 * (m % 4);
  for (int step = warp; step < kSteps; step += kWarps) {
    const int kc = step % kChunks;
    const int col = 16 * (step / kChunks) + 4 * (lane / 8);
    const int key = 32 * kc + key_in_chunk;
    uint32_t rows[4], cols[4];
    rows[0] = *smem_word(sV, key, col);
    rows[1] = *smem_word(sV, key + 1, col);
    rows[2] = *smem_word(sV, key + 8, col);
    rows[3] = *smem_word(sV, key + 9, col);
    transpose_4x4_bytes(rows, cols);
    CUTE_UNROLL
    for (int c = 0; c < 4; ++c) *smem_word(sVt, col + c, 32 * kc + 4 * m) = cols[c];
  }
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
