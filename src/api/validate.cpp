// Every rule of the public API, checked before anything runs.
//
// Rules that need the values of index tensors (cu_seqlens, cache_seqlens, block_table, ...) are
// checked only when those tensors live in host memory: reading device memory would need a
// synchronisation, which decode must not pay (FlashAttention-2 does not check them either).
// Rules that need only addresses, shapes and strides (sizes, memory overlap) hold on every device.
#include "api/validate.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <sstream>
#include <vector>

#include "api/backend.h"
#include "api/overlap.h"
#include "api/staging.h"

namespace flashattn {

constexpr size_t kWorkspaceAlignment = 256;
// Sizes, lengths and positions are int32 in the kernels and in AttnParams: every tensor size,
// and every sum of lengths the mask computes (i + seqlen_k - seqlen_q), stays at most this.
constexpr int64_t kMaxIndex = INT32_MAX;
// batch x seqlen_q x heads x head_dim at most this: the split-KV scratch (up to kMaxSplits fp32
// copies of the output, plus one LSE per row) then has a byte size that fits 64 bits.
constexpr int64_t kMaxOutputElements = int64_t(1) << 53;
// A view's bytes, from its lowest to its highest element, at most this many (so that element
// offsets, int64 in the backends, cannot overflow), and below the end of a 64-bit address space.
constexpr __int128 kMaxSpanBytes = __int128(1) << 62;
constexpr __int128 kAddressSpaceEnd = __int128(1) << 64;

namespace {

[[noreturn]] void fail(Error::Kind kind, const std::string& arg, const std::string& rule,
                       const std::string& seen) {
  throw Error(kind, arg + ": " + rule + " (got " + seen + ")");
}
[[noreturn]] void fail(const std::string& arg, const std::string& rule, const std::string& seen) {
  fail(Error::Kind::invalid_argument, arg, rule, seen);
}

std::string str(int64_t v) { return std::to_string(v); }

bool has_elements(const Tensor& t) {
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] <= 0) return false;
  }
  return t.ndim > 0;
}

void require_defined(const Tensor& t, const char* name) {
  if (!t.defined()) fail(name, "is required", "an undefined tensor");
  if (t.data == nullptr && has_elements(t)) fail(name, "has no data pointer", "nullptr");
}

// The bytes from the view's lowest to its highest element lie in a 64-bit address space and
// number less than 2^62, so that no element offset (int64 in the backends) overflows.
void require_addressable(const Tensor& t, const char* name) {
  const ByteSpan span = byte_span(t);
  if (span.last - span.first >= kMaxSpanBytes || span.first < 0 || span.last >= kAddressSpaceEnd) {
    std::string strides;
    for (int i = 0; i < t.ndim; ++i) strides += (i ? ", " : "") + str(t.stride[i]);
    fail(name, "must lie within the address space, spanning less than 2^62 bytes (element offsets are int64)",
         "strides (" + strides + ") over " + shape_string(t));
  }
}

void require_ndim(const Tensor& t, const char* name, int ndim, const char* layout) {
  if (t.ndim != ndim) {
    fail(name, std::string("must have ") + str(ndim) + " dims " + layout,
         str(t.ndim) + " dims " + shape_string(t));
  }
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) fail(name, "must have non-negative sizes", shape_string(t));
  }
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] > kMaxIndex) {
      fail(name, "must have sizes below 2^31 (the kernels index them with int32)", shape_string(t));
    }
  }
  require_addressable(t, name);
}

void require_dtype(const Tensor& t, const char* name, DType dtype) {
  if (t.dtype != dtype) {
    fail(Error::Kind::type_error, name, std::string("must be ") + dtype_name(dtype),
         dtype_name(t.dtype));
  }
}

void require_same_device(const Tensor& t, const char* name, const Tensor& q) {
  if (t.device != q.device || (t.device == Device::cuda && t.device_index != q.device_index)) {
    std::string want = std::string(device_name(q.device)) +
                       (q.device == Device::cuda ? ":" + str(q.device_index) : "");
    std::string seen = std::string(device_name(t.device)) +
                       (t.device == Device::cuda ? ":" + str(t.device_index) : "");
    fail(name, "must be on the same device as q (" + want + ")", seen);
  }
}

void require_last_dim_contiguous(const Tensor& t, const char* name) {
  if (t.ndim > 0 && t.shape[t.ndim - 1] > 1 && t.stride[t.ndim - 1] != 1) {
    fail(name, "must have a contiguous last dimension (stride 1); copy it into one first "
               "(torch: .contiguous(), NumPy: np.ascontiguousarray)",
         "stride " + str(t.stride[t.ndim - 1]));
  }
}

void require_dim(const Tensor& t, const char* name, int dim, int64_t expected,
                 const std::string& meaning) {
  if (t.shape[dim] != expected) {
    fail(name, "dim " + str(dim) + " must be " + meaning + " = " + str(expected),
         shape_string(t));
  }
}

// An optional int32 index tensor of shape (n): on q's device, contiguous. n_meaning names n
// ("batch" or "batch + 1").
void check_index_vector(const Tensor& t, const char* name, const Tensor& q, int64_t n,
                        const std::string& n_meaning) {
  if (!t.defined()) return;
  require_dtype(t, name, DType::i32);
  require_same_device(t, name, q);
  require_ndim(t, name, 1, ("(" + n_meaning + ")").c_str());
  require_dim(t, name, 0, n, n_meaning);
  if (t.data == nullptr && n > 0) fail(name, "has no data pointer", "nullptr");
  require_last_dim_contiguous(t, name);
}

const int* host_ints(const Tensor& t) {
  return (t.defined() && t.device == Device::cpu) ? static_cast<const int*>(t.data) : nullptr;
}

// ---- the element tensors ----------------------------------------------------------------

void check_storage_dtype(const Tensor& q) {
  const bool half = q.dtype == DType::f16 || q.dtype == DType::bf16;
  if (q.device == Device::cuda && !half && q.dtype != DType::e4m3) {
    fail(Error::Kind::type_error, "q", "must be fp16, bf16 or e4m3 on cuda", dtype_name(q.dtype));
  }
  if (!half && q.dtype != DType::f32 && q.dtype != DType::e4m3) {
    fail(Error::Kind::type_error, "q", "must be fp16, bf16, e4m3 or fp32 (fp32 on cpu only)",
         dtype_name(q.dtype));
  }
}

// The type the kernels compute in and write out in: q's, or bf16 for an e4m3 q (flashattn.h,
// docs/DECISIONS.md D-64). k_new, v_new and the rotary tables have it too.
DType compute_dtype(const Tensor& q) { return q.dtype == DType::e4m3 ? DType::bf16 : q.dtype; }

void require_same_dtype(const Tensor& t, const char* name, DType dtype, const char* whose) {
  if (t.dtype != dtype) {
    fail(Error::Kind::type_error, name, std::string("must have ") + whose + " dtype " + dtype_name(dtype),
         dtype_name(t.dtype));
  }
}

void check_like_q(const Tensor& t, const char* name, const Tensor& q, DType dtype, const char* whose) {
  require_defined(t, name);
  require_same_dtype(t, name, dtype, whose);
  require_same_device(t, name, q);
  require_last_dim_contiguous(t, name);
  require_addressable(t, name);
}
void check_like_q(const Tensor& t, const char* name, const Tensor& q) {
  check_like_q(t, name, q, q.dtype, "q's");
}

// A KV cache: q's dtype, or e4m3 under a bf16/fp16 q (an e4m3 q needs an e4m3 cache: check_like_q).
void check_cache_like_q(const Tensor& t, const char* name, const Tensor& q) {
  const bool fp8_cache = t.dtype == DType::e4m3 && (q.dtype == DType::bf16 || q.dtype == DType::f16);
  check_like_q(t, name, q, fp8_cache ? DType::e4m3 : q.dtype, "e4m3 (under a bf16/fp16 q) or q's");
}

// Any stride and head dim are served on cuda (src/api/staging.h copies what the kernels cannot
// read in place); the data must still be aligned to its element size.
void check_cuda_alignment(const Tensor& t, const char* name) {
  if (t.device != Device::cuda || !t.defined()) return;
  const size_t bytes = dtype_size(t.dtype);
  if (reinterpret_cast<uintptr_t>(t.data) % bytes != 0) {
    fail(name, "data must be aligned to its element size (" + str(int64_t(bytes)) + " bytes) on cuda",
         "address % " + str(int64_t(bytes)) + " = " + str(int64_t(reinterpret_cast<uintptr_t>(t.data) % bytes)));
  }
}

void check_head_dim(const Tensor& q, int d) {
  if (d < 1 || d > kMaxHeadDim) fail("q", "head dim must be in [1, 256]", str(d));
  if (q.device == Device::cuda) {
    if (!cuda::supports(compute_dtype(q), padded_head_dim(d))) {
      fail(Error::Kind::unsupported, "q",
           std::string("no CUDA kernel compiled for this dtype and head dim (compiled: ") +
               cuda::compiled_instances() + ")",
           std::string(dtype_name(q.dtype)) + " head dim " + str(d));
    }
  }
}

void check_heads(int heads, int heads_k, const char* k_name) {
  if (heads < 1) fail("q", "must have at least one head", str(heads));
  if (heads_k < 1) fail(k_name, "must have at least one head", str(heads_k));
  if (heads % heads_k != 0) {
    fail(k_name, "query heads must be a multiple of key/value heads (" + str(heads) + ")",
         str(heads_k) + " heads");
  }
}

// One FP8 descale factor (AttentionOptions): given only for an e4m3 tensor; fp32 on q's device,
// a scalar (shape () or (1)) or one per (batch, KV head).
void check_descale(const Tensor& t, const char* name, bool fp8, const char* fp8_what, const Problem& p,
                   const Tensor& q) {
  if (!t.defined()) return;
  if (!fp8) fail(name, std::string("is given only with ") + fp8_what + " in e4m3", "a descale for a non-FP8 call");
  if (t.data == nullptr) fail(name, "has no data pointer", "nullptr");
  require_dtype(t, name, DType::f32);
  require_same_device(t, name, q);
  const bool scalar = t.ndim == 0 || (t.ndim == 1 && t.shape[0] == 1);
  if (!scalar && !(t.ndim == 2 && t.shape[0] == p.batch && t.shape[1] == p.heads_k)) {
    fail(name, "must be a scalar (shape () or (1)) or have shape (batch, heads_k) = (" + str(p.batch) + ", " +
                   str(p.heads_k) + ")",
         shape_string(t));
  }
  require_addressable(t, name);
  check_cuda_alignment(t, name);
}

// The descale factors, and whether the call reads FP8 (Problem::fp8). kv_what names k and v.
void check_fp8(const AttentionOptions& o, Problem& p, const Tensor& q, const Tensor& k, const char* kv_what) {
  check_descale(o.q_descale, "q_descale", q.dtype == DType::e4m3, "q", p, q);
  check_descale(o.k_descale, "k_descale", k.dtype == DType::e4m3, kv_what, p, q);
  check_descale(o.v_descale, "v_descale", k.dtype == DType::e4m3, kv_what, p, q);
  p.fp8 = q.dtype == DType::e4m3 || k.dtype == DType::e4m3;
  p.fp8_qkv = q.dtype == DType::e4m3 && k.dtype == DType::e4m3;  // v's type is k's (check_like_q)
}

// ---- options ------------------------------------------------------------------------------

void check_options(const AttentionOptions& o, const Tensor& q, const Problem& p,
                   int64_t lse_rows_total) {
  if (o.softmax_scale && !std::isfinite(*o.softmax_scale)) {
    fail("softmax_scale", "must be finite", std::to_string(*o.softmax_scale));
  }
  if (!std::isfinite(o.softcap) || o.softcap < 0.0f) {
    fail("softcap", "must be finite and >= 0 (0 = off)", std::to_string(o.softcap));
  }
  if (o.window_left < -1) fail("window_left", "must be >= -1 (-1 = unbounded)", str(o.window_left));
  if (o.window_right < -1) {
    fail("window_right", "must be >= -1 (-1 = unbounded)", str(o.window_right));
  }
  if (o.num_threads < 0) fail("num_threads", "must be >= 0 (0 = all)", str(o.num_threads));
  if (o.alibi_slopes.defined()) {
    const Tensor& a = o.alibi_slopes;
    require_dtype(a, "alibi_slopes", DType::f32);
    require_same_device(a, "alibi_slopes", q);
    if (a.ndim == 1) {
      require_dim(a, "alibi_slopes", 0, p.heads, "the number of query heads");
    } else if (a.ndim == 2) {
      require_dim(a, "alibi_slopes", 0, p.batch, "the batch size");
      require_dim(a, "alibi_slopes", 1, p.heads, "the number of query heads");
    } else {
      fail("alibi_slopes", "must have shape (heads) or (batch, heads)", shape_string(a));
    }
    require_last_dim_contiguous(a, "alibi_slopes");
    require_addressable(a, "alibi_slopes");
  }
  if (o.softmax_lse.defined()) {
    const Tensor& l = o.softmax_lse;
    require_dtype(l, "softmax_lse", DType::f32);
    require_same_device(l, "softmax_lse", q);
    if (p.varlen) {
      require_ndim(l, "softmax_lse", 2, "(heads, total_q)");
      require_dim(l, "softmax_lse", 0, p.heads, "the number of query heads");
      require_dim(l, "softmax_lse", 1, lse_rows_total, "total_q");
    } else {
      require_ndim(l, "softmax_lse", 3, "(batch, heads, seqlen_q)");
      require_dim(l, "softmax_lse", 0, p.batch, "the batch size");
      require_dim(l, "softmax_lse", 1, p.heads, "the number of query heads");
      require_dim(l, "softmax_lse", 2, p.seqlen_q, "seqlen_q");
    }
    require_last_dim_contiguous(l, "softmax_lse");
  }
}

void check_out(const Tensor& out, const Tensor& q) {
  check_like_q(out, "out", q, compute_dtype(q), q.dtype == DType::e4m3 ? "bf16, the output's" : "q's");
  if (out.ndim != q.ndim) fail("out", "must have q's shape " + shape_string(q), shape_string(out));
  for (int i = 0; i < q.ndim; ++i) {
    if (out.shape[i] != q.shape[i]) {
      fail("out", "must have q's shape " + shape_string(q), shape_string(out));
    }
  }
  check_cuda_alignment(out, "out");
}

// k is checked whole (rank included) before v is compared with it, so that a k of the wrong
// rank is reported as k's problem.
// cache: k and v are a KV cache, which may be e4m3 under a bf16/fp16 q (check_cache_like_q).
void check_q_k_v(const Tensor& q, const Tensor& k, const Tensor& v, const char* k_name,
                 const char* v_name, int k_ndim, const char* k_layout, bool cache = false) {
  require_defined(q, "q");
  check_storage_dtype(q);
  require_last_dim_contiguous(q, "q");
  if (cache) {
    check_cache_like_q(k, k_name, q);
  } else {
    check_like_q(k, k_name, q);
  }
  require_ndim(k, k_name, k_ndim, k_layout);
  check_like_q(v, v_name, q, k.dtype, (std::string(k_name) + "'s").c_str());
  const std::string k_shape = std::string("must have ") + k_name + "'s shape " + shape_string(k);
  if (k.ndim != v.ndim) fail(v_name, k_shape, shape_string(v));
  for (int i = 0; i < k.ndim; ++i) {
    if (k.shape[i] != v.shape[i]) fail(v_name, k_shape, shape_string(v));
  }
  check_cuda_alignment(q, "q");
  check_cuda_alignment(k, k_name);
  check_cuda_alignment(v, v_name);
}

// ---- paging ---------------------------------------------------------------------------------

// block_table (b, max_pages) int32 over a paged cache (num_pages, page_size, hk, d): its shape.
// Its entries are checked where the lengths say which of them are in use (check_pages_in_use).
void check_block_table(const Tensor& bt, const Tensor& q, const Tensor& cache, int batch,
                       const char* name, const char* cache_name) {
  require_dtype(bt, name, DType::i32);
  require_same_device(bt, name, q);
  require_ndim(bt, name, 2, "(batch, max_pages)");
  require_dim(bt, name, 0, batch, "the batch size");
  require_last_dim_contiguous(bt, name);
  if (cache.shape[1] < 1) fail(cache_name, "page size (dim 1 of a paged cache) must be >= 1", shape_string(cache));
}

// The pages holding key positions [first_key, end_key) of sequence b (end_key within the
// table) are pages of the cache. Entries past them are never read, so a table padded with -1
// beyond the pages in use, as serving engines keep it, is accepted.
void check_pages_in_use(const int* table, const Tensor& bt, int64_t num_pages, int64_t page_size,
                        int b, int64_t first_key, int64_t end_key) {
  if (end_key <= first_key) return;
  const int64_t end_column = (end_key + page_size - 1) / page_size;
  for (int64_t j = first_key / page_size; j < end_column; ++j) {
    const int page = table[b * bt.stride[0] + j];
    if (page < 0 || page >= num_pages) {
      fail("block_table", "entries in use (the pages of each sequence's keys) must be page indices in [0, " + str(num_pages) + ")",
           str(page) + " at [" + str(b) + ", " + str(j) + "]");
    }
  }
}

// ---- sizes the kernels index with int32 ---------------------------------------------------------

// Beyond each size being below 2^31 (require_ndim): the mask's key positions i + seqlen_k -
// seqlen_q (rules.h visible_keys), the query rows of a GQA-packed tile walk, and the split-KV
// scratch size. q_len_name / k_len_name: the arguments that gave seqlen_q / seqlen_k.
void check_int32_limits(const Problem& p, const char* q_len_name, const char* k_len_name) {
  if (int64_t(p.seqlen_q) + p.seqlen_k > kMaxIndex) {
    fail(p.seqlen_q > p.seqlen_k ? q_len_name : k_len_name, "seqlen_q + seqlen_k must be below 2^31 (key positions relative to queries are int32)",
         str(p.seqlen_q) + " + " + str(p.seqlen_k));
  }
  const int64_t group = p.heads / p.heads_k;
  if (int64_t(p.seqlen_q) * group > kMaxIndex) {
    fail(q_len_name, "seqlen_q x (heads / heads_k) must be below 2^31 (the query rows of one KV head are int32)",
         str(p.seqlen_q) + " x " + str(group));
  }
  const double elements = double(p.batch) * double(p.seqlen_q) * double(p.heads) * double(p.head_dim);
  if (elements >= double(kMaxOutputElements)) {
    fail(q_len_name, "batch x seqlen_q x heads x head_dim must be below 2^53 (the split-KV scratch is sized in bytes in 64 bits)",
         str(p.batch) + " x " + str(p.seqlen_q) + " x " + str(p.heads) + " x " + str(p.head_dim));
  }
}

// ---- memory written by the call -------------------------------------------------------------

// One argument of a call, and whether the call writes it.
struct Arg {
  const Tensor* tensor;
  const char* name;
  bool written;
};

std::string strides_string(const Tensor& t) {
  std::string s = "strides (";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + str(t.stride[i]);
  return s + ")";
}

// What args[i] (written) writes shares no byte with another of its elements nor with any other
// argument: the result would depend on the order of the writes and the reads. spans: the
// arguments' byte spans (byte_span), so that most pairs are decided without a search.
void check_written_alone(const std::vector<Arg>& args, const std::vector<ByteSpan>& spans, size_t i) {
  const Tensor& w = *args[i].tensor;
  if (!w.defined() || !has_elements(w)) return;
  if (view_overlaps_itself(w)) {
    fail(args[i].name, "must not have elements that share memory (it is written)", strides_string(w) + " over " + shape_string(w));
  }
  for (size_t j = 0; j < args.size(); ++j) {
    if (j == i || !spans[i].meets(spans[j])) continue;
    if (views_overlap(w, *args[j].tensor)) {
      fail(args[i].name, std::string("must not share memory with ") + args[j].name + " (it is written)",
           "overlapping memory");
    }
  }
}

std::vector<ByteSpan> spans_of(const std::vector<Arg>& args) {
  std::vector<ByteSpan> spans;
  spans.reserve(args.size());
  for (const Arg& a : args) spans.push_back(byte_span(*a.tensor));
  return spans;
}

void check_outputs_alone(const std::vector<Arg>& args) {
  const std::vector<ByteSpan> spans = spans_of(args);
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].written) check_written_alone(args, spans, i);
  }
}

// Appended keys and values land in distinct memory: no cache row (contiguous cache, through
// cache_batch_idx) and no page (paged cache) receives new rows from two sequences, and no
// sequence lists one page twice among the pages it writes.
void check_append_targets(const Problem& p, const int* seqlens, const int* batch_idx,
                          const int* table, const Tensor& bt) {
  struct Target {
    int64_t where;   // cache row or page
    int b;
    int64_t column;  // block_table column (paged)
  };
  std::vector<Target> targets;
  if (p.paged) {
    for (int b = 0; b < p.batch; ++b) {
      const int64_t first = seqlens[b] / p.page_size;
      const int64_t end = (int64_t(seqlens[b]) + p.seqlen_new + p.page_size - 1) / p.page_size;
      for (int64_t j = first; j < end; ++j) targets.push_back({table[b * bt.stride[0] + j], b, j});
    }
  } else if (batch_idx) {
    for (int b = 0; b < p.batch; ++b) targets.push_back({batch_idx[b], b, 0});
  }
  std::sort(targets.begin(), targets.end(), [](const Target& x, const Target& y) {
    return x.where != y.where ? x.where < y.where : (x.b != y.b ? x.b < y.b : x.column < y.column);
  });
  for (size_t i = 1; i < targets.size(); ++i) {
    const Target& x = targets[i - 1];
    const Target& y = targets[i];
    if (x.where != y.where) continue;
    if (p.paged) {
      fail("block_table", "a page receiving appended keys must receive them from one sequence, through one entry",
           "page " + str(x.where) + " at [" + str(x.b) + ", " + str(x.column) + "] and [" + str(y.b) + ", " + str(y.column) + "]");
    }
    fail("cache_batch_idx", "entries must be distinct when k_new/v_new are appended (two sequences would write one cache row)",
         "cache row " + str(x.where) + " at " + str(x.b) + " and " + str(y.b));
  }
}

std::vector<Arg> dense_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const AttentionOptions& o) {
  return {{&q, "q", false}, {&k, "k", false}, {&v, "v", false}, {&out, "out", true},
          {&o.softmax_lse, "softmax_lse", true}, {&o.alibi_slopes, "alibi_slopes", false},
          {&o.q_descale, "q_descale", false}, {&o.k_descale, "k_descale", false}, {&o.v_descale, "v_descale", false}};
}

// out: nullptr when planning (no output yet).
std::vector<Arg> kvcache_args(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              const Tensor* out, const KVCacheArgs& a, const AttentionOptions& o,
                              bool appends) {
  std::vector<Arg> args = {
      {&q, "q", false}, {&k_cache, "k_cache", appends}, {&v_cache, "v_cache", appends},
      {&a.k_new, "k_new", false}, {&a.v_new, "v_new", false},
      {&a.rotary_cos, "rotary_cos", false}, {&a.rotary_sin, "rotary_sin", false},
      {&a.cache_seqlens, "cache_seqlens", false}, {&a.cache_batch_idx, "cache_batch_idx", false},
      {&a.cache_leftpad, "cache_leftpad", false}, {&a.block_table, "block_table", false},
      {&o.alibi_slopes, "alibi_slopes", false}, {&o.softmax_lse, "softmax_lse", true},
      {&o.q_descale, "q_descale", false}, {&o.k_descale, "k_descale", false}, {&o.v_descale, "v_descale", false}};
  if (out) args.push_back({out, "out", true});
  return args;
}

}  // namespace

bool rotary_q_per_row(const AttentionOptions& o) {
  return o.causal || o.window_left >= 0 || o.window_right >= 0;
}

// ---------------------------------------------------------------------------------------------

Problem validate_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                         const AttentionOptions& options) {
  require_defined(q, "q");
  require_ndim(q, "q", 4, "(batch, seqlen_q, heads, head_dim)");
  check_q_k_v(q, k, v, "k", "v", 4, "(batch, seqlen_k, heads_k, head_dim)");
  Problem p;
  p.device = q.device;
  p.device_index = q.device_index;
  p.dtype = compute_dtype(q);
  p.batch = int(q.shape[0]);
  p.seqlen_q = int(q.shape[1]);
  p.heads = int(q.shape[2]);
  p.head_dim = int(q.shape[3]);
  p.seqlen_k = int(k.shape[1]);
  p.heads_k = int(k.shape[2]);
  require_dim(k, "k", 0, p.batch, "q's batch size");
  require_dim(k, "k", 3, p.head_dim, "q's head dim");
  check_heads(p.heads, p.heads_k, "k");
  check_head_dim(q, p.head_dim);
  check_int32_limits(p, "q", "k");
  check_out(out, q);
  check_options(options, q, p, 0);
  check_fp8(options, p, q, k, "k and v");
  check_outputs_alone(dense_args(q, k, v, out, options));
  return p;
}

Problem validate_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const VarlenArgs& args, const AttentionOptions& options) {
  require_defined(q, "q");
  require_ndim(q, "q", 3, "(total_q, heads, head_dim)");
  const bool paged = args.block_table.defined();
  // paged K/V are a KV cache (chunked prefill): e4m3 under a bf16/fp16 q too
  check_q_k_v(q, k, v, "k", "v", paged ? 4 : 3,
              paged ? "(num_pages, page_size, heads_k, head_dim) with block_table"
                    : "(total_k, heads_k, head_dim)",
              paged);
  Problem p;
  p.device = q.device;
  p.device_index = q.device_index;
  p.dtype = compute_dtype(q);
  p.varlen = true;
  p.paged = paged;
  p.heads = int(q.shape[1]);
  p.head_dim = int(q.shape[2]);
  require_defined(args.cu_seqlens_q, "cu_seqlens_q");
  require_defined(args.cu_seqlens_k, "cu_seqlens_k");
  require_ndim(args.cu_seqlens_q, "cu_seqlens_q", 1, "(batch + 1)");
  if (args.cu_seqlens_q.shape[0] < 1) fail("cu_seqlens_q", "must have batch + 1 >= 1 entries", shape_string(args.cu_seqlens_q));
  p.batch = int(args.cu_seqlens_q.shape[0] - 1);
  check_index_vector(args.cu_seqlens_q, "cu_seqlens_q", q, p.batch + 1, "batch + 1");
  check_index_vector(args.cu_seqlens_k, "cu_seqlens_k", q, p.batch + 1, "batch + 1");
  check_index_vector(args.seqused_k, "seqused_k", q, p.batch, "batch");
  check_index_vector(args.leftpad_k, "leftpad_k", q, p.batch, "batch");
  if (args.max_seqlen_q < 0) fail("max_seqlen_q", "must be >= 0", str(args.max_seqlen_q));
  if (args.max_seqlen_k < 0) fail("max_seqlen_k", "must be >= 0", str(args.max_seqlen_k));
  p.seqlen_q = args.max_seqlen_q;
  p.seqlen_k = args.max_seqlen_k;
  if (p.paged) {
    p.page_size = int(k.shape[1]);
    p.heads_k = int(k.shape[2]);
    require_dim(k, "k", 3, p.head_dim, "q's head dim");
    check_block_table(args.block_table, q, k, p.batch, "block_table", "k");
  } else {
    p.heads_k = int(k.shape[1]);
    require_dim(k, "k", 2, p.head_dim, "q's head dim");
  }
  check_heads(p.heads, p.heads_k, "k");
  check_head_dim(q, p.head_dim);
  check_int32_limits(p, "max_seqlen_q", "max_seqlen_k");
  check_out(out, q);
  check_options(options, q, p, q.shape[0]);
  check_fp8(options, p, q, k, "k and v");
  std::vector<Arg> all = dense_args(q, k, v, out, options);
  all.insert(all.end(), {{&args.cu_seqlens_q, "cu_seqlens_q", false}, {&args.cu_seqlens_k, "cu_seqlens_k", false},
                         {&args.seqused_k, "seqused_k", false}, {&args.leftpad_k, "leftpad_k", false},
                         {&args.block_table, "block_table", false}});
  check_outputs_alone(all);

  // Values, when they are readable on the host (lengths in 64 bits: int32 entries may differ
  // by more than int32 holds).
  const int* cu_q = host_ints(args.cu_seqlens_q);
  const int* cu_k = host_ints(args.cu_seqlens_k);
  const int* used = host_ints(args.seqused_k);
  const int* pad = host_ints(args.leftpad_k);
  const int* table = p.paged ? host_ints(args.block_table) : nullptr;
  if (cu_q && cu_k) {
    const int64_t key_rows = p.paged ? args.block_table.shape[1] * int64_t(p.page_size) : k.shape[0];
    if (cu_q[0] != 0) fail("cu_seqlens_q", "must start at 0", str(cu_q[0]));
    if (cu_k[0] != 0) fail("cu_seqlens_k", "must start at 0", str(cu_k[0]));
    for (int b = 0; b < p.batch; ++b) {
      const int64_t len_q = int64_t(cu_q[b + 1]) - cu_q[b];
      const int64_t len_k = int64_t(cu_k[b + 1]) - cu_k[b];
      if (len_q < 0) fail("cu_seqlens_q", "must be non-decreasing", "a decrease at " + str(b));
      if (len_k < 0) fail("cu_seqlens_k", "must be non-decreasing", "a decrease at " + str(b));
      if (len_q > p.seqlen_q) {
        fail("max_seqlen_q", "must be >= every query length", str(p.seqlen_q) + " < " + str(len_q) + " of sequence " + str(b));
      }
      const int64_t end_k = used ? used[b] : len_k;
      const int64_t start_k = pad ? pad[b] : 0;
      if (used && (used[b] < 0 || used[b] > len_k)) {
        fail("seqused_k", "must be in [0, cu_seqlens_k[b+1] - cu_seqlens_k[b]]", str(used[b]) + " at " + str(b));
      }
      if (start_k < 0 || start_k > end_k) {
        fail("leftpad_k", "must be in [0, keys of the sequence]", str(start_k) + " at " + str(b));
      }
      if (end_k - start_k > p.seqlen_k) {
        fail("max_seqlen_k", "must be >= every key length", str(p.seqlen_k) + " < " + str(end_k - start_k) + " of sequence " + str(b));
      }
      if (p.paged && len_k > key_rows) {
        fail("block_table", "must hold every sequence's keys (" + str(len_k) + " at sequence " + str(b) + ")", str(key_rows) + " rows");
      }
      if (table) check_pages_in_use(table, args.block_table, k.shape[0], p.page_size, b, start_k, end_k);
    }
    if (cu_q[p.batch] != q.shape[0]) {
      fail("cu_seqlens_q", "last entry must equal total_q " + str(q.shape[0]) + " (every row of q and out belongs to a sequence)", str(cu_q[p.batch]));
    }
    if (!p.paged && cu_k[p.batch] > k.shape[0]) fail("cu_seqlens_k", "last entry must be <= total_k " + str(k.shape[0]), str(cu_k[p.batch]));
  }
  return p;
}

namespace {

Problem check_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      const Tensor* out, const KVCacheArgs& args, const AttentionOptions& options) {
  require_defined(q, "q");
  require_ndim(q, "q", 4, "(batch, seqlen_q, heads, head_dim)");
  require_defined(k_cache, "k_cache");
  require_defined(v_cache, "v_cache");
  check_q_k_v(q, k_cache, v_cache, "k_cache", "v_cache", 4,
              "(batch_cache, seqlen_cache, heads_k, head_dim) or (num_pages, page_size, heads_k, head_dim)", true);
  Problem p;
  p.device = q.device;
  p.device_index = q.device_index;
  p.dtype = compute_dtype(q);
  p.kvcache = true;
  p.paged = args.block_table.defined();
  p.batch = int(q.shape[0]);
  p.seqlen_q = int(q.shape[1]);
  p.heads = int(q.shape[2]);
  p.head_dim = int(q.shape[3]);
  p.heads_k = int(k_cache.shape[2]);
  require_dim(k_cache, "k_cache", 3, p.head_dim, "q's head dim");
  check_heads(p.heads, p.heads_k, "k_cache");
  check_head_dim(q, p.head_dim);
  if (out) check_out(*out, q);

  if (p.paged) {
    if (args.cache_batch_idx.defined()) {
      fail("cache_batch_idx", "cannot be combined with block_table (the table maps batches to pages)", "both given");
    }
    p.page_size = int(k_cache.shape[1]);
    check_block_table(args.block_table, q, k_cache, p.batch, "block_table", "k_cache");
    const int64_t capacity = args.block_table.shape[1] * int64_t(p.page_size);
    if (capacity > kMaxIndex) {
      fail("block_table", "max_pages x page_size (the keys a sequence can hold) must be below 2^31 (key positions are int32)",
           str(args.block_table.shape[1]) + " x " + str(p.page_size));
    }
    p.seqlen_k = int(capacity);
  } else {
    p.seqlen_k = int(k_cache.shape[1]);
    if (!args.cache_batch_idx.defined()) {
      require_dim(k_cache, "k_cache", 0, p.batch, "q's batch size (or give cache_batch_idx)");
    }
  }
  check_int32_limits(p, "q", p.paged ? "block_table" : "k_cache");
  check_index_vector(args.cache_seqlens, "cache_seqlens", q, p.batch, "batch");
  check_index_vector(args.cache_batch_idx, "cache_batch_idx", q, p.batch, "batch");
  check_index_vector(args.cache_leftpad, "cache_leftpad", q, p.batch, "batch");

  // appended keys and values
  if (args.k_new.defined() != args.v_new.defined()) {
    fail(args.k_new.defined() ? "v_new" : "k_new", "must be given together with the other of k_new/v_new", "only one");
  }
  if (args.k_new.defined()) {
    for (const auto& [t, name] : {std::pair{&args.k_new, "k_new"}, std::pair{&args.v_new, "v_new"}}) {
      check_like_q(*t, name, q, compute_dtype(q), "the output's");
      require_ndim(*t, name, 4, "(batch, seqlen_new, heads_k, head_dim)");
      require_dim(*t, name, 0, p.batch, "q's batch size");
      require_dim(*t, name, 2, p.heads_k, "the cache's heads_k");
      require_dim(*t, name, 3, p.head_dim, "q's head dim");
      check_cuda_alignment(*t, name);
    }
    if (args.v_new.shape[1] != args.k_new.shape[1]) fail("v_new", "must have k_new's shape " + shape_string(args.k_new), shape_string(args.v_new));
    p.seqlen_new = int(args.k_new.shape[1]);
    if (p.seqlen_new > 0 && !args.cache_seqlens.defined()) {
      fail("cache_seqlens", "is required when k_new/v_new are given (where to append)", "undefined");
    }
    if (p.seqlen_new > p.seqlen_k) fail("k_new", "cannot have more rows than the cache holds (" + str(p.seqlen_k) + ")", str(p.seqlen_new));
  }

  // rotary
  if (args.rotary_cos.defined() != args.rotary_sin.defined()) {
    fail(args.rotary_cos.defined() ? "rotary_sin" : "rotary_cos", "must be given together with the other of rotary_cos/rotary_sin", "only one");
  }
  if (args.rotary_cos.defined()) {
    if (q.dtype == DType::e4m3) {
      fail(Error::Kind::unsupported, "rotary_cos", "rotary needs a bf16/fp16 q (an e4m3 q is not rotated)", "q e4m3");
    }
    for (const auto& [t, name] : {std::pair{&args.rotary_cos, "rotary_cos"}, std::pair{&args.rotary_sin, "rotary_sin"}}) {
      check_like_q(*t, name, q);
      require_ndim(*t, name, 2, "(max_position, rotary_dim / 2)");
    }
    if (args.rotary_sin.shape[0] != args.rotary_cos.shape[0] || args.rotary_sin.shape[1] != args.rotary_cos.shape[1]) {
      fail("rotary_sin", "must have rotary_cos's shape " + shape_string(args.rotary_cos), shape_string(args.rotary_sin));
    }
    if (!args.cache_seqlens.defined()) fail("cache_seqlens", "is required with rotary (positions start there)", "undefined");
    p.rotary_dim = int(2 * args.rotary_cos.shape[1]);
    if (p.rotary_dim < 2 || p.rotary_dim > p.head_dim) {
      fail("rotary_cos", "dim 1 must be in [1, head_dim / 2] (rotary_dim = 2 * dim 1 <= " + str(p.head_dim) + ")", shape_string(args.rotary_cos));
    }
    if (args.rotary_cos.shape[0] < p.seqlen_k) {
      fail("rotary_cos", "must have a row for every cache position (" + str(p.seqlen_k) + ")", shape_string(args.rotary_cos));
    }
    if (args.rotary_cos.stride[0] != args.rotary_sin.stride[0]) {
      fail("rotary_sin", "must have rotary_cos's row stride " + str(args.rotary_cos.stride[0]), str(args.rotary_sin.stride[0]));
    }
    if (q.device == Device::cuda && !args.rotary_cos.is_contiguous()) {
      fail("rotary_cos", "must be contiguous on cuda", describe(args.rotary_cos));
    }
  }
  if (args.num_splits < 0 || args.num_splits > kMaxSplits) {
    fail("num_splits", "must be in [0, 128] (0 = heuristic)", str(args.num_splits));
  }
  check_options(options, q, p, 0);
  check_fp8(options, p, q, k_cache, "k_cache and v_cache");
  const bool appends = p.seqlen_new > 0;
  check_outputs_alone(kvcache_args(q, k_cache, v_cache, out, args, options, appends));

  // Values, when they are readable on the host (positions in 64 bits: an int32 length plus the
  // appended rows may pass 2^31).
  const int* seqlens = host_ints(args.cache_seqlens);
  const int* batch_idx = host_ints(args.cache_batch_idx);
  const int* leftpad = host_ints(args.cache_leftpad);
  const int* table = p.paged ? host_ints(args.block_table) : nullptr;
  const bool q_per_row = rotary_q_per_row(options);
  for (int b = 0; b < p.batch; ++b) {
    if (batch_idx && (batch_idx[b] < 0 || batch_idx[b] >= k_cache.shape[0])) {
      fail("cache_batch_idx", "entries must be in [0, " + str(k_cache.shape[0]) + ")", str(batch_idx[b]) + " at " + str(b));
    }
    const int64_t start = seqlens ? seqlens[b] : p.seqlen_k;  // where appended rows go
    if (seqlens && (start < 0 || start + p.seqlen_new > p.seqlen_k)) {
      fail("cache_seqlens", "entries plus seqlen_new (" + str(p.seqlen_new) + ") must be in [0, " + str(p.seqlen_k) + "]", str(start) + " at " + str(b));
    }
    const int64_t first_key = leftpad ? leftpad[b] : 0;
    if (leftpad && (first_key < 0 || first_key > start)) {
      fail("cache_leftpad", "entries must be in [0, cache_seqlens[b]]", str(first_key) + " at " + str(b));
    }
    if (table) check_pages_in_use(table, args.block_table, k_cache.shape[0], p.page_size, b, first_key, start + p.seqlen_new);
    if (p.rotary_dim > 0 && seqlens && p.seqlen_q > 0) {
      const int64_t last_q_position = start + (q_per_row ? p.seqlen_q - 1 : 0);
      if (last_q_position >= args.rotary_cos.shape[0]) {
        fail("rotary_cos", std::string("must have a row for every rotary position of q (cache_seqlens[b]") +
                               (q_per_row ? " + i, causal or local" : "") + ")",
             "position " + str(last_q_position) + " of sequence " + str(b) + ", " + str(args.rotary_cos.shape[0]) + " rows");
      }
    }
  }
  if (appends && seqlens && (batch_idx || table)) check_append_targets(p, seqlens, batch_idx, table, args.block_table);
  return p;
}

}  // namespace

Problem validate_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const Tensor& out, const KVCacheArgs& args,
                         const AttentionOptions& options) {
  return check_kvcache(q, k_cache, v_cache, &out, args, options);
}

Problem validate_kvcache_plan(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              const KVCacheArgs& args, const AttentionOptions& options) {
  return check_kvcache(q, k_cache, v_cache, nullptr, args, options);
}

void validate_workspace(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& out, const KVCacheArgs& args,
                        const AttentionOptions& options, size_t needed_bytes) {
  if (args.workspace == nullptr) {
    if (args.workspace_bytes != 0) fail("workspace", "is null but workspace_bytes is set", str(int64_t(args.workspace_bytes)));
    return;
  }
  if (reinterpret_cast<uintptr_t>(args.workspace) % kWorkspaceAlignment != 0) {
    fail("workspace", "must be 256-byte aligned", "address % 256 = " + str(int64_t(reinterpret_cast<uintptr_t>(args.workspace) % kWorkspaceAlignment)));
  }
  if (args.workspace_bytes < needed_bytes) {
    fail("workspace_bytes", "must be >= plan_kvcache(...).workspace_bytes = " + str(int64_t(needed_bytes)), str(int64_t(args.workspace_bytes)));
  }
  // The bytes the call uses (all of them: which depends on the plan) share nothing with the
  // other arguments.
  const Tensor workspace = byte_range_view(args.workspace, needed_bytes, q.device, q.device_index);
  std::vector<Arg> all = kvcache_args(q, k_cache, v_cache, &out, args, options, false);
  all.push_back({&workspace, "workspace", true});
  check_written_alone(all, spans_of(all), all.size() - 1);
}

}  // namespace flashattn
