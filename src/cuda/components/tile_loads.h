// Gathering Q, K and V tiles into shared memory: row addressing through rules.h (varlen, paged
// K/V of any page size, cache_batch_idx, leftpad, packed GQA, any strides), 16-byte cp.async
// per (row, chunk), contiguous rows walked by stride, paged rows read straight from the table.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cute/tensor.hpp>

#include "common/params.h"
#include "common/rules.h"
#include "cuda/components/async_copy.h"
#include "cuda/components/cta_geometry.h"
#include "cuda/components/index_checks.h"
#include "cuda/kernel_traits.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)

// ---- row addressing ------------------------------------------------------------------------
//
// The element offset of every Q/O row, and of every K/V row when K/V is paged, is computed once,
// by one thread per row, through rules.h (q_offset, o_offset, kv_row_offset: one page-table
// lookup and division per row), and kept in a small smem table; the copy loops then only add a
// column. This keeps the per-row rules (paging, varlen, leftpad, packed GQA) out of the
// register-hungry mainloop. Contiguous K/V needs no table (see load_kv).
constexpr int64_t kNoRow = -1;  // row outside the sequence: zero-filled / not stored

struct KvRowOffsets {
  int64_t k, v;
};

template <class Traits>
__device__ __forceinline__ void compute_q_o_offsets(const AttnParams& p, const CtaInfo& c,
                                                    int64_t* q_off, int64_t* o_off, int tid) {
  for (int r = tid; r < Traits::kBlockM; r += Traits::kNThreads) {
    const int row = c.m0 + r;
    if (row < c.rows) {
      const PackedRow pr = tile_row_query(p, c, row);
      q_off[r] = q_offset(p, c.seq, c.b, pr.query, pr.head);
      o_off[r] = o_offset(p, c.seq, c.b, pr.query, pr.head);
    } else {
      q_off[r] = kNoRow;
      o_off[r] = kNoRow;
    }
  }
}

// Paged K/V: the K and V offsets of key row j from its page (rules.h kv_page); kNoRow past
// the sequence's keys.
__device__ __forceinline__ KvRowOffsets paged_kv_row_offsets(const AttnParams& p, const CtaInfo& c,
                                                            int page, int j) {
  KvRowOffsets off{kNoRow, kNoRow};
  if (j < c.seq.seqlen_k) {
    off.k = kv_paged_row_offset(p, c.seq, page, j, p.k_batch_stride, p.k_row_stride, p.k_head_stride, c.hk);
    off.v = kv_paged_row_offset(p, c.seq, page, j, p.v_batch_stride, p.v_row_stride, p.v_head_stride, c.hk);
  }
  return off;
}

// Paged K/V: the row offsets of key tile n (keys [n*kBlockN, n*kBlockN + kBlockN)) into kv_off.
// A row whose block_table entry names no page of the cache (index_checks.h) reads nothing: it
// is zero-filled, as a row past the keys.
template <class Traits>
__device__ __forceinline__ void compute_kv_offsets(const AttnParams& p, const CtaInfo& c, int n,
                                                   KvRowOffsets* kv_off, int tid) {
  for (int r = tid; r < Traits::kBlockN; r += Traits::kNThreads) {
    const int j = n * Traits::kBlockN + r;
    const int page = j < c.seq.seqlen_k ? kv_page(p, c.seq, c.b, j) : 0;
    kv_off[r] = j < c.seq.seqlen_k && !checked_page(p, c.b, page) ? KvRowOffsets{kNoRow, kNoRow}
                                                                    : paged_kv_row_offsets(p, c, page, j);
  }
}

// Whether K/V tiles are gathered through the page table (Traits::kKvLayouts).
template <class Traits>
__device__ __forceinline__ bool reads_page_table(const AttnParams& p) {
  if constexpr (Traits::kKvLayouts == KvLayouts::either) return p.block_table != nullptr;
  return Traits::kKvLayouts == KvLayouts::paged;
}

// Paged K/V, decode: first thing in the CTA, prefetches into the L2 the page-table row of its
// sequence, spread over the CTAs of that sequence (one 128-byte line per thread). A short
// decode CTA reads its pages (lookup_paged_rows) once the sequence's lengths are known, so
// that read is a second dependent memory latency before its first K/V copy; prefetched beside
// the lengths' read, it hits the L2 (measured: 0.3-0.5 us per call at batch 1-8 x 1k; issued
// after make_cta_info instead, nothing; docs/DECISIONS.md D-23). The whole row is
// prefetched (which of its pages a CTA reads depends on the lengths): 4 bytes per cache row,
// ~0.1% of the K/V bytes at page size 1.
template <class Traits>
__device__ __forceinline__ void prefetch_page_table_row(const AttnParams& p, int tid) {
  if (!reads_page_table<Traits>(p) || p.block_table_pages <= 0) return;
  // The decode grid (make_cta_info): query tiles in x, splits in y, (batch, head) units in z.
  const int heads = units_per_sequence(p);
  const int b = int(blockIdx.z / unsigned(heads));
  const int ctas_of_b = int(gridDim.x * gridDim.y) * heads;
  const int me = int((blockIdx.z - b * heads) * gridDim.y + blockIdx.y) * int(gridDim.x) + int(blockIdx.x);
  const int* row = p.block_table + b * p.block_table_batch_stride;
  constexpr int kPagesPerLine = 128 / sizeof(int);
  // One more line than the row's length in lines, for a row that starts inside a line; each
  // address clamped to the row's last page.
  const int lines = p.block_table_pages / kPagesPerLine + 1;
#pragma unroll 1
  for (int line = me + tid * ctas_of_b; line < lines; line += Traits::kNThreads * ctas_of_b) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + min(line * kPagesPerLine, p.block_table_pages - 1)));
  }
}

// ---- loads, one (row, 16-byte chunk) pair per cp.async --------------------------------------
//
// A source of the tile's Element type fills the chunk itself (16 bytes); an FP8 source
// (kernel_traits.h Fp8Storage) fills the chunk's 8-byte twin in the tile's mirror, widened into
// the chunk once it landed (convert_tile).
template <L2Hint kHint, class Element, class Src>
__device__ __forceinline__ void copy_chunk(Element* chunk, const Element* tile, uint8_t* mirror, const Src* src,
                                           bool valid) {
  if constexpr (sizeof(Src) == sizeof(Element)) {  // Element, or bf16 q's bits for the fp8 pipeline's fp16
    cp_async_16<kHint>(chunk, src, valid);        // tiles (converted in place: rescale_q_into_fp16)
  } else {
    static_assert(sizeof(Src) == 1, "FP8 sources");
    cp_async_8<kHint>(mirror + (chunk - tile), src, valid);
  }
}

// This thread's share of a (kRows x kHeadDim) tile copy: its 16-byte smem chunks and their
// (row, column) coordinates, both (CPY, CPY_M, CPY_K).
template <class Traits, int kRows, class SmemTensor>
__device__ __forceinline__ auto copy_partition(SmemTensor& sX, int tid) {
  typename Traits::GmemTiledCopy gmem_copy;
  auto thr_copy = gmem_copy.get_thread_slice(tid);
  Tensor cX = make_identity_tensor(Shape<Int<kRows>, Int<Traits::kHeadDim>>{});
  return cute::make_tuple(thr_copy.partition_D(sX), thr_copy.partition_D(cX));
}

// Fills the smem tile sX (kRows x kHeadDim) from base + row_off(r) + column; zero-fills rows
// whose offset is kNoRow and columns >= head_dim. The smem side is partitioned by CuTe (static
// per-thread offsets into the swizzled layout); the global side is one offset per row.
template <class Traits, int kRows, L2Hint kHint = L2Hint::none, class SmemTensor, class Src, class RowOff>
__device__ __forceinline__ void load_tile(SmemTensor& sX, const Src* base, uint8_t* mirror, int head_dim, int tid,
                                          RowOff row_off) {
  if (tid >= Traits::kGmemThreads) return;
  auto part = copy_partition<Traits, kRows>(sX, tid);
  const typename Traits::Element* tile = &sX(0);
  auto& tXsX = get<0>(part);  // (CPY, CPY_M, CPY_K)
  const auto& tXcX = get<1>(part);  // (CPY, CPY_M, CPY_K) -> (row, col)
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tXsX); ++m) {
    const int64_t off = row_off(get<0>(tXcX(0, m, 0)));
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tXsX); ++k) {
      const int col = get<1>(tXcX(0, m, k));
      const bool valid = off != kNoRow && col < head_dim;
      copy_chunk<kHint>(&tXsX(0, m, k), tile, mirror, valid ? base + off + col : base, valid);
    }
  }
}

// load_tile for kRows rows row_stride elements apart from first_row (contiguous K/V): rows >=
// rows_valid and columns >= head_dim are zero-filled. Each thread computes its first source
// address once and steps it by constant multiples of the stride, so that a 16-byte copy costs a
// predicate, an address add and the copy (the per-row offsets of load_tile cost ~15 integer
// instructions per copy, a third of a one-tile decode CTA's instructions: docs/DECISIONS.md D-11).
template <class Traits, int kRows, L2Hint kHint = L2Hint::none, class SmemTensor, class Src>
__device__ __forceinline__ void load_strided_rows(SmemTensor& sX, const Src* base, const Src* first_row,
                                                  int64_t row_stride, int rows_valid, int head_dim,
                                                  int tid, uint8_t* mirror = nullptr) {
  if (tid >= Traits::kGmemThreads) return;
  auto part = copy_partition<Traits, kRows>(sX, tid);
  const typename Traits::Element* tile = &sX(0);
  auto& tXsX = get<0>(part);  // (CPY, CPY_M, CPY_K)
  const auto& tXcX = get<1>(part);  // (CPY, CPY_M, CPY_K) -> (row, col)
  const int row = get<0>(tXcX(0, 0, 0));
  const int col = get<1>(tXcX(0, 0, 0));
  const Src* src = first_row + row * row_stride + col;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tXsX); ++m) {
    const int drow = get<0>(tXcX(0, m, 0)) - row;  // a constant of the partition
    const bool row_ok = row + drow < rows_valid;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tXsX); ++k) {
      const int dcol = get<1>(tXcX(0, m, k)) - col;  // a constant of the partition
      const bool valid = row_ok && col + dcol < head_dim;
      copy_chunk<kHint>(&tXsX(0, m, k), tile, mirror, valid ? src + drow * row_stride + dcol : base, valid);
    }
  }
}

// Where a query tile's rows are equally spaced in Q, the first row's offset, the spacing and
// the rows that exist from the first: unpacked rows are the queries m0, m0 + 1, ... of one head
// (q_row_stride apart); packed rows of a one-query sequence (decode) are the heads
// hk * g + m0, ... of that query (q_head_stride apart). Packed rows of longer sequences are not.
struct StridedRows {
  bool strided;
  int64_t first, stride;
  int rows;
};
__device__ __forceinline__ StridedRows q_tile_rows(const AttnParams& p, const CtaInfo& c) {
  if (!p.pack_gqa) return {true, q_offset(p, c.seq, c.b, c.m0, c.head), p.q_row_stride, c.rows - c.m0};
  if (c.seq.seqlen_q == 1) {
    return {true, q_offset(p, c.seq, c.b, 0, c.hk * c.g + c.m0), p.q_head_stride, c.rows - c.m0};
  }
  return {false, 0, 0, 0};
}

template <class Traits, class SmemTensor>
__device__ __forceinline__ void load_q(const AttnParams& p, const int64_t* q_off, SmemTensor& sQ,
                                       int tid, uint8_t* mirror = nullptr) {
  load_tile<Traits, Traits::kBlockM>(sQ, static_cast<const typename Traits::QStorage*>(p.q), mirror,
                                     p.head_dim, tid, [&](int r) { return q_off[r]; });
}

// FP8 (Traits::kQFp8 / kKvFp8): this thread's chunks of a kRows-row tile whose copies (through
// the loads above, into mirror) it waited for, widened from e4m3 into the Element tile sX. The
// chunks are the ones the same thread copied, so no barrier separates its copies' landing
// from this; the barrier after it publishes the tile.
// The e4m3 pair in half `half` (0: its low two bytes) of a word, as an fp16 pair (exact).
__device__ __forceinline__ uint32_t e4m3_pair_to_half2(uint32_t word, int half) {
  const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(word >> (16 * half)), __NV_E4M3));
  return reinterpret_cast<const uint32_t&>(h);
}

template <class Element>
__device__ __forceinline__ uint4 widen_e4m3x8(uint2 bytes) {
  const uint32_t words[2] = {bytes.x, bytes.y};
  uint32_t out[4];
  CUTE_UNROLL
  for (int i = 0; i < 4; ++i) {
    const uint32_t pair = e4m3_pair_to_half2(words[i / 2], i % 2);
    if constexpr (std::is_same_v<Element, cutlass::half_t>) {
      out[i] = pair;
    } else {
      static_assert(std::is_same_v<Element, cutlass::bfloat16_t>, "bf16 or fp16 tiles");
      const __nv_bfloat162 b =
          __float22bfloat162_rn(__half22float2(reinterpret_cast<const __half2&>(pair)));  // exact: e4m3 values are bf16 values
      out[i] = reinterpret_cast<const uint32_t&>(b);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Q's e4m3 mirror (Traits::kQFp8), else null.
template <class Traits>
__device__ __forceinline__ uint8_t* q_mirror(char* smem) {
  if constexpr (Traits::kQFp8) return Traits::q_mirror(smem);
  return nullptr;
}

template <class Traits, int kRows, class SmemTensor>
__device__ __forceinline__ void convert_tile(SmemTensor& sX, const uint8_t* mirror, int tid) {
  using Element = typename Traits::Element;
  if (tid >= Traits::kGmemThreads) return;
  auto part = copy_partition<Traits, kRows>(sX, tid);
  auto& tXsX = get<0>(part);  // (CPY, CPY_M, CPY_K)
  const Element* tile = &sX(0);
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tXsX); ++m) {
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tXsX); ++k) {
      Element* chunk = &tXsX(0, m, k);
      const uint2 bytes = *reinterpret_cast<const uint2*>(mirror + (chunk - tile));
      *reinterpret_cast<uint4*>(chunk) = widen_e4m3x8<Element>(bytes);
    }
  }
}

// K (kIsV false) or V tile n, evict-first in the kernels that ask for it (Traits::
// kKvEvictFirst). Paged K/V reads the per-row offset table; contiguous K/V walks its rows from
// one rules.h offset, since there kv_row_offset(j) = kv_row_offset(j0) + (j - j0) * row_stride
// (measured: +7% at d = 128 over reading the table for contiguous K/V).
template <class Traits, bool kIsV, class SmemTensor>
__device__ __forceinline__ void load_kv(const AttnParams& p, const CtaInfo& c,
                                        const KvRowOffsets* kv_off, int n, SmemTensor& sX,
                                        int tid, uint8_t* mirror = nullptr) {
  using Src = typename Traits::KvStorage;
  constexpr L2Hint kHint = Traits::kKvEvictFirst ? L2Hint::evict_first : L2Hint::none;
  const Src* base = static_cast<const Src*>(kIsV ? p.v : p.k);
  if (!reads_page_table<Traits>(p)) {
    const int j0 = n * Traits::kBlockN;
    const int64_t row_stride = kIsV ? p.v_row_stride : p.k_row_stride;
    const int64_t row0 = kv_row_offset(p, c.seq, c.b, j0, kIsV ? p.v_batch_stride : p.k_batch_stride,
                                       row_stride, kIsV ? p.v_head_stride : p.k_head_stride, c.hk);
    load_strided_rows<Traits, Traits::kBlockN, kHint>(sX, base, base + row0, row_stride,
                                                      c.seq.seqlen_k - j0, p.head_dim, tid, mirror);
  } else {
    load_tile<Traits, Traits::kBlockN, kHint>(sX, base, mirror, p.head_dim, tid, [&](int r) {
      return kIsV ? kv_off[r].v : kv_off[r].k;
    });
  }
}

// ---- paged K/V read directly, without an offset table (splitkeys_kernel.h) ------------------
//
// A thread's copy rows of a K/V tile are kRows rows kGmemRowsPerPass apart (copy_partition).
// lookup_paged_rows reads the page of each from the page table into registers (the reads in
// flight together) and where each lies in its page; load_paged_rows then issues the K or V
// copies from them. Against the offset table (compute_kv_offsets) this drops a division and
// 64-bit products per row, the table's shared-memory round trip and the barrier between the
// page-table read and the copies, which let a short decode CTA start its copies only after its
// setup (docs/DECISIONS.md D-22).
template <int kRows_>
struct PageRows {
  static constexpr int kRows = kRows_;
  int page[kRows];     // each row's block_table entry as read (unchecked); -1 past the sequence's keys
  int in_page[kRows];  // each row's row within its page
  unsigned read = 0;   // bit m: row m's entry was read (for the fault record)
};

// The rows of `rows` that may be copied: bit m set where row m's entry names a page of the
// cache (rules.h valid_page). With `record`, an entry read that names none is recorded as the
// device's fault (index_checks.h) and its row reads nothing (zero-filled). The entries are
// checked here, where the copies use them anyway, not where they are read: a check at the
// lookup waited for the table reads before the tile's cp.async wait instead of under it
// (docs/DECISIONS.md D-61).
template <int kRows>
__device__ __forceinline__ unsigned usable_page_rows(const AttnParams& p, const CtaInfo& c,
                                                     const PageRows<kRows>& rows, bool record) {
  static_assert(kRows <= 32, "one bit per row");
  unsigned usable = 0;
  CUTE_UNROLL
  for (int m = 0; m < kRows; ++m) usable |= unsigned(valid_page(p, rows.page[m])) << m;
  if (record && (rows.read & ~usable) != 0u) {
    CUTE_UNROLL
    for (int m = 0; m < kRows; ++m) {
      if (rows.read >> m & 1u) checked_page(p, c.b, rows.page[m]);
    }
  }
  return usable;
}
template <class Traits>
using PagedRows = PageRows<Traits::kBlockN / Traits::kGmemRowsPerPass>;

// The pages of kRows keys kStep apart from key `first` (rows.page -1 for those past the keys,
// and for all of them where `copies` is false): rules.h kv_page, walked kStep keys at a time
// (kStep keys on is step_pages pages and step_rows rows on), with one division per call.
template <int kRows, int kStep>
__device__ __forceinline__ PageRows<kRows> lookup_page_rows(const AttnParams& p, const CtaInfo& c, int first,
                                                            bool copies) {
  PageRows<kRows> rows;
  const int pos = c.seq.leftpad + first;
  int page_index = pos / p.page_size;
  int in_page = pos - page_index * p.page_size;
  const int step_pages = kStep / p.page_size;
  const int step_rows = kStep - step_pages * p.page_size;
  const int* table_row = p.block_table + c.b * p.block_table_batch_stride;
  // The entries are read here, all of them in flight at once, and checked where the copies use
  // them (usable_page_rows).
  static_assert(kRows <= 32, "one bit per row");
  CUTE_UNROLL
  for (int m = 0; m < kRows; ++m) {
    const bool valid = copies && first + m * kStep < c.seq.seqlen_k;
    rows.read |= unsigned(valid) << m;
    rows.page[m] = valid ? table_row[page_index] : -1;
    rows.in_page[m] = in_page;
    in_page += step_rows;
    page_index += step_pages;
    if (in_page >= p.page_size) in_page -= p.page_size, ++page_index;
  }
  return rows;
}

// This thread's copy rows of key tile n (copy_partition: kGmemRowsPerPass rows apart).
template <class Traits>
__device__ __forceinline__ PagedRows<Traits> lookup_paged_rows(const AttnParams& p, const CtaInfo& c,
                                                              int n, int tid) {
  const int first = n * Traits::kBlockN + tid / Traits::kGmemThreadsPerRow;  // this thread's first key
  return lookup_page_rows<PagedRows<Traits>::kRows, Traits::kGmemRowsPerPass>(p, c, first,
                                                                             tid < Traits::kGmemThreads);
}

// K (kIsV false) or V tile from the rows lookup_paged_rows found: rules.h kv_paged_row_offset
// per row; rows past the keys and columns >= head_dim zero-filled.
template <class Traits, bool kIsV, class SmemTensor>
__device__ __forceinline__ void load_paged_rows(const AttnParams& p, const CtaInfo& c,
                                                const PagedRows<Traits>& rows, SmemTensor& sX, int tid,
                                                uint8_t* mirror = nullptr) {
  using Src = typename Traits::KvStorage;
  constexpr L2Hint kHint = Traits::kKvEvictFirst ? L2Hint::evict_first : L2Hint::none;
  if (tid >= Traits::kGmemThreads) return;
  const Src* base = static_cast<const Src*>(kIsV ? p.v : p.k);
  const typename Traits::Element* tile = &sX(0);
  const int64_t page_stride = kIsV ? p.v_batch_stride : p.k_batch_stride;
  const int64_t row_stride = kIsV ? p.v_row_stride : p.k_row_stride;
  auto part = copy_partition<Traits, Traits::kBlockN>(sX, tid);
  auto& tXsX = get<0>(part);        // (CPY, CPY_M, CPY_K)
  const auto& tXcX = get<1>(part);  // (CPY, CPY_M, CPY_K) -> (row, col)
  const int col = get<1>(tXcX(0, 0, 0));
  const Src* head = base + c.hk * (kIsV ? p.v_head_stride : p.k_head_stride) + col;
  static_assert(decltype(size<1>(tXsX))::value == PagedRows<Traits>::kRows, "a page per copy row");
  const unsigned usable = usable_page_rows(p, c, rows, /*record=*/!kIsV);  // K's copies record a fault
  CUTE_UNROLL
  for (int m = 0; m < PagedRows<Traits>::kRows; ++m) {
    const bool row_ok = usable >> m & 1u;
    const Src* src = head + rows.page[m] * page_stride + rows.in_page[m] * row_stride;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tXsX); ++k) {
      const int dcol = get<1>(tXcX(0, m, k)) - col;  // a constant of the partition
      const bool valid = row_ok && col + dcol < p.head_dim;
      copy_chunk<kHint>(&tXsX(0, m, k), tile, mirror, valid ? src + dcol : base, valid);
    }
  }
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
