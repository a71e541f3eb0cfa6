// ProblemSpec -> HostProblem: per-sequence lengths, the paged block table, seeded random inputs
// in the layout the library is given.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>

#include "cli.h"
#include "half.h"

namespace facli {
namespace {

constexpr double kRotaryBase = 10000.0;  // theta_c = pos * base^(-2c / rotary_dim), as in RoPE
constexpr double kAlibiSpan = 8.0;       // ALiBi slopes 2^(-8 (i+1) / h) (Press et al.)
// Fast fill (bench only): one pool of random values, copied in chunks from random offsets.
constexpr int64_t kPoolSize = int64_t(1) << 16;
constexpr int64_t kChunk = 4096;

using Rng = std::mt19937_64;

int uniform_int(Rng& rng, int lo, int hi) {  // inclusive
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

std::vector<uint16_t> random_normal(int64_t n, DType dtype, Rng& rng, bool fast) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> out(size_t(std::max<int64_t>(n, 0)));
  if (!fast || n <= kPoolSize) {
    for (auto& x : out) x = to_storage(dtype, normal(rng));
    return out;
  }
  std::vector<uint16_t> pool(kPoolSize);
  for (auto& x : pool) x = to_storage(dtype, normal(rng));
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t start = int64_t(rng() % uint64_t(kPoolSize - kChunk));
    const int64_t len = std::min(kChunk, n - i);
    std::copy(pool.begin() + start, pool.begin() + start + len, out.begin() + i);
  }
  return out;
}

constexpr float kE4m3Max = 448.0f;  // the largest finite e4m3 value

// The rows of one sequence in an array: how many, and where the i-th one is.
struct SequenceRows {
  std::function<int(int)> count;             // (b) -> rows of sequence b
  std::function<int64_t(int, int)> row;      // (b, i) -> row index in the array
};

// An e4m3 array (rows, heads, d) of random normal values, quantized with one descale per
// (batch, KV head) = amax / 448 of the values it scales (fp32; 1 where they are all 0):
// code = e4m3(x / descale). Every row belongs to one sequence (seq.row covers the array).
std::vector<uint16_t> quantized_normal(const ProblemSpec& s, int64_t rows, int heads, Rng& rng,
                                       const SequenceRows& seq, std::vector<float>& descale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t d = s.head_dim, row_elems = int64_t(heads) * d;
  std::vector<float> x(size_t(std::max<int64_t>(rows, 0) * row_elems));
  for (auto& e : x) e = normal(rng);
  const int hk = s.kv_heads, group = std::max(1, heads / hk);
  auto kv_head = [&](int head) { return std::min(head / group, hk - 1); };
  std::vector<float> amax(size_t(s.batch) * hk, 0.0f);
  for (int b = 0; b < s.batch; ++b)
    for (int i = 0; i < seq.count(b); ++i)
      for (int head = 0; head < heads; ++head)
        for (int64_t c = 0; c < d; ++c) {
          float& m = amax[size_t(b) * hk + kv_head(head)];
          m = std::max(m, std::fabs(x[size_t(seq.row(b, i) * row_elems + head * d + c)]));
        }
  descale.resize(amax.size());
  for (size_t i = 0; i < amax.size(); ++i) descale[i] = amax[i] > 0 ? amax[i] / kE4m3Max : 1.0f;
  std::vector<uint16_t> codes(x.size());
  for (int b = 0; b < s.batch; ++b)
    for (int i = 0; i < seq.count(b); ++i)
      for (int head = 0; head < heads; ++head)
        for (int64_t c = 0; c < d; ++c) {
          const size_t at = size_t(seq.row(b, i) * row_elems + head * d + c);
          codes[at] = to_storage(DType::e4m3, x[at] / descale[size_t(b) * hk + kv_head(head)]);
        }
  return codes;
}

std::vector<int32_t> prefix_sums(const std::vector<int>& lengths) {
  std::vector<int32_t> cu(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) cu[b + 1] = cu[b] + lengths[b];
  return cu;
}

// Varlen: lengths in [1, seqlen]; with seqlen_q == seqlen_k one length for both (self-attention).
void draw_varlen_lengths(HostProblem& p, Rng& rng) {
  const ProblemSpec& s = p.spec;
  for (int b = 0; b < s.batch; ++b) {
    const int lq = s.random_lengths ? uniform_int(rng, 1, s.seqlen_q) : s.seqlen_q;
    int lk = s.random_lengths ? uniform_int(rng, 1, s.seqlen_k) : s.seqlen_k;
    if (s.seqlen_q == s.seqlen_k) lk = lq;
    p.len_q[b] = lq;
    p.len_k[b] = lk;
  }
  p.cu_q = prefix_sums(p.len_q);
  p.cu_k = prefix_sums(p.len_k);
}

// KV cache: cache_seqlens in [0, capacity - append] (at least 1 key when nothing is appended).
void draw_cache_lengths(HostProblem& p, Rng& rng) {
  const ProblemSpec& s = p.spec;
  const int most = s.seqlen_k - s.append;
  const int least = s.append > 0 ? 0 : 1;
  p.cache_seqlens.resize(s.batch);
  for (int b = 0; b < s.batch; ++b) {
    p.cache_seqlens[b] = s.random_lengths ? uniform_int(rng, std::min(least, most), most) : most;
    p.len_q[b] = s.seqlen_q;
    p.len_k[b] = p.cache_seqlens[b] + s.append;
  }
}

void draw_lengths(HostProblem& p, Rng& rng) {
  const ProblemSpec& s = p.spec;
  p.len_q.assign(s.batch, s.seqlen_q);
  p.len_k.assign(s.batch, s.seqlen_k);
  if (s.mode == Mode::varlen) draw_varlen_lengths(p, rng);
  if (s.mode == Mode::kvcache) draw_cache_lengths(p, rng);
}

// Every sequence owns ceil(seqlen_k / page_size) pages, handed out in a shuffled order.
void make_block_table(HostProblem& p, Rng& rng) {
  const ProblemSpec& s = p.spec;
  p.max_pages = (s.seqlen_k + s.page_size - 1) / s.page_size;
  p.block_table.resize(size_t(s.batch) * p.max_pages);
  std::iota(p.block_table.begin(), p.block_table.end(), 0);
  std::shuffle(p.block_table.begin(), p.block_table.end(), rng);
}

void size_arrays(HostProblem& p) {
  const ProblemSpec& s = p.spec;
  const bool varlen = s.mode == Mode::varlen;
  p.q_rows = varlen ? p.cu_q.back() : int64_t(s.batch) * s.seqlen_q;
  if (s.paged)
    p.kv_rows = int64_t(p.block_table.size()) * s.page_size;
  else
    p.kv_rows = varlen ? p.cu_k.back() : int64_t(s.batch) * s.seqlen_k;
}

void make_rotary_tables(HostProblem& p) {
  const ProblemSpec& s = p.spec;
  const int half = s.head_dim / 2;  // rotary_dim = 2 * half
  // Every cache row (the paged capacity may exceed seqlen_k), and queries may sit past the
  // cache (cache_seqlens + i): seqlen_q more positions.
  const int capacity = s.paged ? p.max_pages * s.page_size : s.seqlen_k;
  p.rotary_positions = capacity + s.seqlen_q;
  p.rot_cos.resize(size_t(p.rotary_positions) * half);
  p.rot_sin.resize(p.rot_cos.size());
  for (int pos = 0; pos < p.rotary_positions; ++pos) {
    for (int c = 0; c < half; ++c) {
      const double angle = pos * std::pow(kRotaryBase, -2.0 * c / (2 * half));
      p.rot_cos[size_t(pos) * half + c] = to_storage(out_dtype(s), float(std::cos(angle)));
      p.rot_sin[size_t(pos) * half + c] = to_storage(out_dtype(s), float(std::sin(angle)));
    }
  }
}

void make_alibi(HostProblem& p) {
  const int h = p.spec.heads;
  p.alibi.resize(h);
  for (int i = 0; i < h; ++i) p.alibi[i] = float(std::pow(2.0, -kAlibiSpan * (i + 1) / h));
}

void fill_inputs(HostProblem& p, Rng& rng) {
  const ProblemSpec& s = p.spec;
  const int64_t q_row = int64_t(s.heads) * s.head_dim;
  const int64_t kv_row = int64_t(s.kv_heads) * s.head_dim;
  const SequenceRows q_rows{[&](int b) { return p.len_q[b]; },
                           [&](int b, int i) { return p.q_row(b, i); }};
  // k / v rows of a sequence: its pages, its cache row, or its keys.
  const int kv_capacity = s.paged ? p.max_pages * s.page_size : s.seqlen_k;
  const SequenceRows kv_rows{
      [&](int b) { return s.mode == Mode::varlen && !s.paged ? p.len_k[b] : kv_capacity; },
      [&](int b, int pos) { return p.kv_row(b, pos); }};
  if (s.dtype == DType::e4m3)
    p.q = quantized_normal(s, p.q_rows, s.heads, rng, q_rows, p.q_descale);
  else
    p.q = random_normal(p.q_rows * q_row, s.dtype, rng, s.fast_fill);
  if (s.kv_dtype == DType::e4m3) {
    p.k = quantized_normal(s, p.kv_rows, s.kv_heads, rng, kv_rows, p.k_descale);
    p.v = quantized_normal(s, p.kv_rows, s.kv_heads, rng, kv_rows, p.v_descale);
  } else {
    p.k = random_normal(p.kv_rows * kv_row, s.kv_dtype, rng, s.fast_fill);
    p.v = random_normal(p.kv_rows * kv_row, s.kv_dtype, rng, s.fast_fill);
  }
  if (s.mode == Mode::kvcache && s.append > 0) {  // in out's dtype
    const int64_t rows = int64_t(s.batch) * s.append;
    p.k_new = random_normal(rows * kv_row, out_dtype(s), rng, s.fast_fill);
    p.v_new = random_normal(rows * kv_row, out_dtype(s), rng, s.fast_fill);
  }
}

}  // namespace

bool is_local(const ProblemSpec& s) { return s.window_left >= 0 || s.window_right >= 0; }

DType out_dtype(const ProblemSpec& s) { return s.dtype == DType::e4m3 ? DType::bf16 : s.dtype; }

bool is_fp8(const ProblemSpec& s) { return s.dtype == DType::e4m3 || s.kv_dtype == DType::e4m3; }

void check_problem_size(const ProblemSpec& s) {
  constexpr double kMaxInt32Count = 2147483647.0;
  constexpr double kMaxArrayBytes = 4611686018427387904.0;  // 2^62
  constexpr double kBytesPerElement = 2.0;                  // fp16 / bf16 storage
  auto text = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", x);
    return std::string(buf);
  };
  const double batch = s.batch, sq = s.seqlen_q, sk = s.seqlen_k;
  if (s.mode == Mode::varlen && batch * std::max(sq, sk) > kMaxInt32Count)
    throw UsageError("--varlen: --batch x --seqlen-q (and x --seqlen-k) must be below 2^31 (cu_seqlens are int32), got " +
                     text(batch * std::max(sq, sk)));
  const double pages_per_seq = s.paged ? std::ceil(sk / s.page_size) : 0.0;
  if (s.paged && batch * pages_per_seq > kMaxInt32Count)
    throw UsageError("--paged: --batch x pages per sequence (--seqlen-k / --page-size) must be below 2^31 (page indices are int32), got " +
                     text(batch * pages_per_seq));
  const double capacity = s.paged ? pages_per_seq * s.page_size : sk;
  if (s.mode == Mode::kvcache && capacity + sq > kMaxInt32Count)
    throw UsageError("--kvcache: the cache capacity (--seqlen-k, rounded up to whole pages) + --seqlen-q must be below 2^31 (positions are int32), got " +
                     text(capacity + sq));
  const double kv_rows = s.paged ? batch * pages_per_seq * s.page_size : batch * sk;
  const double q_bytes = batch * sq * s.heads * s.head_dim * kBytesPerElement;
  const double kv_bytes = kv_rows * s.kv_heads * s.head_dim * kBytesPerElement;
  if (q_bytes > kMaxArrayBytes)
    throw UsageError("the problem is too large: q would take " + text(q_bytes) +
                     " bytes (--batch x --seqlen-q x --heads x --head-dim x 2)");
  if (kv_bytes > kMaxArrayBytes)
    throw UsageError("the problem is too large: k and v would take " + text(kv_bytes) +
                     " bytes each (--batch x --seqlen-k x --kv-heads x --head-dim x 2)");
}

HostProblem make_problem(const ProblemSpec& spec) {
  HostProblem p;
  p.spec = spec;
  Rng rng(spec.seed);
  draw_lengths(p, rng);
  if (spec.paged) make_block_table(p, rng);
  size_arrays(p);
  fill_inputs(p, rng);
  if (spec.rotary != Rotary::none) make_rotary_tables(p);
  if (spec.alibi) make_alibi(p);
  return p;
}

int64_t HostProblem::q_row(int b, int i) const {
  return spec.mode == Mode::varlen ? cu_q[b] + i : int64_t(b) * spec.seqlen_q + i;
}

int64_t HostProblem::kv_row(int b, int pos) const {
  if (spec.paged) {
    const int page = block_table[size_t(b) * max_pages + pos / spec.page_size];
    return int64_t(page) * spec.page_size + pos % spec.page_size;
  }
  return spec.mode == Mode::varlen ? cu_k[b] + pos : int64_t(b) * spec.seqlen_k + pos;
}

// LSE: (b, h, sq) for dense and kvcache calls, (h, total_q) for varlen.
int64_t HostProblem::lse_index(int b, int head, int i) const {
  if (spec.mode == Mode::varlen) return head * q_rows + cu_q[b] + i;
  return (int64_t(b) * spec.heads + head) * spec.seqlen_q + i;
}

int64_t HostProblem::lse_size() const { return int64_t(spec.heads) * q_rows; }

}  // namespace facli
