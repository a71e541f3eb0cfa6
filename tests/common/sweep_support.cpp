#include "sweep_support.h"

#include <algorithm>
#include <cctype>
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
     << "_d" << d << f.name() << layout_name(layout);
  return sanitize(os.str());
}

std::string VarlenCase::name() const {
  std::ostringstream os;
  os << short_name(dtype) << "_q" << lengths(seqlens_q) << "_k" << lengths(seqlens_k) << "_h" << h
     << "_hk" << hk << "_d" << d << f.name();
  if (seqused_k) os << "_seqused";
  if (leftpad_k) os << "_leftpad";
  if (page_size > 0) os << "_page" << page_size;
  os << layout_name(layout);
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
  os << layout_name(layout) << f.name();
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
