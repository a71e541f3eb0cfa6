// The operand order of the fp8 decode pipeline (src/cuda/components/fp8_operand_order.h, D-83),
// run on the host: a warp's e4m3 K and V rows laid in a stage at stage_offset, each lane's operand
// registers read where the maps say, and a model of mma.sync.m16n8k16 (PTX ISA fragment layouts,
// lane (g, t) = (lane / 4, lane % 4): A holds (g, 2t..2t+1), (g+8, 2t..2t+1), (g, 2t+8..2t+9),
// (g+8, 2t+8..2t+9); B holds (k 2t..2t+1, n g), (k 2t+8..2t+9, n g); C holds (g, 2t), (g, 2t+1),
// (g+8, 2t), (g+8, 2t+1)). The sums must be those of S = Q K^T and O = P V, with O's accumulator
// column c at o_column(c); and the reads of d = 128 must meet no bank conflict.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <type_traits>
#include <vector>

#include "cuda/components/fp8_operand_order.h"

namespace {

using flashattn::cuda::fwd::Fp8OperandOrder;

constexpr int kLanes = 32;
constexpr int kRows = 16;  // the MMA's rows (query rows)
constexpr int kKeys = 16;  // a warp's keys of a tile at d = 128 (one 16-key step of P V)

// Small integers: every product and sum below is exact in float.
std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> value(-7, 7);
  std::vector<float> out(n);
  for (float& x : out) x = float(value(rng));
  return out;
}

// A (rows x d) row-major matrix of small integers laid as a stage's bytes (one int8 each).
template <int kHeadDim>
std::vector<int8_t> stage_of(const std::vector<float>& rows_by_d, int rows) {
  std::vector<int8_t> stage(size_t(rows) * kHeadDim, 0);
  for (int r = 0; r < rows; ++r) {
    for (int b = 0; b < kHeadDim; ++b) stage.at(Fp8OperandOrder<kHeadDim>::stage_offset(r, b)) = int8_t(rows_by_d[r * kHeadDim + b]);
  }
  return stage;
}

// A product's operands: the rows' left one (kRows x left_cols), the keys' right one
// (kKeys x kHeadDim) and its stage.
struct Operands {
  std::vector<float> left, right;
  std::vector<int8_t> stage;
};
template <int kHeadDim>
Operands random_operands(int left_cols, std::mt19937& rng) {
  Operands out{random_values(size_t(kRows) * left_cols, rng), random_values(size_t(kKeys) * kHeadDim, rng), {}};
  out.stage = stage_of<kHeadDim>(out.right, kKeys);
  return out;
}

// One m16n8k16 MMA from operands the lanes hold: a[lane][4][2] and b[lane][2][2] (register,
// half) assembled into A (16 x 16) and B (16 x 8) by the fragment layouts, each element once;
// d (16 x 8) += A B.
void mma_16x8x16(const float (&a)[kLanes][4][2], const float (&b)[kLanes][2][2], float (&d)[kRows][8]) {
  float A[kRows][16], B[16][8];
  int a_seen[kRows][16] = {}, b_seen[16][8] = {};
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int reg = 0; reg < 4; ++reg) {
      for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * (reg % 2), col = 2 * t + h + 8 * (reg / 2);
        A[row][col] = a[lane][reg][h];
        ++a_seen[row][col];
      }
    }
    for (int reg = 0; reg < 2; ++reg) {
      for (int h = 0; h < 2; ++h) {
        const int k = 2 * t + h + 8 * reg;
        B[k][g] = b[lane][reg][h];
        ++b_seen[k][g];
      }
    }
  }
  for (int i = 0; i < kRows; ++i) {
    for (int k = 0; k < 16; ++k) ASSERT_EQ(a_seen[i][k], 1);
  }
  for (int k = 0; k < 16; ++k) {
    for (int n = 0; n < 8; ++n) ASSERT_EQ(b_seen[k][n], 1);
  }
  for (int i = 0; i < kRows; ++i) {
    for (int n = 0; n < 8; ++n) {
      for (int k = 0; k < 16; ++k) d[i][n] += A[i][k] * B[k][n];
    }
  }
}

template <int kHeadDim>
void check_stage_layout() {
  using Order = Fp8OperandOrder<kHeadDim>;
  constexpr int kTileRows = 64;
  std::set<uint32_t> offsets;
  for (int r = 0; r < kTileRows; ++r) {
    for (int b = 0; b < kHeadDim; ++b) {
      const uint32_t off = Order::stage_offset(r, b);
      EXPECT_LT(off, uint32_t(kTileRows * kHeadDim));
      offsets.insert(off);
      // a 16-byte piece stays whole (one cp.async writes it)
      EXPECT_EQ(off, Order::stage_offset(r, b / 16 * 16) + uint32_t(b % 16));
    }
  }
  EXPECT_EQ(offsets.size(), size_t(kTileRows * kHeadDim)) << "d = " << kHeadDim;
  // fp8_warp_kv.h copy_tile: lane l's copy i (row l / pieces + i * 32 / pieces, piece l % pieces)
  // lies 512 i bytes past its copy 0, bit 6 flipped where i is odd.
  constexpr int kPieces = kHeadDim / 16, kRowStep = 32 / kPieces;
  for (int lane = 0; lane < kLanes; ++lane) {
    const int row0 = lane / kPieces, col = 16 * (lane % kPieces);
    const uint32_t first = Order::stage_offset(row0, col);
    for (int i = 0; row0 + i * kRowStep < kTileRows; ++i) {
      EXPECT_EQ(Order::stage_offset(row0 + i * kRowStep, col), (i % 2 ? first ^ 64u : first) + uint32_t(512 * i))
          << "d = " << kHeadDim << ", lane " << lane << ", copy " << i;
    }
  }
}

// S = Q K^T over a warp's 16 keys: lane (g, t) of 8-key block j reads key 8j + g's 4 bytes at
// k_byte(t, s) for step s; Q's values come from the same columns.
template <int kHeadDim>
void check_scores(std::mt19937& rng) {
  using Order = Fp8OperandOrder<kHeadDim>;
  const auto [q, k, stage] = random_operands<kHeadDim>(kHeadDim, rng);
  for (int j = 0; j < kKeys / 8; ++j) {
    float d[kRows][8] = {};
    for (int s = 0; s < kHeadDim / 16; ++s) {
      float a[kLanes][4][2], b[kLanes][2][2];
      for (int lane = 0; lane < kLanes; ++lane) {
        const int g = lane / 4, t = lane % 4, col = Order::k_byte(t, s);
        for (int reg = 0; reg < 4; ++reg) {  // rows g, g+8; the word's low pair, then its high pair
          for (int h = 0; h < 2; ++h) a[lane][reg][h] = q[(g + 8 * (reg % 2)) * kHeadDim + col + 2 * (reg / 2) + h];
        }
        for (int reg = 0; reg < 2; ++reg) {
          for (int h = 0; h < 2; ++h) b[lane][reg][h] = stage.at(Order::stage_offset(8 * j + g, col + 2 * reg + h));
        }
      }
      mma_16x8x16(a, b, d);
    }
    for (int i = 0; i < kRows; ++i) {
      for (int n = 0; n < 8; ++n) {
        float want = 0.0f;
        for (int c = 0; c < kHeadDim; ++c) want += q[i * kHeadDim + c] * k[(8 * j + n) * kHeadDim + c];
        EXPECT_EQ(d[i][n], want) << "d = " << kHeadDim << ", row " << i << ", key " << 8 * j + n;
      }
    }
  }
}

// O = P V over a warp's 16 keys: lane (g, t) of 8-dim block j reads byte v_byte(g, j) of the
// rows of keys 2t, 2t+1 (its first register) and 2t+8, 2t+9; the accumulator column c of block
// j / 8 holds O's dim o_column(c).
template <int kHeadDim>
void check_output(std::mt19937& rng) {
  using Order = Fp8OperandOrder<kHeadDim>;
  const auto [p, v, stage] = random_operands<kHeadDim>(kKeys, rng);
  std::vector<float> o(size_t(kRows) * kHeadDim, 0.0f);
  std::vector<int> written(size_t(kRows) * kHeadDim, 0);
  for (int j = 0; j < kHeadDim / 8; ++j) {
    float d[kRows][8] = {};
    float a[kLanes][4][2], b[kLanes][2][2];
    for (int lane = 0; lane < kLanes; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int reg = 0; reg < 4; ++reg) {
        for (int h = 0; h < 2; ++h) a[lane][reg][h] = p[(g + 8 * (reg % 2)) * kKeys + 2 * t + h + 8 * (reg / 2)];
      }
      for (int reg = 0; reg < 2; ++reg) {
        for (int h = 0; h < 2; ++h) b[lane][reg][h] = stage.at(Order::stage_offset(2 * t + h + 8 * reg, Order::v_byte(g, j)));
      }
    }
    mma_16x8x16(a, b, d);
    for (int i = 0; i < kRows; ++i) {
      for (int n = 0; n < 8; ++n) {
        const int dim = Order::o_column(8 * j + n);
        o[i * kHeadDim + dim] = d[i][n];
        ++written[i * kHeadDim + dim];
      }
    }
  }
  for (int i = 0; i < kRows; ++i) {
    for (int dim = 0; dim < kHeadDim; ++dim) {
      ASSERT_EQ(written[i * kHeadDim + dim], 1) << "d = " << kHeadDim << ", dim " << dim;
      float want = 0.0f;
      for (int key = 0; key < kKeys; ++key) want += p[i * kKeys + key] * v[key * kHeadDim + dim];
      EXPECT_EQ(o[i * kHeadDim + dim], want) << "d = " << kHeadDim << ", row " << i << ", dim " << dim;
    }
  }
}

// The 16-byte reads of one instruction, lane by lane (stage offsets): each quarter warp's eight
// must cover all 32 banks once.
void expect_no_bank_conflict(const uint32_t (&offset)[kLanes], const char* what) {
  for (int quarter = 0; quarter < 4; ++quarter) {
    std::set<uint32_t> banks;
    for (int lane = 8 * quarter; lane < 8 * quarter + 8; ++lane) {
      for (uint32_t word = 0; word < 4; ++word) banks.insert((offset[lane] / 4 + word) % 32);
    }
    EXPECT_EQ(banks.size(), 32u) << what << ", quarter warp " << quarter;
  }
}

// Every head dim the pipeline serves (tuning.h fp8_warp_kv_head_dim).
template <class Check>
void for_each_head_dim(Check check) {
  check(std::integral_constant<int, 32>{});
  check(std::integral_constant<int, 64>{});
  check(std::integral_constant<int, 128>{});
  check(std::integral_constant<int, 256>{});
}

TEST(Fp8OperandOrder, StagePiecesStayWholeAndEveryByteHasItsPlace) {
  for_each_head_dim([](auto d) { check_stage_layout<decltype(d)::value>(); });
}

TEST(Fp8OperandOrder, ScoresAreQTimesKTransposed) {
  std::mt19937 rng(83);
  for_each_head_dim([&](auto d) { check_scores<decltype(d)::value>(rng); });
}

TEST(Fp8OperandOrder, OutputIsPTimesVAtTheMergedColumns) {
  std::mt19937 rng(84);
  for_each_head_dim([&](auto d) { check_output<decltype(d)::value>(rng); });
}

// fp8_warp_kv.h reads d = 128's operands as 16-byte pieces: K's piece h of key 8j + g from
// k_byte(t, 4h), V's piece of each of the rows 2t, 2t+1, 2t+8, 2t+9 from v_byte(g, 0).
TEST(Fp8OperandOrder, ReadsAtHeadDim128MeetNoBankConflict) {
  using Order = Fp8OperandOrder<128>;
  uint32_t offset[kLanes];
  for (int j = 0; j < 2; ++j) {
    for (int h = 0; h < 2; ++h) {
      for (int lane = 0; lane < kLanes; ++lane) offset[lane] = Order::stage_offset(8 * j + lane / 4, Order::k_byte(lane % 4, 4 * h));
      expect_no_bank_conflict(offset, "K");
    }
  }
  for (int r = 0; r < 4; ++r) {
    for (int lane = 0; lane < kLanes; ++lane) {
      offset[lane] = Order::stage_offset(2 * (lane % 4) + r % 2 + 8 * (r / 2), Order::v_byte(lane / 4, 0));
    }
    expect_no_bank_conflict(offset, "V");
  }
}

}  // namespace
