// The CPU backend's thread count (AttentionOptions::num_threads) changes how work is divided
// (and, through planning, the split count) but not the answer: every count passes the oracle
// and agrees with one thread. Repeated runs with the same count are bit-identical (no races).
#include <gtest/gtest.h>

#include <thread>

#include "sweep_support.h"

namespace fa_test {
namespace {

constexpr int kB = 2, kSq = 113, kSk = 339, kH = 6, kHk = 2, kD = 64;

struct Result {
  std::vector<double> out, lse;
};

Result run_dense(const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v, int threads) {
  const Buffer dq = to_device(q, DType::bf16, Device::cpu), dk = to_device(k, DType::bf16, Device::cpu),
               dv = to_device(v, DType::bf16, Device::cpu);
  const Buffer dout = poisoned(DType::bf16, int64_t(q.size()), Device::cpu);
  const Buffer dlse = poisoned(DType::f32, int64_t(kB) * kH * kSq, Device::cpu);
  flashattn::AttentionOptions o;
  o.causal = true;
  o.window_left = 100;
  o.num_threads = threads;
  o.softmax_lse = f32_vector(dlse, {kB, kH, kSq});
  flashattn::forward(Tensor::contiguous(dq.data(), DType::bf16, {kB, kSq, kH, kD}),
                     Tensor::contiguous(dk.data(), DType::bf16, {kB, kSk, kHk, kD}),
                     Tensor::contiguous(dv.data(), DType::bf16, {kB, kSk, kHk, kD}),
                     Tensor::contiguous(dout.data(), DType::bf16, {kB, kSq, kH, kD}), o);
  return {from_device(dout, DType::bf16), from_device(dlse, DType::f32)};
}

TEST(Threads, DenseResultDoesNotDependOnThreadCount) {
  const std::vector<double> q = random_normal(int64_t(kB) * kSq * kH * kD, 1, DType::bf16);
  const std::vector<double> k = random_normal(int64_t(kB) * kSk * kHk * kD, 2, DType::bf16);
  const std::vector<double> v = random_normal(int64_t(kB) * kSk * kHk * kD, 3, DType::bf16);
  flashattn_ref::Options opt;
  opt.causal = true;
  opt.window_left = 100;
  std::vector<double> out64(q.size()), out_lowp(q.size()), lse64(size_t(kB) * kH * kSq), lse_lowp = lse64;
  for (int b = 0; b < kB; ++b) {
    const int64_t qo = int64_t(b) * kSq * kH * kD, ko = int64_t(b) * kSk * kHk * kD;
    const OracleOut r = run_oracle(DType::bf16, q.data() + qo, k.data() + ko, v.data() + ko, kSq,
                                   kSk, kH, kHk, kD, opt);
    place_out(out64, r.out64, int64_t(b) * kSq, kSq, kH, kD);
    place_out(out_lowp, r.out_lowp, int64_t(b) * kSq, kSq, kH, kD);
    place_lse(lse64, r.lse64, int64_t(b) * kH * kSq, kSq, kSq, kH);
    place_lse(lse_lowp, r.lse_lowp, int64_t(b) * kH * kSq, kSq, kSq, kH);
  }
  const Result one = run_dense(q, k, v, 1);
  EXPECT_TRUE(outputs_close("out, 1 thread", one.out, out64, out_lowp, DType::bf16));
  EXPECT_TRUE(lse_close("lse, 1 thread", one.lse, lse64, lse_lowp, DType::bf16));
  for (int threads : {2, 3, 8, 0}) {
    const Result r = run_dense(q, k, v, threads);
    const std::string what = std::to_string(threads) + " threads";
    EXPECT_TRUE(outputs_close("out, " + what, r.out, out64, out_lowp, DType::bf16));
    EXPECT_TRUE(results_agree("out, 1 vs " + what, one.out, r.out, out64, out_lowp, DType::bf16));
    const Result again = run_dense(q, k, v, threads);
    EXPECT_EQ(r.out, again.out) << what << ": two runs differ";
    EXPECT_EQ(r.lse, again.lse) << what << ": two runs differ";
  }
}

// Calls from several threads at once share one thread budget (src/cpu/parallel.h): each gets
// the helpers left, possibly none, and every call still gives the one-call answer.
TEST(Threads, ConcurrentCallsAgreeWithOneCall) {
  const std::vector<double> q = random_normal(int64_t(kB) * kSq * kH * kD, 4, DType::bf16);
  const std::vector<double> k = random_normal(int64_t(kB) * kSk * kHk * kD, 5, DType::bf16);
  const std::vector<double> v = random_normal(int64_t(kB) * kSk * kHk * kD, 6, DType::bf16);
  const Result alone = run_dense(q, k, v, 0);
  constexpr int kCallers = 4;
  std::vector<Result> results(kCallers);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] { results[c] = run_dense(q, k, v, 0); });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    EXPECT_EQ(results[c].out, alone.out) << "caller " << c;
    EXPECT_EQ(results[c].lse, alone.lse) << "caller " << c;
  }
}

}  // namespace
}  // namespace fa_test
