// Where the lanes of the fp8 decode pipeline read their MMA operands (D-83): index maps only,
// free of CuTe and of device code, so that the CPU tests run them against a model of
// mma.sync m16n8k16 (tests/cpu/test_fp8_operand_order.cpp). fp8_warp_kv.h issues the copies
// and reads; its header says why this order gives the right sums.
//
// Lane (g, t) = (lane / 4, lane % 4):
//   - K (the B operand of S = Q K^T, key g of an 8-key block): for 16-dim step s, the 4 bytes
//     from k_byte(t, s) of the key's row, the low two for dims (2t, 2t+1), the high two for
//     (2t+8, 2t+9). Q's A operand takes its fp16 values from the same columns.
//   - V (the B operand of O += P V, dim g of an 8-dim block j): byte v_byte(g, j) of the rows of
//     keys 2t, 2t+1 (its first register) and 2t+8, 2t+9 (its second) of a 16-key step.
//   - O: the accumulators' column c holds O's dim o_column(c).
// A stage holds a tile's e4m3 rows (kHeadDim bytes each) at stage_offset: row-major, the
// 16-byte pieces of each 128-byte line swapped by the line's index mod 8.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FA_OPERAND_HD __host__ __device__ __forceinline__
#else
#define FA_OPERAND_HD inline
#endif

namespace flashattn {
namespace cuda {
namespace fwd {

template <int kHeadDim>
struct Fp8OperandOrder {
  static_assert(kHeadDim % 32 == 0, "whole words per lane");
  static constexpr int kKBytes = kHeadDim / 4;  // a lane's bytes of a K row
  static constexpr int kVBytes = kHeadDim / 8;  // of a V row

  FA_OPERAND_HD static uint32_t stage_offset(int row, int byte) {
    const uint32_t linear = uint32_t(row * kHeadDim + byte);
    return linear ^ (((linear >> 7) & 7u) << 4);
  }
  FA_OPERAND_HD static int k_byte(int t, int s) { return t * kKBytes + 4 * s; }
  FA_OPERAND_HD static int v_byte(int g, int j) { return g * kVBytes + j; }
  FA_OPERAND_HD static constexpr int o_column(int c) { return (c % 8) * (kHeadDim / 8) + c / 8; }
};

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
