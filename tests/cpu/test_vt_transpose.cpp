// The V transpose of the FP8 products (src/cuda/components/vt_transpose.h, D-75), run on the
// host: the lanes' row addresses and byte permutes of every warp step, through a model of
// ldmatrix.x4 and stmatrix.x4.trans (PTX ISA: lane t holds row t / 4, 16-bit columns 2 (t % 4)
// and 2 (t % 4) + 1 of each 8 x 8 matrix; lanes 8m..8m+7 give the row addresses of matrix m).
// Every Vt byte of a tile must be written once, with V's byte at (key, column) where Vt's row is
// the column and its slot holds the key that kernel_key names.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/components/vt_transpose.h"

namespace {

using flashattn::cuda::fwd::k_major_offset;
using flashattn::cuda::fwd::kernel_key;
using flashattn::cuda::fwd::pair_keys;
using flashattn::cuda::fwd::VtTransposeSteps;

constexpr int kLanes = 32;

// ldmatrix.x4: lane t receives, from each matrix m, the 4 bytes at 4 (t % 4) of row t / 4.
void load_matrices_x4(const std::vector<uint8_t>& smem, const int (&addr)[kLanes], uint32_t (&regs)[kLanes][4]) {
  for (int t = 0; t < kLanes; ++t) {
    for (int m = 0; m < 4; ++m) std::memcpy(&regs[t][m], &smem[addr[8 * m + t / 4] + 4 * (t % 4)], 4);
  }
}

// stmatrix.x4.trans: the 16-bit element lane t holds at (row t / 4, column 2 (t % 4) + half) of
// matrix m goes to element t / 4 of the row whose address lane 8m + 2 (t % 4) + half gives.
void store_matrices_x4_transposed(std::vector<uint8_t>& smem, std::vector<int>& writes, const int (&addr)[kLanes],
                                  const uint32_t (&regs)[kLanes][4]) {
  for (int t = 0; t < kLanes; ++t) {
    for (int m = 0; m < 4; ++m) {
      for (int half = 0; half < 2; ++half) {
        const int at = addr[8 * m + 2 * (t % 4) + half] + 2 * (t / 4);
        const uint16_t element = uint16_t(regs[t][m] >> (16 * half));
        std::memcpy(&smem[at], &element, 2);
        ++writes[at];
        ++writes[at + 1];
      }
    }
  }
}

// V filled with byte(key, column); the transposed tile checked against it.
template <int kBlockN, int kHeadDim>
void check_transpose(uint8_t (*byte)(int key, int col)) {
  using Steps = VtTransposeSteps<kBlockN, kHeadDim>;
  std::vector<uint8_t> v(kBlockN * kHeadDim), vt(kBlockN * kHeadDim, 0);
  std::vector<int> writes(vt.size(), 0);
  for (int key = 0; key < kBlockN; ++key) {
    for (int col = 0; col < kHeadDim; ++col) v[k_major_offset<128, kBlockN>(key, col)] = byte(key, col);
  }
  for (int step = 0; step < Steps::kSteps; ++step) {
    int load_addr[kLanes], store_addr[kLanes];
    for (int lane = 0; lane < kLanes; ++lane) {
      load_addr[lane] = int(Steps::load_offset(step, lane));
      store_addr[lane] = int(Steps::store_offset(step, lane));
      const int m = lane / 8;  // the addresses as the layouts' offsets of the rows they name
      ASSERT_EQ(load_addr[lane], (k_major_offset<128, kBlockN>(Steps::key0(step) + Steps::pair_key(lane % 8) + m % 2,
                                                                 Steps::col0(step) + 16 * (m / 2))));
      ASSERT_EQ(store_addr[lane], (k_major_offset<Steps::kVtRowBytes, kHeadDim>(
                                      Steps::col0(step) + Steps::store_column(m, lane % 8), Steps::key0(step))));
      ASSERT_EQ(load_addr[lane] % 16, 0) << "ldmatrix rows are 16-byte aligned";
      ASSERT_EQ(store_addr[lane] % 16, 0) << "stmatrix rows are 16-byte aligned";
    }
    uint32_t keys[kLanes][4], pairs[kLanes][4];
    load_matrices_x4(v, load_addr, keys);
    for (int lane = 0; lane < kLanes; ++lane) {
      pair_keys(keys[lane][0], keys[lane][1], pairs[lane][0], pairs[lane][1]);
      pair_keys(keys[lane][2], keys[lane][3], pairs[lane][2], pairs[lane][3]);
    }
    store_matrices_x4_transposed(vt, writes, store_addr, pairs);
  }
  for (int d = 0; d < kHeadDim; ++d) {
    for (int slot = 0; slot < kBlockN; ++slot) {
      const int at = k_major_offset<Steps::kVtRowBytes, kHeadDim>(d, slot);
      const int key = 32 * (slot / 32) + kernel_key(slot % 32);
      ASSERT_EQ(writes[at], 1) << "Vt row " << d << " slot " << slot;
      ASSERT_EQ(vt[at], byte(key, d)) << "Vt row " << d << " slot " << slot << " (key " << key << ")";
    }
  }
}

uint8_t key_byte(int key, int) { return uint8_t(key); }
uint8_t column_byte(int, int col) { return uint8_t(col); }
uint8_t mixed_byte(int key, int col) { return uint8_t(key * 7 + col * 13 + 1); }

TEST(VtTranspose, KernelKeyIsAPermutationOfEachChunkInAdjacentPairs) {
  std::vector<int> seen(32, 0);
  for (int kk = 0; kk < 32; ++kk) {
    ++seen[kernel_key(kk)];
    if (kk % 2 == 1) EXPECT_EQ(kernel_key(kk), kernel_key(kk - 1) + 1);
  }
  for (int key = 0; key < 32; ++key) EXPECT_EQ(seen[key], 1) << key;
}

TEST(VtTranspose, TileOf128KeysAtHeadDim128) {
  check_transpose<128, 128>(key_byte);
  check_transpose<128, 128>(column_byte);
  check_transpose<128, 128>(mixed_byte);
}

TEST(VtTranspose, TileOf64KeysAtHeadDim256) {
  check_transpose<64, 256>(key_byte);
  check_transpose<64, 256>(column_byte);
  check_transpose<64, 256>(mixed_byte);
}

}  // namespace
