// The parametrised sweeps, shared by the CPU and the GPU test executables: each executable
// instantiates the same suites with the case lists of its device (tests/cpu, tests/gpu).
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "test_util.h"

namespace fa_test {

enum class Alibi { none, per_head, per_batch_head };
enum class Rotary { none, interleaved, neox };
// Memory layout of the element tensors: contiguous; padded strides (gaps after each head,
// row and batch entry, NaN-filled); q (and k, v / k_new, v_new) as slices of one packed
// qkv buffer.
enum class Layout { contiguous, padded, qkv_packed };
// FP8 (e4m3) storage: none; with one descale factor per tensor (a scalar); with one per (batch,
// KV head). The stored values are e4m3 numbers, the real ones stored x descale.
enum class Fp8 { none, per_tensor, per_head };

// Mask, score and output options every sweep shares.
struct Features {
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  Alibi alibi = Alibi::none;
  float scale = 0.0f;  // 0 = default 1/sqrt(d)
  bool lse = true;     // ask for softmax_lse and check it
  // The kernel the call is forced onto where it serves it (the GPU sweeps run once per kernel).
  flashattn::KernelOverride kernel;
  std::string name() const;
};

struct DenseCase {
  Device device = Device::cpu;
  DType dtype = DType::bf16;
  int b = 1, sq = 1, sk = 1, h = 1, hk = 1, d = 64;
  Features f;
  Layout layout = Layout::contiguous;
  Fp8 fp8 = Fp8::none;  // q, k, v in e4m3 (out in dtype, bf16)
  std::string name() const;
};

struct VarlenCase {
  Device device = Device::cpu;
  DType dtype = DType::bf16;
  std::vector<int> seqlens_q, seqlens_k;  // per sequence; seqlens_k = keys stored per sequence
  int h = 1, hk = 1, d = 64;
  Features f;
  bool seqused_k = false;  // use only a prefix of each sequence's keys
  bool leftpad_k = false;  // ignore a few keys at the left
  int page_size = 0;       // > 0: paged K/V through a shuffled block_table
  Layout layout = Layout::contiguous;  // padded: q, k, v, out with NaN-filled gaps
  Fp8 fp8 = Fp8::none;     // q, k, v in e4m3 (out in dtype, bf16)
  bool fp8_kv_only = false;  // with fp8 and pages: q in dtype, only the paged K/V in e4m3
  std::string name() const;
};

struct KVCase {
  Device device = Device::cpu;
  DType dtype = DType::bf16;
  int b = 1, sq = 1, h = 1, hk = 1, d = 64;
  int capacity = 64;               // keys per cache row (contiguous) / per sequence (paged)
  bool with_seqlens = true;        // false: cache_seqlens not given (every row full)
  int s_new = 0;                   // k_new / v_new rows appended
  bool batch_idx = false;          // cache_batch_idx maps batch -> a permuted cache row
  bool leftpad = false;            // cache_leftpad
  int page_size = 0;               // > 0: paged cache
  bool shuffled_pages = true;
  Rotary rotary = Rotary::none;
  int rotary_dim = 0;
  int num_splits = 0;
  bool caller_workspace = false;   // pass a workspace of plan_kvcache(...).workspace_bytes
  Layout layout = Layout::contiguous;  // qkv_packed: q, k_new, v_new slices of one buffer
  Fp8 fp8_cache = Fp8::none;       // k_cache / v_cache in e4m3 (k_new, v_new quantized into them)
  bool fp8_q = false;              // q in e4m3 too (with fp8_cache; dtype bf16)
  Features f;
  uint64_t seed = 1;
  std::string name() const;
};

// gtest prints a failing case's parameter with these (instead of its bytes).
inline void PrintTo(const DenseCase& c, std::ostream* os) { *os << c.name(); }
inline void PrintTo(const VarlenCase& c, std::ostream* os) { *os << c.name(); }
inline void PrintTo(const KVCase& c, std::ostream* os) { *os << c.name(); }

// Names gtest shows: the case's name and its index (unique, [A-Za-z0-9_] only).
struct CaseName {
  template <class P>
  std::string operator()(const ::testing::TestParamInfo<P>& info) const {
    return info.param.name() + "_" + std::to_string(info.index);
  }
};

class DenseSweep : public ::testing::TestWithParam<DenseCase> {};
class VarlenSweep : public ::testing::TestWithParam<VarlenCase> {};
class KVCacheSweep : public ::testing::TestWithParam<KVCase> {};
// The same kv-cache problem with num_splits 1, 3, 0 (heuristic), 2, 7, 12, 16: all pass and agree.
class KVCacheSplits : public ::testing::TestWithParam<KVCase> {};
// The same kv-cache problem contiguous and paged (page sizes 1, 16, 256): all pass and agree.
class KVCachePaging : public ::testing::TestWithParam<KVCase> {};

std::vector<DenseCase> dense_cases(Device device);
std::vector<VarlenCase> varlen_cases(Device device);
std::vector<KVCase> kvcache_cases(Device device);
std::vector<KVCase> kvcache_split_cases(Device device);
std::vector<KVCase> kvcache_paging_cases(Device device);
std::vector<KVCase> kvcache_chunked_cases(Device device);  // instantiated as <Prefix>Chunked

// The cases with every call forced onto `kernel` where it serves them (a call it does not serve
// takes the automatic choice, api/kernel_choice.h).
template <class Case>
std::vector<Case> on_kernel(std::vector<Case> cases, flashattn::KernelOverride kernel) {
  for (Case& c : cases) c.f.kernel = kernel;
  return cases;
}
inline flashattn::KernelOverride forced(flashattn::Kernel kernel) {
  flashattn::KernelOverride o;
  o.kernel = kernel;
  return o;
}

}  // namespace fa_test

// The prefill sweeps (dense, varlen, chunked prefill over a cache) with every call forced onto one kernel.
#define FA_INSTANTIATE_PREFILL_SWEEPS_ON(Prefix, device, kernel)                                         \
  INSTANTIATE_TEST_SUITE_P(Prefix##Chunked, KVCacheSweep, ::testing::ValuesIn(::fa_test::on_kernel(::fa_test::kvcache_chunked_cases(device), kernel)), \
                           ::fa_test::CaseName());                                                       \
  INSTANTIATE_TEST_SUITE_P(Prefix##Chunked, KVCachePaging, ::testing::ValuesIn(::fa_test::on_kernel(::fa_test::kvcache_chunked_cases(device), kernel)), \
                           ::fa_test::CaseName());                                                       \
  INSTANTIATE_TEST_SUITE_P(Prefix, DenseSweep, ::testing::ValuesIn(::fa_test::on_kernel(::fa_test::dense_cases(device), kernel)), \
                           ::fa_test::CaseName());                                                       \
  INSTANTIATE_TEST_SUITE_P(Prefix, VarlenSweep, ::testing::ValuesIn(::fa_test::on_kernel(::fa_test::varlen_cases(device), kernel)), \
                           ::fa_test::CaseName())

// The decode sweeps (kv cache, its split counts and paging, varlen) with every call forced onto one kernel.
#define FA_INSTANTIATE_DECODE_SWEEPS_ON(Prefix, device, kernel)                                          \
  INSTANTIATE_TEST_SUITE_P(Prefix, VarlenSweep, ::testing::ValuesIn(::fa_test::on_kernel(::fa_test::varlen_cases(device), kernel)), \
                           ::fa_test::CaseName());                                                       \
  INSTANTIATE_TEST_SUITE_P(Prefix, KVCacheSweep, ::testing::ValuesIn(::fa_test::on_kernel(::fa_test::kvcache_cases(device), kernel)), \
                           ::fa_test::CaseName());                                                       \
  INSTANTIATE_TEST_SUITE_P(Prefix, KVCacheSplits, ::testing::ValuesIn(::fa_test::on_kernel(::fa_test::kvcache_split_cases(device), kernel)), \
                           ::fa_test::CaseName());                                                       \
  INSTANTIATE_TEST_SUITE_P(Prefix, KVCachePaging, ::testing::ValuesIn(::fa_test::on_kernel(::fa_test::kvcache_paging_cases(device), kernel)), \
                           ::fa_test::CaseName())

// Instantiates every sweep for one device (used once by each test executable).
#define FA_INSTANTIATE_SWEEPS(Prefix, device)                                                   \
  INSTANTIATE_TEST_SUITE_P(Prefix, DenseSweep, ::testing::ValuesIn(::fa_test::dense_cases(device)), \
                           ::fa_test::CaseName());                                              \
  INSTANTIATE_TEST_SUITE_P(Prefix, VarlenSweep,                                                 \
                           ::testing::ValuesIn(::fa_test::varlen_cases(device)),                \
                           ::fa_test::CaseName());                                              \
  INSTANTIATE_TEST_SUITE_P(Prefix, KVCacheSweep,                                                \
                           ::testing::ValuesIn(::fa_test::kvcache_cases(device)),               \
                           ::fa_test::CaseName());                                              \
  INSTANTIATE_TEST_SUITE_P(Prefix, KVCacheSplits,                                               \
                           ::testing::ValuesIn(::fa_test::kvcache_split_cases(device)),         \
                           ::fa_test::CaseName());                                              \
  INSTANTIATE_TEST_SUITE_P(Prefix, KVCachePaging,                                               \
                           ::testing::ValuesIn(::fa_test::kvcache_paging_cases(device)),        \
                           ::fa_test::CaseName());                                              \
  INSTANTIATE_TEST_SUITE_P(Prefix##Chunked, KVCacheSweep,                                       \
                           ::testing::ValuesIn(::fa_test::kvcache_chunked_cases(device)),       \
                           ::fa_test::CaseName());                                              \
  INSTANTIATE_TEST_SUITE_P(Prefix##Chunked, KVCachePaging,                                      \
                           ::testing::ValuesIn(::fa_test::kvcache_chunked_cases(device)),       \
                           ::fa_test::CaseName())
