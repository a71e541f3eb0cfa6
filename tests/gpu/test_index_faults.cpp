// Device-side index safety (issue 31, docs/DECISIONS.md D-61): each bad index value in device
// memory, one per test. The call must not fail or touch memory outside its tensors; the
// sequences the value belongs to get a defined output (no keys: output 0, LSE -inf; a bad
// block_table entry: its page read as zero keys; cu_seqlens_q: their rows left alone); every
// other sequence matches the CPU backend on the same inputs; check_device_status() throws once,
// naming the argument, and is clear afterwards. The checked mode throws at the call.
// Run under compute-sanitizer memcheck by scripts/device_check.sh as well.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"

namespace fa_test {
namespace {

using flashattn::AttentionOptions;
using flashattn::KVCacheArgs;
using flashattn::VarlenArgs;

constexpr DType kType = DType::f16;
constexpr int kHeads = 4, kHeadsK = 2, kDim = 64;
constexpr double kOutTol = 5e-3, kLseTol = 1e-3;  // fp16 inputs ~N(0, 1): CPU and GPU roundings

// Clears any fault left by an earlier test, so that each test sees only its own.
void clear_device_status() {
  try {
    flashattn::check_device_status();
  } catch (const flashattn::Error&) {
  }
}

// check_device_status() throws once, naming `argument`, then is clear.
void expect_fault_named(const std::string& argument) {
  try {
    flashattn::check_device_status();
    ADD_FAILURE() << "check_device_status() did not throw (expected a fault in " << argument << ")";
  } catch (const flashattn::Error& e) {
    EXPECT_EQ(e.kind(), flashattn::Error::Kind::invalid_argument);
    EXPECT_EQ(std::string(e.what()).rfind(argument + ":", 0), 0u) << e.what();
  }
  EXPECT_NO_THROW(flashattn::check_device_status()) << "the status word was not cleared";
}

struct Result {
  std::vector<double> out;  // (rows, h, d) rows of every sequence, row-major
  std::vector<double> lse;  // (b, h, sq) or (h, total_q)
};

// Row `row` (all heads) of `out` is 0 and its LSE -inf (lse_at(head) gives the LSE index).
void expect_empty_row(const Result& r, int64_t row, const std::function<int64_t(int)>& lse_at,
                      const std::string& what) {
  for (int i = 0; i < kHeads * kDim; ++i) {
    ASSERT_EQ(r.out[row * kHeads * kDim + i], 0.0) << what << ": row " << row << " element " << i;
  }
  for (int head = 0; head < kHeads; ++head) {
    ASSERT_TRUE(std::isinf(r.lse[lse_at(head)]) && r.lse[lse_at(head)] < 0) << what << ": row " << row << " head " << head;
  }
}

void expect_row_close(const Result& gpu, const Result& cpu, int64_t row,
                      const std::function<int64_t(int)>& lse_at, const std::string& what) {
  for (int i = 0; i < kHeads * kDim; ++i) {
    const int64_t at = row * kHeads * kDim + i;
    ASSERT_NEAR(gpu.out[at], cpu.out[at], kOutTol) << what << ": row " << row << " element " << i;
  }
  for (int head = 0; head < kHeads; ++head) {
    ASSERT_NEAR(gpu.lse[lse_at(head)], cpu.lse[lse_at(head)], kLseTol) << what << ": row " << row << " head " << head;
  }
}

// ---- kv cache -----------------------------------------------------------------------------

constexpr int kBatch = 3, kQueries = 2, kNew = 1;
constexpr int kPageSize = 16, kPagesPerRow = 6, kCapacity = kPageSize * kPagesPerRow;  // 96
constexpr int kPages = kBatch * kPagesPerRow + 2;
constexpr int kBad = 1;  // the sequence given a bad value

struct KVInputs {
  bool paged = false;
  int num_splits = 0;
  std::vector<int> seqlens{40, 70, 25};
  std::vector<int> batch_idx;  // empty: none
  std::vector<int> leftpad;    // empty: none
  std::vector<int> table;      // (kBatch, kPagesPerRow), paged only
};

KVInputs kv_inputs(bool paged) {
  KVInputs in;
  in.paged = paged;
  if (paged) {  // sequence b's pages: 2 + b, 2 + b + kBatch, ... (pages 0 and 1 unused)
    for (int b = 0; b < kBatch; ++b)
      for (int j = 0; j < kPagesPerRow; ++j) in.table.push_back(2 + b + j * kBatch);
  }
  return in;
}

Result run_kv(Device device, const KVInputs& in, const AttentionOptions& base = {}) {
  const int cache_rows = in.paged ? kPages : kBatch;
  const int rows_per = in.paged ? kPageSize : kCapacity;
  const int64_t cache_n = int64_t(cache_rows) * rows_per * kHeadsK * kDim;
  Buffer q = to_device(random_normal(int64_t(kBatch) * kQueries * kHeads * kDim, 1, kType), kType, device);
  Buffer kc = to_device(random_normal(cache_n, 2, kType), kType, device);
  Buffer vc = to_device(random_normal(cache_n, 3, kType), kType, device);
  Buffer kn = to_device(random_normal(int64_t(kBatch) * kNew * kHeadsK * kDim, 4, kType), kType, device);
  Buffer vn = to_device(random_normal(int64_t(kBatch) * kNew * kHeadsK * kDim, 5, kType), kType, device);
  Buffer out = poisoned(kType, int64_t(kBatch) * kQueries * kHeads * kDim, device);
  Buffer lse = poisoned(DType::f32, int64_t(kBatch) * kHeads * kQueries, device);
  Buffer seqlens = to_device_i32(in.seqlens, device);
  Buffer batch_idx = to_device_i32(in.batch_idx.empty() ? std::vector<int>{0} : in.batch_idx, device);
  Buffer leftpad = to_device_i32(in.leftpad.empty() ? std::vector<int>{0} : in.leftpad, device);
  Buffer table = to_device_i32(in.table.empty() ? std::vector<int>{0} : in.table, device);

  KVCacheArgs args;
  args.cache_seqlens = i32_tensor(seqlens, {kBatch});
  if (!in.batch_idx.empty()) args.cache_batch_idx = i32_tensor(batch_idx, {kBatch});
  if (!in.leftpad.empty()) args.cache_leftpad = i32_tensor(leftpad, {kBatch});
  if (in.paged) args.block_table = i32_tensor(table, {kBatch, kPagesPerRow});
  args.k_new = Tensor::contiguous(kn.data(), kType, {kBatch, kNew, kHeadsK, kDim}, device);
  args.v_new = Tensor::contiguous(vn.data(), kType, {kBatch, kNew, kHeadsK, kDim}, device);
  args.num_splits = in.num_splits;
  AttentionOptions opt = base;
  opt.causal = true;
  opt.softmax_lse = f32_vector(lse, {kBatch, kHeads, kQueries});
  flashattn::forward_kvcache(Tensor::contiguous(q.data(), kType, {kBatch, kQueries, kHeads, kDim}, device),
                             Tensor::contiguous(kc.data(), kType, {cache_rows, rows_per, kHeadsK, kDim}, device),
                             Tensor::contiguous(vc.data(), kType, {cache_rows, rows_per, kHeadsK, kDim}, device),
                             Tensor::contiguous(out.data(), kType, {kBatch, kQueries, kHeads, kDim}, device), args, opt);
  return Result{from_device(out, kType), from_device(lse, DType::f32)};
}

// Runs `bad` on the GPU and `good` (the same inputs with the value fixed) on the CPU: sequence
// kBad empty (or, zero_keys_page, checked by the caller), the others equal, the fault reported.
Result check_kv_fault(const KVInputs& good, const KVInputs& bad, const std::string& argument, bool expect_empty = true) {
  clear_device_status();
  const Result gpu = run_kv(Device::cuda, bad);
  const Result cpu = run_kv(Device::cpu, good);
  for (int b = 0; b < kBatch; ++b) {
    for (int i = 0; i < kQueries; ++i) {
      const int64_t row = int64_t(b) * kQueries + i;
      auto lse_at = [&](int head) { return (int64_t(b) * kHeads + head) * kQueries + i; };
      if (b != kBad) {
        expect_row_close(gpu, cpu, row, lse_at, argument + ", a good sequence");
      } else if (expect_empty) {
        expect_empty_row(gpu, row, lse_at, argument + ", the bad sequence");
      } else {
        for (double x : gpu.out) EXPECT_FALSE(std::isnan(x)) << argument << ": an unwritten element";
      }
    }
  }
  expect_fault_named(argument);
  return gpu;
}

// Why these tests cannot run here: no GPU, or no kernel of kType at kDim in this build (a
// restricted device build; a one-row call says so as an unsupported error); empty: they run.
std::string faults_unavailable_reason() {
  std::string reason = unavailable_reason(Device::cuda);
  if (!reason.empty()) return reason;
  const Buffer q = to_device(std::vector<double>(kDim, 0.5), kType, Device::cuda);
  const Buffer out = poisoned(kType, kDim, Device::cuda);
  const Tensor t = Tensor::contiguous(q.data(), kType, {1, 1, 1, kDim}, Device::cuda);
  try {
    flashattn::forward(t, t, t, Tensor::contiguous(out.data(), kType, {1, 1, 1, kDim}, Device::cuda), {});
  } catch (const flashattn::Error& e) {
    if (e.kind() == flashattn::Error::Kind::unsupported) return e.what();
    throw;
  }
  return "";
}

#define FA_SKIP_WITHOUT_GPU()                                                       \
  do {                                                                              \
    static const std::string reason = faults_unavailable_reason(); /* one probe */ \
    if (!reason.empty()) GTEST_SKIP() << reason;                                    \
  } while (0)

TEST(IndexFaults, BlockTableEntryPastThePages) {
  FA_SKIP_WITHOUT_GPU();
  for (int splits : {1, 3}) {
    KVInputs good = kv_inputs(true);
    good.num_splits = splits;
    KVInputs bad = good;
    bad.table[kBad * kPagesPerRow + 1] = kPages + 5;  // a page in use (keys 16..31 of 70)
    // The bad page's keys read as zero vectors: a defined output, not an empty row (D-61).
    check_kv_fault(good, bad, "block_table", /*expect_empty=*/false);
  }
}

TEST(IndexFaults, NegativeBlockTableEntry) {
  FA_SKIP_WITHOUT_GPU();
  KVInputs good = kv_inputs(true);
  KVInputs bad = good;
  bad.table[kBad * kPagesPerRow + 4] = -3;  // the page receiving the appended row (key 70)
  check_kv_fault(good, bad, "block_table", /*expect_empty=*/false);
}

TEST(IndexFaults, CacheSeqlensBeyondCapacity) {
  FA_SKIP_WITHOUT_GPU();
  for (bool paged : {false, true}) {
    for (int splits : {1, 3}) {
      KVInputs good = kv_inputs(paged);
      good.num_splits = splits;
      KVInputs bad = good;
      bad.seqlens[kBad] = kCapacity;  // + kNew appended rows: past the row
      check_kv_fault(good, bad, "cache_seqlens");
      bad.seqlens[kBad] = 1 << 30;
      check_kv_fault(good, bad, "cache_seqlens");
    }
  }
}

TEST(IndexFaults, NegativeCacheSeqlens) {
  FA_SKIP_WITHOUT_GPU();
  for (bool paged : {false, true}) {
    KVInputs good = kv_inputs(paged);
    KVInputs bad = good;
    bad.seqlens[kBad] = -5;
    check_kv_fault(good, bad, "cache_seqlens");
  }
}

TEST(IndexFaults, CacheBatchIdxOutOfRange) {
  FA_SKIP_WITHOUT_GPU();
  KVInputs good = kv_inputs(false);
  good.batch_idx = {2, 1, 0};
  KVInputs bad = good;
  bad.batch_idx[kBad] = kBatch + 4;
  check_kv_fault(good, bad, "cache_batch_idx");
  bad.batch_idx[kBad] = -1;
  check_kv_fault(good, bad, "cache_batch_idx");
}

TEST(IndexFaults, CacheLeftpadOutOfRange) {
  FA_SKIP_WITHOUT_GPU();
  for (bool paged : {false, true}) {
    KVInputs good = kv_inputs(paged);
    good.leftpad = {3, 5, 0};
    KVInputs bad = good;
    bad.leftpad[kBad] = good.seqlens[kBad] + 3;  // past cache_seqlens
    check_kv_fault(good, bad, "cache_leftpad");
    bad.leftpad[kBad] = -2;
    check_kv_fault(good, bad, "cache_leftpad");
  }
}

TEST(IndexFaults, CheckedModeThrowsAtTheCall) {
  FA_SKIP_WITHOUT_GPU();
  clear_device_status();
  KVInputs bad = kv_inputs(false);
  bad.seqlens[kBad] = -1;
  AttentionOptions opt;
  opt.checked = true;
  try {
    run_kv(Device::cuda, bad, opt);
    ADD_FAILURE() << "the checked call did not throw";
  } catch (const flashattn::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("cache_seqlens:", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("sequence 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("-1"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(flashattn::check_device_status());
  // A good call in the checked mode passes.
  EXPECT_NO_THROW(run_kv(Device::cuda, kv_inputs(false), opt));
}

// ---- varlen -------------------------------------------------------------------------------

constexpr int kSeqs = 4;

struct VarlenInputs {
  bool paged = false;
  std::vector<int> cu_q{0, 3, 5, 9, 10};
  std::vector<int> cu_k{0, 20, 45, 60, 90};
  std::vector<int> used;  // empty: none
  int max_q = 4, max_k = 30;
};

int pages_for(const VarlenInputs&) { return kSeqs * 2 + 1; }  // two 16-row pages per sequence

Result run_varlen(Device device, const VarlenInputs& in, const AttentionOptions& base = {}) {
  const int total_q = 10, total_k = 90;
  const int key_rows = in.paged ? pages_for(in) * kPageSize : total_k;
  Buffer q = to_device(random_normal(int64_t(total_q) * kHeads * kDim, 11, kType), kType, device);
  Buffer k = to_device(random_normal(int64_t(key_rows) * kHeadsK * kDim, 12, kType), kType, device);
  Buffer v = to_device(random_normal(int64_t(key_rows) * kHeadsK * kDim, 13, kType), kType, device);
  Buffer out = poisoned(kType, int64_t(total_q) * kHeads * kDim, device);
  Buffer lse = poisoned(DType::f32, int64_t(kHeads) * total_q, device);
  Buffer cu_q = to_device_i32(in.cu_q, device);
  Buffer cu_k = to_device_i32(in.cu_k, device);
  Buffer used = to_device_i32(in.used.empty() ? std::vector<int>{0} : in.used, device);
  std::vector<int> table_values;
  for (int b = 0; b < kSeqs; ++b) {  // sequence b: pages 1 + 2b and 2 + 2b (page 0 unused)
    table_values.push_back(1 + 2 * b);
    table_values.push_back(2 + 2 * b);
  }
  Buffer table = to_device_i32(table_values, device);
  VarlenArgs args;
  args.cu_seqlens_q = i32_tensor(cu_q, {kSeqs + 1});
  args.cu_seqlens_k = i32_tensor(cu_k, {kSeqs + 1});
  args.max_seqlen_q = in.max_q;
  args.max_seqlen_k = in.max_k;
  if (!in.used.empty()) args.seqused_k = i32_tensor(used, {kSeqs});
  if (in.paged) args.block_table = i32_tensor(table, {kSeqs, 2});
  AttentionOptions opt = base;
  opt.softmax_lse = f32_vector(lse, {kHeads, total_q});
  const Tensor kt = in.paged ? Tensor::contiguous(k.data(), kType, {pages_for(in), kPageSize, kHeadsK, kDim}, device)
                             : Tensor::contiguous(k.data(), kType, {total_k, kHeadsK, kDim}, device);
  const Tensor vt = in.paged ? Tensor::contiguous(v.data(), kType, {pages_for(in), kPageSize, kHeadsK, kDim}, device)
                             : Tensor::contiguous(v.data(), kType, {total_k, kHeadsK, kDim}, device);
  flashattn::forward_varlen(Tensor::contiguous(q.data(), kType, {total_q, kHeads, kDim}, device), kt, vt,
                            Tensor::contiguous(out.data(), kType, {total_q, kHeads, kDim}, device), args, opt);
  return Result{from_device(out, kType), from_device(lse, DType::f32)};
}

// The GPU on `bad`, the CPU on `good`: the sequences in `empty` have output 0 and LSE -inf, those
// in `skipped` are not checked (their rows are unknown), the others match.
void check_varlen_fault(const VarlenInputs& good, const VarlenInputs& bad, const std::string& argument,
                        const std::vector<int>& empty, const std::vector<int>& skipped = {}) {
  clear_device_status();
  const Result gpu = run_varlen(Device::cuda, bad);
  const Result cpu = run_varlen(Device::cpu, good);
  const int total_q = good.cu_q[kSeqs];
  auto contains = [](const std::vector<int>& list, int b) {
    for (int x : list) if (x == b) return true;
    return false;
  };
  for (int b = 0; b < kSeqs; ++b) {
    if (contains(skipped, b)) continue;
    for (int row = good.cu_q[b]; row < good.cu_q[b + 1]; ++row) {
      auto lse_at = [&](int head) { return int64_t(head) * total_q + row; };
      if (contains(empty, b)) {
        expect_empty_row(gpu, row, lse_at, argument + ", a bad sequence");
      } else {
        expect_row_close(gpu, cpu, row, lse_at, argument + ", a good sequence");
      }
    }
  }
  expect_fault_named(argument);
}

TEST(IndexFaults, SequsedKBeyondTheSequence) {
  FA_SKIP_WITHOUT_GPU();
  for (bool paged : {false, true}) {
    VarlenInputs good;
    good.paged = paged;
    good.used = {20, 20, 15, 30};
    VarlenInputs bad = good;
    bad.used[kBad] = 26;  // sequence 1 has 25 keys
    check_varlen_fault(good, bad, "seqused_k", {kBad});
    bad.used[kBad] = -4;
    check_varlen_fault(good, bad, "seqused_k", {kBad});
  }
}

TEST(IndexFaults, BadCuSeqlensK) {
  FA_SKIP_WITHOUT_GPU();
  VarlenInputs good;
  VarlenInputs bad = good;
  bad.cu_k[2] = 1000;  // past total_k: sequences 1 and 2 end / start there
  check_varlen_fault(good, bad, "cu_seqlens_k", {1, 2});
  bad.cu_k[2] = 10;  // a decrease: sequence 1 ends before it starts (sequence 2, rows 10..60 of
                     // k, is in bounds: a different result, not a fault)
  check_varlen_fault(good, bad, "cu_seqlens_k", {1}, {2});
  bad.cu_k[2] = -7;
  check_varlen_fault(good, bad, "cu_seqlens_k", {1, 2});
}

TEST(IndexFaults, BadCuSeqlensQ) {
  FA_SKIP_WITHOUT_GPU();
  VarlenInputs good;
  VarlenInputs bad = good;
  bad.cu_q[2] = 500;  // past total_q: sequences 1 and 2 are not computed
  check_varlen_fault(good, bad, "cu_seqlens_q", {}, {1, 2});
  bad.cu_q[2] = -3;
  check_varlen_fault(good, bad, "cu_seqlens_q", {}, {1, 2});
  bad = good;
  bad.cu_q[4] = 9;  // sequence 3 shorter is legal; sequence 2 longer than max_seqlen_q is not
  bad.cu_q[3] = 9;
  bad.cu_q[2] = 3;  // sequence 2: 6 rows > max_seqlen_q 4
  check_varlen_fault(good, bad, "cu_seqlens_q", {}, {1, 2, 3});
}

}  // namespace
}  // namespace fa_test
