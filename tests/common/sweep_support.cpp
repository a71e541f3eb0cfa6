#include "sweep_support.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <random>
#include <sstream>

namespace fa_test {

namespace {
// ALiBi slopes drawn in this range: from nearly flat to strongly local over a few keys.
constexpr double kMinSlope = 0.01;
constexpr double kMaxSlope = 0.5;

std::string sanitize(std::string s) {
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}
std::string window_name(int l, int r) {
  std::ostringstream os;
  os << "win" << (l < 0 ? std::string("inf") : std::to_string(l)) << "x"
     << (r < 0 ? std::string("inf") : std::to_string(r));
  return os.str();
}
}  // namespace

std::string Features::name() const {
  std::ostringstream os;
  if (causal) os << "_causal";
  if (window_left >= 0 || window_right >= 0) os << "_" << window_name(window_left, window_right);
  if (softcap > 0.0f) os << "_cap" << int(softcap);
  if (alibi == Alibi::per_head) os << "_alibiH";
  if (alibi == Alibi::per_batch_head) os << "_alibiBH";
  if (scale != 0.0f) os << "_scaled";
  if (!lse) os << "_nolse";
  if (kernel.kernel != flashattn::Kernel::automatic) os << "_on_" << flashattn::kernel_name(kernel.kernel);
  if (!kernel.cluster_combine) os << "_combinekernel";
  if (!kernel.programmatic_launch) os << "_nopdl";
  if (kernel.tile_order != flashattn::TileOrder::automatic) os << "_order" << int(kernel.tile_order);
  if (kernel.wgmma_tile != flashattn::WgmmaTile::automatic) os << "_tile" << int(kernel.wgmma_tile);
  return os.str();
}

namespace {
const char* fp8_name(Fp8 fp8) {
  switch (fp8) {
    case Fp8::none: return "";
    case Fp8::per_tensor: return "_e4m3_scalar";
    case Fp8::per_head: return "_e4m3_per_head";
  }
  return "";
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "";
    case Layout::padded: return "_padded";
    case Layout::qkv_packed: return "_qkvpacked";
  }
  return "";
}
std::string lengths(const std::vector<int>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "x" : "") << v[i];
  return os.str();
}
}  // namespace

std::string DenseCase::name() const {
  std::ostringstream os;
  os << short_name(dtype) << "_b" << b << "_sq" << sq << "_sk" << sk << "_h" << h << "_hk" << hk
     << "_d" << d << f.name() << layout_name(layout) << fp8_name(fp8);
  return sanitize(os.str());
}

std::string VarlenCase::name() const {
  std::ostringstream os;
  os << short_name(dtype) << "_q" << lengths(seqlens_q) << "_k" << lengths(seqlens_k) << "_h" << h
     << "_hk" << hk << "_d" << d << f.name();
  if (seqused_k) os << "_seqused";
  if (leftpad_k) os << "_leftpad";
  if (page_size > 0) os << "_page" << page_size;
  os << layout_name(layout) << fp8_name(fp8);
  if (fp8_kv_only) os << "_kv_only";
  return sanitize(os.str());
}

std::string KVCase::name() const {
  std::ostringstream os;
  os << short_name(dtype) << "_b" << b << "_sq" << sq << "_h" << h << "_hk" << hk << "_d" << d
     << "_cap" << capacity;
  if (!with_seqlens) os << "_full";
  if (s_new > 0) os << "_new" << s_new;
  if (batch_idx) os << "_bidx";
  if (leftpad) os << "_leftpad";
  if (page_size > 0) os << "_page" << page_size << (shuffled_pages ? "s" : "");
  if (rotary == Rotary::interleaved) os << "_ropeI" << rotary_dim;
  if (rotary == Rotary::neox) os << "_ropeN" << rotary_dim;
  os << "_splits" << num_splits;
  if (caller_workspace) os << "_ws";
  os << layout_name(layout) << f.name() << fp8_name(fp8_cache);
  if (fp8_q) os << "_q_e4m3";
  return sanitize(os.str());
}

// ---- ALiBi ---------------------------------------------------------------------------------

const double* AlibiData::of_sequence(int b) const {
  if (kind == Alibi::none) return nullptr;
  return slopes.data() + (kind == Alibi::per_batch_head ? size_t(b) * size_t(heads) : 0);
}

Tensor AlibiData::tensor(int batch) const {
  if (kind == Alibi::none) return Tensor{};
  if (kind == Alibi::per_head) return f32_vector(buffer, {heads});
  return f32_vector(buffer, {batch, heads});
}

AlibiData make_alibi(Alibi kind, int batch, int heads, Device device, uint64_t seed) {
  AlibiData a;
  a.kind = kind;
  a.heads = heads;
  if (kind == Alibi::none) return a;
  const int rows = kind == Alibi::per_batch_head ? batch : 1;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(kMinSlope, kMaxSlope);
  a.slopes.resize(size_t(rows) * size_t(heads));
  for (double& s : a.slopes) s = double(float(dist(rng)));
  a.buffer = to_device(a.slopes, DType::f32, device);
  return a;
}

// ---- FP8 ---------------------------------------------------------------------------------

namespace {
// Descale factors are drawn from these (exact in fp32, spanning 4x).
constexpr double kFp8Factors[] = {0.5, 0.75, 1.0, 1.25, 1.5, 2.0};
}  // namespace

double Fp8Scales::at(const std::vector<double>& factors, int b, int hk) const {
  if (kind == Fp8::none) return 1.0;
  return kind == Fp8::per_tensor ? factors[0] : factors[size_t(b) * size_t(heads_k) + size_t(hk)];
}

std::vector<double> Fp8Scales::descaled(const std::vector<double>& factors, const double* x, int64_t rows,
                                        int heads, int d, int b) const {
  std::vector<double> y(x, x + rows * heads * d);
  const int group = heads / heads_k;
  for (int64_t r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      const double f = at(factors, b, h / group);
      for (int c = 0; c < d; ++c) y[size_t((r * heads + h) * d + c)] *= f;
    }
  }
  return y;
}

void Fp8Scales::set_options(flashattn::AttentionOptions& o, bool with_q) const {
  if (kind == Fp8::none) return;
  const auto tensor = [&](const Buffer& buf) {
    return kind == Fp8::per_tensor ? f32_vector(buf, {1}) : f32_vector(buf, {batch, heads_k});
  };
  if (with_q) o.q_descale = tensor(q_buffer);
  o.k_descale = tensor(k_buffer);
  o.v_descale = tensor(v_buffer);
}

Fp8Scales make_fp8_scales(Fp8 kind, int batch, int heads_k, Device device, uint64_t seed) {
  Fp8Scales s;
  s.kind = kind;
  s.batch = batch;
  s.heads_k = heads_k;
  if (kind == Fp8::none) return s;
  const size_t n = kind == Fp8::per_tensor ? 1 : size_t(batch) * size_t(heads_k);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, std::size(kFp8Factors) - 1);
  for (std::vector<double>* factors : {&s.q, &s.k, &s.v}) {
    factors->resize(n);
    for (double& f : *factors) f = kFp8Factors[pick(rng)];
  }
  s.q_buffer = to_device(s.q, DType::f32, device);
  s.k_buffer = to_device(s.k, DType::f32, device);
  s.v_buffer = to_device(s.v, DType::f32, device);
  return s;
}

::testing::AssertionResult fp8_output_within_bound(const std::vector<double>& impl,
                                                   const std::vector<double>& ref64) {
  double worst = 0.0, magnitude = 0.0;
  for (size_t i = 0; i < ref64.size(); ++i) {
    magnitude = std::max(magnitude, std::fabs(ref64[i]));
    const double err = std::fabs(impl[i] - ref64[i]);
    if (!(err <= worst)) worst = err;  // NaN counts as the worst
  }
  if (worst <= kFp8OutputBound * magnitude) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "FP8 output: max abs error " << worst << " > " << kFp8OutputBound
                                       << " x max|ref| " << magnitude;
}

flashattn::AttentionOptions api_options(const Features& f, const AlibiData& alibi, int batch,
                                        const Tensor& lse) {
  flashattn::AttentionOptions o;
  if (f.scale != 0.0f) o.softmax_scale = f.scale;
  o.causal = f.causal;
  o.window_left = f.window_left;
  o.window_right = f.window_right;
  o.softcap = f.softcap;
  o.alibi_slopes = alibi.tensor(batch);
  o.softmax_lse = lse;
  o.kernel_override = f.kernel;  // the sweep's kernel, never FLASHATTN_KERNEL's
  return o;
}

flashattn_ref::Options ref_options(const Features& f, const AlibiData& alibi, int b) {
  flashattn_ref::Options o;
  o.scale = f.scale;
  o.causal = f.causal;
  o.window_left = f.window_left;
  o.window_right = f.window_right;
  o.softcap = f.softcap;
  o.alibi_slopes = alibi.of_sequence(b);
  return o;
}

void place_out(std::vector<double>& all, const std::vector<double>& seq, int64_t row0, int sq,
               int h, int d) {
  const int64_t width = int64_t(h) * d;
  std::copy(seq.begin(), seq.begin() + int64_t(sq) * width, all.begin() + row0 * width);
}

void place_lse(std::vector<double>& all, const std::vector<double>& seq, int64_t lse_base,
               int64_t lse_head_stride, int sq, int h) {
  for (int head = 0; head < h; ++head) {
    for (int i = 0; i < sq; ++i) {
      all[size_t(lse_base + head * lse_head_stride + i)] = seq[size_t(head) * size_t(sq) + size_t(i)];
    }
  }
}

}  // namespace fa_test
