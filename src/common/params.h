// AttnParams: the one plain-old-data description of an attention problem that both backends
// run. The API layer fills it after validation; a backend never re-validates.
//
// Addressing (all strides in elements, int64):
//   query row i of sequence b, head h:
//     q + b*q_batch_stride + (q_row_offset(b) + i)*q_row_stride + h*q_head_stride
//     q_row_offset(b) = cu_seqlens_q ? cu_seqlens_q[b] : 0   (varlen: q_batch_stride == 0)
//   out and lse are addressed the same way (lse row stride is 1).
//   key j (0-based among the visible keys of sequence b) lives at absolute position
//     p = leftpad_k(b) + j. Contiguous K:  k + kv_batch(b)*k_batch_stride
//                                             + (k_row_offset(b) + p)*k_row_stride + hk*k_head_stride
//     with kv_batch(b) = cache_batch_idx ? cache_batch_idx[b] : b and
//          k_row_offset(b) = (cu_seqlens_k && !block_table) ? cu_seqlens_k[b] : 0.
//   Paged K (block_table set): page = block_table[b*block_table_batch_stride + p / page_size],
//     k + page*k_batch_stride + (p % page_size)*k_row_stride + hk*k_head_stride.
//   V likewise with the v_* strides.
#pragma once

#include <cstdint>

#include "common/index_faults.h"
#include "flashattn/flashattn.h"

namespace flashattn {

struct AttnParams {
  DType dtype = DType::bf16;  // compute type, and storage type of out (f16, bf16; CPU also f32)
  DType q_storage = DType::bf16;   // storage type of q: dtype, or e4m3
  DType kv_storage = DType::bf16;  // storage type of k and v: dtype, or e4m3
  int device_index = 0;       // CUDA device holding every tensor (the API checked they agree)

  // ---- tensors -------------------------------------------------------------------------
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;

  float* lse = nullptr;  // optional (b, h, sq) or (h, total_q), fp32
  int64_t lse_batch_stride = 0, lse_head_stride = 0;

  // ---- sizes ---------------------------------------------------------------------------
  int batch = 0;
  int num_heads = 0;     // h (query heads)
  int num_heads_k = 0;   // hk; h % hk == 0
  int head_dim = 0;      // d, the real head dim (kernels may round up internally)
  int seqlen_q = 0;      // dense: sq; varlen: max_seqlen_q (an upper bound)
  int seqlen_k = 0;      // dense: sk; varlen: max_seqlen_k; kv-cache: max keys of a row

  // ---- per-sequence lengths and offsets (all optional, device/host like q) ----------------
  const int* cu_seqlens_q = nullptr;    // (b + 1)
  const int* cu_seqlens_k = nullptr;    // (b + 1)
  const int* seqused_k = nullptr;       // (b): keys end (absolute position) of sequence b
  int seqused_k_added = 0;              // added to seqused_k[b] (kv-cache: s_new)
  int block_table_pages = 0;            // max_pages of block_table (below; here it fills padding)
  const int* leftpad_k = nullptr;       // (b)
  const int* cache_batch_idx = nullptr; // (b)
  const int* block_table = nullptr;     // (b, max_pages)
  int64_t block_table_batch_stride = 0;
  int page_size = 0;                    // rows per page when block_table is set

  // ---- bounds of the values above, for the kernels' index checks (rules.h seq_info_read) -----
  int total_q = 0;        // varlen: rows of q and out (cu_seqlens_q ends within them)
  int total_k = 0;        // varlen, contiguous K/V: rows of k and v (cu_seqlens_k likewise)
  int num_pages = 0;      // paged: pages of the cache (block_table entries in [0, num_pages))
  int key_capacity = 0;   // keys a sequence may use without cu_seqlens_k: seqlen_k (dense; kv-cache:
                          // its capacity), or, paged, block_table columns x page_size (capped at 2^31 - 1)
  int cache_batches = 0;  // kv-cache, contiguous: cache rows (cache_batch_idx in [0, cache_batches))
  bool kv_cache = false;  // forward_kvcache: seqused_k / leftpad_k are named cache_seqlens /
                          // cache_leftpad in index faults
  // CUDA: where a kernel records the first index fault (cuda/device_status.cu); null on the CPU,
  // whose backend never sees one (the host checked the values).
  DeviceStatus* status = nullptr;

  // ---- FP8 descale factors (q_storage / kv_storage e4m3) --------------------------------------
  // Factor of (batch b, KV head hk): x_descale[b * x_descale_batch_stride + hk * x_descale_head_stride]
  // (both strides 0 for a scalar); null: 1. Softmax of descale_q * descale_k * q·k * softmax_scale,
  // output descale_v * sum(p v). Same device as q.
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int64_t q_descale_batch_stride = 0, q_descale_head_stride = 0;
  int64_t k_descale_batch_stride = 0, k_descale_head_stride = 0;
  int64_t v_descale_batch_stride = 0, v_descale_head_stride = 0;

  // ---- score function and masks ------------------------------------------------------------
  float softmax_scale = 1.0f;   // multiplies q·k
  float softcap = 0.0f;         // > 0: s = softcap * tanh(q·k * scale / softcap)
  int window_left = -1;         // -1 = unbounded
  int window_right = -1;        // -1 = unbounded
  const float* alibi_slopes = nullptr;  // (h) or (b, h)
  int64_t alibi_batch_stride = 0;       // 0 for (h)

  // ---- work decomposition ------------------------------------------------------------------
  bool pack_gqa = false;  // one tile holds the h/hk query heads that share a KV head
  int num_splits = 1;     // > 1: write partials to o_accum / lse_accum, then combine
  float* o_accum = nullptr;    // (num_splits, b, h, seqlen_q, head_dim) fp32
  float* lse_accum = nullptr;  // (num_splits, b, h, seqlen_q) fp32
  bool deep_decode = false;    // CUDA decode tile: the deep-pipeline kernel (api/kernel_choice.cpp)
  // CUDA: the grid holds query tiles in z and (batch, head) units in x, so that CTAs start in
  // order of query tile, heaviest (last, under a causal mask) first across all units; set by
  // the launcher (launch_tile_grid).
  bool heavy_tiles_first = false;
  // CUDA decode tile, 2..kMaxClusterSplits splits on sm_90: the splits of a unit run as one
  // thread-block cluster and merge their partials through distributed shared memory, with no
  // o_accum / lse_accum and no combine kernel (splitkeys_kernel.h combine_in_cluster); set by
  // the launcher (launch_tile_grid).
  bool cluster_combine = false;

  // ---- CPU only ----------------------------------------------------------------------------
  int num_threads = 0;
};

// Paged K/V on the warpspec kernel: a key tile loads as slabs of this many rows, each from its
// page, where a page does not hold whole tiles (cuda/components/tma_tiles.h); pages must hold
// whole slabs (page_size a multiple of it) and keys have no left pad (api/kernel_choice.cpp
// tma_describable).
constexpr int kTmaPageSlabRows = 16;

// The rows and batch entries one tensor's TMA descriptor spans (cuda/components/tma_tiles.h;
// api/kernel_choice.cpp tma_describable checks them against the hardware's rules): the
// sequence's rows per batch entry (a contiguous cache: per cache row), or, with rows packed by
// cu_seqlens (varlen), all the tensor's rows as one entry, each sequence's tiles starting at its
// row offset (rules.h SeqInfo); paged K/V: a page's rows per entry, one entry per page of the
// cache (the kernel names the page of each load).
struct TmaRows {
  int64_t rows, batches;
  int64_t batch_stride;  // elements; with one entry, any valid stride (it is never stepped)
  bool packed;
};
inline TmaRows tma_q_rows(const AttnParams& a) {
  if (a.cu_seqlens_q != nullptr) return TmaRows{a.total_q, 1, a.q_row_stride, true};
  return TmaRows{a.seqlen_q, a.batch, a.q_batch_stride, false};
}
// K or V (their own batch and row strides; the same rows).
inline TmaRows tma_kv_rows(const AttnParams& a, int64_t batch_stride, int64_t row_stride) {
  if (a.block_table != nullptr) return TmaRows{a.page_size, a.num_pages, batch_stride, false};
  if (a.cu_seqlens_k != nullptr) return TmaRows{a.total_k, 1, row_stride, true};
  return TmaRows{a.seqlen_k, a.kv_cache ? a.cache_batches : a.batch, batch_stride, false};
}

// Appending new keys/values into a KV cache, with optional rotary embedding of q and k.
// Run before attention. Rotary position of new key t of batch b: seqused_k[b] + t (absolute,
// i.e. the cache row it is written to). Rotary position of query i: seqused_k[b] + i when
// rotary_q_per_row (causal or local), else seqused_k[b] for every query.
struct AppendParams {
  DType dtype = DType::bf16;        // q, k_new, v_new, rotary tables (f16, bf16; CPU also f32)
  DType cache_storage = DType::bf16;  // k_cache / v_cache: dtype, or e4m3 (quantized on append)
  // e4m3 cache: stored = e4m3_rn_satfinite(float(x) / descale), x the (rotated) new key / value
  // rounded to dtype first; descale as AttnParams (b, hk), null = 1.
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int64_t k_descale_batch_stride = 0, k_descale_head_stride = 0;
  int64_t v_descale_batch_stride = 0, v_descale_head_stride = 0;
  int device_index = 0;  // CUDA device holding every tensor
  int batch = 0, num_heads = 0, num_heads_k = 0, head_dim = 0;
  int seqlen_q = 0;
  int seqlen_new = 0;  // s_new; 0 = nothing to append

  const int* cache_seqlens = nullptr;  // (b), required when seqlen_new > 0 or rotary is set
  const int* cache_batch_idx = nullptr;
  const int* block_table = nullptr;
  int64_t block_table_batch_stride = 0;
  int page_size = 0;
  // Bounds for the append's index checks (cuda/append.cu): cache_seqlens[b] + seqlen_new within
  // capacity, cache_batch_idx below cache_batches, block_table entries below num_pages.
  int capacity = 0;       // keys a cache row holds (paged: max_pages x page_size)
  int cache_batches = 0;  // contiguous cache: its rows
  int num_pages = 0;      // paged cache: its pages
  DeviceStatus* status = nullptr;  // CUDA: the first index fault is recorded here

  // destination cache (same addressing as AttnParams' K/V with leftpad 0)
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t kc_batch_stride = 0, kc_row_stride = 0, kc_head_stride = 0;
  int64_t vc_batch_stride = 0, vc_row_stride = 0, vc_head_stride = 0;

  // new keys / values (b, s_new, hk, d)
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int64_t kn_batch_stride = 0, kn_row_stride = 0, kn_head_stride = 0;
  int64_t vn_batch_stride = 0, vn_row_stride = 0, vn_head_stride = 0;

  // rotary: cos/sin (max_position, rotary_dim / 2), contiguous rows
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int64_t rotary_row_stride = 0;
  int rotary_dim = 0;  // 0 = no rotary
  int rotary_rows = 0;  // rows of rotary_cos / rotary_sin (positions a rotation may read)
  bool rotary_interleaved = true;
  bool rotary_q_per_row = false;

  // q in, rotated q out (b, sq, h, d); q_rot is contiguous scratch when rotary is set
  const void* q = nullptr;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  void* q_rot = nullptr;

  int num_threads = 0;
};

}  // namespace flashattn
