// Reliability on the CPU (issue 31): what validation must accept as well as refuse.
//   - the memory-overlap test behind "an output must not share memory" (src/api/overlap.h):
//     exact on the layouts met in practice;
//   - layouts and values that are legal and must keep working: an output interleaved with an
//     input in one buffer, K and V caches interleaved in one buffer (with appends), a
//     block_table padded with -1 past the pages in use, duplicate cache_batch_idx without
//     appends, window sizes far beyond the sequence (unbounded);
//   - a worker thread that cannot be started is a flashattn::Error (runtime), not an abort.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "api/overlap.h"
#include "test_util.h"

namespace fa_test {
namespace {

using flashattn::views_overlap;
using flashattn::view_overlaps_itself;

// ---- overlap.h ----------------------------------------------------------------------------

std::vector<uint16_t> g_buffer(1 << 16);

Tensor view(int64_t offset, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides,
            DType dtype = DType::f16) {
  return Tensor::strided(g_buffer.data() + offset, dtype, shape, strides);
}

TEST(Overlap, SameViewOverlaps) {
  const Tensor a = view(0, {2, 3, 4, 16}, {192, 64, 16, 1});
  EXPECT_TRUE(views_overlap(a, a));
  EXPECT_FALSE(view_overlaps_itself(a));
}

TEST(Overlap, DisjointRangesDoNot) {
  const Tensor a = view(0, {2, 3, 4, 16}, {192, 64, 16, 1});
  const Tensor b = view(384, {2, 3, 4, 16}, {192, 64, 16, 1});
  EXPECT_FALSE(views_overlap(a, b));
  EXPECT_TRUE(views_overlap(a, view(383, {1}, {1})));  // the last element of a
}

TEST(Overlap, InterleavedSlicesOfOneBufferDoNot) {
  // kv (b=2, s=8, 2, h=4, d=16): k = kv[:, :, 0], v = kv[:, :, 1]
  const Tensor k = view(0, {2, 8, 4, 16}, {1024, 128, 16, 1});
  const Tensor v = view(64, {2, 8, 4, 16}, {1024, 128, 16, 1});
  EXPECT_FALSE(views_overlap(k, v));
  // qkv (s=5, 3, h=2, d=8) packed the other way round: q = qkv[:, 0], k = qkv[:, 1]
  EXPECT_FALSE(views_overlap(view(0, {5, 2, 8}, {48, 8, 1}), view(16, {5, 2, 8}, {48, 8, 1})));
  // head dim split in halves: bytes interleave row by row, never meet
  EXPECT_FALSE(views_overlap(view(0, {8, 4, 8}, {64, 16, 1}), view(8, {8, 4, 8}, {64, 16, 1})));
  // shifted by less than a row: the halves meet
  EXPECT_TRUE(views_overlap(view(0, {8, 4, 8}, {64, 16, 1}), view(7, {8, 4, 8}, {64, 16, 1})));
}

TEST(Overlap, TransposedViewOfTheSameElementsOverlaps) {
  const Tensor bshd = view(0, {2, 5, 4, 16}, {320, 64, 16, 1});
  const Tensor bhsd_as_bshd = view(0, {2, 5, 4, 16}, {320, 16, 80, 1});
  EXPECT_TRUE(views_overlap(bshd, bhsd_as_bshd));
}

TEST(Overlap, NegativeStridesCountFromTheLowestElement) {
  // rows in reverse order, ending at the buffer's start: elements 0 .. 63
  const Tensor reversed = Tensor::strided(g_buffer.data() + 48, DType::f16, {4, 16}, {-16, 1});
  EXPECT_TRUE(views_overlap(reversed, view(0, {1}, {1})));
  EXPECT_FALSE(views_overlap(reversed, view(64, {4, 16}, {16, 1})));
  EXPECT_FALSE(view_overlaps_itself(reversed));
}

TEST(Overlap, BytesOfDifferentElementSizes) {
  // an fp32 view's element at byte 0-3 meets an fp16 element at bytes 2-3
  EXPECT_TRUE(views_overlap(view(0, {1}, {1}, DType::f32), view(1, {1}, {1})));
  EXPECT_FALSE(views_overlap(view(0, {1}, {1}, DType::f32), view(2, {1}, {1})));
}

TEST(Overlap, ItselfWhenStridesRepeatElements) {
  EXPECT_TRUE(view_overlaps_itself(view(0, {4, 16}, {0, 1})));    // broadcast rows
  EXPECT_TRUE(view_overlaps_itself(view(0, {4, 16}, {8, 1})));    // rows overlap by half
  EXPECT_TRUE(view_overlaps_itself(view(0, {3, 3, 2}, {4, 4, 1})));  // two dims, one stride
  EXPECT_FALSE(view_overlaps_itself(view(0, {4, 3, 2}, {6, 2, 1})));
  EXPECT_FALSE(view_overlaps_itself(view(0, {4, 16}, {16, 1})));
  EXPECT_FALSE(view_overlaps_itself(view(0, {1, 16}, {0, 1})));  // size 1: the stride is unused
}

TEST(Overlap, EmptyViewsNeverOverlap) {
  const Tensor a = view(0, {2, 0, 4, 16}, {128, 64, 16, 1});
  EXPECT_FALSE(views_overlap(a, view(0, {4}, {1})));
  EXPECT_FALSE(view_overlaps_itself(a));
}

TEST(Overlap, IrregularStridesAreDecidedExactly) {
  // elements at 7a + 5b (a, b < 1000): every offset from 24 on, and 0, 5, 7, 10, 12, ... below
  const Tensor c = view(0, {1000, 1000}, {7, 5});
  for (int offset : {0, 5, 7, 12, 14, 22, 24, 25, 26, 27, 28, 29, 30, 1000}) {
    EXPECT_TRUE(views_overlap(c, view(offset, {1}, {1}))) << offset;
  }
  for (int offset : {1, 2, 3, 4, 6, 8, 9, 11, 13, 16, 18, 23}) {
    EXPECT_FALSE(views_overlap(c, view(offset, {1}, {1}))) << offset;
  }
  EXPECT_TRUE(view_overlaps_itself(c));  // 7 x 5 = 5 x 7
}

// ---- legal inputs that must keep working ----------------------------------------------------

constexpr int kB = 2, kSq = 5, kSk = 23, kH = 4, kHk = 2, kD = 32;

std::vector<uint16_t> random_f16(int64_t n, uint64_t seed) {
  std::vector<uint16_t> bits;
  for (double x : random_normal(n, seed, DType::f16)) bits.push_back(f16_bits(x));
  return bits;
}

Tensor f16(void* data, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(data, DType::f16, shape);
}

// out (b, sq, h, d) of a dense call, with the given window and causal flag.
std::vector<uint16_t> dense_out(int left, int right, bool causal) {
  std::vector<uint16_t> q = random_f16(kB * kSq * kH * kD, 1), k = random_f16(kB * kSk * kHk * kD, 2),
                        v = random_f16(kB * kSk * kHk * kD, 3), out(q.size(), 0x7e00);
  flashattn::AttentionOptions o;
  o.window_left = left;
  o.window_right = right;
  o.causal = causal;
  o.num_threads = 2;
  flashattn::forward(f16(q.data(), {kB, kSq, kH, kD}), f16(k.data(), {kB, kSk, kHk, kD}),
                     f16(v.data(), {kB, kSk, kHk, kD}), f16(out.data(), {kB, kSq, kH, kD}), o);
  return out;
}

TEST(Reliability, WindowBeyondTheKeysIsUnbounded) {
  const int huge = INT_MAX;
  EXPECT_EQ(dense_out(huge, huge, false), dense_out(-1, -1, false));
  EXPECT_EQ(dense_out(huge, 0, false), dense_out(-1, -1, true));
  EXPECT_EQ(dense_out(huge, huge, true), dense_out(-1, -1, true));
  EXPECT_EQ(dense_out(kSk, kSq, false), dense_out(-1, -1, false));
  EXPECT_NE(dense_out(3, 1, false), dense_out(-1, -1, false));  // a real window does change it
}

TEST(Reliability, OutputInterleavedWithQInOneBufferIsAccepted) {
  // one buffer (b, sq, 2, h, d): q = [:, :, 0], out = [:, :, 1]
  std::vector<uint16_t> packed = random_f16(kB * kSq * 2 * kH * kD, 1);
  std::vector<uint16_t> q_alone(kB * kSq * kH * kD), out_alone(q_alone.size());
  for (int64_t r = 0; r < kB * kSq; ++r) {
    std::copy_n(packed.begin() + r * 2 * kH * kD, kH * kD, q_alone.begin() + r * kH * kD);
  }
  std::vector<uint16_t> k = random_f16(kB * kSk * kHk * kD, 2), v = random_f16(k.size(), 3);
  const Tensor tk = f16(k.data(), {kB, kSk, kHk, kD}), tv = f16(v.data(), {kB, kSk, kHk, kD});
  const std::initializer_list<int64_t> packed_strides = {kSq * 2 * kH * kD, 2 * kH * kD, kD, 1};
  const Tensor q = Tensor::strided(packed.data(), DType::f16, {kB, kSq, kH, kD}, packed_strides);
  const Tensor out = Tensor::strided(packed.data() + kH * kD, DType::f16, {kB, kSq, kH, kD}, packed_strides);
  ASSERT_NO_THROW(flashattn::forward(q, tk, tv, out));
  flashattn::forward(f16(q_alone.data(), {kB, kSq, kH, kD}), tk, tv, f16(out_alone.data(), {kB, kSq, kH, kD}));
  for (int64_t r = 0; r < kB * kSq; ++r) {
    for (int c = 0; c < kH * kD; ++c) {
      ASSERT_EQ(packed[r * 2 * kH * kD + kH * kD + c], out_alone[r * kH * kD + c]) << "row " << r;
      ASSERT_EQ(packed[r * 2 * kH * kD + c], q_alone[r * kH * kD + c]) << "q was written";
    }
  }
}

// A kv-cache decode step: q (2, 1, 4, 32), caches of 2 rows x 16 positions, one appended token.
struct DecodeStep {
  std::vector<uint16_t> q = random_f16(kB * 1 * kH * kD, 11);
  std::vector<uint16_t> k_new = random_f16(kB * kHk * kD, 12), v_new = random_f16(kB * kHk * kD, 13);
  std::vector<int> seqlens = {7, 12};
  std::vector<uint16_t> out = std::vector<uint16_t>(q.size(), 0x7e00);
  flashattn::KVCacheArgs args() {
    flashattn::KVCacheArgs a;
    a.cache_seqlens = Tensor::contiguous(seqlens.data(), DType::i32, {kB});
    a.k_new = f16(k_new.data(), {kB, 1, kHk, kD});
    a.v_new = f16(v_new.data(), {kB, 1, kHk, kD});
    return a;
  }
  void run(const Tensor& k_cache, const Tensor& v_cache, const flashattn::KVCacheArgs& a) {
    flashattn::forward_kvcache(f16(q.data(), {kB, 1, kH, kD}), k_cache, v_cache,
                               f16(out.data(), {kB, 1, kH, kD}), a);
  }
};

constexpr int kCap = 16;

TEST(Reliability, KAndVCachesInterleavedInOneBufferAcceptAppends) {
  // kv (b, cap, 2, hk, d): k_cache = [:, :, 0], v_cache = [:, :, 1]
  std::vector<uint16_t> kv = random_f16(kB * kCap * 2 * kHk * kD, 5);
  std::vector<uint16_t> k_alone(kB * kCap * kHk * kD), v_alone(k_alone.size());
  for (int64_t r = 0; r < kB * kCap; ++r) {
    std::copy_n(kv.begin() + r * 2 * kHk * kD, kHk * kD, k_alone.begin() + r * kHk * kD);
    std::copy_n(kv.begin() + r * 2 * kHk * kD + kHk * kD, kHk * kD, v_alone.begin() + r * kHk * kD);
  }
  const std::initializer_list<int64_t> strides = {kCap * 2 * kHk * kD, 2 * kHk * kD, kD, 1};
  DecodeStep packed, alone;
  ASSERT_NO_THROW(packed.run(Tensor::strided(kv.data(), DType::f16, {kB, kCap, kHk, kD}, strides),
                             Tensor::strided(kv.data() + kHk * kD, DType::f16, {kB, kCap, kHk, kD}, strides),
                             packed.args()));
  alone.run(f16(k_alone.data(), {kB, kCap, kHk, kD}), f16(v_alone.data(), {kB, kCap, kHk, kD}), alone.args());
  EXPECT_EQ(packed.out, alone.out);
  for (int64_t r = 0; r < kB * kCap; ++r) {
    for (int c = 0; c < kHk * kD; ++c) {
      ASSERT_EQ(kv[r * 2 * kHk * kD + c], k_alone[r * kHk * kD + c]) << "k row " << r;
      ASSERT_EQ(kv[r * 2 * kHk * kD + kHk * kD + c], v_alone[r * kHk * kD + c]) << "v row " << r;
    }
  }
}

TEST(Reliability, BlockTablePaddedWithMinusOneIsAccepted) {
  // pages of 4 rows; sequence 0 holds 7 + 1 keys (2 pages), sequence 1 12 + 1 (4 pages)
  constexpr int kPage = 4, kPages = 8, kColumns = 6;
  std::vector<uint16_t> kc = random_f16(kPages * kPage * kHk * kD, 5), vc = random_f16(kc.size(), 6);
  std::vector<uint16_t> kc2 = kc, vc2 = vc;
  std::vector<int> padded = {5, 2, -1, -1, -1, -1, 0, 7, 3, 1, -1, -1};
  std::vector<int> filled = {5, 2, 4, 6, 4, 6, 0, 7, 3, 1, 4, 6};
  DecodeStep a, b;
  flashattn::KVCacheArgs args_a = a.args(), args_b = b.args();
  args_a.block_table = Tensor::contiguous(padded.data(), DType::i32, {kB, kColumns});
  args_b.block_table = Tensor::contiguous(filled.data(), DType::i32, {kB, kColumns});
  ASSERT_NO_THROW(a.run(f16(kc.data(), {kPages, kPage, kHk, kD}), f16(vc.data(), {kPages, kPage, kHk, kD}), args_a));
  b.run(f16(kc2.data(), {kPages, kPage, kHk, kD}), f16(vc2.data(), {kPages, kPage, kHk, kD}), args_b);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(kc, kc2);
  EXPECT_EQ(vc, vc2);

  // varlen over the same pages: keys 8 and 13, queries 1 each
  std::vector<int> cu_q = {0, 1, 2}, cu_k = {0, 8, 21};
  std::vector<uint16_t> out_a(kB * kH * kD, 0x7e00), out_b = out_a;
  flashattn::VarlenArgs va;
  va.cu_seqlens_q = Tensor::contiguous(cu_q.data(), DType::i32, {3});
  va.cu_seqlens_k = Tensor::contiguous(cu_k.data(), DType::i32, {3});
  va.max_seqlen_q = 1;
  va.max_seqlen_k = 13;
  flashattn::VarlenArgs vb = va;
  va.block_table = Tensor::contiguous(padded.data(), DType::i32, {kB, kColumns});
  vb.block_table = Tensor::contiguous(filled.data(), DType::i32, {kB, kColumns});
  const Tensor q = f16(a.q.data(), {kB, kH, kD});
  const Tensor k = f16(kc.data(), {kPages, kPage, kHk, kD}), v = f16(vc.data(), {kPages, kPage, kHk, kD});
  ASSERT_NO_THROW(flashattn::forward_varlen(q, k, v, f16(out_a.data(), {kB, kH, kD}), va));
  flashattn::forward_varlen(q, k, v, f16(out_b.data(), {kB, kH, kD}), vb);
  EXPECT_EQ(out_a, out_b);
}

TEST(Reliability, DuplicateCacheBatchIdxWithoutAppendsIsAccepted) {
  // two sequences reading one cache row (e.g. beams sharing a prompt): nothing is written
  std::vector<uint16_t> kc = random_f16(kB * kCap * kHk * kD, 5), vc = random_f16(kc.size(), 6);
  std::vector<int> idx = {1, 1};
  DecodeStep s;
  flashattn::KVCacheArgs a;
  a.cache_seqlens = Tensor::contiguous(s.seqlens.data(), DType::i32, {kB});
  a.cache_batch_idx = Tensor::contiguous(idx.data(), DType::i32, {kB});
  EXPECT_NO_THROW(s.run(f16(kc.data(), {kB, kCap, kHk, kD}), f16(vc.data(), {kB, kCap, kHk, kD}), a));
}

// ---- threads ----------------------------------------------------------------------------------

// The address space the process uses now (bytes), from /proc/self/statm.
size_t address_space_in_use() {
  unsigned long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return size_t(pages) * size_t(sysconf(_SC_PAGESIZE));
}

// 4000 thread stacks do not fit 1 GiB more address space than the process uses (8 MiB each by
// default; even 1 MiB ones would not): the CPU backend must report that as an Error (kind
// runtime), not abort. Run in a child process (the limit is the child's).
void run_with_too_many_threads() {
  // The CPU backend never runs more threads than the machine has (a budget shared by concurrent
  // calls), so the limit must leave no room for even one helper's stack (8 MiB by default)
  // while the call's own few-KiB buffers still fit.
  const rlim_t limit_bytes = rlim_t(address_space_in_use()) + (rlim_t(2) << 20);
  const rlimit limit = {limit_bytes, limit_bytes};
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::exit(3);
  // One work item per head: two query rows (one row would take the decode walk, whose work
  // items are sequences, D-72).
  constexpr int heads = 64, rows = 2;
  std::vector<uint16_t> q(rows * heads * 16, 0x3c00), k(q), v(q), out(q.size());
  flashattn::AttentionOptions o;
  o.num_threads = 4000;  // capped to the machine's threads
  try {
    flashattn::forward(f16(q.data(), {1, rows, heads, 16}), f16(k.data(), {1, rows, heads, 16}),
                       f16(v.data(), {1, rows, heads, 16}), f16(out.data(), {1, rows, heads, 16}), o);
  } catch (const flashattn::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(e.kind() == flashattn::Error::Kind::runtime ? 0 : 1);
  } catch (const std::bad_alloc&) {
    std::exit(4);  // the limit bit before any thread was asked for: the test's premise failed
  }
  std::exit(2);  // every thread started: the limit did not bite
}

TEST(Reliability, ThreadStartFailureIsARuntimeError) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one hardware thread: no helper to start";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_with_too_many_threads(), ::testing::ExitedWithCode(0), "could not start worker thread");
}

}  // namespace
}  // namespace fa_test
