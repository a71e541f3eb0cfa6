// A NaN in a query row reaches that row's output and LSE (it is not taken for "no visible key",
// which gives 0 and -inf), in a dense call and through the split-KV merge of a KV-cache call;
// the other rows stay finite. Outputs start finite (not the usual NaN poison), so that a NaN
// seen afterwards was written by the call.
#include <gtest/gtest.h>

#include <cmath>

#include "sweep_support.h"

namespace fa_test {
namespace {

constexpr int kB = 2, kSq = 5, kSk = 300, kH = 4, kHk = 2, kD = 64;
constexpr int kNanBatch = 1, kNanQuery = 2, kNanHead = 3;

struct Inputs {
  Buffer q, k, v, out, lse;
};

Inputs make_inputs(DType dtype) {
  std::vector<double> q = random_normal(int64_t(kB) * kSq * kH * kD, 11, dtype);
  q[((int64_t(kNanBatch) * kSq + kNanQuery) * kH + kNanHead) * kD + 7] = NAN;
  const int64_t kv = int64_t(kB) * kSk * kHk * kD;
  return {to_device(q, dtype, Device::cpu), to_device(random_normal(kv, 12, dtype), dtype, Device::cpu),
          to_device(random_normal(kv, 13, dtype), dtype, Device::cpu),
          to_device(std::vector<double>(q.size(), 0.5), dtype, Device::cpu),
          to_device(std::vector<double>(size_t(kB) * kH * kSq, 0.5), DType::f32, Device::cpu)};
}

// Every element of the NaN row is NaN, every other one finite.
void expect_only_nan_row(const Inputs& in, DType dtype, const std::string& what) {
  const std::vector<double> out = from_device(in.out, dtype), lse = from_device(in.lse, DType::f32);
  for (int b = 0; b < kB; ++b) {
    for (int i = 0; i < kSq; ++i) {
      for (int h = 0; h < kH; ++h) {
        const bool nan_row = b == kNanBatch && i == kNanQuery && h == kNanHead;
        const double l = lse[(int64_t(b) * kH + h) * kSq + i];
        EXPECT_EQ(std::isnan(l), nan_row) << what << ": lse b=" << b << " i=" << i << " h=" << h << " is " << l;
        for (int c = 0; c < kD; ++c) {
          const double x = out[((int64_t(b) * kSq + i) * kH + h) * kD + c];
          ASSERT_EQ(std::isnan(x), nan_row) << what << ": out b=" << b << " i=" << i << " h=" << h << " c=" << c
                                            << " is " << x;
        }
      }
    }
  }
}

class NanQuery : public ::testing::TestWithParam<DType> {};

TEST_P(NanQuery, DenseRowIsNan) {
  const DType dtype = GetParam();
  const Inputs in = make_inputs(dtype);
  flashattn::AttentionOptions o;
  o.causal = true;
  o.softmax_lse = f32_vector(in.lse, {kB, kH, kSq});
  flashattn::forward(Tensor::contiguous(in.q.data(), dtype, {kB, kSq, kH, kD}),
                     Tensor::contiguous(in.k.data(), dtype, {kB, kSk, kHk, kD}),
                     Tensor::contiguous(in.v.data(), dtype, {kB, kSk, kHk, kD}),
                     Tensor::contiguous(in.out.data(), dtype, {kB, kSq, kH, kD}), o);
  expect_only_nan_row(in, dtype, "dense");
}

TEST_P(NanQuery, SplitKVRowIsNan) {
  const DType dtype = GetParam();
  const Inputs in = make_inputs(dtype);
  flashattn::AttentionOptions o;
  o.softmax_lse = f32_vector(in.lse, {kB, kH, kSq});
  flashattn::KVCacheArgs args;
  args.num_splits = 3;
  flashattn::forward_kvcache(Tensor::contiguous(in.q.data(), dtype, {kB, kSq, kH, kD}),
                             Tensor::contiguous(in.k.data(), dtype, {kB, kSk, kHk, kD}),
                             Tensor::contiguous(in.v.data(), dtype, {kB, kSk, kHk, kD}),
                             Tensor::contiguous(in.out.data(), dtype, {kB, kSq, kH, kD}), args, o);
  expect_only_nan_row(in, dtype, "split-KV, 3 splits");
}

INSTANTIATE_TEST_SUITE_P(Cpu, NanQuery, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& info) { return short_name(info.param); });

}  // namespace
}  // namespace fa_test
