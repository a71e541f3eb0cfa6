// --check: the library's result against the float64 oracle (tests/reference), one sequence at a
// time, after gathering each sequence's inputs the way a test would: varlen offsets, the paged
// block table, cache_seqlens, and append + rotary done by hand with flashattn_ref::rotary.
//
// Pass rule (FlashAttention-2's): max|lib - f64| <= 2 * max|lowp - f64| + floor, where lowp is
// flashattn_ref::attention_lowp (float32 scores, P rounded to the storage type). Same for LSE.
// Cache rows after --append: within 1 ulp of the storage type (rotation rounds once).
// FP8 (e4m3 q or k/v): the oracle runs on the dequantized inputs (descale * stored), appended
// rows of an e4m3 cache are quantized as the library does (e4m3(x / descale), x in out's dtype),
// and out is held to the FP8 bound (cli.h kFp8Rtol) instead (LSE keeps the usual rule).
// With rotary, the library may round a rotated element of q or k the other way (float32 vs
// float64 rotation): the tolerances also get 2 * the change that rounding the rotated q and k
// at all makes to the f64 result.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cli.h"
#include "half.h"
#include "reference.h"

namespace facli {
namespace {

namespace ref = flashattn_ref;

constexpr double kInf = std::numeric_limits<double>::infinity();
// Floors: half an ulp at 1.0 of the storage type (one rounding of an O(1) output), and for
// the fp32 LSE (values up to ~log(sk) + max score ~ 20) a few hundred fp32 ulps there.
constexpr double kOutFloorBf16 = 1.0 / 512;   // 2^-9
constexpr double kOutFloorFp16 = 1.0 / 4096;  // 2^-12
constexpr double kLseFloor = 1e-4;
constexpr double kCacheTolUlps = 1.0;

ref::Storage storage_of(DType t) { return t == DType::bf16 ? ref::Storage::bf16 : ref::Storage::f16; }

double out_floor(DType t) { return t == DType::bf16 ? kOutFloorBf16 : kOutFloorFp16; }

// The spacing of storage values around x (for the cache check).
double ulp_of(DType t, double x) {
  const int mantissa_bits = t == DType::bf16 ? 7 : (t == DType::e4m3 ? 3 : 10);
  const int min_exponent = t == DType::bf16 ? -126 : (t == DType::e4m3 ? -6 : -14);
  const int e = x == 0 ? min_exponent : std::max(int(std::floor(std::log2(std::fabs(x)))), min_exponent);
  return std::ldexp(1.0, e - mantissa_bits);
}

// One sequence's inputs as the oracle sees them: q (sq, h, d), k and v (sk, hk, d).
struct Sequence {
  int sq = 0, sk = 0;
  std::vector<double> q, k, v;
  std::vector<double> k_new, v_new;  // kvcache: the rows the call writes at cache_seqlens
  std::vector<double> q_exact, k_exact;  // rotary: q and k rotated but not rounded
};

// The factor of each head of sequence b's rows: its descale (an e4m3 tensor), else 1.
std::vector<double> head_factors(const ProblemSpec& s, const std::vector<float>& descale, int b, int heads) {
  std::vector<double> f(size_t(heads), 1.0);
  if (descale.empty()) return f;
  for (int h = 0; h < heads; ++h) f[size_t(h)] = descale[size_t(b) * s.kv_heads + h / (heads / s.kv_heads)];
  return f;
}

// Appends row `row` of src (heads = factors.size(), d each), dequantized: factor * stored.
void append_row(std::vector<double>& dst, const std::vector<uint16_t>& src, int64_t row,
                const std::vector<double>& factors, int d, DType t) {
  const int64_t row_elems = int64_t(factors.size()) * d;
  for (int64_t c = 0; c < row_elems; ++c)
    dst.push_back(from_storage(t, src[size_t(row * row_elems + c)]) * factors[size_t(c / d)]);
}

// New rows (s_new, hk, d) as an e4m3 cache of sequence b stores them: e4m3(x / descale).
void quantize_rows(const ProblemSpec& s, const std::vector<double>& factors, std::vector<double>& x) {
  for (size_t i = 0; i < x.size(); ++i) {
    const float scaled = float(x[i]) / float(factors[(i / size_t(s.head_dim)) % factors.size()]);
    x[i] = from_storage(DType::e4m3, to_storage(DType::e4m3, scaled));
  }
}

// Rows (n, hk, d) times their head's factor.
std::vector<double> scaled(std::vector<double> x, const std::vector<double>& factors, int d) {
  for (size_t i = 0; i < x.size(); ++i) x[i] *= factors[(i / size_t(d)) % factors.size()];
  return x;
}

std::vector<double> to_double(const std::vector<uint16_t>& src, DType t) {
  std::vector<double> out(src.size());
  for (size_t i = 0; i < src.size(); ++i) out[i] = from_storage(t, src[i]);
  return out;
}

// Rotates rows in place at positions first + step*r (in float64, not rounded).
void rotate_rows(const HostProblem& p, std::vector<double>& x, int rows, int heads, int first,
                 int step) {
  const ProblemSpec& s = p.spec;
  if (s.rotary == Rotary::none || rows == 0) return;
  const std::vector<double> cos = to_double(p.rot_cos, out_dtype(s)), sin = to_double(p.rot_sin, out_dtype(s));
  std::vector<int> positions(rows);
  for (int r = 0; r < rows; ++r) positions[r] = first + step * r;
  ref::rotary(x.data(), rows, heads, s.head_dim, cos.data(), sin.data(), 2 * (s.head_dim / 2),
              s.rotary == Rotary::interleaved, positions.data());
}

std::vector<double> rounded(const ProblemSpec& s, std::vector<double> x) {
  for (double& e : x) e = ref::round_to(storage_of(out_dtype(s)), e);
  return x;
}

Sequence gather_sequence(const HostProblem& p, int b) {
  const ProblemSpec& s = p.spec;
  const int d = s.head_dim;
  const std::vector<double> qf = head_factors(s, p.q_descale, b, s.heads);
  const std::vector<double> kf = head_factors(s, p.k_descale, b, s.kv_heads);
  const std::vector<double> vf = head_factors(s, p.v_descale, b, s.kv_heads);
  const std::vector<double> ones(size_t(s.kv_heads), 1.0);
  Sequence seq;
  seq.sq = p.len_q[b];
  seq.sk = p.len_k[b];
  for (int i = 0; i < seq.sq; ++i) append_row(seq.q, p.q, p.q_row(b, i), qf, d, s.dtype);
  const int old_keys = s.mode == Mode::kvcache ? p.cache_seqlens[b] : seq.sk;
  for (int pos = 0; pos < old_keys; ++pos) {
    append_row(seq.k, p.k, p.kv_row(b, pos), kf, d, s.kv_dtype);
    append_row(seq.v, p.v, p.kv_row(b, pos), vf, d, s.kv_dtype);
  }
  if (s.mode != Mode::kvcache) return seq;
  for (int t = 0; t < s.append; ++t) {
    append_row(seq.k_new, p.k_new, int64_t(b) * s.append + t, ones, d, out_dtype(s));
    append_row(seq.v_new, p.v_new, int64_t(b) * s.append + t, ones, d, out_dtype(s));
  }
  // Keys rotate at their cache row; queries at cache_seqlens + i when causal or local, else
  // all at cache_seqlens.
  if (s.rotary != Rotary::none) {
    rotate_rows(p, seq.k_new, s.append, s.kv_heads, old_keys, 1);
    rotate_rows(p, seq.q, seq.sq, s.heads, old_keys, (s.causal || is_local(s)) ? 1 : 0);
    seq.q_exact = seq.q;
    seq.k_exact = seq.k;
    seq.k_exact.insert(seq.k_exact.end(), seq.k_new.begin(), seq.k_new.end());
    seq.q = rounded(s, seq.q);
    seq.k_new = rounded(s, seq.k_new);
  }
  // k_new / v_new: the values the cache stores; the keys attended are their dequantized values.
  if (s.kv_dtype == DType::e4m3) {
    quantize_rows(s, kf, seq.k_new);
    quantize_rows(s, vf, seq.v_new);
  }
  const std::vector<double> k_new = scaled(seq.k_new, kf, d), v_new = scaled(seq.v_new, vf, d);
  seq.k.insert(seq.k.end(), k_new.begin(), k_new.end());
  seq.v.insert(seq.v.end(), v_new.begin(), v_new.end());
  return seq;
}

double lse_diff(double got, double want) {
  const bool want_empty = std::isinf(want) && want < 0;  // a row without keys: -inf
  if (want_empty) return (std::isinf(got) && got < 0) ? 0.0 : kInf;
  return std::isnan(got) ? kInf : std::fabs(got - want);
}

double max_lse_diff(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0;
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, lse_diff(got[i], want[i]));
  return err;
}

// The library's out / lse rows of sequence b in the oracle's layouts (sq, h, d) and (h, sq).
void library_rows(const HostProblem& p, const RunOutput& r, int b, int sq, std::vector<double>& out,
                  std::vector<double>& lse) {
  const ProblemSpec& s = p.spec;
  const std::vector<double> ones(size_t(s.heads), 1.0);
  out.clear();
  for (int i = 0; i < sq; ++i) append_row(out, r.out, p.q_row(b, i), ones, s.head_dim, out_dtype(s));
  lse.assign(size_t(s.heads) * sq, 0.0);
  for (int h = 0; h < s.heads; ++h)
    for (int i = 0; i < sq; ++i) lse[size_t(h) * sq + i] = r.lse[size_t(p.lse_index(b, h, i))];
}

// Every cache row [0, seqlen_k) of sequence b after the call: the appended rows as expected,
// all others unchanged. Returns the largest error in storage ulps.
double cache_error_ulps(const HostProblem& p, const RunOutput& r, int b, const Sequence& seq) {
  const ProblemSpec& s = p.spec;
  const int64_t elems = int64_t(s.kv_heads) * s.head_dim;
  const int first_new = p.cache_seqlens[b];
  double worst = 0;
  for (int pos = 0; pos < s.seqlen_k; ++pos) {
    const int64_t row = p.kv_row(b, pos);
    const bool is_new = pos >= first_new && pos < first_new + s.append;
    for (int64_t c = 0; c < elems; ++c) {
      const size_t at = size_t(row * elems + c);
      const DType t = s.kv_dtype;
      const double want_k = is_new ? seq.k_new[size_t((pos - first_new) * elems + c)] : from_storage(t, p.k[at]);
      const double want_v = is_new ? seq.v_new[size_t((pos - first_new) * elems + c)] : from_storage(t, p.v[at]);
      const double dk = std::fabs(from_storage(t, r.k_cache[at]) - want_k) / ulp_of(t, want_k);
      const double dv = std::fabs(from_storage(t, r.v_cache[at]) - want_v) / ulp_of(t, want_v);
      worst = std::max({worst, std::isnan(dk) ? kInf : dk, std::isnan(dv) ? kInf : dv});
    }
  }
  return worst;
}

ref::Options oracle_options(const ProblemSpec& s, const std::vector<double>& slopes) {
  ref::Options o;
  o.causal = s.causal;
  o.window_left = s.window_left;
  o.window_right = s.window_right;
  o.softcap = s.softcap;
  o.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
  return o;
}

// Running maxima over the sequences.
struct Errors {
  double out = 0, out_lowp = 0, lse = 0, lse_lowp = 0, cache_ulps = 0;
  double out_ref_max = 0;  // max|f64| (FP8 bound)
  double out_rounding = 0, lse_rounding = 0;  // rotary: effect of rounding the rotated q, k
};

// How much rounding the rotated q and k changes the f64 result.
void rotary_rounding_effect(const ProblemSpec& s, const Sequence& seq, const ref::Options& opt,
                            const std::vector<double>& out_ref, const std::vector<double>& lse_ref,
                            Errors& e) {
  std::vector<double> out(out_ref.size()), lse(lse_ref.size());
  ref::attention(seq.q_exact.data(), seq.k_exact.data(), seq.v.data(), seq.sq, seq.sk, s.heads,
                 s.kv_heads, s.head_dim, opt, out.data(), lse.data());
  e.out_rounding = std::max(e.out_rounding, ref::max_abs_diff(out.data(), out_ref.data(), int64_t(out.size())));
  e.lse_rounding = std::max(e.lse_rounding, max_lse_diff(lse, lse_ref));
}

void check_sequence(const HostProblem& p, const RunOutput& r, int b, const ref::Options& opt, Errors& e) {
  const ProblemSpec& s = p.spec;
  const Sequence seq = gather_sequence(p, b);
  const size_t out_size = size_t(seq.sq) * s.heads * s.head_dim, lse_size = size_t(s.heads) * seq.sq;
  std::vector<double> out_ref(out_size), lse_ref(lse_size), out_lp(out_size), lse_lp(lse_size);
  const int h = s.heads, hk = s.kv_heads, d = s.head_dim;
  ref::attention(seq.q.data(), seq.k.data(), seq.v.data(), seq.sq, seq.sk, h, hk, d, opt, out_ref.data(), lse_ref.data());
  ref::attention_lowp(storage_of(out_dtype(s)), seq.q.data(), seq.k.data(), seq.v.data(), seq.sq, seq.sk, h, hk, d, opt,
                      out_lp.data(), lse_lp.data());
  std::vector<double> out_lib, lse_lib;
  library_rows(p, r, b, seq.sq, out_lib, lse_lib);
  e.out = std::max(e.out, ref::max_abs_diff(out_lib.data(), out_ref.data(), int64_t(out_size)));
  e.out_lowp = std::max(e.out_lowp, ref::max_abs_diff(out_lp.data(), out_ref.data(), int64_t(out_size)));
  e.lse = std::max(e.lse, max_lse_diff(lse_lib, lse_ref));
  e.lse_lowp = std::max(e.lse_lowp, max_lse_diff(lse_lp, lse_ref));
  for (double x : out_ref) e.out_ref_max = std::max(e.out_ref_max, std::fabs(x));
  if (s.rotary != Rotary::none) rotary_rounding_effect(s, seq, opt, out_ref, lse_ref, e);
  if (!r.k_cache.empty()) e.cache_ulps = std::max(e.cache_ulps, cache_error_ulps(p, r, b, seq));
}

}  // namespace

CheckResult check(const HostProblem& p, const RunOutput& r) {
  const ProblemSpec& s = p.spec;
  const std::vector<double> slopes(p.alibi.begin(), p.alibi.end());
  const ref::Options opt = oracle_options(s, slopes);
  Errors e;
  for (int b = 0; b < s.batch; ++b) check_sequence(p, r, b, opt, e);
  CheckResult c;
  c.out_err = e.out;
  c.lse_err = e.lse;
  c.out_tol = is_fp8(s) ? kFp8Rtol * e.out_ref_max : 2 * (e.out_lowp + e.out_rounding) + out_floor(s.dtype);
  // LSE (fp32, from values exact in the compute type) by the usual rule in FP8 too
  c.lse_tol = 2 * (e.lse_lowp + e.lse_rounding) + kLseFloor;
  c.cache_checked = !r.k_cache.empty();
  c.cache_err_ulps = e.cache_ulps;
  c.pass = c.out_err <= c.out_tol && c.lse_err <= c.lse_tol &&
           (!c.cache_checked || c.cache_err_ulps <= kCacheTolUlps);
  return c;
}

}  // namespace facli
