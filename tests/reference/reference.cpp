// The float64 test oracle (see reference.h). Written plainly from the semantics in DESIGN.md and
// README.md (Semantics); it includes nothing from src/ on purpose.
#include "reference.h"

#include <cmath>
#include <limits>

namespace flashattn_ref {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Precision (significand bits incl. the implicit one), smallest normal exponent and largest
// finite value of each storage type.
struct Format {
  int precision;
  int min_exponent;
  double max_finite;
};

Format format_of(Storage s) {
  switch (s) {
    case Storage::f16: return {11, -14, 65504.0};
    case Storage::bf16: return {8, -126, 3.38953138925153547590e38};
    case Storage::f32: break;
  }
  return {24, -126, 3.40282346638528859812e38};
}

// Is key j visible to query i? Bottom-right aligned: the diagonal key of query i is
// i + sk - sq. Causal means "no key right of the diagonal".
bool visible(const Options& opt, int i, int j, int sq, int sk) {
  const long diag = long(i) + sk - sq;
  const int right = opt.causal ? 0 : opt.window_right;
  if (right >= 0 && j > diag + right) return false;
  if (opt.window_left >= 0 && j < diag - opt.window_left) return false;
  return true;
}

double scale_of(const Options& opt, int d) {
  return opt.scale != 0.0 ? opt.scale : 1.0 / std::sqrt(double(d));
}

}  // namespace

double round_to(Storage s, double x) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  if (s == Storage::f32) return double(float(x));  // the hardware conversion is RNE
  const Format f = format_of(s);
  int exponent;  // x = m * 2^exponent, 0.5 <= |m| < 1: the leading bit weighs 2^(exponent-1)
  std::frexp(x, &exponent);
  int lead = exponent - 1;
  if (lead < f.min_exponent) lead = f.min_exponent;  // subnormal: fixed quantum
  const double quantum = std::ldexp(1.0, lead - (f.precision - 1));
  const double r = std::nearbyint(x / quantum) * quantum;  // default rounding mode: RNE
  if (std::fabs(r) > f.max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

void attention(const double* q, const double* k, const double* v, int sq, int sk, int h,
               int hk, int d, const Options& opt, double* out, double* lse) {
  const double scale = scale_of(opt, d);
  const int group = h / hk;
  std::vector<double> score(sk > 0 ? sk : 1);
  for (int head = 0; head < h; ++head) {
    const int kv_head = head / group;
    const double slope = opt.alibi_slopes ? opt.alibi_slopes[head] : 0.0;
    for (int i = 0; i < sq; ++i) {
      const double* qi = q + (int64_t(i) * h + head) * d;
      double* oi = out + (int64_t(i) * h + head) * d;
      // scores of the visible keys, -inf elsewhere
      double m = kNegInf;
      for (int j = 0; j < sk; ++j) {
        if (!visible(opt, i, j, sq, sk)) {
          score[j] = kNegInf;
          continue;
        }
        const double* kj = k + (int64_t(j) * hk + kv_head) * d;
        double dot = 0.0;
        for (int c = 0; c < d; ++c) dot += qi[c] * kj[c];
        double s = opt.softcap > 0.0 ? opt.softcap * std::tanh(dot * scale / opt.softcap)
                                     : dot * scale;
        s -= slope * std::fabs(double(i) + sk - sq - j);
        score[j] = s;
        if (s > m) m = s;
      }
      for (int c = 0; c < d; ++c) oi[c] = 0.0;
      if (m == kNegInf) {  // no visible key
        if (lse) lse[int64_t(head) * sq + i] = kNegInf;
        continue;
      }
      // softmax and P·V
      double sum = 0.0;
      for (int j = 0; j < sk; ++j) {
        if (score[j] == kNegInf) continue;
        const double p = std::exp(score[j] - m);
        sum += p;
        const double* vj = v + (int64_t(j) * hk + kv_head) * d;
        for (int c = 0; c < d; ++c) oi[c] += p * vj[c];
      }
      for (int c = 0; c < d; ++c) oi[c] /= sum;
      if (lse) lse[int64_t(head) * sq + i] = m + std::log(sum);
    }
  }
}

void attention_lowp(Storage s, const double* q, const double* k, const double* v, int sq,
                    int sk, int h, int hk, int d, const Options& opt, double* out,
                    double* lse) {
  const float scale = float(scale_of(opt, d));
  const float softcap = float(opt.softcap);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int group = h / hk;
  std::vector<float> score(sk > 0 ? sk : 1);
  std::vector<float> acc(d);
  for (int head = 0; head < h; ++head) {
    const int kv_head = head / group;
    const float slope = opt.alibi_slopes ? float(opt.alibi_slopes[head]) : 0.0f;
    for (int i = 0; i < sq; ++i) {
      const double* qi = q + (int64_t(i) * h + head) * d;
      double* oi = out + (int64_t(i) * h + head) * d;
      float m = neg_inf;
      for (int j = 0; j < sk; ++j) {
        if (!visible(opt, i, j, sq, sk)) {
          score[j] = neg_inf;
          continue;
        }
        const double* kj = k + (int64_t(j) * hk + kv_head) * d;
        float dot = 0.0f;
        for (int c = 0; c < d; ++c) dot += float(qi[c]) * float(kj[c]);
        float sc = softcap > 0.0f ? softcap * std::tanh(dot * (scale / softcap)) : dot * scale;
        sc -= slope * float(std::abs(i + sk - sq - j));
        score[j] = sc;
        if (sc > m) m = sc;
      }
      if (m == neg_inf) {
        for (int c = 0; c < d; ++c) oi[c] = 0.0;
        if (lse) lse[int64_t(head) * sq + i] = kNegInf;
        continue;
      }
      // Unnormalised P in float32, rounded to storage before P·V (as a tiled kernel feeds
      // the tensor cores); the row sum uses the unrounded P.
      float sum = 0.0f;
      for (int c = 0; c < d; ++c) acc[c] = 0.0f;
      for (int j = 0; j < sk; ++j) {
        if (score[j] == neg_inf) continue;
        const float p = std::exp(score[j] - m);
        sum += p;
        const float p_low = float(round_to(s, p));
        const double* vj = v + (int64_t(j) * hk + kv_head) * d;
        for (int c = 0; c < d; ++c) acc[c] += p_low * float(vj[c]);
      }
      for (int c = 0; c < d; ++c) oi[c] = round_to(s, double(acc[c] / sum));
      if (lse) lse[int64_t(head) * sq + i] = double(m + std::log(sum));
    }
  }
}

void rotary(double* x, int rows, int heads, int d, const double* cos, const double* sin,
            int rotary_dim, bool interleaved, const int* positions) {
  const int half = rotary_dim / 2;
  for (int r = 0; r < rows; ++r) {
    const double* cr = cos + int64_t(positions[r]) * half;
    const double* sr = sin + int64_t(positions[r]) * half;
    for (int hh = 0; hh < heads; ++hh) {
      double* xr = x + (int64_t(r) * heads + hh) * d;
      for (int t = 0; t < half; ++t) {
        // the pair (a, b) rotates by the angle of column t
        const int a = interleaved ? 2 * t : t;
        const int b = interleaved ? 2 * t + 1 : t + half;
        const double xa = xr[a], xb = xr[b];
        xr[a] = xa * cr[t] - xb * sr[t];
        xr[b] = xb * cr[t] + xa * sr[t];
      }
    }
  }
  (void)d;
}

double max_abs_diff(const double* a, const double* b, int64_t n) {
  double worst = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    if (a[i] == b[i]) continue;  // equal infinities too
    const double diff = std::fabs(a[i] - b[i]);
    if (diff > worst) worst = diff;
  }
  return worst;
}

}  // namespace flashattn_ref
