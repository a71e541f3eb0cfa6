// Variable-length forward: packed queries, packed or paged keys, seqused_k and leftpad_k.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "layouts.h"
#include "sweep_support.h"

namespace fa_test {

namespace {

constexpr uint64_t kSeedQ = 201, kSeedKeys = 202, kSeedValues = 203, kSeedAlibi = 204;
constexpr uint64_t kSeedLengths = 205, kSeedPages = 206, kSeedFp8 = 207;
// Unowned pages in the pool (NaN-filled): a walk past a sequence's pages reads NaN.
constexpr int kSparePages = 2;

struct KeyWindow {
  std::vector<int> start, end;  // visible keys [start[b], end[b]) of the stored keys
};

KeyWindow key_windows(const VarlenCase& c) {
  const int batch = int(c.seqlens_q.size());
  KeyWindow w;
  std::mt19937_64 rng(kSeedLengths);
  for (int b = 0; b < batch; ++b) {
    const int len = c.seqlens_k[size_t(b)];
    int end = len, start = 0;
    if (c.seqused_k && len > 0) end = len - std::uniform_int_distribution<int>(0, len / 3)(rng);
    if (c.leftpad_k && end > 0) start = std::uniform_int_distribution<int>(0, end / 3 + 1)(rng);
    start = std::min(start, end);
    w.start.push_back(start);
    w.end.push_back(end);
  }
  return w;
}

void run_varlen(const VarlenCase& c) {
  const int batch = int(c.seqlens_q.size());
  const std::vector<int> cu_q = prefix_offsets(c.seqlens_q);
  const std::vector<int> cu_k = prefix_offsets(c.seqlens_k);
  const int total_q = cu_q.back();
  const int max_q = *std::max_element(c.seqlens_q.begin(), c.seqlens_q.end());
  const int max_k = *std::max_element(c.seqlens_k.begin(), c.seqlens_k.end());
  const KeyWindow win = key_windows(c);
  // stored values (e4m3 numbers for an FP8 case, scaled by fp8's factors)
  const DType in = c.fp8 != Fp8::none ? DType::e4m3 : c.dtype;
  const Fp8Scales fp8 = make_fp8_scales(c.fp8, batch, c.hk, c.device, kSeedFp8);

  // K/V storage: packed rows, or pages
  KVLayout layout;
  layout.heads_k = c.hk;
  layout.d = c.d;
  int64_t rows = 0;
  if (c.page_size > 0) {
    layout.kind = KVLayout::Kind::paged;
    layout.page_size = c.page_size;
    const int pages_per_seq = std::max(1, (max_k + c.page_size - 1) / c.page_size);
    const int num_pages = batch * pages_per_seq + kSparePages;
    layout.max_pages = pages_per_seq + 1;
    layout.block_table = make_block_table(batch, pages_per_seq, num_pages, 1, true, kSeedPages);
    rows = int64_t(num_pages) * c.page_size;
  } else {
    layout.kind = KVLayout::Kind::packed;
    layout.cu_seqlens_k = cu_k;
    rows = cu_k.back();
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> krows(size_t(rows * layout.row_elems()), nan), vrows = krows;
  for (int b = 0; b < batch; ++b) {  // only the visible keys hold numbers
    const int n = win.end[size_t(b)] - win.start[size_t(b)];
    const int64_t count = int64_t(n) * c.hk * c.d;
    scatter_keys(layout, krows, b, win.start[size_t(b)], win.end[size_t(b)],
                 random_normal(count, kSeedKeys + uint64_t(b), in));
    scatter_keys(layout, vrows, b, win.start[size_t(b)], win.end[size_t(b)],
                 random_normal(count, kSeedValues + uint64_t(b), in));
  }
  const DType q_in = c.fp8_kv_only ? c.dtype : in;
  const std::vector<double> q = random_normal(int64_t(total_q) * c.h * c.d, kSeedQ, q_in);

  // element views: contiguous, or with NaN-filled gaps after each head / row / page
  const bool padded = c.layout == Layout::padded;
  const int64_t pad = padded ? kPadElements : 0;
  const View qv = padded ? padded_view({total_q, c.h, c.d}, pad) : contiguous_view({total_q, c.h, c.d});
  const View ov = padded ? padded_view({total_q, c.h, c.d}, 2 * pad) : contiguous_view({total_q, c.h, c.d});
  View kview;
  if (c.page_size > 0) {
    const int64_t num_pages = rows / c.page_size;
    kview = padded ? padded_view({num_pages, c.page_size, c.hk, c.d}, pad)
                   : contiguous_view({num_pages, c.page_size, c.hk, c.d});
  } else {
    kview = padded ? padded_view({rows, c.hk, c.d}, pad) : contiguous_view({rows, c.hk, c.d});
  }
  std::vector<double> qbuf, kbuf, vbuf;
  scatter(qbuf, qv, q);
  scatter(kbuf, kview, krows);
  scatter(vbuf, kview, vrows);

  // device buffers
  const Buffer dq = to_device(qbuf, q_in, c.device);
  const Buffer dk = to_device(kbuf, in, c.device);
  const Buffer dv = to_device(vbuf, in, c.device);
  const Buffer dout = poisoned(c.dtype, ov.extent(), c.device);
  const Buffer dlse = poisoned(DType::f32, int64_t(c.h) * total_q, c.device);
  const Buffer dcu_q = to_device_i32(cu_q, c.device), dcu_k = to_device_i32(cu_k, c.device);
  const Buffer dused = to_device_i32(win.end, c.device);
  const Buffer dpad = to_device_i32(win.start, c.device);
  const Buffer dtable = to_device_i32(layout.block_table, c.device);
  const AlibiData alibi = make_alibi(c.f.alibi, batch, c.h, c.device, kSeedAlibi);

  flashattn::VarlenArgs args;
  args.cu_seqlens_q = i32_tensor(dcu_q, {batch + 1});
  args.cu_seqlens_k = i32_tensor(dcu_k, {batch + 1});
  args.max_seqlen_q = max_q;
  args.max_seqlen_k = max_k;
  if (c.seqused_k) args.seqused_k = i32_tensor(dused, {batch});
  if (c.leftpad_k) args.leftpad_k = i32_tensor(dpad, {batch});
  if (c.page_size > 0) args.block_table = i32_tensor(dtable, {batch, layout.max_pages});
  const Tensor lse = c.f.lse ? f32_vector(dlse, {c.h, total_q}) : Tensor{};
  flashattn::AttentionOptions opts = api_options(c.f, alibi, batch, lse);
  fp8.set_options(opts, !c.fp8_kv_only);
  flashattn::forward_varlen(tensor_of(dq, q_in, qv), tensor_of(dk, in, kview),
                            tensor_of(dv, in, kview), tensor_of(dout, c.dtype, ov), args, opts);
  const std::vector<double> out_all = from_device(dout, c.dtype);
  EXPECT_TRUE(poison_outside_view_intact(out_all, ov)) << "out: wrote outside its view";
  const std::vector<double> out = gather(out_all, ov);
  const std::vector<double> lse_impl = from_device(dlse, DType::f32);

  // oracle per sequence on gathered plain arrays
  std::vector<double> out64(out.size()), out_lowp(out.size());
  std::vector<double> lse64(lse_impl.size()), lse_lowp(lse_impl.size());
  for (int b = 0; b < batch; ++b) {
    const int sq = c.seqlens_q[size_t(b)];
    const int p0 = win.start[size_t(b)], p1 = win.end[size_t(b)];
    const std::vector<double> kb = fp8.descaled(fp8.k, gather_keys(layout, krows, b, p0, p1).data(), p1 - p0, c.hk, c.d, b);
    const std::vector<double> vb = fp8.descaled(fp8.v, gather_keys(layout, vrows, b, p0, p1).data(), p1 - p0, c.hk, c.d, b);
    const double* q_rows = q.data() + int64_t(cu_q[size_t(b)]) * c.h * c.d;
    const std::vector<double> qb =
        c.fp8_kv_only ? std::vector<double>(q_rows, q_rows + int64_t(sq) * c.h * c.d) : fp8.descaled(fp8.q, q_rows, sq, c.h, c.d, b);
    const OracleOut r = run_oracle(c.dtype, qb.data(), kb.data(), vb.data(), sq, p1 - p0, c.h, c.hk, c.d,
                                   ref_options(c.f, alibi, b));
    place_out(out64, r.out64, cu_q[size_t(b)], sq, c.h, c.d);
    place_out(out_lowp, r.out_lowp, cu_q[size_t(b)], sq, c.h, c.d);
    place_lse(lse64, r.lse64, cu_q[size_t(b)], total_q, sq, c.h);
    place_lse(lse_lowp, r.lse_lowp, cu_q[size_t(b)], total_q, sq, c.h);
  }
  EXPECT_TRUE(outputs_close("out", out, out64, out_lowp, c.dtype));
  if (c.fp8 != Fp8::none) {
    EXPECT_TRUE(fp8_output_within_bound(out, out64));
  }
  if (c.f.lse) {
    EXPECT_TRUE(lse_close("softmax_lse", lse_impl, lse64, lse_lowp, c.dtype));
  }
}

}  // namespace

TEST_P(VarlenSweep, MatchesReference) {
  const VarlenCase& c = GetParam();
  FA_RUN_CASE(c.device, run_varlen(c));
}

}  // namespace fa_test
