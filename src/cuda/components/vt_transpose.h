// Where the V transpose of the FP8 products (D-75) reads and writes: index maps only, free of
// CuTe and of device code, so that the CPU tests run them against a model of ldmatrix and
// stmatrix (tests/cpu/test_vt_transpose.cpp). fp8_operands.h transpose_v_tile issues the
// instructions.
//
// V arrives (keys, d) in 128-byte swizzle rows; Vt is (d, keys) with keys contiguous, each
// 32-key chunk in kernel_key order (fp8_operands.h says why that order). A warp step moves 16
// keys x 32 columns (bytes) of V:
//   - ldmatrix.x4 reads four 8 x 16-byte matrices: rows u < 8 are the 8 key pairs, matrix m the
//     pair's first (m even) or second key (m odd) at the step's lower (m < 2) or upper 16
//     columns. Lane t receives 4 columns of one key per matrix: pair t / 4, columns 4 (t % 4)..+3.
//   - pair_keys interleaves the two keys of a pair byte by byte: 16-bit elements (first key,
//     second key), one per column.
//   - stmatrix.x4.trans writes each 8 x 8 matrix of 16-bit elements transposed: the element
//     a lane holds at (pair u, column j) lands in Vt row j at slots 2u, 2u + 1; one Vt row of a
//     matrix is 16 contiguous bytes, the 16 keys in kernel_key order.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FA_VT_HD __host__ __device__ __forceinline__
#else
#define FA_VT_HD inline
#endif

namespace flashattn {
namespace cuda {
namespace fwd {

// The key (within its 32-key chunk) that Vt stores at slot kk = 16 h + 4 q + i (fp8_operands.h).
FA_VT_HD constexpr int kernel_key(int kk) {
  const int h = kk / 16, q = (kk % 16) / 4, i = kk % 4;
  return 16 * h + 8 * (i / 2) + 2 * q + i % 2;
}

// The byte offset of element (r, c) of a K-major e4m3 tile of kRows rows in 128- or 64-byte
// swizzle atoms (GMMA::Layout_K_SW128_Atom / Layout_K_SW64_Atom tiled rows first): the 16-byte
// chunk of a row XOR the row's 3 (SW128) or 2 (SW64) swizzle bits. Written out so that the
// transpose's addresses cost a few integer operations (warpspec_kernel.h checks it against the
// CuTe layouts at compile time).
template <int kRowBytes, int kRows>
FA_VT_HD constexpr int k_major_offset(int r, int c) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "SW128 or SW64 atoms");
  const int block = c / kRowBytes, x = c % kRowBytes;
  const int swizzle = kRowBytes == 128 ? r % 8 : (r / 2) % 4;
  return block * kRows * kRowBytes + r * kRowBytes + ((x / 16) ^ swizzle) * 16 + x % 16;
}

// __byte_perm, also on the host.
FA_VT_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, selector);
#else
  const uint64_t both = (uint64_t(b) << 32) | a;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) out |= uint32_t((both >> (8 * ((selector >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return out;
#endif
}

// 4 columns of a pair's first and second key (one byte per column each) as 16-bit elements
// (first, second) of columns 0-1 and 2-3.
FA_VT_HD void pair_keys(uint32_t first, uint32_t second, uint32_t& cols01, uint32_t& cols23) {
  cols01 = byte_perm(first, second, 0x5140);
  cols23 = byte_perm(first, second, 0x7362);
}

// The warp steps of one V tile (kBlockN keys x kHeadDim columns) and each lane's row addresses.
template <int kBlockN, int kHeadDim>
struct VtTransposeSteps {
  static constexpr int kKeyGroups = kBlockN / 16;
  static constexpr int kSteps = kKeyGroups * (kHeadDim / 32);
  static constexpr int kVtRowBytes = kBlockN % 128 == 0 ? 128 : 64;  // Vt's swizzle atom (kernel_traits.h)
  static_assert(kBlockN % 64 == 0 && kHeadDim % 128 == 0, "whole swizzle atoms of V and Vt");

  // The step's first key and first column (unsigned: the divisions are shifts).
  static FA_VT_HD constexpr uint32_t key0(uint32_t step) { return 16 * (step % kKeyGroups); }
  static FA_VT_HD constexpr uint32_t col0(uint32_t step) { return 32 * (step / kKeyGroups); }
  // The first key of pair u: the key at slot 2u (the second is the next key, at slot 2u + 1).
  static FA_VT_HD constexpr int pair_key(int u) { return kernel_key(2 * u); }
  // The V column that row j of stmatrix matrix m holds: registers 0 and 1 are pair_keys of
  // ldmatrix's matrices 0 and 1 (columns 0-1 and 2-3 of a lane's 4), registers 2 and 3 the same
  // 16 columns up.
  static FA_VT_HD constexpr int store_column(int m, int j) { return 16 * (m / 2) + 4 * (j / 2) + 2 * (m % 2) + j % 2; }

  // ldmatrix.x4: lane t gives row t % 8 of matrix t / 8, i.e.
  //     k_major_offset<128, kBlockN>(key0 + pair_key(t % 8) + m % 2, col0 + 16 (m / 2)), m = t / 8,
  // written so that the lane's share is loop-invariant: key0 is a multiple of 16, so the row's
  // swizzle bits are the lane's key's; col0 a multiple of 32, so the 16-byte chunk is col0's
  // XOR the lane's m / 2.
  static FA_VT_HD constexpr uint32_t load_offset(uint32_t step, uint32_t lane) {
    const uint32_t m = lane / 8, key = uint32_t(pair_key(int(lane % 8))) + m % 2;
    const uint32_t key0 = VtTransposeSteps::key0(step), col0 = VtTransposeSteps::col0(step);
    const uint32_t chunk = ((col0 % 128) / 16) ^ (m / 2) ^ (key % 8);
    return (col0 / 128) * (kBlockN * 128) + (key0 + key) * 128 + chunk * 16;
  }
  // stmatrix.x4.trans: lane t gives row t % 8 of matrix t / 8, Vt row (a column of V) at the
  // step's 16 slots: k_major_offset<kRowBytes, kHeadDim>(col0 + store_column(m, t % 8), key0),
  // the swizzle bits the lane's column's (col0 is a multiple of 32).
  static FA_VT_HD constexpr uint32_t store_offset(uint32_t step, uint32_t lane) {
    const uint32_t column = uint32_t(store_column(int(lane / 8), int(lane % 8)));
    const uint32_t swizzle = kVtRowBytes == 128 ? column % 8 : (column / 2) % 4;
    const uint32_t key0 = VtTransposeSteps::key0(step), col0 = VtTransposeSteps::col0(step);
    const uint32_t chunk = ((key0 % kVtRowBytes) / 16) ^ swizzle;
    return (key0 / kVtRowBytes) * (kHeadDim * kVtRowBytes) + (col0 + column) * kVtRowBytes + chunk * 16;
  }
};

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
