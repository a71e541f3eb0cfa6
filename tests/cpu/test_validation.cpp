// One test per validation rule of the public API (src/api/validate.cpp): the call throws
// flashattn::Error of the expected kind, the message begins with the offending argument's name
// ("<argument>: <rule> (got <value>)"), and nothing was written: out (and the kv cache) keep
// their NaN poison / contents bit for bit.
//
// Each rule starts from a valid problem (checked by the *.ValidBaseline tests) and breaks one
// thing. Rules that only apply on CUDA are checked with CUDA-tagged views of host memory:
// validation rejects them before anything is read or launched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace fa_test {
namespace {

using flashattn::Error;
using Kind = flashattn::Error::Kind;

constexpr int kB = 2, kSq = 3, kSk = 5, kH = 4, kHk = 2, kD = 16;
constexpr int kPage = 4, kPagesPerSeq = 2, kNumPages = 5;

// Host storage for every tensor a rule may point at. Large enough for all mutations.
struct Storage {
  std::vector<uint16_t> q = std::vector<uint16_t>(4096, 0x3c00), k = q, v = q, kn = q, vn = q;
  std::vector<uint16_t> cos = std::vector<uint16_t>(4096, 0x3c00), sin = cos;
  std::vector<uint16_t> out = std::vector<uint16_t>(4096, 0x7e00);  // poison
  std::vector<float> lse = std::vector<float>(512, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> alibi = std::vector<float>(64, 0.5f);
  std::vector<int> ints = std::vector<int>(64, 0);
  std::vector<int> ints2 = std::vector<int>(64, 0);
  std::vector<int> ints3 = std::vector<int>(64, 0);
  std::vector<int> table = std::vector<int>(64, 0);
  alignas(256) unsigned char workspace[1 << 16];
};

Tensor t16(std::vector<uint16_t>& s, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(s.data(), DType::f16, shape);
}

// ---- expectations ---------------------------------------------------------------------------

struct Outcome {
  bool threw = false;
  Kind kind = Kind::runtime;
  std::string message;
};

Outcome capture(const std::function<void()>& call) {
  Outcome o;
  try {
    call();
  } catch (const Error& e) {
    o.threw = true;
    o.kind = e.kind();
    o.message = e.what();
  }
  return o;
}

::testing::AssertionResult rejected(const Outcome& o, const std::string& arg, Kind kind) {
  if (!o.threw) return ::testing::AssertionFailure() << "no flashattn::Error thrown";
  if (o.kind != kind) {
    return ::testing::AssertionFailure() << "kind " << int(o.kind) << ", expected " << int(kind)
                                         << ": " << o.message;
  }
  if (o.message.rfind(arg + ":", 0) != 0) {
    return ::testing::AssertionFailure() << "message does not begin with '" << arg
                                         << ":': " << o.message;
  }
  if (o.message.find("(got ") == std::string::npos) {
    return ::testing::AssertionFailure() << "message does not say the value seen: " << o.message;
  }
  return ::testing::AssertionSuccess();
}

// =============================================================================================
// forward
// =============================================================================================

struct DenseSetup {
  Storage s;
  Tensor q, k, v, out;
  flashattn::AttentionOptions o;
  DenseSetup() {
    q = t16(s.q, {kB, kSq, kH, kD});
    k = t16(s.k, {kB, kSk, kHk, kD});
    v = t16(s.v, {kB, kSk, kHk, kD});
    out = t16(s.out, {kB, kSq, kH, kD});
    o.num_threads = 1;
  }
  void call() { flashattn::forward(q, k, v, out, o); }
};

struct Rule {
  std::string name;
  std::string arg;
  Kind kind;
  std::function<void(DenseSetup&)> breaks;
};

void PrintTo(const Rule& r, std::ostream* os) { *os << r.name; }

class ForwardRule : public ::testing::TestWithParam<Rule> {};

TEST(ForwardValidation, ValidBaseline) {
  DenseSetup d;
  EXPECT_NO_THROW(d.call());
  EXPECT_NE(d.s.out[0], 0x7e00) << "the valid call wrote its output";
}

TEST_P(ForwardRule, RejectsAndWritesNothing) {
  const Rule& r = GetParam();
  DenseSetup d;
  r.breaks(d);
  const std::vector<uint16_t> out_before = d.s.out, q_before = d.s.q, k_before = d.s.k, v_before = d.s.v;
  const std::vector<float> lse_before = d.s.lse;
  EXPECT_TRUE(rejected(capture([&] { d.call(); }), r.arg, r.kind));
  EXPECT_TRUE(d.s.out == out_before) << "out was written";
  EXPECT_EQ(std::memcmp(d.s.lse.data(), lse_before.data(), lse_before.size() * 4), 0) << "lse was written";
  EXPECT_TRUE(d.s.q == q_before && d.s.k == k_before && d.s.v == v_before) << "an input was written";
}

const Kind kInvalid = Kind::invalid_argument, kType = Kind::type_error;

// FP8 (flashattn.h DType::e4m3): the tensor's bytes read as e4m3; a descale over `factors`.
void as_e4m3(Tensor& t) { t.dtype = DType::e4m3; }
Tensor descale(std::vector<float>& factors, std::initializer_list<int64_t> shape, DType dtype = DType::f32) {
  return Tensor::contiguous(factors.data(), dtype, shape);
}
void make_fp8(DenseSetup& d) {  // q, k, v e4m3 with descales, out bf16
  as_e4m3(d.q), as_e4m3(d.k), as_e4m3(d.v);
  d.out.dtype = DType::bf16;
  d.o.q_descale = descale(d.s.alibi, {1});
  d.o.k_descale = descale(d.s.alibi, {kB, kHk});
  d.o.v_descale = descale(d.s.alibi, {kB, kHk});
}

TEST(ForwardValidation, Fp8ValidBaseline) {
  DenseSetup d;
  make_fp8(d);
  EXPECT_NO_THROW(d.call());
  EXPECT_NE(d.s.out[0], 0x7e00) << "the valid call wrote its output";
}

std::vector<Rule> forward_rules() {
  auto cuda = [](Tensor& t) { t.device = Device::cuda; };
  return {
      {"QMissing", "q", kInvalid, [](DenseSetup& d) { d.q = Tensor{}; }},
      // FP8
      {"QDescaleWithoutFp8", "q_descale", kInvalid, [](DenseSetup& d) { d.o.q_descale = descale(d.s.alibi, {1}); }},
      {"VDescaleWithoutFp8", "v_descale", kInvalid, [](DenseSetup& d) { d.o.v_descale = descale(d.s.alibi, {kB, kHk}); }},
      {"Fp8OutNotBf16", "out", kType, [](DenseSetup& d) { make_fp8(d), d.out.dtype = DType::f16; }},
      {"Fp8KVUnderF16Q", "k", kType, [](DenseSetup& d) { as_e4m3(d.k), as_e4m3(d.v); }},
      {"Fp8VNotE4m3", "v", kType, [](DenseSetup& d) { make_fp8(d), d.v.dtype = DType::f16; }},
      {"Fp8DescalePerQueryHead", "k_descale", kInvalid, [](DenseSetup& d) {
         make_fp8(d), d.o.k_descale = descale(d.s.alibi, {kB, kH});
       }},
      {"Fp8DescaleNotFp32", "q_descale", kType, [](DenseSetup& d) {
         make_fp8(d), d.o.q_descale = descale(d.s.alibi, {1}, DType::bf16);
       }},
      {"Fp8DescaleOtherDevice", "v_descale", kInvalid, [cuda](DenseSetup& d) { make_fp8(d), cuda(d.o.v_descale); }},
      {"Fp8DescaleNullData", "q_descale", kInvalid, [](DenseSetup& d) { make_fp8(d), d.o.q_descale.data = nullptr; }},
      {"Fp8OutOverlapsDescale", "out", kInvalid, [](DenseSetup& d) {
         make_fp8(d), d.o.k_descale = Tensor::contiguous(d.s.out.data(), DType::f32, {1});
       }},
      {"QNotFourDims", "q", kInvalid, [](DenseSetup& d) { d.q = t16(d.s.q, {kB * kSq, kH, kD}); }},
      {"QNegativeSize", "q", kInvalid, [](DenseSetup& d) { d.q.shape[1] = -1; }},
      {"QNullData", "q", kInvalid, [](DenseSetup& d) { d.q.data = nullptr; }},
      {"QIntDtype", "q", kType, [](DenseSetup& d) { d.q.dtype = DType::i32; }},
      {"QLastDimStrided", "q", kInvalid, [](DenseSetup& d) { d.q.stride[3] = 2; }},
      {"KDtypeDiffers", "k", kType, [](DenseSetup& d) { d.k.dtype = DType::bf16; }},
      {"VDtypeDiffers", "v", kType, [](DenseSetup& d) { d.v.dtype = DType::bf16; }},
      {"KMissing", "k", kInvalid, [](DenseSetup& d) { d.k = Tensor{}; }},
      {"KOtherDevice", "k", kInvalid, [cuda](DenseSetup& d) { cuda(d.k); }},
      {"KLastDimStrided", "k", kInvalid, [](DenseSetup& d) { d.k.stride[3] = 3; }},
      {"VShapeDiffers", "v", kInvalid, [](DenseSetup& d) { d.v = t16(d.s.v, {kB, kSk + 1, kHk, kD}); }},
      {"VNotFourDims", "v", kInvalid, [](DenseSetup& d) { d.v = t16(d.s.v, {kB, kSk, kHk * kD}); }},
      {"KNotFourDims", "k", kInvalid, [](DenseSetup& d) {
         d.k = t16(d.s.k, {kB, kSk, kHk * kD});
         d.v = t16(d.s.v, {kB, kSk, kHk * kD});
       }},
      {"KBatchDiffers", "k", kInvalid, [](DenseSetup& d) {
         d.k = t16(d.s.k, {kB + 1, kSk, kHk, kD});
         d.v = t16(d.s.v, {kB + 1, kSk, kHk, kD});
       }},
      {"KHeadDimDiffers", "k", kInvalid, [](DenseSetup& d) {
         d.k = t16(d.s.k, {kB, kSk, kHk, kD / 2});
         d.v = t16(d.s.v, {kB, kSk, kHk, kD / 2});
       }},
      {"HeadsNotMultipleOfKvHeads", "k", kInvalid, [](DenseSetup& d) {
         d.k = t16(d.s.k, {kB, kSk, 3, kD});
         d.v = t16(d.s.v, {kB, kSk, 3, kD});
       }},
      {"HeadDimTooLarge", "q", kInvalid, [](DenseSetup& d) {
         d.q = t16(d.s.q, {1, 1, 1, 264});
         d.k = t16(d.s.k, {1, 1, 1, 264});
         d.v = t16(d.s.v, {1, 1, 1, 264});
         d.out = t16(d.s.out, {1, 1, 1, 264});
       }},
      {"OutMissing", "out", kInvalid, [](DenseSetup& d) { d.out = Tensor{}; }},
      {"OutDtypeDiffers", "out", kType, [](DenseSetup& d) { d.out.dtype = DType::bf16; }},
      {"OutShapeDiffers", "out", kInvalid, [](DenseSetup& d) { d.out = t16(d.s.out, {kB, kSq, kH, kD / 2}); }},
      {"OutLastDimStrided", "out", kInvalid, [](DenseSetup& d) { d.out.stride[3] = 2; }},
      {"OutOtherDevice", "out", kInvalid, [cuda](DenseSetup& d) { cuda(d.out); }},
      {"ScaleNotFinite", "softmax_scale", kInvalid, [](DenseSetup& d) { d.o.softmax_scale = std::numeric_limits<float>::infinity(); }},
      {"ScaleNan", "softmax_scale", kInvalid, [](DenseSetup& d) { d.o.softmax_scale = std::nanf(""); }},
      {"SoftcapNegative", "softcap", kInvalid, [](DenseSetup& d) { d.o.softcap = -1.0f; }},
      {"SoftcapInfinite", "softcap", kInvalid, [](DenseSetup& d) { d.o.softcap = std::numeric_limits<float>::infinity(); }},
      {"WindowLeftBelowMinusOne", "window_left", kInvalid, [](DenseSetup& d) { d.o.window_left = -2; }},
      {"WindowRightBelowMinusOne", "window_right", kInvalid, [](DenseSetup& d) { d.o.window_right = -5; }},
      {"NumThreadsNegative", "num_threads", kInvalid, [](DenseSetup& d) { d.o.num_threads = -1; }},
      {"AlibiNotFp32", "alibi_slopes", kType, [](DenseSetup& d) {
         d.o.alibi_slopes = Tensor::contiguous(d.s.alibi.data(), DType::bf16, {kH});
       }},
      {"AlibiWrongHeads", "alibi_slopes", kInvalid, [](DenseSetup& d) {
         d.o.alibi_slopes = Tensor::contiguous(d.s.alibi.data(), DType::f32, {kH + 1});
       }},
      {"AlibiWrongBatch", "alibi_slopes", kInvalid, [](DenseSetup& d) {
         d.o.alibi_slopes = Tensor::contiguous(d.s.alibi.data(), DType::f32, {kB + 1, kH});
       }},
      {"AlibiThreeDims", "alibi_slopes", kInvalid, [](DenseSetup& d) {
         d.o.alibi_slopes = Tensor::contiguous(d.s.alibi.data(), DType::f32, {1, kB, kH});
       }},
      {"AlibiOtherDevice", "alibi_slopes", kInvalid, [cuda](DenseSetup& d) {
         d.o.alibi_slopes = Tensor::contiguous(d.s.alibi.data(), DType::f32, {kH});
         cuda(d.o.alibi_slopes);
       }},
      {"AlibiStrided", "alibi_slopes", kInvalid, [](DenseSetup& d) {
         d.o.alibi_slopes = Tensor::strided(d.s.alibi.data(), DType::f32, {kH}, {2});
       }},
      {"LseNotFp32", "softmax_lse", kType, [](DenseSetup& d) {
         d.o.softmax_lse = Tensor::contiguous(d.s.lse.data(), DType::f16, {kB, kH, kSq});
       }},
      {"LseWrongDims", "softmax_lse", kInvalid, [](DenseSetup& d) {
         d.o.softmax_lse = Tensor::contiguous(d.s.lse.data(), DType::f32, {kH, kB * kSq});
       }},
      {"LseWrongSeqlen", "softmax_lse", kInvalid, [](DenseSetup& d) {
         d.o.softmax_lse = Tensor::contiguous(d.s.lse.data(), DType::f32, {kB, kH, kSq + 1});
       }},
      {"LseWrongHeads", "softmax_lse", kInvalid, [](DenseSetup& d) {
         d.o.softmax_lse = Tensor::contiguous(d.s.lse.data(), DType::f32, {kB, kHk, kSq});
       }},
      {"LseWrongBatch", "softmax_lse", kInvalid, [](DenseSetup& d) {
         d.o.softmax_lse = Tensor::contiguous(d.s.lse.data(), DType::f32, {1, kH, kSq});
       }},
      {"LseOtherDevice", "softmax_lse", kInvalid, [cuda](DenseSetup& d) {
         d.o.softmax_lse = Tensor::contiguous(d.s.lse.data(), DType::f32, {kB, kH, kSq});
         cuda(d.o.softmax_lse);
       }},
      // sizes the kernels index with int32 (rejected before any element is read)
      {"BatchAtLeast2To31", "q", kInvalid, [](DenseSetup& d) { d.q.shape[0] = int64_t(1) << 31; }},
      {"SeqlenQAtLeast2To31", "q", kInvalid, [](DenseSetup& d) { d.q.shape[1] = int64_t(1) << 31; }},
      {"HeadsAbove2To32", "q", kInvalid, [](DenseSetup& d) { d.q.shape[2] = (int64_t(1) << 32) + 1; }},
      {"SeqlenKAtLeast2To31", "k", kInvalid, [](DenseSetup& d) { d.k.shape[1] = d.v.shape[1] = int64_t(1) << 31; }},
      {"SeqlenSumAtLeast2To31", "k", kInvalid, [](DenseSetup& d) {
         d.q.shape[1] = d.out.shape[1] = int64_t(1) << 30;
         d.k.shape[1] = d.v.shape[1] = int64_t(1) << 30;
       }},
      {"PackedQueryRowsAtLeast2To31", "q", kInvalid, [](DenseSetup& d) {
         d.q.shape[1] = d.out.shape[1] = 64;
         d.q.shape[2] = d.out.shape[2] = int64_t(1) << 26;  // 2^26 query heads on one KV head
         d.k.shape[2] = d.v.shape[2] = 1;
       }},
      {"OutputElementsAtLeast2To53", "q", kInvalid, [](DenseSetup& d) {
         d.q.shape[0] = d.k.shape[0] = d.v.shape[0] = d.out.shape[0] = int64_t(1) << 30;
         d.q.shape[1] = d.out.shape[1] = int64_t(1) << 20;
         d.q.shape[2] = d.out.shape[2] = 16;
         d.k.shape[2] = d.v.shape[2] = 16;
       }},
      {"StridesSpanBeyond2To62Bytes", "k", kInvalid, [](DenseSetup& d) { d.k.stride[0] = d.v.stride[0] = int64_t(1) << 62; }},
      {"NegativeStrideBelowAddressZero", "v", kInvalid, [](DenseSetup& d) { d.v.stride[1] = -(int64_t(1) << 50); }},
      // outputs that share memory with an input or with themselves
      {"OutIsQ", "out", kInvalid, [](DenseSetup& d) { d.out = d.q; }},
      {"OutOverlapsK", "out", kInvalid, [](DenseSetup& d) { d.out = t16(d.s.k, {kB, kSq, kH, kD}); }},
      {"OutOverlapsLastElementOfV", "out", kInvalid, [](DenseSetup& d) {
         d.out = Tensor::contiguous(d.s.v.data() + (kB * kSk * kHk * kD - 1), DType::f16, {kB, kSq, kH, kD});
       }},
      {"OutRowsShareMemory", "out", kInvalid, [](DenseSetup& d) { d.out.stride[1] = 0; }},
      {"OutOverlapsLse", "out", kInvalid, [](DenseSetup& d) {
         d.o.softmax_lse = Tensor::contiguous(d.s.out.data(), DType::f32, {kB, kH, kSq});
       }},
      {"LseOverlapsQ", "softmax_lse", kInvalid, [](DenseSetup& d) {
         d.o.softmax_lse = Tensor::contiguous(d.s.q.data(), DType::f32, {kB, kH, kSq});
       }},
      {"LseOverlapsAlibi", "softmax_lse", kInvalid, [](DenseSetup& d) {
         d.o.softmax_lse = Tensor::contiguous(d.s.lse.data(), DType::f32, {kB, kH, kSq});
         d.o.alibi_slopes = Tensor::contiguous(d.s.lse.data() + 3, DType::f32, {kH});
       }},
      {"LseRowsShareMemory", "softmax_lse", kInvalid, [](DenseSetup& d) {
         d.o.softmax_lse = Tensor::strided(d.s.lse.data(), DType::f32, {kB, kH, kSq}, {0, kSq, 1});
       }},
      // CUDA-only rules, on CUDA-tagged views (rejected before any access)
      {"CudaFp32", "q", kType, [cuda](DenseSetup& d) {
         for (Tensor* t : {&d.q, &d.k, &d.v, &d.out}) {
           t->dtype = DType::f32;
           cuda(*t);
         }
       }},
      // Any head dim, stride and 16-bit-aligned address are served on cuda (the API stages
      // copies the kernels can read: src/api/staging.h); an address that is not a multiple of
      // the element size is not.
      {"CudaMisalignedData", "q", kInvalid, [cuda](DenseSetup& d) {
         for (Tensor* t : {&d.q, &d.k, &d.v, &d.out}) cuda(*t);
         d.q.data = reinterpret_cast<char*>(d.s.q.data()) + 1;
       }},
      {"CudaHeadDimNotCompiled", "q", Kind::unsupported, [cuda](DenseSetup& d) {
         d.q = t16(d.s.q, {kB, kSq, kH, 8});  // no instance is built for head dim 8
         d.k = t16(d.s.k, {kB, kSk, kHk, 8});
         d.v = t16(d.s.v, {kB, kSk, kHk, 8});
         d.out = t16(d.s.out, {kB, kSq, kH, 8});
         for (Tensor* t : {&d.q, &d.k, &d.v, &d.out}) cuda(*t);
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(Forward, ForwardRule, ::testing::ValuesIn(forward_rules()),
                         [](const ::testing::TestParamInfo<Rule>& i) { return i.param.name; });

// =============================================================================================
// forward_varlen
// =============================================================================================

// Two sequences: q lengths 2 and 3 (total 5), k lengths 4 and 6 (total 10).
struct VarlenSetup {
  Storage s;
  Tensor q, k, v, out;
  flashattn::VarlenArgs a;
  flashattn::AttentionOptions o;
  VarlenSetup() {
    s.ints = {0, 2, 5};
    s.ints2 = {0, 4, 10};
    q = t16(s.q, {5, kH, kD});
    k = t16(s.k, {10, kHk, kD});
    v = t16(s.v, {10, kHk, kD});
    out = t16(s.out, {5, kH, kD});
    a.cu_seqlens_q = Tensor::contiguous(s.ints.data(), DType::i32, {3});
    a.cu_seqlens_k = Tensor::contiguous(s.ints2.data(), DType::i32, {3});
    a.max_seqlen_q = 3;
    a.max_seqlen_k = 6;
    o.num_threads = 1;
  }
  // paged K/V: pages of kPage rows, 3 pages per sequence
  void make_paged() {
    k = t16(s.k, {kNumPages + 1, kPage, kHk, kD});
    v = t16(s.v, {kNumPages + 1, kPage, kHk, kD});
    s.table = {0, 1, 2, 3, 4, 5};
    a.block_table = Tensor::contiguous(s.table.data(), DType::i32, {2, 3});
  }
  void call() { flashattn::forward_varlen(q, k, v, out, a, o); }
};

struct VarlenRule {
  std::string name;
  std::string arg;
  Kind kind;
  std::function<void(VarlenSetup&)> breaks;
};

void PrintTo(const VarlenRule& r, std::ostream* os) { *os << r.name; }

class VarlenRuleTest : public ::testing::TestWithParam<VarlenRule> {};

TEST(VarlenValidation, ValidBaseline) {
  VarlenSetup d;
  EXPECT_NO_THROW(d.call());
  VarlenSetup p;
  p.make_paged();
  p.s.ints3 = {3, 5};
  p.a.seqused_k = Tensor::contiguous(p.s.ints3.data(), DType::i32, {2});
  EXPECT_NO_THROW(p.call());
}

TEST_P(VarlenRuleTest, RejectsAndWritesNothing) {
  const VarlenRule& r = GetParam();
  VarlenSetup d;
  r.breaks(d);
  const std::vector<uint16_t> out_before = d.s.out;
  EXPECT_TRUE(rejected(capture([&] { d.call(); }), r.arg, r.kind));
  EXPECT_TRUE(d.s.out == out_before) << "out was written";
}

std::vector<VarlenRule> varlen_rules() {
  auto vec = [](std::vector<int>& s, int64_t n) { return Tensor::contiguous(s.data(), DType::i32, {n}); };
  return {
      {"QNotThreeDims", "q", kInvalid, [](VarlenSetup& d) { d.q = t16(d.s.q, {1, 5, kH, kD}); }},
      {"CuSeqlensQMissing", "cu_seqlens_q", kInvalid, [](VarlenSetup& d) { d.a.cu_seqlens_q = Tensor{}; }},
      {"CuSeqlensKMissing", "cu_seqlens_k", kInvalid, [](VarlenSetup& d) { d.a.cu_seqlens_k = Tensor{}; }},
      {"CuSeqlensQTwoDims", "cu_seqlens_q", kInvalid, [](VarlenSetup& d) {
         d.a.cu_seqlens_q = Tensor::contiguous(d.s.ints.data(), DType::i32, {1, 3});
       }},
      {"CuSeqlensQEmpty", "cu_seqlens_q", kInvalid, [vec](VarlenSetup& d) { d.a.cu_seqlens_q = vec(d.s.ints, 0); }},
      {"CuSeqlensQNotInt", "cu_seqlens_q", kType, [](VarlenSetup& d) { d.a.cu_seqlens_q.dtype = DType::f32; }},
      {"CuSeqlensKWrongLength", "cu_seqlens_k", kInvalid, [vec](VarlenSetup& d) { d.a.cu_seqlens_k = vec(d.s.ints2, 4); }},
      {"CuSeqlensKOtherDevice", "cu_seqlens_k", kInvalid, [](VarlenSetup& d) { d.a.cu_seqlens_k.device = Device::cuda; }},
      {"SequsedWrongLength", "seqused_k", kInvalid, [vec](VarlenSetup& d) { d.a.seqused_k = vec(d.s.ints3, 3); }},
      {"LeftpadWrongLength", "leftpad_k", kInvalid, [vec](VarlenSetup& d) { d.a.leftpad_k = vec(d.s.ints3, 1); }},
      {"LeftpadNotInt", "leftpad_k", kType, [](VarlenSetup& d) {
         d.a.leftpad_k = Tensor::contiguous(d.s.alibi.data(), DType::f32, {2});
       }},
      {"MaxSeqlenQNegative", "max_seqlen_q", kInvalid, [](VarlenSetup& d) { d.a.max_seqlen_q = -1; }},
      {"MaxSeqlenKNegative", "max_seqlen_k", kInvalid, [](VarlenSetup& d) { d.a.max_seqlen_k = -1; }},
      {"KNotThreeDims", "k", kInvalid, [](VarlenSetup& d) {
         d.k = t16(d.s.k, {1, 10, kHk, kD});
         d.v = t16(d.s.v, {1, 10, kHk, kD});
       }},
      {"KHeadDimDiffers", "k", kInvalid, [](VarlenSetup& d) {
         d.k = t16(d.s.k, {10, kHk, kD + 1});
         d.v = t16(d.s.v, {10, kHk, kD + 1});
       }},
      {"OutShapeDiffers", "out", kInvalid, [](VarlenSetup& d) { d.out = t16(d.s.out, {4, kH, kD}); }},
      {"LseNotHeadsByTotal", "softmax_lse", kInvalid, [](VarlenSetup& d) {
         d.o.softmax_lse = Tensor::contiguous(d.s.lse.data(), DType::f32, {2, kH, 3});
       }},
      {"LseWrongTotal", "softmax_lse", kInvalid, [](VarlenSetup& d) {
         d.o.softmax_lse = Tensor::contiguous(d.s.lse.data(), DType::f32, {kH, 6});
       }},
      {"CuSeqlensQNotFromZero", "cu_seqlens_q", kInvalid, [](VarlenSetup& d) { d.s.ints[0] = 1; }},
      {"CuSeqlensKNotFromZero", "cu_seqlens_k", kInvalid, [](VarlenSetup& d) { d.s.ints2[0] = 1; }},
      {"CuSeqlensQDecreasing", "cu_seqlens_q", kInvalid, [](VarlenSetup& d) { d.s.ints = {0, 3, 2}; }},
      {"CuSeqlensKDecreasing", "cu_seqlens_k", kInvalid, [](VarlenSetup& d) { d.s.ints2 = {0, 6, 5}; }},
      {"QueryLongerThanMax", "max_seqlen_q", kInvalid, [](VarlenSetup& d) { d.a.max_seqlen_q = 2; }},
      {"KeysLongerThanMax", "max_seqlen_k", kInvalid, [](VarlenSetup& d) { d.a.max_seqlen_k = 5; }},
      {"SequsedBeyondKeys", "seqused_k", kInvalid, [vec](VarlenSetup& d) {
         d.s.ints3 = {5, 6};  // sequence 0 has 4 keys
         d.a.seqused_k = vec(d.s.ints3, 2);
       }},
      {"SequsedNegative", "seqused_k", kInvalid, [vec](VarlenSetup& d) {
         d.s.ints3 = {-1, 6};
         d.a.seqused_k = vec(d.s.ints3, 2);
       }},
      {"LeftpadBeyondEnd", "leftpad_k", kInvalid, [vec](VarlenSetup& d) {
         d.s.ints3 = {0, 7};  // sequence 1 has 6 keys
         d.a.leftpad_k = vec(d.s.ints3, 2);
       }},
      {"LeftpadBeyondSeqused", "leftpad_k", kInvalid, [vec](VarlenSetup& d) {
         d.s.ints3 = {2, 6};
         d.s.table = {3, 6};
         d.a.seqused_k = vec(d.s.ints3, 2);
         d.a.leftpad_k = vec(d.s.table, 2);
       }},
      {"LeftpadNegative", "leftpad_k", kInvalid, [vec](VarlenSetup& d) {
         d.s.ints3 = {-1, 0};
         d.a.leftpad_k = vec(d.s.ints3, 2);
       }},
      // lengths are differences of int32 entries: computed in 64 bits, an overflow is a decrease
      {"CuSeqlensQDifferenceOverflows", "cu_seqlens_q", kInvalid, [](VarlenSetup& d) {
         d.s.ints = {0, 2, std::numeric_limits<int>::min()};
       }},
      {"CuSeqlensKDifferenceOverflows", "cu_seqlens_k", kInvalid, [](VarlenSetup& d) {
         d.s.ints2 = {0, 4, std::numeric_limits<int>::min()};
       }},
      {"CuSeqlensKUpToInt32Max", "max_seqlen_k", kInvalid, [](VarlenSetup& d) {
         d.s.ints2 = {0, std::numeric_limits<int>::max(), std::numeric_limits<int>::min()};
         d.a.max_seqlen_k = std::numeric_limits<int>::max();
       }},
      {"MaxSeqlensSumAtLeast2To31", "max_seqlen_k", kInvalid, [](VarlenSetup& d) {
         d.a.max_seqlen_q = 1 << 30;
         d.a.max_seqlen_k = 1 << 30;
       }},
      {"TotalQAtLeast2To31", "q", kInvalid, [](VarlenSetup& d) { d.q.shape[0] = d.out.shape[0] = int64_t(1) << 31; }},
      {"CuSeqlensQEndsBeforeTotal", "cu_seqlens_q", kInvalid, [](VarlenSetup& d) {
         d.q = t16(d.s.q, {6, kH, kD});  // row 5 would belong to no sequence: never written
         d.out = t16(d.s.out, {6, kH, kD});
       }},
      {"OutIsQ", "out", kInvalid, [](VarlenSetup& d) { d.out = d.q; }},
      {"OutOverlapsCuSeqlens", "out", kInvalid, [](VarlenSetup& d) {
         d.out = Tensor::contiguous(d.s.ints.data(), DType::f16, {5, kH, kD});
       }},
      {"CuSeqlensQBeyondTotal", "cu_seqlens_q", kInvalid, [](VarlenSetup& d) {
         d.q = t16(d.s.q, {4, kH, kD});
         d.out = t16(d.s.out, {4, kH, kD});
       }},
      {"CuSeqlensKBeyondTotal", "cu_seqlens_k", kInvalid, [](VarlenSetup& d) {
         d.k = t16(d.s.k, {9, kHk, kD});
         d.v = t16(d.s.v, {9, kHk, kD});
       }},
      // paged
      {"PagedKNotFourDims", "k", kInvalid, [](VarlenSetup& d) {
         d.make_paged();
         d.k = t16(d.s.k, {10, kHk, kD});
         d.v = t16(d.s.v, {10, kHk, kD});
       }},
      {"BlockTableWrongBatch", "block_table", kInvalid, [](VarlenSetup& d) {
         d.make_paged();
         d.a.block_table = Tensor::contiguous(d.s.table.data(), DType::i32, {3, 2});
       }},
      {"BlockTableOneDim", "block_table", kInvalid, [](VarlenSetup& d) {
         d.make_paged();
         d.a.block_table = Tensor::contiguous(d.s.table.data(), DType::i32, {6});
       }},
      {"BlockTableNotInt", "block_table", kType, [](VarlenSetup& d) {
         d.make_paged();
         d.a.block_table.dtype = DType::f32;
       }},
      {"BlockTablePageOutOfRange", "block_table", kInvalid, [](VarlenSetup& d) {
         d.make_paged();
         d.s.table[4] = kNumPages + 1;
       }},
      {"BlockTableNegativePage", "block_table", kInvalid, [](VarlenSetup& d) {
         d.make_paged();
         d.s.table[0] = -1;  // sequence 0's only page in use (4 keys)
       }},
      {"BlockTablePaddingBeforeLastPageInUse", "block_table", kInvalid, [](VarlenSetup& d) {
         d.make_paged();
         d.s.table[3] = -1;  // sequence 1 (6 keys) uses columns 0 and 1
       }},
      {"BlockTableTooFewPages", "block_table", kInvalid, [](VarlenSetup& d) {
         d.make_paged();  // 1 page of 4 rows cannot hold 6 keys
         d.a.block_table = Tensor::contiguous(d.s.table.data(), DType::i32, {2, 1});
       }},
      {"PageSizeZero", "k", kInvalid, [](VarlenSetup& d) {
         d.make_paged();
         d.k = t16(d.s.k, {kNumPages + 1, 0, kHk, kD});
         d.v = t16(d.s.v, {kNumPages + 1, 0, kHk, kD});
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenRuleTest, ::testing::ValuesIn(varlen_rules()),
                         [](const ::testing::TestParamInfo<VarlenRule>& i) { return i.param.name; });

// =============================================================================================
// forward_kvcache (and plan_kvcache, which validates the same way)
// =============================================================================================

constexpr int kCap = 8, kNew = 2, kRotHalf = 4;

struct KVSetup {
  Storage s;
  Tensor q, kc, vc, out;
  flashattn::KVCacheArgs a;
  flashattn::AttentionOptions o;
  KVSetup() {
    q = t16(s.q, {kB, kSq, kH, kD});
    kc = t16(s.k, {kB, kCap, kHk, kD});
    vc = t16(s.v, {kB, kCap, kHk, kD});
    out = t16(s.out, {kB, kSq, kH, kD});
    s.ints = {3, 5};  // cache_seqlens
    a.cache_seqlens = Tensor::contiguous(s.ints.data(), DType::i32, {kB});
    a.k_new = t16(s.kn, {kB, kNew, kHk, kD});
    a.v_new = t16(s.vn, {kB, kNew, kHk, kD});
    a.rotary_cos = t16(s.cos, {kCap + 4, kRotHalf});
    a.rotary_sin = t16(s.sin, {kCap + 4, kRotHalf});
    o.num_threads = 1;
    o.causal = true;
  }
  void make_paged() {  // 2 pages of 4 rows per sequence, capacity 8
    kc = t16(s.k, {kNumPages, kPage, kHk, kD});
    vc = t16(s.v, {kNumPages, kPage, kHk, kD});
    s.table = {4, 0, 2, 1};
    a.block_table = Tensor::contiguous(s.table.data(), DType::i32, {kB, kPagesPerSeq});
  }
  void call() { flashattn::forward_kvcache(q, kc, vc, out, a, o); }
};

struct KVRule {
  std::string name;
  std::string arg;
  Kind kind;
  std::function<void(KVSetup&)> breaks;
};

void PrintTo(const KVRule& r, std::ostream* os) { *os << r.name; }

class KVCacheRuleTest : public ::testing::TestWithParam<KVRule> {};

TEST(KVCacheValidation, ValidBaseline) {
  KVSetup d;
  EXPECT_NO_THROW(d.call());
  KVSetup p;
  p.make_paged();
  EXPECT_NO_THROW(p.call());
  KVSetup w;  // caller workspace of exactly the planned size
  w.a.num_splits = 3;
  const flashattn::Plan plan = flashattn::plan_kvcache(w.q, w.kc, w.vc, w.a, w.o);
  ASSERT_LE(plan.workspace_bytes, sizeof(w.s.workspace));
  w.a.workspace = w.s.workspace;
  w.a.workspace_bytes = plan.workspace_bytes;
  EXPECT_NO_THROW(w.call());
}

TEST_P(KVCacheRuleTest, RejectsAndWritesNothing) {
  const KVRule& r = GetParam();
  if (r.name.rfind("Cuda", 0) == 0 && !flashattn::cuda_available()) GTEST_SKIP() << "needs a CUDA build (a compiled head dim)";
  KVSetup d;
  r.breaks(d);
  const std::vector<uint16_t> out_before = d.s.out, k_before = d.s.k, v_before = d.s.v;
  const Outcome o = capture([&] { d.call(); });
  if (r.name.rfind("Cuda", 0) == 0 && o.kind == Kind::unsupported) GTEST_SKIP() << o.message;
  EXPECT_TRUE(rejected(o, r.arg, r.kind));
  EXPECT_TRUE(d.s.out == out_before) << "out was written";
  EXPECT_TRUE(d.s.k == k_before) << "k_cache was written";
  EXPECT_TRUE(d.s.v == v_before) << "v_cache was written";
}

// plan_kvcache validates the same arguments (except out and the workspace).
TEST_P(KVCacheRuleTest, PlanRejectsToo) {
  const KVRule& r = GetParam();
  const bool breaks_out = r.name.rfind("Out", 0) == 0 || r.name.rfind("Workspace", 0) == 0;
  if (r.arg == "out" || r.arg == "workspace" || r.arg == "workspace_bytes" || breaks_out) GTEST_SKIP() << "not a plan argument";
  if (r.name.rfind("Cuda", 0) == 0 && !flashattn::cuda_available()) GTEST_SKIP() << "needs a CUDA build (a compiled head dim)";
  KVSetup d;
  r.breaks(d);
  const Outcome o = capture([&] { flashattn::plan_kvcache(d.q, d.kc, d.vc, d.a, d.o); });
  if (r.name.rfind("Cuda", 0) == 0 && o.kind == Kind::unsupported) GTEST_SKIP() << o.message;
  EXPECT_TRUE(rejected(o, r.arg, r.kind));
}

// An e4m3 cache with per-(batch, KV head) descales under the f16 q (and k_new, v_new).
void make_fp8_cache(KVSetup& d) {
  as_e4m3(d.kc), as_e4m3(d.vc);
  d.o.k_descale = descale(d.s.alibi, {kB, kHk});
  d.o.v_descale = descale(d.s.alibi, {1});
}
// ... and an e4m3 q: out, k_new and v_new bf16, no rotary (an e4m3 q is not rotated).
void make_fp8_q(KVSetup& d) {
  make_fp8_cache(d);
  as_e4m3(d.q);
  d.o.q_descale = descale(d.s.alibi, {kB, kHk});
  d.out.dtype = d.a.k_new.dtype = d.a.v_new.dtype = DType::bf16;
  d.a.rotary_cos = d.a.rotary_sin = Tensor{};
}

TEST(KVCacheValidation, Fp8ValidBaseline) {
  for (bool e4m3_q : {false, true}) {
    KVSetup d;
    e4m3_q ? make_fp8_q(d) : make_fp8_cache(d);
    const std::vector<uint16_t> k_before = d.s.k;
    EXPECT_NO_THROW(d.call()) << "e4m3 q " << e4m3_q;
    EXPECT_TRUE(d.s.k != k_before) << "the appended keys were quantized into the cache";
    KVSetup p;
    p.make_paged();
    e4m3_q ? make_fp8_q(p) : make_fp8_cache(p);
    EXPECT_NO_THROW(p.call()) << "paged, e4m3 q " << e4m3_q;
  }
}

std::vector<KVRule> kvcache_rules() {
  auto vec = [](std::vector<int>& s, int64_t n) { return Tensor::contiguous(s.data(), DType::i32, {n}); };
  return {
      // FP8
      {"Fp8VCacheNotE4m3", "v_cache", kType, [](KVSetup& d) { make_fp8_cache(d), d.vc.dtype = DType::f16; }},
      {"Fp8CacheKNewE4m3", "k_new", kType, [](KVSetup& d) { make_fp8_cache(d), as_e4m3(d.a.k_new); }},
      {"Fp8QOverF16Cache", "k_cache", kType, [](KVSetup& d) {
         make_fp8_q(d), d.kc.dtype = d.vc.dtype = DType::f16;
       }},
      {"Fp8QWithRotary", "rotary_cos", Kind::unsupported, [](KVSetup& d) {
         make_fp8_q(d);
         d.a.rotary_cos = t16(d.s.cos, {kCap + 4, kRotHalf});
         d.a.rotary_sin = t16(d.s.sin, {kCap + 4, kRotHalf});
       }},
      {"Fp8QKNewNotBf16", "k_new", kType, [](KVSetup& d) { make_fp8_q(d), d.a.k_new.dtype = DType::f16; }},
      {"KDescaleWithoutFp8Cache", "k_descale", kInvalid, [](KVSetup& d) { d.o.k_descale = descale(d.s.alibi, {1}); }},
      {"Fp8DescaleWrongBatch", "v_descale", kInvalid, [](KVSetup& d) {
         make_fp8_cache(d), d.o.v_descale = descale(d.s.alibi, {kB + 1, kHk});
       }},
      {"KCacheMissing", "k_cache", kInvalid, [](KVSetup& d) { d.kc = Tensor{}; }},
      {"VCacheMissing", "v_cache", kInvalid, [](KVSetup& d) { d.vc = Tensor{}; }},
      {"KCacheNotFourDims", "k_cache", kInvalid, [](KVSetup& d) {
         d.kc = t16(d.s.k, {kB * kCap, kHk, kD});
         d.vc = t16(d.s.v, {kB * kCap, kHk, kD});
       }},
      {"KCacheHeadDimDiffers", "k_cache", kInvalid, [](KVSetup& d) {
         d.kc = t16(d.s.k, {kB, kCap, kHk, kD / 2});
         d.vc = t16(d.s.v, {kB, kCap, kHk, kD / 2});
       }},
      {"KCacheBatchDiffers", "k_cache", kInvalid, [](KVSetup& d) {
         d.kc = t16(d.s.k, {kB + 1, kCap, kHk, kD});
         d.vc = t16(d.s.v, {kB + 1, kCap, kHk, kD});
       }},
      // k_cache / v_cache are the argument names of forward_kvcache
      {"KCacheDtypeDiffers", "k_cache", kType, [](KVSetup& d) { d.kc.dtype = DType::bf16; }},
      {"VCacheShapeDiffers", "v_cache", kInvalid, [](KVSetup& d) { d.vc = t16(d.s.v, {kB, kCap - 1, kHk, kD}); }},
      {"HeadsNotMultiple", "k_cache", kInvalid, [](KVSetup& d) {
         d.kc = t16(d.s.k, {kB, kCap, 3, kD});
         d.vc = t16(d.s.v, {kB, kCap, 3, kD});
       }},
      {"OutShapeDiffers", "out", kInvalid, [](KVSetup& d) { d.out = t16(d.s.out, {kB, kSq + 1, kH, kD}); }},
      {"BatchIdxWithBlockTable", "cache_batch_idx", kInvalid, [vec](KVSetup& d) {
         d.make_paged();
         d.s.ints2 = {0, 1};
         d.a.cache_batch_idx = vec(d.s.ints2, kB);
       }},
      {"CacheSeqlensWrongLength", "cache_seqlens", kInvalid, [vec](KVSetup& d) { d.a.cache_seqlens = vec(d.s.ints, kB + 1); }},
      {"CacheSeqlensNotInt", "cache_seqlens", kType, [](KVSetup& d) { d.a.cache_seqlens.dtype = DType::f32; }},
      {"CacheBatchIdxWrongLength", "cache_batch_idx", kInvalid, [vec](KVSetup& d) {
         d.s.ints2 = {0, 1, 0};
         d.a.cache_batch_idx = vec(d.s.ints2, 3);
       }},
      {"CacheLeftpadWrongLength", "cache_leftpad", kInvalid, [vec](KVSetup& d) { d.a.cache_leftpad = vec(d.s.ints3, 1); }},
      {"CacheLeftpadOtherDevice", "cache_leftpad", kInvalid, [vec](KVSetup& d) {
         d.a.cache_leftpad = vec(d.s.ints3, kB);
         d.a.cache_leftpad.device = Device::cuda;
       }},
      {"KNewWithoutVNew", "v_new", kInvalid, [](KVSetup& d) { d.a.v_new = Tensor{}; }},
      {"VNewWithoutKNew", "k_new", kInvalid, [](KVSetup& d) { d.a.k_new = Tensor{}; }},
      {"KNewDtypeDiffers", "k_new", kType, [](KVSetup& d) { d.a.k_new.dtype = DType::bf16; }},
      {"KNewNotFourDims", "k_new", kInvalid, [](KVSetup& d) { d.a.k_new = t16(d.s.kn, {kB * kNew, kHk, kD}); }},
      {"KNewWrongBatch", "k_new", kInvalid, [](KVSetup& d) {
         d.a.k_new = t16(d.s.kn, {kB + 1, kNew, kHk, kD});
         d.a.v_new = t16(d.s.vn, {kB + 1, kNew, kHk, kD});
       }},
      {"KNewWrongHeads", "k_new", kInvalid, [](KVSetup& d) {
         d.a.k_new = t16(d.s.kn, {kB, kNew, kH, kD});
         d.a.v_new = t16(d.s.vn, {kB, kNew, kH, kD});
       }},
      {"KNewWrongHeadDim", "k_new", kInvalid, [](KVSetup& d) {
         d.a.k_new = t16(d.s.kn, {kB, kNew, kHk, kD / 2});
         d.a.v_new = t16(d.s.vn, {kB, kNew, kHk, kD / 2});
       }},
      {"VNewLengthDiffers", "v_new", kInvalid, [](KVSetup& d) { d.a.v_new = t16(d.s.vn, {kB, kNew + 1, kHk, kD}); }},
      {"VNewStrided", "v_new", kInvalid, [](KVSetup& d) { d.a.v_new.stride[3] = 2; }},
      {"KNewWithoutCacheSeqlens", "cache_seqlens", kInvalid, [](KVSetup& d) {
         d.a.cache_seqlens = Tensor{};
         d.a.rotary_cos = d.a.rotary_sin = Tensor{};
       }},
      {"KNewLongerThanCache", "k_new", kInvalid, [](KVSetup& d) {
         d.a.k_new = t16(d.s.kn, {kB, kCap + 1, kHk, kD});
         d.a.v_new = t16(d.s.vn, {kB, kCap + 1, kHk, kD});
       }},
      {"RotaryCosWithoutSin", "rotary_sin", kInvalid, [](KVSetup& d) { d.a.rotary_sin = Tensor{}; }},
      {"RotarySinWithoutCos", "rotary_cos", kInvalid, [](KVSetup& d) { d.a.rotary_cos = Tensor{}; }},
      {"RotaryDtypeDiffers", "rotary_cos", kType, [](KVSetup& d) { d.a.rotary_cos.dtype = DType::bf16; }},
      {"RotaryOneDim", "rotary_cos", kInvalid, [](KVSetup& d) {
         d.a.rotary_cos = t16(d.s.cos, {(kCap + 4) * kRotHalf});
         d.a.rotary_sin = t16(d.s.sin, {(kCap + 4) * kRotHalf});
       }},
      {"RotarySinShapeDiffers", "rotary_sin", kInvalid, [](KVSetup& d) { d.a.rotary_sin = t16(d.s.sin, {kCap + 4, kRotHalf - 1}); }},
      {"RotaryWithoutCacheSeqlens", "cache_seqlens", kInvalid, [](KVSetup& d) {
         d.a.cache_seqlens = Tensor{};
         d.a.k_new = d.a.v_new = Tensor{};
       }},
      {"RotaryDimBeyondHeadDim", "rotary_cos", kInvalid, [](KVSetup& d) {
         d.a.rotary_cos = t16(d.s.cos, {kCap + 4, kD / 2 + 1});
         d.a.rotary_sin = t16(d.s.sin, {kCap + 4, kD / 2 + 1});
       }},
      {"RotaryEmpty", "rotary_cos", kInvalid, [](KVSetup& d) {
         d.a.rotary_cos = t16(d.s.cos, {kCap + 4, 0});
         d.a.rotary_sin = t16(d.s.sin, {kCap + 4, 0});
       }},
      {"RotaryTooFewPositions", "rotary_cos", kInvalid, [](KVSetup& d) {
         d.a.rotary_cos = t16(d.s.cos, {kCap - 1, kRotHalf});
         d.a.rotary_sin = t16(d.s.sin, {kCap - 1, kRotHalf});
       }},
      {"RotaryRowStridesDiffer", "rotary_sin", kInvalid, [](KVSetup& d) {
         d.a.rotary_sin = Tensor::strided(d.s.sin.data(), DType::f16, {kCap + 4, kRotHalf}, {2 * kRotHalf, 1});
       }},
      {"CudaRotaryNotContiguous", "rotary_cos", kInvalid, [](KVSetup& d) {
         for (Tensor* t : {&d.q, &d.kc, &d.vc, &d.out, &d.a.k_new, &d.a.v_new, &d.a.cache_seqlens}) t->device = Device::cuda;
         d.a.rotary_cos = Tensor::strided(d.s.cos.data(), DType::f16, {kCap + 4, kRotHalf}, {2 * kRotHalf, 1}, Device::cuda);
         d.a.rotary_sin = Tensor::strided(d.s.sin.data(), DType::f16, {kCap + 4, kRotHalf}, {2 * kRotHalf, 1}, Device::cuda);
         // head dim 16 may lack a compiled instance: use one the default build has (32)
         d.q = Tensor::contiguous(d.s.q.data(), DType::f16, {kB, kSq, kH, 32}, Device::cuda);
         d.out = Tensor::contiguous(d.s.out.data(), DType::f16, {kB, kSq, kH, 32}, Device::cuda);
         d.kc = Tensor::contiguous(d.s.k.data(), DType::f16, {kB, kCap, kHk, 32}, Device::cuda);
         d.vc = Tensor::contiguous(d.s.v.data(), DType::f16, {kB, kCap, kHk, 32}, Device::cuda);
         d.a.k_new = Tensor::contiguous(d.s.kn.data(), DType::f16, {kB, kNew, kHk, 32}, Device::cuda);
         d.a.v_new = Tensor::contiguous(d.s.vn.data(), DType::f16, {kB, kNew, kHk, 32}, Device::cuda);
       }},
      {"NumSplitsNegative", "num_splits", kInvalid, [](KVSetup& d) { d.a.num_splits = -1; }},
      {"NumSplitsTooMany", "num_splits", kInvalid, [](KVSetup& d) { d.a.num_splits = flashattn::kMaxSplits + 1; }},
      {"BatchIdxOutOfRange", "cache_batch_idx", kInvalid, [vec](KVSetup& d) {
         d.s.ints2 = {1, kB};
         d.a.cache_batch_idx = vec(d.s.ints2, kB);
       }},
      {"BatchIdxNegative", "cache_batch_idx", kInvalid, [vec](KVSetup& d) {
         d.s.ints2 = {-1, 0};
         d.a.cache_batch_idx = vec(d.s.ints2, kB);
       }},
      {"CacheSeqlensPlusNewBeyondCapacity", "cache_seqlens", kInvalid, [](KVSetup& d) { d.s.ints = {3, kCap - kNew + 1}; }},
      {"CacheSeqlensNegative", "cache_seqlens", kInvalid, [](KVSetup& d) { d.s.ints = {-1, 2}; }},
      // cache_seqlens + seqlen_new in 64 bits (an int32 sum wraps to a negative row)
      {"CacheSeqlensInt32MaxPlusNew", "cache_seqlens", kInvalid, [](KVSetup& d) {
         d.s.ints = {std::numeric_limits<int>::max(), 2};
       }},
      {"PagedCacheSeqlensInt32MaxPlusNew", "cache_seqlens", kInvalid, [](KVSetup& d) {
         d.make_paged();
         d.s.ints = {std::numeric_limits<int>::max(), 2};
       }},
      {"PagedCapacityAtLeast2To31", "block_table", kInvalid, [](KVSetup& d) {
         d.make_paged();  // (never read) 2^29 pages of 4 rows per sequence
         d.a.block_table = Tensor::strided(d.s.table.data(), DType::i32, {kB, int64_t(1) << 29}, {0, 1});
       }},
      {"CacheCapacityPlusSeqlenQAtLeast2To31", "k_cache", kInvalid, [](KVSetup& d) {
         d.kc.shape[1] = d.vc.shape[1] = std::numeric_limits<int>::max();
       }},
      // rotary: every position of q has a row of rotary_cos/sin (causal: cache_seqlens[b] + i)
      {"RotaryQPositionPastTable", "rotary_cos", kInvalid, [](KVSetup& d) {
         d.s.ints = {3, kCap - kNew};  // q rows of sequence 1 at positions 6, 7, 8
         d.a.rotary_cos = t16(d.s.cos, {kCap, kRotHalf});
         d.a.rotary_sin = t16(d.s.sin, {kCap, kRotHalf});
       }},
      // appends must not overwrite one another
      {"DuplicateBatchIdxWithAppend", "cache_batch_idx", kInvalid, [vec](KVSetup& d) {
         d.s.ints2 = {1, 1};
         d.a.cache_batch_idx = vec(d.s.ints2, kB);
       }},
      {"TwoSequencesAppendIntoOnePage", "block_table", kInvalid, [](KVSetup& d) {
         d.make_paged();
         d.s.table = {4, 0, 2, 0};  // positions 4 (sequence 0) and 5, 6 (sequence 1) in page 0
       }},
      {"OneSequenceListsAPageTwice", "block_table", kInvalid, [](KVSetup& d) {
         d.make_paged();
         d.s.table = {4, 4, 2, 1};  // sequence 0 appends at positions 3 and 4: page 4 twice
       }},
      {"PagedEntryInUseNegative", "block_table", kInvalid, [](KVSetup& d) {
         d.make_paged();
         d.s.table = {4, 0, -1, 1};
       }},
      {"VCacheIsKCache", "k_cache", kInvalid, [](KVSetup& d) { d.vc = d.kc; }},
      {"KCacheRowsShareMemory", "k_cache", kInvalid, [](KVSetup& d) { d.kc.stride[0] = 0; }},
      {"KNewInsideKCache", "k_cache", kInvalid, [](KVSetup& d) { d.a.k_new = t16(d.s.k, {kB, kNew, kHk, kD}); }},
      {"OutOverlapsKCache", "k_cache", kInvalid, [](KVSetup& d) { d.out = t16(d.s.k, {kB, kSq, kH, kD}); }},
      {"OutIsQ", "out", kInvalid, [](KVSetup& d) { d.out = d.q; }},
      {"OutOverlapsRotary", "out", kInvalid, [](KVSetup& d) { d.out = t16(d.s.cos, {kB, kSq, kH, kD}); }},
      {"WorkspaceOverlapsOut", "workspace", kInvalid, [](KVSetup& d) {
         d.a.num_splits = 3;
         d.a.workspace = d.s.workspace;
         d.a.workspace_bytes = sizeof(d.s.workspace);
         d.out = Tensor::contiguous(d.s.workspace + 512, DType::f16, {kB, kSq, kH, kD});
       }},
      {"PagedSeqlensBeyondCapacity", "cache_seqlens", kInvalid, [](KVSetup& d) {
         d.make_paged();
         d.s.ints = {kPage * kPagesPerSeq - 1, 0};
       }},
      {"LeftpadBeyondSeqlens", "cache_leftpad", kInvalid, [vec](KVSetup& d) {
         d.s.ints3 = {4, 0};  // cache_seqlens[0] = 3
         d.a.cache_leftpad = vec(d.s.ints3, kB);
       }},
      {"LeftpadNegative", "cache_leftpad", kInvalid, [vec](KVSetup& d) {
         d.s.ints3 = {0, -2};
         d.a.cache_leftpad = vec(d.s.ints3, kB);
       }},
      {"PagedBlockTablePageOutOfRange", "block_table", kInvalid, [](KVSetup& d) {
         d.make_paged();
         d.s.table[3] = kNumPages;
       }},
      {"PagedBlockTableWrongBatch", "block_table", kInvalid, [](KVSetup& d) {
         d.make_paged();
         d.a.block_table = Tensor::contiguous(d.s.table.data(), DType::i32, {1, 4});
       }},
      {"WorkspaceMisaligned", "workspace", kInvalid, [](KVSetup& d) {
         d.a.num_splits = 3;
         d.a.workspace = d.s.workspace + 8;
         d.a.workspace_bytes = sizeof(d.s.workspace) - 256;
       }},
      {"WorkspaceTooSmall", "workspace_bytes", kInvalid, [](KVSetup& d) {
         d.a.num_splits = 3;
         d.a.workspace = d.s.workspace;
         d.a.workspace_bytes = 16;
       }},
      {"WorkspaceBytesWithoutPointer", "workspace", kInvalid, [](KVSetup& d) {
         d.a.workspace = nullptr;
         d.a.workspace_bytes = 1024;
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(KVCache, KVCacheRuleTest, ::testing::ValuesIn(kvcache_rules()),
                         [](const ::testing::TestParamInfo<KVRule>& i) { return i.param.name; });

}  // namespace
}  // namespace fa_test
