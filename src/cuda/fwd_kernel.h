// The forward attention kernel (FlashAttention-2 mainloop, SM80 mma.sync through CuTe).
//
// A CTA owns kBlockM rows of one (batch, head) — with pack_gqa of one (batch, KV head), row r
// standing for (query r / g, head hk*g + r % g) — and one split of the visible key tiles.
// Q, K and V rows are gathered row by row through rules.h (varlen, paged KV with any page size,
// cache_batch_idx, leftpad, arbitrary strides and packed GQA are one code path): each thread
// issues 16-byte cp.async copies for (row, chunk) pairs into CuTe's swizzled smem layout.
//
// Per key tile n (walked from the last visible tile down):
//   wait K[n]; issue V[n]  |  S = Q K^T  |  score transform, ALiBi, mask (edge tiles only)
//   wait V[n]  |  online softmax (exp2)  |  issue K[n-1]  |  O += P V
// so V[n] streams in under Q K^T and K[n-1] under P V and the next tile's wait (FA2's pipeline,
// with K issued after the softmax to keep the fp32 scores and the copy addresses apart).
#pragma once

#include <cmath>

#include <cute/arch/copy_sm90_desc.hpp>  // cute::TMA::CacheHintSm90
#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include "common/params.h"
#include "common/rules.h"
#include "cuda/grid_dependence.h"
#include "cuda/kernel_traits.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)

// ---- small device helpers ------------------------------------------------------------------

// The L2 eviction priority of the lines a copy brings in: the default, or evict-first
// (Traits::kKvEvictFirst). The hinted copy carries the cache policy PTX createpolicy.fractional makes for
// evict-first (the value CuTe names for TMA; a constant, which the compiler rematerialises
// instead of holding a register pair through the mainloop). The default is the plain copy: the
// hinted copy with an evict-normal policy measured 7% slower at batch 128 decode (docs/PERF.md,
// session 5 run 6).
enum class L2Hint { none, evict_first };

// 16-byte global->shared async copy to the shared-window address dst; src_bytes 0 zero-fills
// the destination without reading.
template <L2Hint kHint = L2Hint::none>
__device__ __forceinline__ void cp_async_16_to(uint32_t dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  if constexpr (kHint == L2Hint::evict_first) {
    constexpr uint64_t kPolicy = uint64_t(cute::TMA::CacheHintSm90::EVICT_FIRST);
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(gmem_src), "r"(src_bytes), "l"(kPolicy));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
                 "r"(src_bytes));
  }
}
template <L2Hint kHint = L2Hint::none>
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  cp_async_16_to<kHint>(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst)), gmem_src, valid);
}
// 4-byte global->shared async copy (one int: persistent_decode_kernel.h stages lengths so).
__device__ __forceinline__ void cp_async_4(int* smem_dst, const int* gmem_src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
               "l"(gmem_src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Accumulator layout ((2,2), MMA_M, MMA_N) viewed as (rows = (2, MMA_M), cols = (2, MMA_N)).
template <class Layout>
__device__ __forceinline__ auto acc_to_rowcol(Layout acc) {
  auto l = logical_divide(acc, Shape<_2>{});  // ((2, 2), MMA_M, MMA_N)
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

// Accumulator layout ((2,2), MMA_M, MMA_N) viewed as the A operand of an m16n8k16 MMA:
// ((2,2,2), MMA_M, MMA_N / 2) — two adjacent n8 C tiles form one k16 A tile.
template <class Layout>
__device__ __forceinline__ auto acc_to_a_operand(Layout acc) {
  auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});  // ((2,2), MMA_M, (2, MMA_N/2))
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

template <typename To, class Engine, class Layout>
__device__ __forceinline__ auto convert_fragment(const Tensor<Engine, Layout>& src) {
  Tensor dst = make_tensor<To>(src.layout());
  CUTE_UNROLL
  for (int e = 0; e < size(src); ++e) dst(e) = static_cast<To>(src(e));
  return dst;
}

template <class T>
__device__ __forceinline__ T quad_allreduce_max(T x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
template <class T>
__device__ __forceinline__ T quad_allreduce_sum(T x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// acc += A(smem) * B(smem), ldmatrix of k-step i+1 overlapping the MMA of step i.
template <class Acc, class RA, class RB, class SA, class SB, class TiledMma, class CopyA,
          class CopyB, class ThrCopyA, class ThrCopyB>
__device__ __forceinline__ void gemm_ss(Acc& acc, RA& tCrA, RB& tCrB, const SA& tCsA,
                                        const SB& tCsB, TiledMma tiled_mma, CopyA copy_a,
                                        CopyB copy_b, ThrCopyA thr_copy_a, ThrCopyB thr_copy_b) {
  Tensor tCrA_view = thr_copy_a.retile_D(tCrA);
  Tensor tCrB_view = thr_copy_b.retile_D(tCrB);
  copy(copy_a, tCsA(_, _, _0{}), tCrA_view(_, _, _0{}));
  copy(copy_b, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k < size<2>(tCrA) - 1) {
      copy(copy_a, tCsA(_, _, k + 1), tCrA_view(_, _, k + 1));
      copy(copy_b, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
    }
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// acc += A(registers) * B(smem). (Prefetching the next k-step's B fragment, as gemm_ss does,
// measured the same at d = 128 and costs registers.)
template <class Acc, class RA, class RB, class SB, class TiledMma, class CopyB, class ThrCopyB>
__device__ __forceinline__ void gemm_rs(Acc& acc, const RA& tCrA, RB& tCrB, const SB& tCsB,
                                        TiledMma tiled_mma, CopyB copy_b, ThrCopyB thr_copy_b) {
  Tensor tCrB_view = thr_copy_b.retile_D(tCrB);
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    copy(copy_b, tCsB(_, _, k), tCrB_view(_, _, k));
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// ---- per-CTA geometry ----------------------------------------------------------------------

struct CtaInfo {
  int b;           // batch
  int head;        // query head (unpacked) or KV head (pack_gqa)
  int hk;          // KV head
  int g;           // rows per query (h / hk with pack_gqa, else 1)
  int m0;          // first tile row
  int rows;        // tile rows of this sequence: seqlen_q * g
  SeqInfo seq;
};

// Query index and head of tile row r (absolute row within the sequence's packed rows).
__device__ __forceinline__ PackedRow tile_row_query(const AttnParams& p, const CtaInfo& c, int r) {
  if (p.pack_gqa) return unpack_row(p, r, c.hk);
  return PackedRow{r, c.head};
}

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
template <class Traits>
__device__ __forceinline__ void compute_kv_offsets(const AttnParams& p, const CtaInfo& c, int n,
                                                   KvRowOffsets* kv_off, int tid) {
  for (int r = tid; r < Traits::kBlockN; r += Traits::kNThreads) {
    const int j = n * Traits::kBlockN + r;
    kv_off[r] = paged_kv_row_offsets(p, c, j < c.seq.seqlen_k ? kv_page(p, c.seq, c.b, j) : 0, j);
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
// after make_cta_info instead, nothing; docs/PERF.md, session 7 runs 3-4). The whole row is
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
template <class Traits, int kRows, L2Hint kHint = L2Hint::none, class SmemTensor, class RowOff>
__device__ __forceinline__ void load_tile(SmemTensor& sX, const typename Traits::Element* base,
                                          int head_dim, int tid, RowOff row_off) {
  if (tid >= Traits::kGmemThreads) return;
  auto part = copy_partition<Traits, kRows>(sX, tid);
  auto& tXsX = get<0>(part);  // (CPY, CPY_M, CPY_K)
  const auto& tXcX = get<1>(part);  // (CPY, CPY_M, CPY_K) -> (row, col)
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tXsX); ++m) {
    const int64_t off = row_off(get<0>(tXcX(0, m, 0)));
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tXsX); ++k) {
      const int col = get<1>(tXcX(0, m, k));
      const bool valid = off != kNoRow && col < head_dim;
      cp_async_16<kHint>(&tXsX(0, m, k), valid ? base + off + col : base, valid);
    }
  }
}

// load_tile for kRows rows row_stride elements apart from first_row (contiguous K/V): rows >=
// rows_valid and columns >= head_dim are zero-filled. Each thread computes its first source
// address once and steps it by constant multiples of the stride, so that a 16-byte copy costs a
// predicate, an address add and the copy (the per-row offsets of load_tile cost ~15 integer
// instructions per copy, a third of a one-tile decode CTA's instructions: docs/PERF.md,
// session 4 run 7).
template <class Traits, int kRows, L2Hint kHint = L2Hint::none, class SmemTensor>
__device__ __forceinline__ void load_strided_rows(SmemTensor& sX, const typename Traits::Element* base,
                                                  const typename Traits::Element* first_row,
                                                  int64_t row_stride, int rows_valid, int head_dim,
                                                  int tid) {
  if (tid >= Traits::kGmemThreads) return;
  auto part = copy_partition<Traits, kRows>(sX, tid);
  auto& tXsX = get<0>(part);  // (CPY, CPY_M, CPY_K)
  const auto& tXcX = get<1>(part);  // (CPY, CPY_M, CPY_K) -> (row, col)
  const int row = get<0>(tXcX(0, 0, 0));
  const int col = get<1>(tXcX(0, 0, 0));
  const typename Traits::Element* src = first_row + row * row_stride + col;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tXsX); ++m) {
    const int drow = get<0>(tXcX(0, m, 0)) - row;  // a constant of the partition
    const bool row_ok = row + drow < rows_valid;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tXsX); ++k) {
      const int dcol = get<1>(tXcX(0, m, k)) - col;  // a constant of the partition
      const bool valid = row_ok && col + dcol < head_dim;
      cp_async_16<kHint>(&tXsX(0, m, k), valid ? src + drow * row_stride + dcol : base, valid);
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
                                       int tid) {
  load_tile<Traits, Traits::kBlockM>(sQ, static_cast<const typename Traits::Element*>(p.q),
                                     p.head_dim, tid, [&](int r) { return q_off[r]; });
}

// K (kIsV false) or V tile n, evict-first in the kernels that ask for it (Traits::
// kKvEvictFirst). Paged K/V reads the per-row offset table; contiguous K/V walks its rows from
// one rules.h offset, since there kv_row_offset(j) = kv_row_offset(j0) + (j - j0) * row_stride
// (measured: +7% at d = 128 over reading the table for contiguous K/V).
template <class Traits, bool kIsV, class SmemTensor>
__device__ __forceinline__ void load_kv(const AttnParams& p, const CtaInfo& c,
                                        const KvRowOffsets* kv_off, int n, SmemTensor& sX,
                                        int tid) {
  using Element = typename Traits::Element;
  constexpr L2Hint kHint = Traits::kKvEvictFirst ? L2Hint::evict_first : L2Hint::none;
  const Element* base = static_cast<const Element*>(kIsV ? p.v : p.k);
  if (!reads_page_table<Traits>(p)) {
    const int j0 = n * Traits::kBlockN;
    const int64_t row_stride = kIsV ? p.v_row_stride : p.k_row_stride;
    const int64_t row0 = kv_row_offset(p, c.seq, c.b, j0, kIsV ? p.v_batch_stride : p.k_batch_stride,
                                       row_stride, kIsV ? p.v_head_stride : p.k_head_stride, c.hk);
    load_strided_rows<Traits, Traits::kBlockN, kHint>(sX, base, base + row0, row_stride,
                                                      c.seq.seqlen_k - j0, p.head_dim, tid);
  } else {
    load_tile<Traits, Traits::kBlockN, kHint>(sX, base, p.head_dim, tid, [&](int r) {
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
// setup (docs/PERF.md, session 10).
template <class Traits>
struct PagedRows {
  static constexpr int kRows = Traits::kBlockN / Traits::kGmemRowsPerPass;
  int page[kRows];     // the page holding each row; -1 past the sequence's keys
  int in_page[kRows];  // each row's row within its page
};

template <class Traits>
__device__ __forceinline__ PagedRows<Traits> lookup_paged_rows(const AttnParams& p, const CtaInfo& c,
                                                              int n, int tid) {
  constexpr int kStep = Traits::kGmemRowsPerPass;
  PagedRows<Traits> rows;
  const int first = n * Traits::kBlockN + tid / Traits::kGmemThreadsPerRow;  // this thread's first key
  const bool copies = tid < Traits::kGmemThreads;
  // rules.h kv_page, walked kStep keys at a time: kStep keys on is step_pages pages and
  // step_rows rows on.
  const int pos = c.seq.leftpad + first;
  int page_index = pos / p.page_size;
  int in_page = pos - page_index * p.page_size;
  const int step_pages = kStep / p.page_size;
  const int step_rows = kStep - step_pages * p.page_size;
  const int* table_row = p.block_table + c.b * p.block_table_batch_stride;
  CUTE_UNROLL
  for (int m = 0; m < PagedRows<Traits>::kRows; ++m) {
    const bool valid = copies && first + m * kStep < c.seq.seqlen_k;
    rows.page[m] = valid ? table_row[page_index] : -1;
    rows.in_page[m] = in_page;
    in_page += step_rows;
    page_index += step_pages;
    if (in_page >= p.page_size) in_page -= p.page_size, ++page_index;
  }
  return rows;
}

// K (kIsV false) or V tile from the rows lookup_paged_rows found: rules.h kv_paged_row_offset
// per row; rows past the keys and columns >= head_dim zero-filled.
template <class Traits, bool kIsV, class SmemTensor>
__device__ __forceinline__ void load_paged_rows(const AttnParams& p, const CtaInfo& c,
                                                const PagedRows<Traits>& rows, SmemTensor& sX, int tid) {
  using Element = typename Traits::Element;
  constexpr L2Hint kHint = Traits::kKvEvictFirst ? L2Hint::evict_first : L2Hint::none;
  if (tid >= Traits::kGmemThreads) return;
  const Element* base = static_cast<const Element*>(kIsV ? p.v : p.k);
  const int64_t page_stride = kIsV ? p.v_batch_stride : p.k_batch_stride;
  const int64_t row_stride = kIsV ? p.v_row_stride : p.k_row_stride;
  auto part = copy_partition<Traits, Traits::kBlockN>(sX, tid);
  auto& tXsX = get<0>(part);        // (CPY, CPY_M, CPY_K)
  const auto& tXcX = get<1>(part);  // (CPY, CPY_M, CPY_K) -> (row, col)
  const int col = get<1>(tXcX(0, 0, 0));
  const Element* head = base + c.hk * (kIsV ? p.v_head_stride : p.k_head_stride) + col;
  static_assert(decltype(size<1>(tXsX))::value == PagedRows<Traits>::kRows, "a page per copy row");
  CUTE_UNROLL
  for (int m = 0; m < PagedRows<Traits>::kRows; ++m) {
    const bool row_ok = rows.page[m] >= 0;
    const Element* src = head + rows.page[m] * page_stride + rows.in_page[m] * row_stride;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tXsX); ++k) {
      const int dcol = get<1>(tXcX(0, m, k)) - col;  // a constant of the partition
      const bool valid = row_ok && col + dcol < p.head_dim;
      cp_async_16<kHint>(&tXsX(0, m, k), valid ? src + dcol : base, valid);
    }
  }
}

// ---- per-CTA setup and per-tile steps shared by both kernels ----------------------------

// The batch and heads of unit (batch x heads, or batch x KV heads with pack_gqa); heads:
// units_per_sequence(p).
__device__ __forceinline__ void set_unit_heads(const AttnParams& p, int unit, int heads, CtaInfo& c) {
  c.b = int(unsigned(unit) / unsigned(heads));
  c.head = unit - c.b * heads;
  c.g = p.pack_gqa ? heads_per_kv_head(p) : 1;
  c.hk = p.pack_gqa ? c.head : int(unsigned(c.head) / unsigned(heads_per_kv_head(p)));
}
__device__ __forceinline__ void set_unit_heads(const AttnParams& p, int unit, CtaInfo& c) {
  set_unit_heads(p, unit, units_per_sequence(p), c);
}

// The geometry of decode unit `unit` of sequence seq: one query tile per unit, so its first
// row is 0 (the persistent and heads-split decode kernels).
__device__ __forceinline__ CtaInfo decode_unit_info(const AttnParams& p, int unit, const SeqInfo& seq) {
  CtaInfo c;
  set_unit_heads(p, unit, c);
  c.seq = seq;
  c.rows = seq.seqlen_q * c.g;
  c.m0 = 0;
  return c;
}

// The CTA's (batch, head, first row) from its block index; false when this query tile lies
// past the end of its sequence (varlen: shorter than max_seqlen_q).
template <int kBlockM>
__device__ __forceinline__ bool make_cta_info(const AttnParams& p, CtaInfo& c) {
  // Read before the block indices are chosen, and seq_info's reads as rules.h has them: the
  // order session 8's build compiled. In another order ptxas rescheduled the whole d = 256
  // wgmma kernel, 2-3% slower (docs/PERF.md session 19 runs 7-8).
  const int heads = units_per_sequence(p);
  // The decode tile (one query tile per unit) is always launched unit by unit.
  const bool heavy_first = kBlockM != kQueryTileRowsDecode && p.heavy_tiles_first;
  const int unit = heavy_first ? blockIdx.x : blockIdx.z;
  const int m_block = heavy_first ? blockIdx.z : blockIdx.x;
  const int m_blocks = heavy_first ? gridDim.z : gridDim.x;
  set_unit_heads(p, unit, heads, c);
  c.seq = seq_info(p, c.b);
  c.rows = c.seq.seqlen_q * c.g;
  // Heavy (late, causal) query tiles first: better tail balance.
  c.m0 = (m_blocks - 1 - m_block) * kBlockM;
  return c.m0 < c.rows;
}

// The key tiles [lo, hi) this CTA visits (its rows' visible keys, cut to its split), and the
// keys [mask_free_lo, mask_free_hi) visible to every one of its rows: a tile inside that range
// needs no element mask.
struct CtaKeyTiles {
  int lo, hi;
  int mask_free_lo, mask_free_hi;
};

template <int kBlockM, int kBlockN>
__device__ __forceinline__ CtaKeyTiles cta_key_tiles(const AttnParams& p, const CtaInfo& c, int split) {
  const int q_first = tile_row_query(p, c, c.m0).query;
  const int q_last = tile_row_query(p, c, min(c.m0 + kBlockM, c.rows) - 1).query;
  const KeyRange keys = visible_keys_of_rows(p, q_first, q_last + 1, c.seq.seqlen_q, c.seq.seqlen_k);
  CtaKeyTiles t;
  t.lo = keys.lo / kBlockN;
  t.hi = keys.hi > keys.lo ? (keys.hi + kBlockN - 1) / kBlockN : t.lo;
  if (p.num_splits > 1) {
    // Splits are cut at whole splitkv_block_n(head_dim)-key units, as the CPU backend cuts
    // them; a unit is a whole number of this kernel's tiles (launch_fwd checks), also when a
    // larger compiled head dim serves this one.
    // The unit is a power of two: shifts instead of divisions (keys are never negative).
    const int unit = splitkv_block_n(p.head_dim);
    const int unit_log2 = __ffs(unit) - 1;
    const int tiles_per_unit = unit / kBlockN;
    const int unit_lo = keys.lo >> unit_log2;
    const int unit_hi = keys.hi > keys.lo ? (keys.hi + unit - 1) >> unit_log2 : unit_lo;
    const KeyRange cut = split_tiles(split, p.num_splits, unit_lo, unit_hi);
    t.lo = max(t.lo, cut.lo * tiles_per_unit);
    t.hi = min(t.hi, cut.hi * tiles_per_unit);
    if (t.hi < t.lo) t.hi = t.lo;
  }
  // First row's range ends earliest and the last row's starts latest.
  t.mask_free_lo = visible_keys(p, q_last, c.seq.seqlen_q, c.seq.seqlen_k).lo;
  t.mask_free_hi = visible_keys(p, q_first, c.seq.seqlen_q, c.seq.seqlen_k).hi;
  return t;
}

// Scores are kept "raw": x = q·k (or tanh(q·k·scale/softcap) with softcap) so that the
// logit is x * raw_scale and exp(logit - max) = exp2(x * scale_log2 - max * scale_log2).
struct ScoreScale {
  bool has_softcap;
  float raw_scale, scale_log2, softcap_in_scale;
  __device__ __forceinline__ explicit ScoreScale(const AttnParams& p)
      : has_softcap(p.softcap > 0.0f),
        raw_scale(has_softcap ? p.softcap : p.softmax_scale),
        scale_log2(raw_scale * kLog2e),
        softcap_in_scale(has_softcap ? p.softmax_scale / p.softcap : 0.0f) {}
};

// Softcap, ALiBi and the mask on one block of scores s (rows, cols), in place. coord(i, jj)
// is the (tile row, column) of s(i, jj); row r is tile row cs.m0 + r, column jj is key
// key0 + column. The mask is applied only when need_mask (edge tiles).
template <class S, class Coord>
__device__ __forceinline__ void apply_score_rules(const AttnParams& p, const CtaInfo& cs,
                                                  const ScoreScale& sc, S& s, const Coord& coord,
                                                  int key0, bool need_mask) {
  constexpr int kRows = decltype(size<0>(s))::value;
  constexpr int kCols = decltype(size<1>(s))::value;
  if (sc.has_softcap) {
    CUTE_UNROLL
    for (int e = 0; e < size(s); ++e) s(e) = tanhf(s(e) * sc.softcap_in_scale);
  }
  if (p.alibi_slopes != nullptr) {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const PackedRow pr = tile_row_query(p, cs, cs.m0 + get<0>(coord(i, 0)));
      const int diag = pr.query + cs.seq.seqlen_k - cs.seq.seqlen_q;
      const float slope = alibi_slope(p, cs.b, pr.head) / sc.raw_scale;  // raw score units
      CUTE_UNROLL
      for (int jj = 0; jj < kCols; ++jj) {
        const int dist = diag - (key0 + get<1>(coord(i, jj)));
        s(i, jj) -= slope * float(dist < 0 ? -dist : dist);
      }
    }
  }
  if (need_mask) {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const int query = tile_row_query(p, cs, cs.m0 + get<0>(coord(i, 0))).query;
      const KeyRange kr = visible_keys(p, query, cs.seq.seqlen_q, cs.seq.seqlen_k);
      CUTE_UNROLL
      for (int jj = 0; jj < kCols; ++jj) {
        const int j = key0 + get<1>(coord(i, jj));
        if (j < kr.lo || j >= kr.hi) s(i, jj) = -INFINITY;
      }
    }
  }
}

// The softmax half of an online-softmax step: fold the scores s (rows, cols) into the running
// max and sum of each row and turn s into P = exp2(x * scale_log2 - max'); correction[i] is the
// factor row i of O must be scaled by (rescale_rows) before P V is added. row_sum stays
// thread-local (reduced across the quad at the end).
template <class S>
__device__ __forceinline__ void softmax_update(S& s, float* row_max, float* row_sum,
                                               float scale_log2, float* correction) {
  constexpr int kRows = decltype(size<0>(s))::value;
  constexpr int kCols = decltype(size<1>(s))::value;
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    float m = row_max[i];
    CUTE_UNROLL
    for (int jj = 0; jj < kCols; ++jj) m = fmaxf(m, s(i, jj));
    m = quad_allreduce_max(m);
    // A row that has seen no key yet keeps max -inf; use 0 as its offset to avoid inf - inf.
    const float m_scaled = m == -INFINITY ? 0.0f : m * scale_log2;
    correction[i] = exp2f(row_max[i] * scale_log2 - m_scaled);
    row_max[i] = m;
    row_sum[i] *= correction[i];
    float sum = 0.0f;
    CUTE_UNROLL
    for (int jj = 0; jj < kCols; ++jj) {
      s(i, jj) = exp2f(s(i, jj) * scale_log2 - m_scaled);
      sum += s(i, jj);
    }
    row_sum[i] += sum;
  }
}

template <class O>
__device__ __forceinline__ void rescale_rows(O& o_rc, const float* correction) {
  constexpr int kRows = decltype(size<0>(o_rc))::value;
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    CUTE_UNROLL
    for (int d = 0; d < size<1>(o_rc); ++d) o_rc(i, d) *= correction[i];
  }
}

// One online-softmax step: softmax_update, then rescale the rows of O (o_rc: rows, d).
// kSkipUnitRescale (a whole warp calls it uniformly, splitkeys_kernel.h): the rescale is skipped
// when no row of the warp needs it, i.e. every correction is exactly 1 (no row max rose), which
// is exact (x * 1.0f == x) and, after a walk's first tiles, the usual case: a decode warp's row
// max rises at its n-th tile with probability about 1/n per row.
template <bool kSkipUnitRescale = false, class S, class O>
__device__ __forceinline__ void online_softmax_step(S& s, O& o_rc, float* row_max, float* row_sum,
                                                    float scale_log2) {
  constexpr int kRows = decltype(size<0>(s))::value;
  float correction[kRows];
  softmax_update(s, row_max, row_sum, scale_log2, correction);
  if constexpr (kSkipUnitRescale) {
    bool rescale = false;
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) rescale |= correction[i] != 1.0f;
    if (!__any_sync(0xffffffffu, rescale)) return;
  }
  rescale_rows(o_rc, correction);
}

// O rows from the staged smem tile sO (kBlockM x kHeadDim, Element) to global memory with
// 16-byte stores, row r at p.o + o_off[r] (kNoRow: not stored), columns < head_dim.
template <class Traits, class SmemTensor>
__device__ __forceinline__ void store_o_rows(const AttnParams& p, const SmemTensor& sO,
                                             const int64_t* o_off, int tid) {
  if (tid >= Traits::kGmemThreads) return;
  using Element = typename Traits::Element;
  Element* o = static_cast<Element*>(p.o);
  typename Traits::GmemTiledCopy gmem_copy;
  auto thr_copy = gmem_copy.get_thread_slice(tid);
  Tensor tOsO = thr_copy.partition_S(sO);  // (CPY, CPY_M, CPY_K)
  Tensor cO = make_identity_tensor(Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{});
  Tensor tOcO = thr_copy.partition_S(cO);  // (CPY, CPY_M, CPY_K) -> (row, col)
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tOsO); ++m) {
    const int64_t off = o_off[get<0>(tOcO(0, m, 0))];
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tOsO); ++k) {
      const int col = get<1>(tOcO(0, m, k));
      if (off != kNoRow && col < p.head_dim) {
        *reinterpret_cast<uint4*>(o + off + col) = *reinterpret_cast<const uint4*>(&tOsO(0, m, k));
      }
    }
  }
}

// Every row starts with max -inf and sum 0 (no key seen).
template <int kRows>
__device__ __forceinline__ void start_softmax_rows(float (&row_max)[kRows], float (&row_sum)[kRows]) {
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.0f;
  }
}

// ---- multi-stage K/V buffers (splitkeys_kernel.h, wgmma_kernel.h) -------------------------
//
// Traits::kStages K buffers, Traits::kStages V buffers and, for paged K/V in wgmma_kernel.h,
// one row-offset table per stage in shared memory; key tile n lives in stage n % kStages.
template <class Traits>
struct KvStages {
  using Element = typename Traits::Element;
  static constexpr int kElems = int(cute::cosize_v<typename Traits::SmemLayoutKV>);
  Element* k;              // [kStages] K tiles
  Element* v;              // [kStages] V tiles
  KvRowOffsets* tables;    // [kStages][kBlockN] (paged K/V through issue(n) only)

  __device__ __forceinline__ auto k_tile(int stage) const {
    return make_tensor(make_smem_ptr(k + stage * kElems), typename Traits::SmemLayoutKV{});
  }
  __device__ __forceinline__ auto v_tile(int stage) const {
    return make_tensor(make_smem_ptr(v + stage * kElems), typename Traits::SmemLayoutKV{});
  }
  // V of a stage seen as (d, n), the B operand of P V.
  __device__ __forceinline__ auto vt_tile(int stage) const {
    return make_tensor(make_smem_ptr(v + stage * kElems), typename Traits::SmemLayoutVt{});
  }
  __device__ __forceinline__ KvRowOffsets* table(int n) const {
    return tables + (unsigned(n) % Traits::kStages) * Traits::kBlockN;  // n >= 0
  }
  // The K and V copies of tile n into its stage: always one commit group (possibly empty, for
  // n before the first tile), so that wait_group counts stay in step near the end of the walk.
  __device__ __forceinline__ void issue(const AttnParams& p, const CtaInfo& c,
                                        const CtaKeyTiles& tiles, int n, int tid) const {
    if (n >= tiles.lo) {
      auto k_stage = k_tile(unsigned(n) % Traits::kStages);
      auto v_stage = v_tile(unsigned(n) % Traits::kStages);
      load_kv<Traits, false>(p, c, table(n), n, k_stage, tid);
      load_kv<Traits, true>(p, c, table(n), n, v_stage, tid);
    }
    cp_async_commit();
  }
  // Paged K/V: the row offsets of tile n into its table, read by issue() after a barrier.
  __device__ __forceinline__ void prepare(const AttnParams& p, const CtaInfo& c,
                                          const CtaKeyTiles& tiles, int n, int tid) const {
    if (n >= tiles.lo && reads_page_table<Traits>(p)) compute_kv_offsets<Traits>(p, c, n, table(n), tid);
  }
  // issue() without the offset table (splitkeys_kernel.h, tables unset): paged K/V from the
  // pages lookup(n) read. Both always run, as one commit group per tile.
  __device__ __forceinline__ PagedRows<Traits> lookup(const AttnParams& p, const CtaInfo& c,
                                                      const CtaKeyTiles& tiles, int n, int tid) const {
    if (n >= tiles.lo && reads_page_table<Traits>(p)) return lookup_paged_rows<Traits>(p, c, n, tid);
    return PagedRows<Traits>{};
  }
  __device__ __forceinline__ void issue(const AttnParams& p, const CtaInfo& c, const CtaKeyTiles& tiles,
                                        int n, int tid, const PagedRows<Traits>& rows) const {
    if (n >= tiles.lo && reads_page_table<Traits>(p)) {
      auto k_stage = k_tile(unsigned(n) % Traits::kStages);
      auto v_stage = v_tile(unsigned(n) % Traits::kStages);
      load_paged_rows<Traits, false>(p, c, rows, k_stage, tid);
      load_paged_rows<Traits, true>(p, c, rows, v_stage, tid);
      cp_async_commit();
    } else {
      issue(p, c, tiles, n, tid);
    }
  }
};

// ---- the kernel ----------------------------------------------------------------------------

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1) fwd_kernel(const __grid_constant__ AttnParams p) {
  allow_dependent_launch();
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x;

  // ---- geometry: which rows, which sequence, which split
  CtaInfo c;
  if (!make_cta_info<kBlockM>(p, c)) return;
  const int split = blockIdx.y;
  const CtaKeyTiles tiles = cta_key_tiles<kBlockM, kBlockN>(p, c, split);
  const int tile_lo = tiles.lo, tile_hi = tiles.hi;

  // ---- shared memory tensors
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)),
                          typename Traits::SmemLayoutQ{});  // (kBlockM, kHeadDim)
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});  // (kBlockN, kHeadDim)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});  // (kBlockN, kHeadDim)
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});  // (kHeadDim, kBlockN)
  Tensor sVtNoSwizzle = make_tensor(sV.data().get(), typename Traits::SmemLayoutVtNoSwizzle{});

  // Row offset tables (after sV): Q and O rows of this CTA, K/V rows of two key tiles.
  int64_t* q_off = reinterpret_cast<int64_t*>(smem + Traits::kSmemQBytes + 2 * Traits::kSmemKVBytes);
  int64_t* o_off = q_off + kBlockM;
  KvRowOffsets* kv_off_buf = reinterpret_cast<KvRowOffsets*>(o_off + kBlockM);  // [2][kBlockN]
  auto kv_off = [&](int n) { return kv_off_buf + (n & 1) * kBlockN; };

  // The CTA geometry is read from smem from here on: a value re-read after each barrier is not
  // held in registers across the mainloop (measured: fewer spills at d = 128).
  static_assert(sizeof(CtaInfo) <= Traits::kSmemCtaInfoBytes, "CTA geometry fits its smem slot");
  CtaInfo* c_smem = reinterpret_cast<CtaInfo*>(kv_off_buf + 2 * kBlockN);
  if (tid == 0) *c_smem = c;

  // ---- start the loads: Q and the first (highest) K tile
  compute_q_o_offsets<Traits>(p, c, q_off, o_off, tid);
  if (tile_hi > tile_lo && reads_page_table<Traits>(p)) compute_kv_offsets<Traits>(p, c, tile_hi - 1, kv_off(tile_hi - 1), tid);
  __syncthreads();
  const CtaInfo& cs = *c_smem;
  if (tile_hi > tile_lo) {
    load_q<Traits>(p, q_off, sQ, tid);
    load_kv<Traits, false>(p, c, kv_off(tile_hi - 1), tile_hi - 1, sK, tid);
    cp_async_commit();
  }

  // ---- MMA partitions
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);            // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_mma.partition_fragment_B(sK);            // (MMA, MMA_N, MMA_K)
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);  // (MMA, MMA_K=d/8, MMA_N)
  Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_K)
  clear(acc_o);

  auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_copy_q = smem_copy_q.get_thread_slice(tid);
  Tensor tSsQ = smem_thr_copy_q.partition_S(sQ);
  auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_copy_k = smem_copy_k.get_thread_slice(tid);
  Tensor tSsK = smem_thr_copy_k.partition_S(sK);
  auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto smem_thr_copy_v = smem_copy_v.get_thread_slice(tid);
  Tensor tOsVt = smem_thr_copy_v.partition_S(sVt);

  // ---- this thread's rows: visible key range, ALiBi slope, softmax state
  // Coordinates (row, col) within the S tile of each accumulator element.
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS = thr_mma.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_to_rowcol(tScS.layout()));  // (rows, cols)
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;

  const ScoreScale sc(p);

  // Per row only the softmax state lives in registers (they are the scarce resource at d = 128);
  // the query index, visible range and ALiBi slope are re-derived on the tiles that need them.
  float row_max[kRows], row_sum[kRows];
  start_softmax_rows(row_max, row_sum);

  // ---- mainloop over key tiles, last first
  for (int n = tile_hi - 1; n >= tile_lo; --n) {
    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
    clear(acc_s);
    cp_async_wait<0>();
    __syncthreads();  // K[n] landed; every warp is done with V[n+1]
    load_kv<Traits, true>(p, cs, kv_off(n), n, sV, tid);
    cp_async_commit();
    // Offsets of tile n-1 into the other table (its last reader, V[n+1], was issued before the
    // barrier above); they are read after the next barrier.
    if (n > tile_lo && reads_page_table<Traits>(p)) compute_kv_offsets<Traits>(p, cs, n - 1, kv_off(n - 1), tid);

    gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, smem_copy_q, smem_copy_k, smem_thr_copy_q,
            smem_thr_copy_k);

    // score transform, ALiBi, mask
    Tensor s = make_tensor(acc_s.data(), acc_to_rowcol(acc_s.layout()));  // (kRows, kCols)
    const int j0 = n * kBlockN;
    const bool need_mask = !(j0 >= tiles.mask_free_lo && j0 + kBlockN <= tiles.mask_free_hi);
    apply_score_rules(p, cs, sc, s, tScS_rc, j0, need_mask);

    cp_async_wait<0>();
    __syncthreads();  // V[n] landed; every warp is done with K[n]

    // online softmax: new running max, rescale O and the sum, P = exp2(...)
    Tensor o_rc = make_tensor(acc_o.data(), acc_to_rowcol(acc_o.layout()));  // (kRows, d cols)
    online_softmax_step(s, o_rc, row_max, row_sum, sc.scale_log2);

    // O += P V
    Tensor rP = convert_fragment<Element>(acc_s);
    // K[n-1] is issued here rather than right after the barrier: the fp32 scores are dead by now,
    // so the address work does not compete with them for registers (measured: fewer spills).
    if (n > tile_lo) {
      load_kv<Traits, false>(p, cs, kv_off(n - 1), n - 1, sK, tid);
      cp_async_commit();
    }
    Tensor tOrP = make_tensor(rP.data(), acc_to_a_operand(rP.layout()));  // ((2,2,2), MMA_M, kBlockN/16)
    gemm_rs(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, smem_copy_v, smem_thr_copy_v);
  }

  // ---- epilogue: normalise, LSE, store
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with sQ/sK/sV; sQ becomes the O staging buffer

  Tensor o_rc = make_tensor(acc_o.data(), acc_to_rowcol(acc_o.layout()));
  float row_lse[kRows];
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    const float sum = quad_allreduce_sum(row_sum[i]);
    // A row with no visible key (or an empty split) writes 0 and LSE -inf.
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    row_lse[i] = sum > 0.0f ? row_max[i] * sc.raw_scale + logf(sum) : -INFINITY;
    CUTE_UNROLL
    for (int d = 0; d < size<1>(o_rc); ++d) o_rc(i, d) *= inv;
  }

  Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});
  Tensor tOcO = thr_mma.partition_C(cO);
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_to_rowcol(tOcO.layout()));
  const bool owns_row_lse = get<1>(tOcO_rc(0, 0)) == 0;  // one thread of each quad writes LSE

  if (p.num_splits > 1) {
    // fp32 partials of this split, straight from registers (2 adjacent columns per store).
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const int r = cs.m0 + get<0>(tOcO_rc(i, 0));
      if (r >= cs.rows) continue;
      const PackedRow pr = tile_row_query(p, cs, r);
      const int64_t row = accum_row(p, split, cs.b, pr.head, pr.query);
      float* o_row = p.o_accum + row * p.head_dim;
      CUTE_UNROLL
      for (int d = 0; d < size<1>(o_rc); d += 2) {
        const int col = get<1>(tOcO_rc(i, d));
        if (col < p.head_dim) {
          *reinterpret_cast<float2*>(o_row + col) = make_float2(o_rc(i, d), o_rc(i, d + 1));
        }
      }
      if (owns_row_lse) p.lse_accum[row] = row_lse[i];
    }
    return;
  }

  if (p.lse != nullptr && owns_row_lse) {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const int r = cs.m0 + get<0>(tOcO_rc(i, 0));
      if (r >= cs.rows) continue;
      const PackedRow pr = tile_row_query(p, cs, r);
      p.lse[lse_offset(p, cs.seq, cs.b, pr.query, pr.head)] = row_lse[i];
    }
  }

  // O: registers -> swizzled smem (Element) -> 16-byte coalesced stores per row.
  Tensor rO = convert_fragment<Element>(acc_o);
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});  // (kBlockM, kHeadDim)
  auto smem_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_copy_o = smem_copy_o.get_thread_slice(tid);
  Tensor taccOrO = smem_thr_copy_o.retile_S(rO);
  Tensor taccOsO = smem_thr_copy_o.partition_D(sO);
  copy(smem_copy_o, taccOrO, taccOsO);
  __syncthreads();

  store_o_rows<Traits>(p, sO, o_off, tid);
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
