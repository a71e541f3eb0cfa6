// Probe: the AVX2 decode kernels per block of 16 keys x 4 heads, alone (stages left out) or in an emulated walk with prefetch variants.
//
// Compiles src/cpu/kernels_avx2.cpp in (its decode set is internal to the library):
//
//   g++ -O2 -std=c++17 -Isrc -Iinclude bench/probes/cpu_decode_kernels.cpp src/cpu/kernels_avx2.cpp -o /tmp/dk
//   /tmp/dk stages 1 15      # K/V cycled over 1 MB (hot in L2); stages: 1 scores, 2 max, 4 exp2, 8 P.V
//   /tmp/dk walk 512 1       # a (s, 8, 128) bf16 cache of 512 MB, prefetch variant 0-3 (below)
//
// Build it once from each version of kernels_avx2.cpp and run the binaries in turns. Prints the
// best ns per block (16 keys of one KV head: 8 KB of K and V) and the GB/s it makes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels.h"

using namespace flashattn;
using namespace flashattn::cpu;

namespace {

constexpr int kD = 128, kGroup = 4, kKvHeads = 8;
constexpr size_t kRow = kD * 2, kKeyBytes = kKvHeads * kRow;

// Prefetch variants of the walk, for the rows of block step `step` (block step / 8, KV head step % 8):
//   0 none; 1 D-72's: the next block's rows of the current KV head, PREFETCHT1 (8 steps ahead);
//   2 the same, PREFETCHT0; 3 D-85's: the next step's rows, PREFETCHT0.
// Always inlined: g++ drops calls of a function whose only effects are prefetches (D-72).
[[gnu::always_inline]] inline void prefetch(const char* k, const char* v, size_t step, int hint) {
  const size_t j0 = step / kKvHeads * 16, h = step % kKvHeads;
  for (int j = 0; j < 16; ++j) {
    for (size_t b = 0; b < kRow; b += 64) {
      const size_t at = (j0 + j) * kKeyBytes + h * kRow + b;
      if (hint == 3) {
        __builtin_prefetch(k + at, 0, 3), __builtin_prefetch(v + at, 0, 3);
      } else {
        __builtin_prefetch(k + at, 0, 2), __builtin_prefetch(v + at, 0, 2);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "stages";
  const size_t mb = argc > 2 ? std::atoi(argv[2]) : 1;
  const int arg = argc > 3 ? std::atoi(argv[3]) : (mode == "walk" ? 3 : 15);
  const int reps = argc > 4 ? std::atoi(argv[4]) : (mode == "walk" ? 5 : 300);
  const DecodeKernels* dk = avx2_decode_kernels(DType::bf16, kD);
  if (dk == nullptr) return std::puts("no AVX2 decode set here"), 1;
  const size_t keys = mb * (1 << 20) / 2 / kKeyBytes;
  std::vector<uint16_t> k(keys * kKvHeads * kD), v(k.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  auto bf16 = [](float x) { uint32_t b; std::memcpy(&b, &x, 4); return uint16_t(b >> 16); };
  for (size_t i = 0; i < k.size(); ++i) k[i] = bf16(normal(rng)), v[i] = bf16(normal(rng));
  std::vector<float> q(kGroup * kD), s(kGroup * kDecodeKeys), o(kGroup * kD), mx(kGroup), offset(kGroup, 0.0f),
      sum(kGroup), factor(kGroup, 1.0f);
  for (auto& e : q) e = normal(rng) * 0.1f;
  const char* K = reinterpret_cast<const char*>(k.data());
  const char* V = reinterpret_cast<const char*>(v.data());
  const int stages = mode == "walk" ? 15 : arg;
  const size_t steps = keys / 16 * kKvHeads;
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    std::fill(o.begin(), o.end(), 0.0f);
    const auto start = std::chrono::steady_clock::now();
    for (size_t step = 0; step < steps; ++step) {
      if (mode == "walk" && arg == 3 && step + 1 < steps) prefetch(K, V, step + 1, 3);
      if (mode == "walk" && (arg == 1 || arg == 2) && step + kKvHeads < steps) prefetch(K, V, step + kKvHeads, arg);
      const size_t j0 = step / kKvHeads * 16, h = step % kKvHeads;
      const void* kr[16];
      const void* vr[16];
      for (int j = 0; j < 16; ++j) kr[j] = K + (j0 + j) * kKeyBytes + h * kRow, vr[j] = V + (j0 + j) * kKeyBytes + h * kRow;
      if (stages & 1) dk->scores(q.data(), kGroup, kD, kr, 16, s.data());
      if (stages & 2) dk->row_max(s.data(), kGroup, 16, mx.data());
      if (stages & 4) dk->exp2_sum(s.data(), kGroup, 16, 0.1f, offset.data(), sum.data());
      if (stages & 8) dk->pv(s.data(), kGroup, vr, 16, kD, factor.data(), o.data());
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, ns / double(steps));
  }
  std::printf("%s %zu MB %d: %.1f ns a block (%.2f GB/s)\n", mode.c_str(), mb, arg, best, 2 * 16 * kRow / best);
}
