// CPU KV-cache append: k_new/v_new into the cache at rows cache_seqlens[b] + t (paged or
// contiguous), K rotated at its absolute cache position; q rotated into q_rot.
// Rotation runs in fp32 on the stored values and rounds once to the storage dtype.
#include <algorithm>
#include <vector>

#include "api/backend.h"
#include "common/rules.h"
#include "cpu/parallel.h"
#include "cpu/storage.h"

namespace flashattn {
namespace cpu {
namespace {

// Positions are int64 here: validation keeps cache_seqlens[b] + s_new within the cache, and
// an int32 sum could not even represent the one past it.
int64_t cache_seqlen(const AppendParams& p, int b) { return p.cache_seqlens ? p.cache_seqlens[b] : 0; }

// Element offset of absolute cache row `pos` of batch b, KV head hk (params.h addressing, no
// leftpad, no varlen).
int64_t cache_row_offset(const AppendParams& p, int b, int64_t pos, int64_t batch_stride,
                         int64_t row_stride, int64_t head_stride, int hk) {
  if (p.block_table) {
    const int page = p.block_table[b * p.block_table_batch_stride + pos / p.page_size];
    return page * batch_stride + (pos % p.page_size) * row_stride + hk * head_stride;
  }
  const int cache_b = p.cache_batch_idx ? p.cache_batch_idx[b] : b;
  return cache_b * batch_stride + pos * row_stride + hk * head_stride;
}

// row (fp32, head_dim) = src rotated at position `pos` (elements c >= rotary_dim copied).
template <typename S>
void rotated_row(const AppendParams& p, const typename S::Element* src, int64_t pos, std::vector<float>& row) {
  using T = typename S::Element;
  load_row<S>(src, p.head_dim, row.data());
  const T* cos_row = static_cast<const T*>(p.rotary_cos) + pos * p.rotary_row_stride;
  const T* sin_row = static_cast<const T*>(p.rotary_sin) + pos * p.rotary_row_stride;
  for (int c = 0; c < p.rotary_dim; ++c) {
    const RotaryPair pair = rotary_pair(c, p.rotary_dim, p.rotary_interleaved);
    const float x = S::load(src[c]);
    const float partner = S::load(src[pair.partner]);
    row[c] = x * S::load(cos_row[pair.col]) + pair.sign * partner * S::load(sin_row[pair.col]);
  }
}

// dst = src rotated at position `pos`. `row` is fp32 scratch of head_dim; going through it lets
// src and dst alias.
template <typename S>
void rotate_row(const AppendParams& p, const typename S::Element* src, int64_t pos,
                typename S::Element* dst, std::vector<float>& row) {
  rotated_row<S>(p, src, pos, row);
  store_row<S>(row.data(), p.head_dim, dst);
}

// A new key or value row (fp32) into an e4m3 cache row: rounded to S first (as a cache of S
// would hold it), then e4m3(x / descale), to nearest even, saturated (AppendParams).
template <typename S>
void quantize_row(const std::vector<float>& row, int d, float descale, uint8_t* dst) {
  for (int c = 0; c < d; ++c) dst[c] = E4m3::store(S::load(S::store(row[c])) / descale);
}

template <typename S>
void copy_row(const typename S::Element* src, int d, typename S::Element* dst) {
  std::copy(src, src + d, dst);
}

// Element offsets of new row t of batch b, KV head hk, in k_new, v_new and the caches.
struct AppendRow {
  int64_t k_src, v_src, k_dst, v_dst;
};
AppendRow append_offsets(const AppendParams& p, int b, int t, int hk, int64_t pos) {
  return {b * p.kn_batch_stride + t * p.kn_row_stride + hk * p.kn_head_stride,
          b * p.vn_batch_stride + t * p.vn_row_stride + hk * p.vn_head_stride,
          cache_row_offset(p, b, pos, p.kc_batch_stride, p.kc_row_stride, p.kc_head_stride, hk),
          cache_row_offset(p, b, pos, p.vc_batch_stride, p.vc_row_stride, p.vc_head_stride, hk)};
}

// New key/value row t of batch b, every KV head, into an e4m3 cache.
template <typename S>
void append_row_e4m3(const AppendParams& p, int b, int t, std::vector<float>& row) {
  using T = typename S::Element;
  const int64_t pos = cache_seqlen(p, b) + t;
  for (int hk = 0; hk < p.num_heads_k; ++hk) {
    const AppendRow at = append_offsets(p, b, t, hk, pos);
    const T* k_src = static_cast<const T*>(p.k_new) + at.k_src;
    if (p.rotary_dim > 0) {
      rotated_row<S>(p, k_src, pos, row);
    } else {
      load_row<S>(k_src, p.head_dim, row.data());
    }
    quantize_row<S>(row, p.head_dim, k_descale(p, b, hk), static_cast<uint8_t*>(p.k_cache) + at.k_dst);
    load_row<S>(static_cast<const T*>(p.v_new) + at.v_src, p.head_dim, row.data());
    quantize_row<S>(row, p.head_dim, v_descale(p, b, hk), static_cast<uint8_t*>(p.v_cache) + at.v_dst);
  }
}

// New key/value row t of batch b, every KV head.
template <typename S>
void append_row(const AppendParams& p, int b, int t, std::vector<float>& row) {
  if (p.cache_storage == DType::e4m3) return append_row_e4m3<S>(p, b, t, row);
  using T = typename S::Element;
  const int64_t pos = cache_seqlen(p, b) + t;
  const T* k_new = static_cast<const T*>(p.k_new);
  const T* v_new = static_cast<const T*>(p.v_new);
  T* k_cache = static_cast<T*>(p.k_cache);
  T* v_cache = static_cast<T*>(p.v_cache);
  for (int hk = 0; hk < p.num_heads_k; ++hk) {
    const AppendRow at = append_offsets(p, b, t, hk, pos);
    const T* k_src = k_new + at.k_src;
    const T* v_src = v_new + at.v_src;
    T* k_dst = k_cache + at.k_dst;
    T* v_dst = v_cache + at.v_dst;
    if (p.rotary_dim > 0) {
      rotate_row<S>(p, k_src, pos, k_dst, row);
    } else {
      copy_row<S>(k_src, p.head_dim, k_dst);
    }
    copy_row<S>(v_src, p.head_dim, v_dst);
  }
}

// Query row i of batch b, every head, rotated into q_rot (b, sq, h, d) contiguous.
template <typename S>
void rotate_q_row(const AppendParams& p, int b, int i, std::vector<float>& row) {
  using T = typename S::Element;
  const int64_t pos = cache_seqlen(p, b) + (p.rotary_q_per_row ? i : 0);
  const T* q = static_cast<const T*>(p.q);
  T* q_rot = static_cast<T*>(p.q_rot);
  for (int h = 0; h < p.num_heads; ++h) {
    const T* src = q + b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride;
    T* dst = q_rot + ((int64_t(b) * p.seqlen_q + i) * p.num_heads + h) * p.head_dim;
    rotate_row<S>(p, src, pos, dst, row);
  }
}

template <typename S>
void run(const AppendParams& p) {
  const int64_t new_rows = p.seqlen_new > 0 ? int64_t(p.batch) * p.seqlen_new : 0;
  const int64_t q_rows = p.rotary_dim > 0 ? int64_t(p.batch) * p.seqlen_q : 0;
  const int64_t items = new_rows + q_rows;
  const int workers = resolve_threads(p.num_threads, items);
  std::vector<std::vector<float>> rows(workers, std::vector<float>(p.head_dim));
  parallel_for(items, workers, [&](int64_t item, int worker) {
    if (item < new_rows) {
      append_row<S>(p, int(item / p.seqlen_new), int(item % p.seqlen_new), rows[worker]);
    } else {
      const int64_t q_item = item - new_rows;
      rotate_q_row<S>(p, int(q_item / p.seqlen_q), int(q_item % p.seqlen_q), rows[worker]);
    }
  });
}

}  // namespace

void run_append(const AppendParams& params) {
  dispatch_dtype(params.dtype, [&](auto storage) { run<decltype(storage)>(params); });
}

}  // namespace cpu
}  // namespace flashattn
