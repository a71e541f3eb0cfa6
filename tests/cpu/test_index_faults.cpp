// The device-side index checks, on the host (docs/DECISIONS.md D-61): rules.h seq_info_read is
// compiled for host and device alike, so its ranges, the emptied sequence it returns on a fault
// and the fault it reports are unit-tested here, one rule each; the GPU tests
// (tests/gpu/test_index_faults.cpp) run the same values through the kernels. Also the checked
// mode's setting in FLASHATTN_KERNEL and check_device_status() in a build without CUDA.
#include <gtest/gtest.h>

#include <vector>

#include "api/kernel_choice.h"
#include "common/index_faults.h"
#include "common/rules.h"
#include "flashattn/flashattn.h"

namespace {

using flashattn::AttnParams;
using flashattn::IndexArg;
using flashattn::IndexFault;
using flashattn::SeqInfo;

// seq_info_read with plain reads; the faults it reports are collected.
struct Checked {
  SeqInfo seq;
  std::vector<IndexFault> faults;
};
Checked checked_seq_info(const AttnParams& p, int b) {
  Checked c;
  c.seq = flashattn::seq_info_read(
      p, b, [](const int* array, int i) { return array[i]; },
      [&](const IndexFault& f) { c.faults.push_back(f); });
  return c;
}

void expect_fault(const Checked& c, IndexArg arg, int batch, int value, int lo, int hi) {
  ASSERT_EQ(c.faults.size(), 1u);
  const IndexFault& f = c.faults[0];
  EXPECT_EQ(f.arg, int(arg)) << flashattn::index_arg_name(IndexArg(f.arg));
  EXPECT_EQ(f.batch, batch);
  EXPECT_EQ(f.value, value);
  EXPECT_EQ(f.lo, lo);
  EXPECT_EQ(f.hi, hi);
}

// A kv-cache call: capacity 96 keys per row, 3 cache rows, 1 appended row.
AttnParams kv_params(const int* seqlens) {
  AttnParams p;
  p.batch = 3;
  p.seqlen_q = 1;
  p.seqlen_k = 96;
  p.key_capacity = 96;
  p.seqused_k = seqlens;
  p.seqused_k_added = 1;
  p.cache_batches = 3;
  p.kv_cache = true;
  return p;
}

TEST(IndexRules, GoodKvCacheLengthsPassUnchanged) {
  const int seqlens[] = {0, 40, 95};
  const int leftpad[] = {0, 40, 3};
  AttnParams p = kv_params(seqlens);
  p.leftpad_k = leftpad;
  for (int b = 0; b < 3; ++b) {
    const Checked c = checked_seq_info(p, b);
    EXPECT_TRUE(c.faults.empty()) << b;
    EXPECT_EQ(c.seq.seqlen_k, seqlens[b] + 1 - leftpad[b]);
    EXPECT_EQ(c.seq.leftpad, leftpad[b]);
    EXPECT_EQ(c.seq.seqlen_q, 1);
  }
}

TEST(IndexRules, CacheSeqlensMustLeaveRoomForTheAppend) {
  const int seqlens[] = {96, -1, 1 << 30};
  const AttnParams p = kv_params(seqlens);
  for (int b = 0; b < 3; ++b) {
    const Checked c = checked_seq_info(p, b);
    expect_fault(c, IndexArg::cache_seqlens, b, seqlens[b], 0, 95);
    EXPECT_EQ(c.seq.seqlen_k, 0) << "a faulty sequence has no keys";
    EXPECT_EQ(c.seq.seqlen_q, 1) << "its rows are still computed (output 0, LSE -inf)";
  }
}

TEST(IndexRules, PagedCapacityIsTheTableRow) {
  const int seqlens[] = {63, 64, 10};
  const int table[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  AttnParams p = kv_params(seqlens);
  p.seqlen_k = p.key_capacity = 64;  // capacity: 4 columns x 16
  p.block_table = table;
  p.block_table_batch_stride = 4;
  p.block_table_pages = 4;
  p.page_size = 16;
  p.num_pages = 12;
  EXPECT_TRUE(checked_seq_info(p, 0).faults.empty());
  expect_fault(checked_seq_info(p, 1), IndexArg::cache_seqlens, 1, 64, 0, 63);
  EXPECT_TRUE(flashattn::valid_page(p, 11));
  EXPECT_FALSE(flashattn::valid_page(p, 12));
  EXPECT_FALSE(flashattn::valid_page(p, -1));
}

TEST(IndexRules, CacheLeftpadWithinCacheSeqlens) {
  const int seqlens[] = {10, 10, 10};
  const int leftpad[] = {10, 11, -1};
  AttnParams p = kv_params(seqlens);
  p.leftpad_k = leftpad;
  EXPECT_TRUE(checked_seq_info(p, 0).faults.empty());
  expect_fault(checked_seq_info(p, 1), IndexArg::cache_leftpad, 1, 11, 0, 10);
  const Checked c = checked_seq_info(p, 2);
  expect_fault(c, IndexArg::cache_leftpad, 2, -1, 0, 10);
  EXPECT_EQ(c.seq.leftpad, 0);
  EXPECT_EQ(c.seq.seqlen_k, 0);
}

TEST(IndexRules, CacheBatchIdxWithinTheCache) {
  const int seqlens[] = {5, 5, 5};
  const int batch_idx[] = {2, 3, -1};
  AttnParams p = kv_params(seqlens);
  p.cache_batch_idx = batch_idx;
  EXPECT_EQ(checked_seq_info(p, 0).seq.kv_batch, 2);
  expect_fault(checked_seq_info(p, 1), IndexArg::cache_batch_idx, 1, 3, 0, 2);
  const Checked c = checked_seq_info(p, 2);
  expect_fault(c, IndexArg::cache_batch_idx, 2, -1, 0, 2);
  EXPECT_EQ(c.seq.kv_batch, 0) << "no row of the cache is addressed through it";
}

// A varlen call: q (10, ...), contiguous k (90, ...), max_seqlen_q 4.
AttnParams varlen_params(const int* cu_q, const int* cu_k) {
  AttnParams p;
  p.batch = 4;
  p.seqlen_q = 4;
  p.seqlen_k = 30;
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_k = cu_k;
  p.total_q = 10;
  p.total_k = 90;
  return p;
}

TEST(IndexRules, CuSeqlensQWithinQAndMaxSeqlenQ) {
  const int cu_k[] = {0, 20, 45, 60, 90};
  const int good[] = {0, 3, 5, 9, 10};
  for (int b = 0; b < 4; ++b) EXPECT_TRUE(checked_seq_info(varlen_params(good, cu_k), b).faults.empty());
  const int past[] = {0, 3, 500, 9, 10};
  const Checked c = checked_seq_info(varlen_params(past, cu_k), 1);
  expect_fault(c, IndexArg::cu_seqlens_q, 1, 500, 3, 7);
  EXPECT_EQ(c.seq.seqlen_q, 0) << "its rows are unknown: none computed";
  expect_fault(checked_seq_info(varlen_params(past, cu_k), 2), IndexArg::cu_seqlens_q, 2, 500, 0, 10);
  const int longer[] = {0, 3, 3, 9, 10};  // sequence 2: 6 rows, max_seqlen_q 4
  expect_fault(checked_seq_info(varlen_params(longer, cu_k), 2), IndexArg::cu_seqlens_q, 2, 9, 3, 7);
}

TEST(IndexRules, CuSeqlensKWithinKOrThePages) {
  const int cu_q[] = {0, 3, 5, 9, 10};
  const int decrease[] = {0, 20, 10, 60, 90};
  expect_fault(checked_seq_info(varlen_params(cu_q, decrease), 1), IndexArg::cu_seqlens_k, 1, 10, 20, 90);
  const int past[] = {0, 20, 45, 60, 91};
  const Checked c = checked_seq_info(varlen_params(cu_q, past), 3);
  expect_fault(c, IndexArg::cu_seqlens_k, 3, 91, 60, 90);
  EXPECT_EQ(c.seq.seqlen_k, 0);
  EXPECT_EQ(c.seq.k_row_offset, 0);
  const int negative[] = {0, 20, -7, 60, 90};
  expect_fault(checked_seq_info(varlen_params(cu_q, negative), 2), IndexArg::cu_seqlens_k, 2, -7, 0, 90);
  // paged: only the lengths count, each at most the table row's keys (2 x 16)
  const int table[] = {0, 1, 2, 3, 4, 5, 6, 7};
  const int lengths[] = {0, 20, 45, 60, 93};
  AttnParams p = varlen_params(cu_q, lengths);
  p.block_table = table;
  p.block_table_batch_stride = 2;
  p.block_table_pages = 2;
  p.page_size = 16;
  p.num_pages = 8;
  p.key_capacity = 32;
  EXPECT_TRUE(checked_seq_info(p, 1).faults.empty());
  expect_fault(checked_seq_info(p, 3), IndexArg::cu_seqlens_k, 3, 33, 0, 32);  // the length
}

TEST(IndexRules, SequsedKWithinTheSequence) {
  const int cu_q[] = {0, 3, 5, 9, 10};
  const int cu_k[] = {0, 20, 45, 60, 90};
  const int used[] = {20, 26, -1, 0};
  AttnParams p = varlen_params(cu_q, cu_k);
  p.seqused_k = used;
  EXPECT_EQ(checked_seq_info(p, 0).seq.seqlen_k, 20);
  expect_fault(checked_seq_info(p, 1), IndexArg::seqused_k, 1, 26, 0, 25);
  expect_fault(checked_seq_info(p, 2), IndexArg::seqused_k, 2, -1, 0, 15);
  EXPECT_TRUE(checked_seq_info(p, 3).faults.empty());
  const int leftpad[] = {21, 0, 0, 0};  // past seqused_k of sequence 0
  p.leftpad_k = leftpad;
  expect_fault(checked_seq_info(p, 0), IndexArg::leftpad_k, 0, 21, 0, 20);
}

TEST(IndexRules, ReadsDependOnlyOnWhichArraysAreSet) {
  // The persistent kernel stages a sequence's reads ahead (at most kSeqInfoReads), and replays
  // them in the same order: the count may not depend on the values read.
  const int cu_q[] = {0, 3, 5, 9, 10};
  const int cu_k[] = {0, 20, 45, 60, 90};
  const int used[] = {20, 26, -1, 0};
  const int leftpad[] = {0, 0, 0, 0};
  const int batch_idx[] = {0, 9, 0, 0};
  AttnParams p = varlen_params(cu_q, cu_k);
  p.seqused_k = used;
  p.leftpad_k = leftpad;
  p.cache_batch_idx = batch_idx;  // never with cu_seqlens in the API: the most reads at once
  for (int b = 0; b < 4; ++b) {
    int reads = 0;
    flashattn::seq_info_read(p, b, [&](const int* array, int i) { return ++reads, array[i]; });
    EXPECT_EQ(reads, flashattn::kSeqInfoReads) << b;
  }
}

TEST(CheckedMode, ParsedFromTheKernelVariable) {
  EXPECT_FALSE(flashattn::parse_kernel_override("").checked);
  EXPECT_TRUE(flashattn::parse_kernel_override("automatic,checked=on").checked);
  EXPECT_TRUE(flashattn::parse_kernel_override("splitkeys,pdl=off,checked=on").checked);
  EXPECT_FALSE(flashattn::parse_kernel_override("automatic,checked=off").checked);
  EXPECT_THROW(flashattn::parse_kernel_override("automatic,checked=yes"), flashattn::Error);
  EXPECT_FALSE(flashattn::AttentionOptions{}.checked) << "off by default: no synchronisation";
}

TEST(CheckedMode, DeviceStatusWithoutCudaIsClear) {
  if (flashattn::cuda_available()) GTEST_SKIP() << "a CUDA device is visible (tests/gpu covers it)";
  EXPECT_NO_THROW(flashattn::check_device_status());
  EXPECT_NO_THROW(flashattn::check_device_status(nullptr));
}

}  // namespace
