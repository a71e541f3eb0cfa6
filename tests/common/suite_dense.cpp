// Dense forward: q (b, sq, h, d), k/v (b, sk, hk, d), against the float64 oracle.
#include <cmath>

#include "sweep_support.h"

namespace fa_test {

namespace {

constexpr uint64_t kSeedQ = 101, kSeedK = 102, kSeedV = 103, kSeedAlibi = 104, kSeedFp8 = 105;

// The element views of q, k, v and out, and whether q/k/v share one buffer.
struct DenseViews {
  View q, k, v, out;
  bool shared = false;
};

DenseViews views_of(const DenseCase& c) {
  DenseViews w;
  switch (c.layout) {
    case Layout::contiguous:
      w.q = contiguous_view({c.b, c.sq, c.h, c.d});
      w.k = contiguous_view({c.b, c.sk, c.hk, c.d});
      w.v = contiguous_view({c.b, c.sk, c.hk, c.d});
      w.out = contiguous_view({c.b, c.sq, c.h, c.d});
      break;
    case Layout::padded:
      w.q = padded_view({c.b, c.sq, c.h, c.d}, kPadElements);
      w.k = padded_view({c.b, c.sk, c.hk, c.d}, 2 * kPadElements);
      w.v = padded_view({c.b, c.sk, c.hk, c.d}, kPadElements);
      w.out = padded_view({c.b, c.sq, c.h, c.d}, kPadElements);
      break;
    case Layout::qkv_packed: {  // (b, s, h + 2 hk, d), sq == sk
      const int64_t heads = c.h + 2 * c.hk;
      const int64_t row = heads * c.d, batch = int64_t(c.sq) * row;
      w.q = strided_view({c.b, c.sq, c.h, c.d}, {batch, row, c.d, 1}, 0);
      w.k = strided_view({c.b, c.sk, c.hk, c.d}, {batch, row, c.d, 1}, int64_t(c.h) * c.d);
      w.v = strided_view({c.b, c.sk, c.hk, c.d}, {batch, row, c.d, 1}, int64_t(c.h + c.hk) * c.d);
      w.out = contiguous_view({c.b, c.sq, c.h, c.d});
      w.shared = true;
      break;
    }
  }
  return w;
}

void run_dense(const DenseCase& c) {
  // stored values (e4m3 numbers for an FP8 case, scaled by fp8's factors)
  const DType in = c.fp8 != Fp8::none ? DType::e4m3 : c.dtype;
  const std::vector<double> q = random_normal(int64_t(c.b) * c.sq * c.h * c.d, kSeedQ, in);
  const std::vector<double> k = random_normal(int64_t(c.b) * c.sk * c.hk * c.d, kSeedK, in);
  const std::vector<double> v = random_normal(int64_t(c.b) * c.sk * c.hk * c.d, kSeedV, in);
  const Fp8Scales fp8 = make_fp8_scales(c.fp8, c.b, c.hk, c.device, kSeedFp8);
  const DenseViews w = views_of(c);

  // inputs on the device (gaps between view elements stay NaN)
  std::vector<double> qbuf, kbuf, vbuf;
  scatter(qbuf, w.q, q);
  scatter(w.shared ? qbuf : kbuf, w.k, k);
  scatter(w.shared ? qbuf : vbuf, w.v, v);
  const Buffer dq = to_device(qbuf, in, c.device);
  const Buffer dk = w.shared ? Buffer() : to_device(kbuf, in, c.device);
  const Buffer dv = w.shared ? Buffer() : to_device(vbuf, in, c.device);
  const Buffer dout = poisoned(c.dtype, w.out.extent(), c.device);
  const Buffer dlse = poisoned(DType::f32, int64_t(c.b) * c.h * c.sq, c.device);
  const AlibiData alibi = make_alibi(c.f.alibi, c.b, c.h, c.device, kSeedAlibi);

  const Tensor lse = c.f.lse ? f32_vector(dlse, {c.b, c.h, c.sq}) : Tensor{};
  flashattn::AttentionOptions opts = api_options(c.f, alibi, c.b, lse);
  fp8.set_options(opts, true);
  flashattn::forward(tensor_of(dq, in, w.q), tensor_of(w.shared ? dq : dk, in, w.k),
                     tensor_of(w.shared ? dq : dv, in, w.v), tensor_of(dout, c.dtype, w.out),
                     opts);

  // implementation results
  const std::vector<double> out_all = from_device(dout, c.dtype);
  EXPECT_TRUE(poison_outside_view_intact(out_all, w.out)) << "out: wrote outside its view";
  const std::vector<double> out = gather(out_all, w.out);
  const std::vector<double> lse_impl = from_device(dlse, DType::f32);

  // oracle, one batch entry at a time
  std::vector<double> out64(out.size()), out_lowp(out.size());
  std::vector<double> lse64(lse_impl.size()), lse_lowp(lse_impl.size());
  const int64_t q_batch = int64_t(c.sq) * c.h * c.d, k_batch = int64_t(c.sk) * c.hk * c.d;
  for (int b = 0; b < c.b; ++b) {
    const std::vector<double> qb = fp8.descaled(fp8.q, q.data() + b * q_batch, c.sq, c.h, c.d, b);
    const std::vector<double> kb = fp8.descaled(fp8.k, k.data() + b * k_batch, c.sk, c.hk, c.d, b);
    const std::vector<double> vb = fp8.descaled(fp8.v, v.data() + b * k_batch, c.sk, c.hk, c.d, b);
    const OracleOut r = run_oracle(c.dtype, qb.data(), kb.data(), vb.data(), c.sq, c.sk, c.h, c.hk, c.d,
                                   ref_options(c.f, alibi, b));
    place_out(out64, r.out64, int64_t(b) * c.sq, c.sq, c.h, c.d);
    place_out(out_lowp, r.out_lowp, int64_t(b) * c.sq, c.sq, c.h, c.d);
    place_lse(lse64, r.lse64, int64_t(b) * c.h * c.sq, c.sq, c.sq, c.h);
    place_lse(lse_lowp, r.lse_lowp, int64_t(b) * c.h * c.sq, c.sq, c.sq, c.h);
  }
  if (c.fp8 != Fp8::none) EXPECT_TRUE(fp8_output_within_bound(out, out64));
  // The bf16 rule (P rounded to bf16 at most) wherever P stays in bf16: everywhere but where the
  // warpspec kernel's FP8 products may run, which round P to e4m3 (D-75) and are held to FP8's
  // bound only: CUDA, e4m3 q, k and v on the d = 128 and 256 instances (head dims 97-128 and
  // 193-256, cuda/backend.cu smallest_head_dim).
  const bool fp8_products_instance = (c.d > 96 && c.d <= 128) || c.d > 192;
  if (!(c.fp8 != Fp8::none && c.device == Device::cuda && fp8_products_instance)) {
    EXPECT_TRUE(outputs_close("out", out, out64, out_lowp, c.dtype));
  }
  if (c.f.lse) {
    EXPECT_TRUE(lse_close("softmax_lse", lse_impl, lse64, lse_lowp, c.dtype));
  }
}

}  // namespace

TEST_P(DenseSweep, MatchesReference) {
  const DenseCase& c = GetParam();
  FA_RUN_CASE(c.device, run_dense(c));
}

}  // namespace fa_test
