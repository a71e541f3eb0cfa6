// Work counts (FLOPs, bytes of K and V read) and the output of `flashattn run`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "cli.h"
#include "json.h"

namespace facli {
namespace {

constexpr double kMatmulFlopsPerPair = 4.0;  // QK^T and PV: 2 multiply-adds per element of d
constexpr double kCausalFraction = 0.5;      // FA2's convention for the causal FLOP count
constexpr double kTera = 1e12, kGiga = 1e9, kMsPerS = 1e3;

// The keys [lo, hi) query i of a (sq, sk) sequence sees; with causal the right side is 0.
struct Span {
  int lo, hi;
};

Span visible_span(const ProblemSpec& s, int i, int sq, int sk) {
  const int diag = i + sk - sq;
  const int right = s.causal ? 0 : s.window_right;
  Span r{0, sk};
  if (right >= 0) r.hi = std::min(r.hi, diag + right + 1);
  if (s.window_left >= 0) r.lo = std::max(r.lo, diag - s.window_left);
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

struct SequenceWork {
  double pairs = 0;  // visible (query, key) pairs of one head
  int keys_read = 0;  // keys from the first to the last one any query sees
};

SequenceWork sequence_work(const ProblemSpec& s, int sq, int sk) {
  SequenceWork w;
  int first = sk, last = 0;
  for (int i = 0; i < sq; ++i) {
    const Span r = visible_span(s, i, sq, sk);
    if (r.hi <= r.lo) continue;
    w.pairs += r.hi - r.lo;
    first = std::min(first, r.lo);
    last = std::max(last, r.hi);
  }
  w.keys_read = std::max(0, last - first);
  return w;
}

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::dense: return "dense";
    case Mode::varlen: return "varlen";
    case Mode::kvcache: return "kvcache";
  }
  return "?";
}

const char* rotary_name(Rotary r) {
  return r == Rotary::interleaved ? "interleaved" : (r == Rotary::neox ? "neox" : "none");
}

std::string flops_label(const Counts& c) {
  return c.flops_exact ? "exact count of visible pairs: 4*h*d*pairs"
                       : "FA2 count: 4*b*h*sq*sk*d, halved when causal";
}

}  // namespace

Counts count_work(const HostProblem& p) {
  const ProblemSpec& s = p.spec;
  Counts c;
  c.flops_exact = s.mode != Mode::dense || is_local(s);
  double pairs = 0, keys = 0;
  for (int b = 0; b < s.batch; ++b) {
    const SequenceWork w = sequence_work(s, p.len_q[b], p.len_k[b]);
    pairs += w.pairs;
    keys += w.keys_read;
  }
  const double per_pair = kMatmulFlopsPerPair * s.heads * s.head_dim;
  if (c.flops_exact) {
    c.flops = per_pair * pairs;
  } else {
    c.flops = per_pair * s.batch * double(s.seqlen_q) * s.seqlen_k * (s.causal ? kCausalFraction : 1.0);
  }
  c.kv_bytes = keys * s.kv_heads * s.head_dim * 2.0 * flashattn::dtype_size(s.kv_dtype);
  return c;
}

bool is_decode(const ProblemSpec& s) { return s.mode == Mode::kvcache; }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const char* dtype_label(DType t) {
  if (t == DType::e4m3) return "e4m3";
  return t == DType::bf16 ? "bf16" : "fp16";
}

std::string describe_problem(const ProblemSpec& s) {
  std::ostringstream os;
  os << mode_name(s.mode) << " b=" << s.batch << " sq=" << s.seqlen_q << " sk=" << s.seqlen_k
     << " h=" << s.heads << " hk=" << s.kv_heads << " d=" << s.head_dim;
  if (s.causal) os << " causal";
  if (is_local(s)) os << " window=" << s.window_left << "," << s.window_right;
  if (s.alibi) os << " alibi";
  if (s.softcap > 0) os << " softcap=" << s.softcap;
  if (s.paged) os << " paged(P=" << s.page_size << ")";
  if (s.mode == Mode::kvcache) os << " splits=" << (s.splits ? std::to_string(s.splits) : "auto");
  if (s.append > 0) os << " append=" << s.append;
  if (s.rotary != Rotary::none) os << " rotary=" << rotary_name(s.rotary);
  if (s.kv_dtype != s.dtype) os << " kv=" << dtype_label(s.kv_dtype);
  return os.str();
}

void print_report_text(const RunReport& rep) {
  const ProblemSpec& s = rep.problem->spec;
  const double seconds = rep.median_ms / kMsPerS;
  std::printf("flashattn run: %s %s %s\n", rep.device_name.c_str(), dtype_label(s.dtype),
              describe_problem(s).c_str());
  const double tflops = rep.counts.flops / seconds / kTera, gbps = rep.counts.kv_bytes / seconds / kGiga;
  if (s.mode == Mode::kvcache) std::printf("plan: %d split(s)\n", rep.splits_used);
  std::printf("time: %.4f ms (median of %d)", rep.median_ms, rep.repeat);
  if (is_decode(s))
    std::printf("  %.2f GB/s (K and V read: %.3g MB)  %.3f TFLOP/s (%s)\n", gbps,
                rep.counts.kv_bytes / 1e6, tflops, flops_label(rep.counts).c_str());
  else
    std::printf("  %.3f TFLOP/s (%s)\n", tflops, flops_label(rep.counts).c_str());
  if (!rep.checked) return;
  const CheckResult& c = rep.check;
  std::printf("check: out max err %.3g (tol %.3g)  lse max err %.3g (tol %.3g)", c.out_err, c.out_tol,
              c.lse_err, c.lse_tol);
  if (c.cache_checked) std::printf("  cache max err %.3g ulp (tol 1)", c.cache_err_ulps);
  std::printf("  %s\n", c.pass ? "PASS" : "FAIL");
}

void print_report_json(const RunReport& rep) {
  const ProblemSpec& s = rep.problem->spec;
  const double seconds = rep.median_ms / kMsPerS;
  JsonObject j;
  j.add("command", "run").add("device", rep.device_name).add("dtype", dtype_label(s.dtype));
  j.add("kv_dtype", dtype_label(s.kv_dtype));
  j.add("mode", mode_name(s.mode)).add("batch", s.batch).add("seqlen_q", s.seqlen_q);
  j.add("seqlen_k", s.seqlen_k).add("heads", s.heads).add("kv_heads", s.kv_heads).add("head_dim", s.head_dim);
  j.add("causal", s.causal).add("window_left", s.window_left).add("window_right", s.window_right);
  j.add("alibi", s.alibi).add("softcap", double(s.softcap)).add("paged", s.paged);
  j.add("page_size", s.paged ? s.page_size : 0).add("splits", s.splits).add("splits_used", rep.splits_used);
  j.add("append", s.append);
  j.add("rotary", rotary_name(s.rotary)).add("seed", double(s.seed)).add("repeat", rep.repeat);
  j.add("time_ms", rep.median_ms).add("flops", rep.counts.flops);
  j.add("flops_count", rep.counts.flops_exact ? "exact" : "fa2");
  j.add("tflops", rep.counts.flops / seconds / kTera).add("kv_bytes", rep.counts.kv_bytes);
  j.add("gbps", rep.counts.kv_bytes / seconds / kGiga);
  if (rep.checked) {
    const CheckResult& c = rep.check;
    JsonObject k;
    k.add("out_err", c.out_err).add("out_tol", c.out_tol).add("lse_err", c.lse_err).add("lse_tol", c.lse_tol);
    if (c.cache_checked) k.add("cache_err_ulps", c.cache_err_ulps);
    k.add("pass", c.pass);
    j.add_raw("check", k.str());
  }
  std::printf("%s\n", j.str().c_str());
}

}  // namespace facli
