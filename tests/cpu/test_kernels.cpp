// The CPU tile kernels' one exact operation, fp32 -> bf16 output rounding, agrees bit for bit
// between the portable set and the AVX-512 set (where the CPU has it), on random values, ties,
// denormals, infinities and NaN, for lengths that end inside a vector.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/kernels.h"

namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

TEST(CpuKernels, Bf16RoundingMatchesPortable) {
  const flashattn::cpu::TileKernels* fast = flashattn::cpu::avx512_kernels();
  if (fast == nullptr) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::vector<float> src;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int i = 0; i < 1000; ++i) src.push_back(normal(gen));
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x7f800000u,
                        0xff800000u, 0x7fc00001u, 0x7f800001u, 0xffffffffu, 0x00000000u, 0x80000000u}) {
    src.push_back(from_bits(bits));
  }
  for (int n : {int(src.size()), 1, 15, 17, 31}) {
    for (float scale : {1.0f, 0.37f}) {
      std::vector<uint16_t> want(n), got(n, 0xdead);
      flashattn::cpu::portable_kernels().scaled_to_bf16(src.data(), n, scale, want.data());
      fast->scaled_to_bf16(src.data(), n, scale, got.data());
      for (int c = 0; c < n; ++c) {
        ASSERT_EQ(got[c], want[c]) << "n=" << n << " scale=" << scale << " c=" << c << " x=" << src[c];
      }
    }
  }
}

}  // namespace
