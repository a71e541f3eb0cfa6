// KV-cache forward: cache_seqlens, cache_batch_idx, cache_leftpad, paged caches, k_new/v_new
// append with rotary, split-KV. The test builds the logical problem once (per-sequence caches,
// the expected cache after the append, the oracle's answer) and then runs it through one or
// more physical layouts (contiguous / paged, split counts).
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "layouts.h"
#include "sweep_support.h"

namespace fa_test {

namespace {

constexpr uint64_t kSeedQ = 301, kSeedKNew = 302, kSeedVNew = 303, kSeedCacheK = 304;
constexpr uint64_t kSeedCacheV = 305, kSeedAlibi = 306, kSeedLengths = 307, kSeedLayout = 308;
constexpr uint64_t kSeedFp8 = 309;
constexpr double kRotaryBase = 10000.0;
// Cache rows / pages no sequence owns (NaN-filled), so that a wrong row or page shows.
constexpr int kSpareCacheRows = 2;
constexpr int kSparePages = 3;
constexpr size_t kWorkspaceAlign = 256;  // documented alignment of a caller workspace

const double kNaN = std::numeric_limits<double>::quiet_NaN();

bool rotates_q_per_row(const Features& f) {
  return f.causal || f.window_left >= 0 || f.window_right >= 0;
}

int round_up(int x, int m) { return (x + m - 1) / m * m; }

// The problem independent of its physical layout.
struct KVProblem {
  std::vector<double> q, k_new, v_new;         // (b, sq, h, d), (b, s_new, hk, d)
  std::vector<std::vector<double>> k0, v0;     // per sequence (capacity, hk, d) before the call
  std::vector<std::vector<double>> k1, v1;     // ... and after the append
  std::vector<int> seqlens, leftpad;           // cache_seqlens, cache_leftpad
  int max_pos = 0;
  std::vector<double> cos, sin;                // (max_pos, rotary_dim / 2)
  std::vector<double> out64, out_lowp, lse64, lse_lowp;
  AlibiData alibi;
  Fp8Scales fp8;  // the stored q (fp8_q) and caches (fp8_cache) times these are the real values
};

// Storage of q and of the caches: e4m3 in an FP8 case, else dtype (k_new, v_new and out).
DType q_storage(const KVCase& c) { return c.fp8_q ? DType::e4m3 : c.dtype; }
DType cache_storage_type(const KVCase& c) { return c.fp8_cache != Fp8::none ? DType::e4m3 : c.dtype; }

// New rows (rows, hk, d) of sequence b as an e4m3 cache stores them: x / descale in fp32,
// to the nearest e4m3 (saturated); as they are in a cache of dtype.
std::vector<double> stored_in_cache(const KVCase& c, const KVProblem& p, const std::vector<double>& factors,
                                    std::vector<double> x, int rows, int b) {
  if (c.fp8_cache == Fp8::none) return x;
  for (int r = 0; r < rows; ++r) {
    for (int hk = 0; hk < c.hk; ++hk) {
      const float descale = float(p.fp8.at(factors, b, hk));
      for (int i = 0; i < c.d; ++i) {
        double& e = x[(size_t(r) * size_t(c.hk) + size_t(hk)) * size_t(c.d) + size_t(i)];
        e = round_to(DType::e4m3, double(float(e) / descale));
      }
    }
  }
  return x;
}

std::vector<double> rotary_table(int max_pos, int rotary_dim, DType dtype, bool sine) {
  const int half = rotary_dim / 2;
  std::vector<double> t(size_t(max_pos) * size_t(half));
  for (int p = 0; p < max_pos; ++p) {
    for (int i = 0; i < half; ++i) {
      const double angle = p * std::pow(kRotaryBase, -2.0 * i / rotary_dim);
      t[size_t(p) * size_t(half) + size_t(i)] = round_to(dtype, sine ? std::sin(angle) : std::cos(angle));
    }
  }
  return t;
}

// Rotates rows (rows, heads, d) at the given positions and rounds the result to storage.
std::vector<double> rotated(const KVCase& c, const KVProblem& p, const double* x, int rows,
                            int heads, const std::vector<int>& positions) {
  std::vector<double> y(x, x + int64_t(rows) * heads * c.d);
  flashattn_ref::rotary(y.data(), rows, heads, c.d, p.cos.data(), p.sin.data(), c.rotary_dim,
                        c.rotary == Rotary::interleaved, positions.data());
  for (double& e : y) e = round_to(c.dtype, e);
  return y;
}

KVProblem make_problem(const KVCase& c, Device device) {
  KVProblem p;
  const int64_t row = int64_t(c.hk) * c.d;
  p.fp8 = make_fp8_scales(c.fp8_cache, c.b, c.hk, device, kSeedFp8 + c.seed);
  p.q = random_normal(int64_t(c.b) * c.sq * c.h * c.d, kSeedQ + c.seed, q_storage(c));
  p.k_new = random_normal(int64_t(c.b) * c.s_new * row, kSeedKNew + c.seed, c.dtype);
  p.v_new = random_normal(int64_t(c.b) * c.s_new * row, kSeedVNew + c.seed, c.dtype);
  std::mt19937_64 rng(kSeedLengths + c.seed);
  for (int b = 0; b < c.b; ++b) {
    int len = c.capacity;
    if (c.with_seqlens) {  // the last sequence is full, sequence 1 (if any) empty
      len = std::uniform_int_distribution<int>(0, c.capacity - c.s_new)(rng);
      if (b == c.b - 1) len = c.capacity - c.s_new;
      if (b == 1) len = 0;
    }
    const int pad = c.leftpad ? std::uniform_int_distribution<int>(0, len / 3 + 1)(rng) : 0;
    p.seqlens.push_back(len);
    p.leftpad.push_back(std::min(pad, len));
  }
  // caches: numbers in [leftpad, seqlens), NaN elsewhere
  for (int b = 0; b < c.b; ++b) {
    std::vector<double> k(size_t(c.capacity * row), kNaN), v = k;
    const int lo = p.leftpad[size_t(b)], hi = p.seqlens[size_t(b)];
    const std::vector<double> kr = random_normal((hi - lo) * row, kSeedCacheK + c.seed * 131 + uint64_t(b), cache_storage_type(c));
    const std::vector<double> vr = random_normal((hi - lo) * row, kSeedCacheV + c.seed * 131 + uint64_t(b), cache_storage_type(c));
    std::copy(kr.begin(), kr.end(), k.begin() + lo * row);
    std::copy(vr.begin(), vr.end(), v.begin() + lo * row);
    p.k0.push_back(k);
    p.v0.push_back(v);
  }
  // rotary tables cover every cache row and every query position
  if (c.rotary != Rotary::none) {
    p.max_pos = round_up(c.capacity, 256) + c.sq;
    p.cos = rotary_table(p.max_pos, c.rotary_dim, c.dtype, false);
    p.sin = rotary_table(p.max_pos, c.rotary_dim, c.dtype, true);
  }
  p.alibi = make_alibi(c.f.alibi, c.b, c.h, device, kSeedAlibi + c.seed);

  // expected cache after the append, effective q, oracle
  const int64_t q_batch = int64_t(c.sq) * c.h * c.d, new_batch = int64_t(c.s_new) * row;
  const int64_t n_out = int64_t(c.b) * q_batch, n_lse = int64_t(c.b) * c.h * c.sq;
  p.out64.resize(size_t(n_out));
  p.out_lowp.resize(size_t(n_out));
  p.lse64.resize(size_t(n_lse));
  p.lse_lowp.resize(size_t(n_lse));
  for (int b = 0; b < c.b; ++b) {
    const int len = p.seqlens[size_t(b)];
    std::vector<double> kb = p.k0[size_t(b)], vb = p.v0[size_t(b)];
    const double* qb = p.q.data() + b * q_batch;
    std::vector<double> q_eff(qb, qb + q_batch);
    std::vector<double> k_add(p.k_new.begin() + b * new_batch, p.k_new.begin() + (b + 1) * new_batch);
    if (c.rotary != Rotary::none) {
      std::vector<int> kpos(size_t(c.s_new)), qpos(size_t(c.sq));
      for (int t = 0; t < c.s_new; ++t) kpos[size_t(t)] = len + t;
      for (int i = 0; i < c.sq; ++i) qpos[size_t(i)] = len + (rotates_q_per_row(c.f) ? i : 0);
      k_add = rotated(c, p, k_add.data(), c.s_new, c.hk, kpos);
      q_eff = rotated(c, p, q_eff.data(), c.sq, c.h, qpos);
    }
    k_add = stored_in_cache(c, p, p.fp8.k, k_add, c.s_new, b);
    const std::vector<double> v_add = stored_in_cache(
        c, p, p.fp8.v, std::vector<double>(p.v_new.begin() + b * new_batch, p.v_new.begin() + (b + 1) * new_batch),
        c.s_new, b);
    std::copy(k_add.begin(), k_add.end(), kb.begin() + len * row);
    std::copy(v_add.begin(), v_add.end(), vb.begin() + len * row);
    const int lo = p.leftpad[size_t(b)], hi = len + c.s_new;
    // the oracle sees the real values: stored x descale (FP8)
    const std::vector<double> k_real = p.fp8.descaled(p.fp8.k, kb.data() + lo * row, hi - lo, c.hk, c.d, b);
    const std::vector<double> v_real = p.fp8.descaled(p.fp8.v, vb.data() + lo * row, hi - lo, c.hk, c.d, b);
    if (c.fp8_q) q_eff = p.fp8.descaled(p.fp8.q, q_eff.data(), c.sq, c.h, c.d, b);
    const OracleOut r = run_oracle(c.dtype, q_eff.data(), k_real.data(), v_real.data(), c.sq, hi - lo, c.h,
                                   c.hk, c.d, ref_options(c.f, p.alibi, b));
    place_out(p.out64, r.out64, int64_t(b) * c.sq, c.sq, c.h, c.d);
    place_out(p.out_lowp, r.out_lowp, int64_t(b) * c.sq, c.sq, c.h, c.d);
    place_lse(p.lse64, r.lse64, int64_t(b) * c.h * c.sq, c.sq, c.sq, c.h);
    place_lse(p.lse_lowp, r.lse_lowp, int64_t(b) * c.h * c.sq, c.sq, c.sq, c.h);
    p.k1.push_back(std::move(kb));
    p.v1.push_back(std::move(vb));
  }
  return p;
}

// The physical cache of a case: layout plus the flat rows.
struct CacheStorage {
  KVLayout layout;
  int64_t rows = 0;
  int64_t num_pages = 0;
  int cache_batch = 0;  // contiguous: rows of the (cache_batch, capacity, hk, d) cache
};

CacheStorage cache_storage(const KVCase& c) {
  CacheStorage s;
  s.layout.heads_k = c.hk;
  s.layout.d = c.d;
  if (c.page_size > 0) {
    s.layout.kind = KVLayout::Kind::paged;
    s.layout.page_size = c.page_size;
    s.layout.max_pages = (c.capacity + c.page_size - 1) / c.page_size;
    s.num_pages = int64_t(c.b) * s.layout.max_pages + kSparePages;
    s.layout.block_table = make_block_table(c.b, s.layout.max_pages, int(s.num_pages), 0,
                                            c.shuffled_pages, kSeedLayout + c.seed);
    s.rows = s.num_pages * c.page_size;
  } else {
    s.layout.kind = KVLayout::Kind::cache;
    s.layout.capacity = c.capacity;
    s.cache_batch = c.batch_idx ? c.b + kSpareCacheRows : c.b;
    if (c.batch_idx) {
      std::vector<int> perm(size_t(s.cache_batch));
      for (int i = 0; i < s.cache_batch; ++i) perm[size_t(i)] = i;
      std::mt19937_64 rng(kSeedLayout + c.seed);
      std::shuffle(perm.begin(), perm.end(), rng);
      s.layout.batch_idx.assign(perm.begin(), perm.begin() + c.b);
    }
    s.rows = int64_t(s.cache_batch) * c.capacity;
  }
  return s;
}

std::vector<double> physical(const KVCase& c, const CacheStorage& s,
                             const std::vector<std::vector<double>>& logical) {
  std::vector<double> rows(size_t(s.rows * s.layout.row_elems()), kNaN);
  for (int b = 0; b < c.b; ++b) scatter_keys(s.layout, rows, b, 0, c.capacity, logical[size_t(b)]);
  return rows;
}

// One unit in the last place of x in the storage type.
double ulp(DType dtype, double x) {
  if (dtype == DType::e4m3) {  // 3 mantissa bits, normal from 2^-6, subnormal step 2^-9
    int e = 0;
    std::frexp(x, &e);
    return std::ldexp(1.0, std::max(e - 1, -6) - 3);
  }
  const int precision = dtype == DType::bf16 ? 8 : (dtype == DType::f16 ? 11 : 24);
  if (x == 0.0) return std::ldexp(1.0, dtype == DType::f16 ? -24 : -133);
  int e;
  std::frexp(x, &e);
  return std::ldexp(1.0, e - precision);
}

constexpr double kFp32Epsilon = 1.0 / (1 << 24);  // unit roundoff of fp32 arithmetic
// fp32 evaluation of x*cos - y*sin errs by a few roundoffs of |x| + |y| (cancellation).
constexpr double kRotaryRoundoffs = 4.0;

// The cache after the call equals the expected one: bit-exact except rotated new keys, which
// may differ by one unit in the last place of storage plus the fp32 evaluation error of the
// rotation (rotary_magnitude: the largest |k_new| element; 0 when nothing is rotated).
::testing::AssertionResult cache_matches(const std::string& what, const std::vector<double>& got,
                                         const std::vector<double>& want, DType dtype,
                                         double rotary_magnitude) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    if (got[i] == want[i]) continue;
    const double tol = ulp(dtype, want[i]) + kRotaryRoundoffs * kFp32Epsilon * rotary_magnitude;
    if (rotary_magnitude > 0.0 && std::isfinite(got[i]) && std::fabs(got[i] - want[i]) <= tol) continue;
    return ::testing::AssertionFailure() << what << ": element " << i << " is " << got[i]
                                         << ", expected " << want[i];
  }
  return ::testing::AssertionSuccess();
}

struct KVImpl {
  std::vector<double> out, lse;
};

// Runs the case's physical layout; checks the cache afterwards and that inputs are untouched.
KVImpl run_impl(const KVCase& c, const KVProblem& p) {
  const CacheStorage s = cache_storage(c);
  const std::vector<double> kphys = physical(c, s, p.k0), vphys = physical(c, s, p.v0);
  const DType cache_type = cache_storage_type(c), q_type = q_storage(c);
  const Buffer dkc = to_device(kphys, cache_type, c.device);
  const Buffer dvc = to_device(vphys, cache_type, c.device);

  // q, k_new, v_new: contiguous, or slices of one (b, s, h + 2 hk, d) buffer
  View qv = contiguous_view({c.b, c.sq, c.h, c.d});
  View knv = contiguous_view({c.b, c.s_new, c.hk, c.d}), vnv = knv;
  const bool packed = c.layout == Layout::qkv_packed;
  if (packed) {
    const int64_t row = int64_t(c.h + 2 * c.hk) * c.d, batch = int64_t(c.sq) * row;
    qv = strided_view({c.b, c.sq, c.h, c.d}, {batch, row, c.d, 1}, 0);
    knv = strided_view({c.b, c.s_new, c.hk, c.d}, {batch, row, c.d, 1}, int64_t(c.h) * c.d);
    vnv = strided_view({c.b, c.s_new, c.hk, c.d}, {batch, row, c.d, 1}, int64_t(c.h + c.hk) * c.d);
  }
  std::vector<double> qbuf, knbuf, vnbuf;
  scatter(qbuf, qv, p.q);
  scatter(packed ? qbuf : knbuf, knv, p.k_new);
  scatter(packed ? qbuf : vnbuf, vnv, p.v_new);
  const Buffer dq = to_device(qbuf, q_type, c.device);
  const Buffer dkn = packed ? Buffer() : to_device(knbuf, c.dtype, c.device);
  const Buffer dvn = packed ? Buffer() : to_device(vnbuf, c.dtype, c.device);
  const std::vector<uint8_t> q_before = dq.raw(), kn_before = dkn.raw(), vn_before = dvn.raw();

  const Buffer dout = poisoned(c.dtype, int64_t(c.b) * c.sq * c.h * c.d, c.device);
  const Buffer dlse = poisoned(DType::f32, int64_t(c.b) * c.h * c.sq, c.device);
  const Buffer dseqlens = to_device_i32(p.seqlens, c.device);
  const Buffer dpad = to_device_i32(p.leftpad, c.device);
  const Buffer dbidx = to_device_i32(s.layout.batch_idx, c.device);
  const Buffer dtable = to_device_i32(s.layout.block_table, c.device);
  const Buffer dcos = to_device(p.cos, c.dtype, c.device), dsin = to_device(p.sin, c.dtype, c.device);

  Tensor kc, vc;
  if (c.page_size > 0) {
    kc = Tensor::contiguous(dkc.data(), cache_type, {s.num_pages, c.page_size, c.hk, c.d}, c.device);
    vc = Tensor::contiguous(dvc.data(), cache_type, {s.num_pages, c.page_size, c.hk, c.d}, c.device);
  } else {
    kc = Tensor::contiguous(dkc.data(), cache_type, {s.cache_batch, c.capacity, c.hk, c.d}, c.device);
    vc = Tensor::contiguous(dvc.data(), cache_type, {s.cache_batch, c.capacity, c.hk, c.d}, c.device);
  }
  flashattn::KVCacheArgs args;
  if (c.with_seqlens) args.cache_seqlens = i32_tensor(dseqlens, {c.b});
  if (c.batch_idx) args.cache_batch_idx = i32_tensor(dbidx, {c.b});
  if (c.leftpad) args.cache_leftpad = i32_tensor(dpad, {c.b});
  if (c.page_size > 0) args.block_table = i32_tensor(dtable, {c.b, s.layout.max_pages});
  if (c.s_new > 0) {
    args.k_new = tensor_of(packed ? dq : dkn, c.dtype, knv);
    args.v_new = tensor_of(packed ? dq : dvn, c.dtype, vnv);
  }
  if (c.rotary != Rotary::none) {
    args.rotary_cos = Tensor::contiguous(dcos.data(), c.dtype, {p.max_pos, c.rotary_dim / 2}, c.device);
    args.rotary_sin = Tensor::contiguous(dsin.data(), c.dtype, {p.max_pos, c.rotary_dim / 2}, c.device);
    args.rotary_interleaved = c.rotary == Rotary::interleaved;
  }
  args.num_splits = c.num_splits;
  const Tensor lse = c.f.lse ? f32_vector(dlse, {c.b, c.h, c.sq}) : Tensor{};
  flashattn::AttentionOptions opts = api_options(c.f, p.alibi, c.b, lse);
  p.fp8.set_options(opts, c.fp8_q);
  const Tensor qt = tensor_of(dq, q_type, qv);
  Buffer workspace;
  if (c.caller_workspace) {
    const flashattn::Plan plan = flashattn::plan_kvcache(qt, kc, vc, args, opts);
    workspace = Buffer(c.device, plan.workspace_bytes + kWorkspaceAlign);
    const uintptr_t base = reinterpret_cast<uintptr_t>(workspace.data());
    args.workspace = reinterpret_cast<void*>((base + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign);
    args.workspace_bytes = plan.workspace_bytes;
  }
  flashattn::forward_kvcache(qt, kc, vc, Tensor::contiguous(dout.data(), c.dtype, {c.b, c.sq, c.h, c.d}, c.device),
                             args, opts);

  KVImpl r;
  r.out = from_device(dout, c.dtype);
  r.lse = from_device(dlse, DType::f32);
  // the cache holds the appended (rotated) keys and nothing else changed
  double rotary_magnitude = 0.0;
  if (c.rotary != Rotary::none) {
    for (double x : p.k_new) rotary_magnitude = std::max(rotary_magnitude, std::fabs(x));
  }
  EXPECT_TRUE(cache_matches("k_cache", from_device(dkc, cache_type), physical(c, s, p.k1), cache_type,
                            rotary_magnitude));
  EXPECT_TRUE(cache_matches("v_cache", from_device(dvc, cache_type), physical(c, s, p.v1), cache_type, 0.0));
  EXPECT_TRUE(dq.raw() == q_before) << "q (or the packed qkv buffer) was modified";
  EXPECT_TRUE(dkn.raw() == kn_before) << "k_new was modified";
  EXPECT_TRUE(dvn.raw() == vn_before) << "v_new was modified";
  return r;
}

void check_against_oracle(const KVCase& c, const KVProblem& p, const KVImpl& r) {
  EXPECT_TRUE(outputs_close("out", r.out, p.out64, p.out_lowp, c.dtype)) << c.name();
  if (c.fp8_cache != Fp8::none) {
    EXPECT_TRUE(fp8_output_within_bound(r.out, p.out64)) << c.name();
  }
  if (c.f.lse) {
    EXPECT_TRUE(lse_close("softmax_lse", r.lse, p.lse64, p.lse_lowp, c.dtype)) << c.name();
  }
}

void run_kvcache(const KVCase& c) {
  const KVProblem p = make_problem(c, c.device);
  check_against_oracle(c, p, run_impl(c, p));
}

void run_splits(const KVCase& c) {
  const KVProblem p = make_problem(c, c.device);
  KVCase one = c;
  one.num_splits = 1;
  const KVImpl base = run_impl(one, p);
  check_against_oracle(one, p, base);
  // 12 and 16: more splits than some cases have key tiles (empty splits in the combine)
  for (int splits : {3, 0, 2, 7, 12, 16}) {
    KVCase other = c;
    other.num_splits = splits;
    const KVImpl r = run_impl(other, p);
    check_against_oracle(other, p, r);
    EXPECT_TRUE(results_agree("num_splits 1 vs " + std::to_string(splits), base.out, r.out,
                              p.out64, p.out_lowp, c.dtype));
    if (c.f.lse) {
      EXPECT_TRUE(results_agree("lse, num_splits 1 vs " + std::to_string(splits), base.lse, r.lse,
                                p.lse64, p.lse_lowp, c.dtype));
    }
  }
}

void run_paging(const KVCase& c) {
  const KVProblem p = make_problem(c, c.device);
  KVCase contiguous = c;
  contiguous.page_size = 0;
  const KVImpl base = run_impl(contiguous, p);
  check_against_oracle(contiguous, p, base);
  // Page sizes below, at and past the 16-row step between a CUDA thread's copy rows (3, 16,
  // 40: lookup_paged_rows walks them in whole pages plus rows), and the extremes.
  for (int page : {1, 3, 16, 40, 256}) {
    for (bool shuffled : {true, false}) {
      if (!shuffled && page != 16) continue;
      // without cache_seqlens every paged row is valid: capacities must then fill pages
      if (!c.with_seqlens && c.capacity % page != 0) continue;
      KVCase paged = c;
      paged.page_size = page;
      paged.shuffled_pages = shuffled;
      paged.batch_idx = false;  // the block table maps batches to pages
      const KVImpl r = run_impl(paged, p);
      check_against_oracle(paged, p, r);
      EXPECT_TRUE(results_agree("paged " + std::to_string(page) + " vs contiguous", base.out, r.out,
                                p.out64, p.out_lowp, c.dtype));
    }
  }
}

}  // namespace

TEST_P(KVCacheSweep, MatchesReference) {
  const KVCase& c = GetParam();
  FA_RUN_CASE(c.device, run_kvcache(c));
}

TEST_P(KVCacheSplits, SplitCountsAgree) {
  const KVCase& c = GetParam();
  FA_RUN_CASE(c.device, run_splits(c));
}

TEST_P(KVCachePaging, PagedMatchesContiguous) {
  const KVCase& c = GetParam();
  FA_RUN_CASE(c.device, run_paging(c));
}

// The CPU backend keeps its workers' scratch between calls (attention.cpp ScratchPool): an FP8
// decode right after a bf16 decode of the same shape, whose call sized that scratch without the
// widened FP8 rows, still passes (D-87; a first version read past the scratch there).
TEST(KVCacheCpuScratch, Fp8DecodeAfterBf16DecodeOfTheSameShape) {
  KVCase c;
  c.b = 2, c.h = 8, c.hk = 2, c.d = 128, c.capacity = 339;
  run_kvcache(c);
  c.fp8_cache = Fp8::per_head;
  run_kvcache(c);
}

}  // namespace fa_test
