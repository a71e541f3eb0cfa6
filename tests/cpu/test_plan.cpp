// plan_kvcache unit tests, through the public API on the CPU (processors = options.num_threads):
// split-KV heuristic (FlashAttention-2's wave-efficiency rule, restated here), GQA packing,
// workspace size (DESIGN.md: splits x b x h x sq x (d + 1) fp32, plus the rotated q).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "flashattn/flashattn.h"

namespace {

using flashattn::DType;
using flashattn::Tensor;

// Rules restated from DESIGN.md / README.md (Semantics) / FlashAttention-2.
// Query rows per tile: 16 for decode (<= 16 rows per unit), 64 for short query blocks
// (<= 64 rows), else 128.
int tile_rows(int rows) { return rows <= 16 ? 16 : rows <= 64 ? 64 : 128; }
constexpr int kPackGqaMaxSeqlenQ = 64;       // GQA packing when sq <= this
constexpr double kFillFraction = 0.8;        // no split once 80% of the processors have work
constexpr double kEfficiencyFraction = 0.85; // fewest splits within 85% of the best efficiency
constexpr size_t kAlign = 256;

int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }
// Rows per K/V tile of the split walk: rules.h splitkv_block_n (docs/DECISIONS.md D-33), which
// follows the CUDA kernel tile (kBlockN). Update here if the kernel tile changes.
int block_n(int d) { return d <= 32 ? 128 : 64; }

int fa2_splits(int64_t work, int processors, int key_tiles) {
  if (key_tiles <= 1 || work >= kFillFraction * processors) return 1;
  const int max_splits = std::min({flashattn::kMaxSplits, processors, key_tiles});
  std::vector<double> eff(size_t(max_splits) + 1, 0.0);
  std::vector<bool> eligible(size_t(max_splits) + 1, false);
  double best = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    eligible[size_t(s)] = s == 1 || ceil_div(key_tiles, s) != ceil_div(key_tiles, s - 1);
    const double waves = double(work) * s / processors;
    eff[size_t(s)] = waves / std::ceil(waves);
    if (eligible[size_t(s)]) best = std::max(best, eff[size_t(s)]);
  }
  for (int s = 1; s <= max_splits; ++s) {
    if (eligible[size_t(s)] && eff[size_t(s)] >= kEfficiencyFraction * best) return s;
  }
  return 1;
}

// CPU decode (one query row per sequence, docs/DECISIONS.md D-72): the work items are (sequence,
// split) pairs, each over all KV heads, so the rule counts the sequences: the fewest splits whose
// items fill the threads' rounds to kEfficiencyFraction, else the best-filling count.
int cpu_decode_splits(int sequences, int threads, int key_tiles) {
  if (key_tiles <= 1) return 1;
  const int max_splits = std::min(flashattn::kMaxSplits, key_tiles);
  int best = 1;
  double best_eff = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    const double waves = double(sequences) * s / threads;
    const double eff = waves / std::ceil(waves);
    if (eff >= kEfficiencyFraction) return s;
    if (eff > best_eff) best = s, best_eff = eff;
  }
  return best;
}

struct Shape {
  int b = 1, sq = 1, h = 1, hk = 1, d = 64, capacity = 1024;
  int page_size = 0;  // > 0: paged, capacity / page_size pages per sequence
  int rotary_half = 0;
  DType dtype = DType::bf16;
};

// Host tensors over dummy storage: planning reads shapes and host index tensors only.
struct Problem {
  std::vector<uint16_t> dummy = std::vector<uint16_t>(16, 0);
  std::vector<int> seqlens, table;
  std::vector<uint16_t> rot;
  Tensor q, kc, vc;
  flashattn::KVCacheArgs args;
  flashattn::AttentionOptions opts;

  Problem(const Shape& s, int threads, int splits = 0) {
    q = Tensor::contiguous(dummy.data(), s.dtype, {s.b, s.sq, s.h, s.d});
    if (s.page_size > 0) {
      const int pages = s.capacity / s.page_size;
      kc = Tensor::contiguous(dummy.data(), s.dtype, {int64_t(s.b) * pages, s.page_size, s.hk, s.d});
      table.resize(size_t(s.b) * size_t(pages));
      for (size_t i = 0; i < table.size(); ++i) table[i] = int(i);
      args.block_table = Tensor::contiguous(table.data(), DType::i32, {s.b, pages});
    } else {
      kc = Tensor::contiguous(dummy.data(), s.dtype, {s.b, s.capacity, s.hk, s.d});
    }
    vc = kc;
    seqlens.assign(size_t(s.b), s.capacity / 2);
    args.cache_seqlens = Tensor::contiguous(seqlens.data(), DType::i32, {s.b});
    if (s.rotary_half > 0) {
      rot.resize(16);
      args.rotary_cos = Tensor::contiguous(rot.data(), s.dtype, {s.capacity, s.rotary_half});
      args.rotary_sin = args.rotary_cos;
    }
    args.num_splits = splits;
    opts.num_threads = threads;
  }
  flashattn::Plan plan() const { return flashattn::plan_kvcache(q, kc, vc, args, opts); }
};

size_t partials_bytes(const Shape& s, int splits) {
  return size_t(splits) * s.b * s.h * s.sq * (s.d + 1) * sizeof(float);
}
size_t rotated_q_bytes(const Shape& s) {
  return size_t(s.b) * s.sq * s.h * s.d * (s.dtype == DType::f32 ? 4 : 2);
}

TEST(Plan, RequestedSplitCountIsUsed) {
  Shape s;
  s.capacity = 4096;
  for (int n : {1, 2, 3, 17, flashattn::kMaxSplits}) {
    EXPECT_EQ(Problem(s, 4, n).plan().num_splits, n) << n;
  }
}

TEST(Plan, HeuristicFollowsWaveEfficiencyRule) {
  int checked = 0, split = 0;
  for (int b : {1, 2, 8}) {
    for (auto [h, hk] : std::vector<std::pair<int, int>>{{1, 1}, {8, 1}, {16, 16}, {32, 8}}) {
      for (int sq : {1, 4, 65, 128}) {
        for (int capacity : {64, 1000, 4097, 20000}) {
          for (int d : {64, 128, 256}) {
            for (int threads : {1, 2, 16, 132}) {
              Shape s;
              s.b = b, s.h = h, s.hk = hk, s.sq = sq, s.capacity = capacity, s.d = d;
              const bool pack = h > hk && sq <= kPackGqaMaxSeqlenQ;
              const int rows = pack ? sq * (h / hk) : sq;
              const int64_t work = int64_t(b) * (pack ? hk : h) * ceil_div(rows, tile_rows(rows));
              const int key_tiles = ceil_div(capacity, block_n(d));
              const int expected =
                  sq == 1 ? cpu_decode_splits(b, threads, key_tiles) : fa2_splits(work, threads, key_tiles);
              const flashattn::Plan p = Problem(s, threads).plan();
              ASSERT_EQ(p.num_splits, expected)
                  << "b " << b << " h " << h << " hk " << hk << " sq " << sq << " cap " << capacity
                  << " d " << d << " threads " << threads;
              ++checked;
              split += expected > 1;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(split, 10) << "the grid should exercise splitting";
  EXPECT_LT(split, checked);
}

TEST(Plan, HeuristicProperties) {
  Shape decode;  // one long sequence, one head: a single work tile
  decode.capacity = 32768;
  decode.d = 128;
  const int many = Problem(decode, 64).plan().num_splits;
  EXPECT_GT(many, 1) << "a lone decode on 64 threads should split";
  EXPECT_LE(many, 64);
  EXPECT_LE(many, ceil_div(decode.capacity, block_n(decode.d)));
  EXPECT_EQ(Problem(decode, 1).plan().num_splits, 1) << "one thread: nothing to fill";
  Shape busy = decode;  // enough work tiles for every thread
  busy.b = 64;
  EXPECT_EQ(Problem(busy, 64).plan().num_splits, 1);
  Shape short_cache = decode;  // a single key tile cannot be split
  short_cache.capacity = block_n(decode.d);
  EXPECT_EQ(Problem(short_cache, 64).plan().num_splits, 1);
}

TEST(Plan, HeuristicDependsOnShapesNotOnSeqlens) {
  Shape s;
  s.capacity = 8192;
  Problem a(s, 32), b(s, 32);
  for (int& x : b.seqlens) x = 1;
  EXPECT_EQ(a.plan().num_splits, b.plan().num_splits);
  EXPECT_EQ(a.plan().workspace_bytes, b.plan().workspace_bytes);
}

TEST(Plan, PagedCapacityPlansLikeContiguous) {
  for (int page : {1, 16, 256}) {
    Shape c;
    c.capacity = 4096;
    c.b = 2;
    Shape p = c;
    p.page_size = page;
    const flashattn::Plan pc = Problem(c, 48).plan(), pp = Problem(p, 48).plan();
    EXPECT_EQ(pc.num_splits, pp.num_splits) << page;
    EXPECT_EQ(pc.pack_gqa, pp.pack_gqa) << page;
    EXPECT_EQ(pc.workspace_bytes, pp.workspace_bytes) << page;
  }
}

TEST(Plan, PackGqaWhenHeadsShareKvAndFewQueries) {
  for (int sq : {1, 17, 64, 65, 200}) {
    for (auto [h, hk] : std::vector<std::pair<int, int>>{{8, 8}, {8, 2}, {7, 1}, {1, 1}}) {
      Shape s;
      s.sq = sq, s.h = h, s.hk = hk;
      EXPECT_EQ(Problem(s, 4).plan().pack_gqa, h > hk && sq <= kPackGqaMaxSeqlenQ)
          << "sq " << sq << " h " << h << " hk " << hk;
    }
  }
}

TEST(Plan, WorkspaceMatchesDocumentedSize) {
  Shape s;
  s.b = 3, s.sq = 5, s.h = 6, s.hk = 2, s.d = 96, s.capacity = 2048;
  EXPECT_EQ(Problem(s, 4, 1).plan().workspace_bytes, 0u) << "no split, no rotary: no scratch";
  for (int n : {2, 3, 7, 64}) {
    const size_t bytes = Problem(s, 4, n).plan().workspace_bytes;
    EXPECT_GE(bytes, partials_bytes(s, n)) << n;
    EXPECT_LT(bytes, partials_bytes(s, n) + 2 * kAlign) << n;  // o and lse partials, aligned
  }
  Shape r = s;  // rotary adds the rotated q, in q's dtype
  r.rotary_half = 16;
  for (int n : {1, 3}) {
    const size_t with = Problem(r, 4, n).plan().workspace_bytes;
    const size_t without = Problem(s, 4, n).plan().workspace_bytes;
    EXPECT_GE(with - without, rotated_q_bytes(r)) << n;
    EXPECT_LT(with - without, rotated_q_bytes(r) + kAlign) << n;
  }
}

TEST(Plan, WorkspaceGrowsWithSplitsBatchAndQueries) {
  Shape s;
  s.capacity = 4096;
  s.rotary_half = 8;
  size_t last = 0;
  for (int n = 1; n <= 12; ++n) {
    const size_t bytes = Problem(s, 4, n).plan().workspace_bytes;
    EXPECT_GE(bytes, last) << n;
    last = bytes;
  }
  for (int* dim : {&s.b, &s.sq}) {
    last = 0;
    for (int v : {1, 2, 5, 33}) {
      *dim = v;
      const size_t bytes = Problem(s, 4, 3).plan().workspace_bytes;
      EXPECT_GT(bytes, last) << v;
      last = bytes;
    }
    *dim = 1;
  }
}

TEST(Plan, EmptyProblemNeedsNoSplits) {
  Shape s;
  s.sq = 0;
  s.capacity = 4096;
  const flashattn::Plan p = Problem(s, 64, 0).plan();
  EXPECT_EQ(p.num_splits, 1);
  EXPECT_EQ(p.workspace_bytes, 0u);
}

}  // namespace
