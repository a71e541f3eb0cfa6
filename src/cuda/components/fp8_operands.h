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

__device__ __forceinline__ uint32_t shared_address(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 64-bit shared-memory accesses at a shared-window address (ld/st.shared: through a generic
// pointer each access was a 64-bit generic load or store with its address arithmetic).
__device__ __forceinline__ uint2 load_shared_u64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ void store_shared_u64(uint32_t addr, uint2 v) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(addr), "r"(v.x), "r"(v.y) : "memory");
}

// The byte offset of element (r, c) of a K-major e4m3 tile of kRows rows in 128- or 64-byte
// swizzle atoms (GMMA::Layout_K_SW128_Atom / Layout_K_SW64_Atom tiled rows first): the 16-byte
// chunk of a row XOR the row's 3 (SW128) or 2 (SW64) swizzle bits. Written out so that the
// transpose's addresses cost a few integer operations (warpspec_kernel.h checks it against the
// CuTe layouts at compile time).
template <int kRowBytes, int kRows>
CUTE_HOST_DEVICE constexpr int k_major_offset(int r, int c) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "SW128 or SW64 atoms");
  const int block = c / kRowBytes, x = c % kRowBytes;
  const int swizzle = kRowBytes == 128 ? r % 8 : (r / 2) % 4;
  return block * kRows * kRowBytes + r * kRowBytes + ((x / 16) ^ swizzle) * 16 + x % 16;
}

// __byte_perm, also on the host (the transpose is checked there).
CUTE_HOST_DEVICE uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, selector);
#else
  const uint64_t both = (uint64_t(b) << 32) | a;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) out |= uint32_t((both >> (8 * ((selector >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return out;
#endif
}

// Byte transpose of a 4 x 4 block: out[c] byte r = in[r] byte c.
CUTE_HOST_DEVICE void transpose_4x4_bytes(uint32_t in0, uint32_t in1, uint32_t in2, uint32_t in3,
                                          uint32_t (&out)[4]) {
  const uint32_t lo01 = byte_perm(in0, in1, 0x5140), hi01 = byte_perm(in0, in1, 0x7362);
  const uint32_t lo23 = byte_perm(in2, in3, 0x5140), hi23 = byte_perm(in2, in3, 0x7362);
  out[0] = byte_perm(lo01, lo23, 0x5410);
  out[1] = byte_perm(lo01, lo23, 0x7632);
  out[2] = byte_perm(hi01, hi23, 0x5410);
  out[3] = byte_perm(hi01, hi23, 0x7632);
}

// V (kBlockN keys x kHeadDim, as loaded: 128-byte swizzle rows) into Vt (kHeadDim x kBlockN,
// kBlockN-byte swizzle rows, keys in kernel_key order per 32-key chunk), by kThreads threads;
// `thread` is this one's index among them. load64(offset) and store64(offset, word pair) reach
// the tiles' bytes.
//
// A unit is Vt's 8 bytes at slots 8 qp .. 8 qp + 7 of half h of 32-key chunk kc in 8 rows
// (columns 8 d8 .. 8 d8 + 7 of V): slots 16h + 8qp + {0..3} hold keys key0 + {0, 1, 8, 9} and
// slots + {4..7} keys key0 + {2, 3, 10, 11}, key0 = 32 kc + 16 h + 4 qp (kernel_key). It is 8
// loads of 8 bytes (those keys' columns), four 4 x 4 byte transposes and 8 stores of 8 bytes.
// The lanes of a warp take 4 column groups x (qp, h) x 2 chunks, so that both the loads and
// the stores spread over 16 banks (4 wavefronts for 256 bytes, where the fewest is 2).
template <int kBlockN, int kHeadDim, int kThreads, class Load64, class Store64>
CUTE_HOST_DEVICE void transpose_v_tile(int thread, Load64&& load64, Store64&& store64) {
  constexpr int kChunks = kBlockN / 32;
  constexpr int kUnits = (kBlockN / 8) * (kHeadDim / 8);
  static_assert(kUnits % 16 == 0 && (kUnits / 16) % kChunks == 0, "whole unit groups");
  for (int u = thread; u < kUnits; u += kThreads) {
    const int qp = (u >> 2) & 1, h = (u >> 3) & 1;
    const int kc = (u >> 4) % kChunks;
    const int col = 8 * ((u & 3) + 4 * ((u >> 4) / kChunks));
    const int key0 = 32 * kc + 16 * h + 4 * qp;
    constexpr int kRowOffset[8] = {0, 1, 2, 3, 8, 9, 10, 11};
    uint2 r[8];
    CUTE_UNROLL
    for (int i = 0; i < 8; ++i) r[i] = load64(k_major_offset<128, kBlockN>(key0 + kRowOffset[i], col));
    uint32_t lo[4], hi[4], lo4[4], hi4[4];
    transpose_4x4_bytes(r[0].x, r[1].x, r[4].x, r[5].x, lo);   // columns 0-3, keys + {0, 1, 8, 9}
    transpose_4x4_bytes(r[2].x, r[3].x, r[6].x, r[7].x, hi);   // columns 0-3, keys + {2, 3, 10, 11}
    transpose_4x4_bytes(r[0].y, r[1].y, r[4].y, r[5].y, lo4);  // columns 4-7
    transpose_4x4_bytes(r[2].y, r[3].y, r[6].y, r[7].y, hi4);
    const int slot = 32 * kc + 16 * h + 8 * qp;
    CUTE_UNROLL
    for (int c = 0; c < 4; ++c) {
      store64(k_major_offset<kBlockN, kHeadDim>(col + c, slot), uint2{lo[c], hi[c]});
      store64(k_major_offset<kBlockN, kHeadDim>(col + 4 + c, slot), uint2{lo4[c], hi4[c]});
    }
  }
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
