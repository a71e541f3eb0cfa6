// KV-cache append with rotary embedding (AppendParams, src/common/params.h):
//   K: k_new (b, s_new, hk, d) -> cache row cache_seqlens[b] + t, rotated at that position
//   V: v_new                   -> the same rows, copied
//   Q: q (b, sq, h, d)         -> q_rot (contiguous), rotated at cache_seqlens[b] (+ i when
//                                 rotary_q_per_row); only when rotary_dim > 0
// Paged caches use any page size (the page of position p is block_table[b][p / page_size]).
//
// One thread handles one chunk of kVec consecutive elements of one row: a single vector load
// and store. kVec is the widest of 8/4/2/1 that divides every stride, the head dim and the
// rotary layout (so a chunk never straddles rotary_dim, and a GPT-NeoX chunk's partner chunk
// starts kVec-aligned). Interleaved pairs lie inside a chunk; GPT-NeoX partners are one more
// vector load. Rotation is computed in fp32 and rounded once to the storage type.
// An e4m3 cache (AppendParams::cache_storage) receives each rounded element quantized:
// e4m3_rn_satfinite(x / descale of (b, hk)), as common/half.h float_to_e4m3_bits on the host.
#include <cuda_fp8.h>
#include <cutlass/numeric_types.h>

#include <cstdint>
#include <type_traits>
#include <string>

#include "common/rules.h"
#include "cuda/components/index_checks.h"
#include "cuda/grid_dependence.h"
#include "cuda/launch.h"

namespace flashattn {
namespace cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kTasks = 3;  // blockIdx.y: 0 = K, 1 = V, 2 = Q
constexpr int kMaxBlocksPerTask = 65535 * 4;  // grid-stride loop beyond this

template <typename Element, int kVec>
struct alignas(sizeof(Element) * kVec) Chunk {
  Element v[kVec];
};

template <typename Element, int kVec>
__device__ __forceinline__ Chunk<Element, kVec> load_chunk(const Element* src) {
  return *reinterpret_cast<const Chunk<Element, kVec>*>(src);
}
template <typename Element, int kVec>
__device__ __forceinline__ void store_chunk(Element* dst, const Chunk<Element, kVec>& c) {
  *reinterpret_cast<Chunk<Element, kVec>*>(dst) = c;
}

// One chunk of a row at `position`: copied (rotary_dim == 0 or col >= rotary_dim) or rotated.
template <typename Element, int kVec>
__device__ Chunk<Element, kVec> rotated_chunk(const AppendParams& p, const Element* src_row, int col, int position,
                                              bool rotate) {
  Chunk<Element, kVec> x = load_chunk<Element, kVec>(src_row + col);
  if (!rotate || col >= p.rotary_dim) return x;
  const Element* cos_row = static_cast<const Element*>(p.rotary_cos) + int64_t(position) * p.rotary_row_stride;
  const Element* sin_row = static_cast<const Element*>(p.rotary_sin) + int64_t(position) * p.rotary_row_stride;
  Chunk<Element, kVec> partner;
  const bool pairs_in_chunk = p.rotary_interleaved && kVec >= 2;
  if (!pairs_in_chunk) {
    if (p.rotary_interleaved) {  // kVec == 1
      partner.v[0] = src_row[rotary_pair(col, p.rotary_dim, true).partner];
    } else {  // GPT-NeoX: the partner chunk starts at col +- rotary_dim / 2, kVec-aligned
      partner = load_chunk<Element, kVec>(src_row + rotary_pair(col, p.rotary_dim, false).partner);
    }
  }
  Chunk<Element, kVec> y;
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    const RotaryPair pair = rotary_pair(col + e, p.rotary_dim, p.rotary_interleaved);
    const float other = pairs_in_chunk ? float(x.v[(e ^ 1) % kVec]) : float(partner.v[e]);
    const float c = float(cos_row[pair.col]);
    const float s = float(sin_row[pair.col]);
    y.v[e] = Element(float(x.v[e]) * c + pair.sign * other * s);
  }
  return y;
}

template <typename Element, int kVec>
__device__ void rotate_chunk(const AppendParams& p, const Element* src_row, Element* dst_row,
                             int col, int position, bool rotate) {
  store_chunk<Element, kVec>(dst_row + col, rotated_chunk<Element, kVec>(p, src_row, col, position, rotate));
}

// A chunk of new keys or values into the cache row at dst_row: as is, or quantized to e4m3.
template <typename Element, typename CacheElement, int kVec>
__device__ void store_cache_chunk(CacheElement* dst_row, int col, const Chunk<Element, kVec>& x, float descale) {
  if constexpr (std::is_same_v<CacheElement, Element>) {
    store_chunk<Element, kVec>(dst_row + col, x);
  } else {
    Chunk<uint8_t, kVec> q;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      q.v[e] = __nv_cvt_float_to_fp8(__fdiv_rn(float(x.v[e]), descale), __NV_SATFINITE, __NV_E4M3);
    }
    store_chunk<uint8_t, kVec>(dst_row + col, q);
  }
}

// Element offset of cache row `pos` of batch b, KV head hk (leftpad 0; see params.h), or kNoRow
// where cache_batch_idx or the block_table entry names no row or page of the cache (the fault is
// recorded and the row is not written).
constexpr int64_t kNoRow = -1;
__device__ __forceinline__ int64_t cache_offset(const AppendParams& p, int b, int pos,
                                                int64_t batch_stride, int64_t row_stride,
                                                int64_t head_stride, int hk) {
  if (p.block_table) {
    const int page = p.block_table[b * p.block_table_batch_stride + pos / p.page_size];
    if (unsigned(page) >= unsigned(p.num_pages)) {
      record_index_fault(p.status, index_fault(IndexArg::block_table, b, page, 0, p.num_pages - 1));
      return kNoRow;
    }
    return int64_t(page) * batch_stride + int64_t(pos % p.page_size) * row_stride + hk * head_stride;
  }
  const int kv_batch = p.cache_batch_idx ? p.cache_batch_idx[b] : b;
  if (unsigned(kv_batch) >= unsigned(p.cache_batches)) {
    record_index_fault(p.status, index_fault(IndexArg::cache_batch_idx, b, kv_batch, 0, p.cache_batches - 1));
    return kNoRow;
  }
  return int64_t(kv_batch) * batch_stride + int64_t(pos) * row_stride + hk * head_stride;
}

// Where sequence b's appended rows start: cache_seqlens[b], which leaves room for them in the
// row (capacity), or -1 (the fault recorded: nothing of b is appended, and its attention sees no
// keys, rules.h seq_info_read).
__device__ __forceinline__ int cache_start(const AppendParams& p, int b) {
  if (!p.cache_seqlens) return 0;
  const int start = p.cache_seqlens[b];
  const int last_start = p.capacity - p.seqlen_new;
  if (in_bounds(start, 0, last_start)) return start;
  record_index_fault(p.status, index_fault(IndexArg::cache_seqlens, b, start, 0, last_start));
  return -1;
}

// Whether q row i of sequence b, whose rows start at `start` (cache_start), has a row of
// rotary_cos/sin at `position`: else it is copied unrotated (its sequence's attention output is
// 0 anyway when start is -1).
__device__ __forceinline__ bool has_rotary_row(const AppendParams& p, int b, int start, int position) {
  if (start < 0) return false;
  if (position < p.rotary_rows) return true;
  record_index_fault(p.status, index_fault(IndexArg::cache_seqlens, b, start, 0, p.rotary_rows - 1 - (position - start)));
  return false;
}

template <typename Element, typename CacheElement, int kVec>
__global__ void __launch_bounds__(kThreads) append_kernel(const AppendParams p) {
  wait_for_previous_grid();  // launched as a programmatic dependent (launch_append)
  const int task = blockIdx.y;
  const int chunks = p.head_dim / kVec;
  const bool rotate = p.rotary_dim > 0;
  const int64_t kv_items = int64_t(p.batch) * p.seqlen_new * p.num_heads_k * chunks;
  const int64_t q_items = rotate ? int64_t(p.batch) * p.seqlen_q * p.num_heads * chunks : 0;
  const int64_t items = task == 2 ? q_items : kv_items;
  const int64_t step = int64_t(gridDim.x) * kThreads;

  for (int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x; item < items; item += step) {
    // item = ((b * rows + t) * heads + head) * chunks + chunk
    const int col = int(item % chunks) * kVec;
    int64_t rest = item / chunks;
    if (task == 2) {
      const int head = int(rest % p.num_heads);
      rest /= p.num_heads;
      const int i = int(rest % p.seqlen_q);
      const int b = int(rest / p.seqlen_q);
      const int start = cache_start(p, b);
      const int position = start + (p.rotary_q_per_row ? i : 0);
      const Element* src = static_cast<const Element*>(p.q) + b * p.q_batch_stride +
                           i * p.q_row_stride + head * p.q_head_stride;
      Element* dst = static_cast<Element*>(p.q_rot) +
                     ((int64_t(b) * p.seqlen_q + i) * p.num_heads + head) * p.head_dim;
      rotate_chunk<Element, kVec>(p, src, dst, col, position, has_rotary_row(p, b, start, position));
      continue;
    }
    const int hk = int(rest % p.num_heads_k);
    rest /= p.num_heads_k;
    const int t = int(rest % p.seqlen_new);
    const int b = int(rest / p.seqlen_new);
    const int start = cache_start(p, b);
    if (start < 0) continue;
    const int position = start + t;
    if (task == 0) {
      const Element* src = static_cast<const Element*>(p.k_new) + b * p.kn_batch_stride +
                           t * p.kn_row_stride + hk * p.kn_head_stride;
      const int64_t dst = cache_offset(p, b, position, p.kc_batch_stride, p.kc_row_stride, p.kc_head_stride, hk);
      if (dst == kNoRow) continue;
      store_cache_chunk<Element, CacheElement, kVec>(
          static_cast<CacheElement*>(p.k_cache) + dst, col, rotated_chunk<Element, kVec>(p, src, col, position, rotate),
          k_descale(p, b, hk));
    } else {
      const Element* src = static_cast<const Element*>(p.v_new) + b * p.vn_batch_stride +
                           t * p.vn_row_stride + hk * p.vn_head_stride;
      const int64_t dst = cache_offset(p, b, position, p.vc_batch_stride, p.vc_row_stride, p.vc_head_stride, hk);
      if (dst == kNoRow) continue;
      store_cache_chunk<Element, CacheElement, kVec>(static_cast<CacheElement*>(p.v_cache) + dst, col,
                                                     load_chunk<Element, kVec>(src + col),
                                                     v_descale(p, b, hk));
    }
  }
}

bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Whether chunks of `vec` elements keep every load/store aligned and every rotary pair whole.
bool fits_vector(const AppendParams& p, int vec, int element_bytes) {
  if (p.head_dim % vec != 0) return false;
  const int bytes = vec * element_bytes;
  const bool has_new = p.seqlen_new > 0;
  if (has_new) {
    for (const void* ptr : {static_cast<const void*>(p.k_cache), static_cast<const void*>(p.v_cache), p.k_new, p.v_new})
      if (!aligned(ptr, bytes)) return false;
    for (int64_t stride : {p.kc_batch_stride, p.kc_row_stride, p.kc_head_stride, p.vc_batch_stride, p.vc_row_stride,
                           p.vc_head_stride, p.kn_batch_stride, p.kn_row_stride, p.kn_head_stride,
                           p.vn_batch_stride, p.vn_row_stride, p.vn_head_stride})
      if (stride % vec != 0) return false;
  }
  if (p.rotary_dim > 0) {
    if (!aligned(p.q, bytes) || !aligned(p.q_rot, bytes)) return false;
    for (int64_t stride : {p.q_batch_stride, p.q_row_stride, p.q_head_stride})
      if (stride % vec != 0) return false;
    if (p.rotary_interleaved ? (p.rotary_dim % vec != 0) : ((p.rotary_dim / 2) % vec != 0)) return false;
  }
  return true;
}

template <typename Element, typename CacheElement, int kVec>
void launch_append(const AppendParams& p, bool programmatic, cudaStream_t stream) {
  const int64_t chunks = p.head_dim / kVec;
  const int64_t kv_items = int64_t(p.batch) * p.seqlen_new * p.num_heads_k * chunks;
  const int64_t q_items = p.rotary_dim > 0 ? int64_t(p.batch) * p.seqlen_q * p.num_heads * chunks : 0;
  const int64_t items = kv_items > q_items ? kv_items : q_items;
  if (items == 0) return;
  int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocksPerTask) blocks = kMaxBlocksPerTask;
  const dim3 grid(static_cast<unsigned>(blocks), kTasks);
  // On sm_90 a programmatic dependent of the kernel before it (which may have written k_new,
  // v_new, q or the lengths): its blocks become resident as that grid drains and wait first.
  const auto kernel = &append_kernel<Element, CacheElement, kVec>;
  KernelLaunch launch(grid, kThreads, 0, stream);
  launch.as_programmatic_dependent(reinterpret_cast<const void*>(kernel), p.device_index, programmatic);
  check_cuda(cudaLaunchKernelEx(&launch.config, kernel, p), "cudaLaunchKernelEx(append_kernel)");
  check_launch("append_kernel");
}

// The widest vector fits_vector allows (its Element alignment also aligns an e4m3 cache).
template <typename Element, typename CacheElement>
void dispatch_vector(const AppendParams& p, bool programmatic, cudaStream_t stream) {
  constexpr int kBytes = sizeof(Element);
  if (fits_vector(p, 8, kBytes)) return launch_append<Element, CacheElement, 8>(p, programmatic, stream);  // 16-byte accesses
  if (fits_vector(p, 4, kBytes)) return launch_append<Element, CacheElement, 4>(p, programmatic, stream);
  if (fits_vector(p, 2, kBytes)) return launch_append<Element, CacheElement, 2>(p, programmatic, stream);
  launch_append<Element, CacheElement, 1>(p, programmatic, stream);
}

template <typename Element>
void dispatch_cache(const AppendParams& p, bool programmatic, cudaStream_t stream) {
  if (p.cache_storage == DType::e4m3) return dispatch_vector<Element, uint8_t>(p, programmatic, stream);
  dispatch_vector<Element, Element>(p, programmatic, stream);
}

}  // namespace

void run_append_kernel(const AppendParams& params, bool programmatic, cudaStream_t stream) {
  if (params.seqlen_new == 0 && params.rotary_dim == 0) return;
  switch (params.dtype) {
    case DType::bf16: dispatch_cache<cutlass::bfloat16_t>(params, programmatic, stream); break;
    case DType::f16: dispatch_cache<cutlass::half_t>(params, programmatic, stream); break;
    default:
      throw Error(Error::Kind::unsupported, "CUDA append: cache dtype must be fp16 or bf16");
  }
}

}  // namespace cuda
}  // namespace flashattn
