// The AVX512-BF16 tile kernels (kernels.h "bf16 tile kernels"): both products with VDPBF16PS,
// which adds to each of a zmm's 16 fp32 lanes the products of one pair of bf16 from each
// operand. The layouts are the AMX set's, whose pairs run along each product's reduction: a
// zmm of k_vnni holds one pair of head-dim columns of 16 keys, a zmm of v_vnni one pair of keys
// of 16 columns, and the other operand's pair (two bf16 of a q row, or of a p row) is
// broadcast to every lane as one dword. Register blocks of kRows rows x kVecs vectors, as the
// fp32 AVX-512 set's P.V blocks. The pack steps and the row-major softmax passes are shared with
// the AMX set (avx512_bf16_tiles.h). Every function carries the target attribute;
// avx512bf16_kernels() hands them out only where CPUID lists the features.
#include "cpu/kernels.h"

#include "cpu/avx512_bf16_tiles.h"
#include "cpu/avx512_decode.h"

#ifdef FLASHATTN_HAVE_AVX512_KERNELS
#include <cstdint>

namespace flashattn {
namespace cpu {
namespace {

using bf16_tiles::kLanes;

// Register blocks: 8 rows x 2 vectors (32 keys of s, or 32 columns of o): 16 zmm accumulators
// fed per pair by 2 vector loads and 8 dword broadcasts (12-row blocks measured 0.95-1.0x); a
// 4-row block for the last rows (decode: the 4 query heads of a KV head), so that tiles pad their
// rows to kRowPad only (padded to 16, decode measured 0.72-0.74x). Against the fp32 AVX-512 set
// on bf16 inputs, 1 thread on a Zen 4 core: prefill 1.78-2.09x (153-180 GFLOP/s), decode
// 2.1-3.0x (D-70).
constexpr int kRows = 8, kTailRows = 4, kVecs = 2;
constexpr int kRowPad = kTailRows;
static_assert(kVecs * kLanes == kBf16Pair, "a block spans one 32-key run of k_vnni (n is a multiple of it)");

// acc += a . b over one pair: each fp32 lane adds the products of its pair of bf16.
FA_AVX512_BF16 inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// The dword (pair of bf16) at `at`, in every lane.
FA_AVX512_BF16 inline __m512i broadcast_pair(const uint16_t* at) {
  return _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(at));
}

// acc[r][v] += sum over pairs t < pairs of a[r][2t, 2t+1] . b_t[16v + l, pair]: kRowsOf rows of a
// (lda elements apart, pairs along them) against the pair vectors of b (b_stride elements from one
// pair to the next). Both products are this block: q against k_vnni, p against v_vnni.
template <int kRowsOf>
FA_AVX512_BF16 inline void dot_pair_block(__m512 (&acc)[kRowsOf][kVecs], const uint16_t* a, int lda, int pairs,
                                          const uint16_t* b, size_t b_stride) {
  for (int t = 0; t < pairs; ++t) {
    __m512i bv[kVecs];
    for (int v = 0; v < kVecs; ++v) bv[v] = _mm512_loadu_si512(b + size_t(t) * b_stride + v * kBf16Pair);
    for (int r = 0; r < kRowsOf; ++r) {
      const __m512i a_pair = broadcast_pair(a + size_t(r) * lda + 2 * t);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = dot_pairs(acc[r][v], a_pair, bv[v]);
    }
  }
}

// ---- scores: s (rows x n) = q (rows x d) . k^T ---------------------------------------------------

// s[r][16v + l] for r < kRowsOf, l < 16, v < kVecs: q rows in place, kb the first pair of the
// block's first key in k_vnni (pairs pair_stride elements apart).
template <int kRowsOf>
FA_AVX512_BF16 inline void scores_block(const uint16_t* q, int d, const uint16_t* kb, int pair_stride, float* s,
                                        int n) {
  __m512 acc[kRowsOf][kVecs];
  for (int r = 0; r < kRowsOf; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_setzero_ps();
  dot_pair_block<kRowsOf>(acc, q, d, d / 2, kb, size_t(pair_stride));
  for (int r = 0; r < kRowsOf; ++r)
    for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(s + size_t(r) * n + v * kLanes, acc[r][v]);
}

// kRowsOf rows over all n keys, one 32-key run of a key tile's block at a time.
template <int kRowsOf>
FA_AVX512_BF16 void scores_rows(const uint16_t* q, int d, const uint16_t* k_vnni, int tile_keys, int n, float* s) {
  for (int j0 = 0; j0 < n; j0 += kBf16Pair) {
    const uint16_t* kb = k_vnni + size_t(j0 / tile_keys) * tile_keys * d + (j0 % tile_keys) * 2;
    scores_block<kRowsOf>(q, d, kb, tile_keys * 2, s + j0, n);
  }
}

FA_AVX512_BF16 void scores(const uint16_t* q, int rows_pad, int d, const uint16_t* k_vnni, int tile_keys, int n,
                           float* s) {
  int r = 0;
  for (; r + kRows <= rows_pad; r += kRows) scores_rows<kRows>(q + size_t(r) * d, d, k_vnni, tile_keys, n, s + size_t(r) * n);
  for (; r < rows_pad; r += kTailRows) {
    scores_rows<kTailRows>(q + size_t(r) * d, d, k_vnni, tile_keys, n, s + size_t(r) * n);
  }
}

// ---- o (rows x d) += p (rows x n) . v ------------------------------------------------------------

// o[r][c0 + 16v + l] for r < kRowsOf: loaded, updated over the n keys, stored; p rows in place,
// vb the first key pair of column c0 in v_vnni.
template <int kRowsOf>
FA_AVX512_BF16 inline void pv_block(const uint16_t* p, int n, const uint16_t* vb, int d, float* o, int ld_o) {
  __m512 acc[kRowsOf][kVecs];
  for (int r = 0; r < kRowsOf; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_loadu_ps(o + size_t(r) * ld_o + v * kLanes);
  dot_pair_block<kRowsOf>(acc, p, n, n / 2, vb, 2 * size_t(d));  // a pair of keys: two v_vnni rows of d
  for (int r = 0; r < kRowsOf; ++r)
    for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(o + size_t(r) * ld_o + v * kLanes, acc[r][v]);
}

template <int kRowsOf>
FA_AVX512_BF16 void pv_rows(const uint16_t* p, int n, const uint16_t* v_vnni, int d, float* o, int ld_o) {
  for (int c0 = 0; c0 < d; c0 += kVecs * kLanes) pv_block<kRowsOf>(p, n, v_vnni + size_t(c0) * 2, d, o + c0, ld_o);
}

FA_AVX512_BF16 void pv(const uint16_t* p, int rows_pad, int n, const uint16_t* v_vnni, int d, float* o, int ld_o) {
  int r = 0;
  for (; r + kRows <= rows_pad; r += kRows) pv_rows<kRows>(p + size_t(r) * n, n, v_vnni, d, o + size_t(r) * ld_o, ld_o);
  for (; r < rows_pad; r += kTailRows) {
    pv_rows<kTailRows>(p + size_t(r) * n, n, v_vnni, d, o + size_t(r) * ld_o, ld_o);
  }
}

void no_tile_state() {}

// ---- decode (D-72): scores with VDPBF16PS on the stored bf16 q and K rows ----------------------

// Scores of H heads (H <= avx512_decode::kHeads): each zmm of a key row is 16 pairs of head-dim
// columns against the same pairs of q; the 16 partial sums fold as in the fp32 scores.
template <int H>
FA_AVX512_BF16 void decode_scores_heads(const uint16_t* q, int d, const void* const* k_rows, int keys, float* s) {
  using avx512_decode::kScoreKeys;
  for (int j0 = 0; j0 < keys; j0 += kScoreKeys) {
    const void* k[kScoreKeys];
    avx512_decode::score_block_rows(k_rows, keys, j0, k);
    __m512 acc[avx512_decode::kHeads][kScoreKeys];
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < kScoreKeys; ++i) acc[h][i] = _mm512_setzero_ps();
    for (int c = 0; c < d; c += kBf16Pair) {
      __m512i kv[kScoreKeys];
      for (int i = 0; i < kScoreKeys; ++i) kv[i] = _mm512_loadu_si512(static_cast<const uint16_t*>(k[i]) + c);
      for (int h = 0; h < H; ++h) {
        const __m512i qv = _mm512_loadu_si512(q + size_t(h) * d + c);
        for (int i = 0; i < kScoreKeys; ++i) acc[h][i] = dot_pairs(acc[h][i], qv, kv[i]);
      }
    }
    avx512_decode::store_score_block<H>(acc, s, j0);
  }
}

template <int H>
struct DecodeScoreGroup {
  FA_AVX512_BF16 static void run(int h0, const uint16_t* q, int d, const void* const* k_rows, int keys, float* s) {
    decode_scores_heads<H>(q + size_t(h0) * d, d, k_rows, keys, s + h0 * kDecodeKeys);
  }
};

FA_AVX512_BF16 void decode_scores(const void* q, int heads, int d, const void* const* k_rows, int keys, float* s) {
  avx512_decode::by_head_groups<DecodeScoreGroup>(heads, static_cast<const uint16_t*>(q), d, k_rows, keys, s);
}

}  // namespace

const Bf16Kernels* avx512bf16_kernels() {
  static const Bf16Kernels kernels{"avx512bf16", kRowPad, no_tile_state, no_tile_state, bf16_tiles::pack_k,
                                   bf16_tiles::pack_v, scores, bf16_tiles::row_max, bf16_tiles::row_exp2_sum, pv};
  static const bool usable = kernel_level_allowed(KernelLevel::avx512bf16) && avx512_kernels() != nullptr &&
                             __builtin_cpu_supports("avx512bf16");
  return usable ? &kernels : nullptr;
}

// Decode (D-72): bf16 K/V with d a multiple of 32; P.V and the softmax passes are the AVX-512
// set's.
const DecodeKernels* avx512bf16_decode_kernels(DType storage, int d) {
  static const DecodeKernels kernels{"avx512bf16", true, decode_scores, avx512_decode::row_max,
                                     avx512_decode::exp2_sum, avx512_decode::pv<DType::bf16>};
  return avx512bf16_kernels() != nullptr && storage == DType::bf16 && d % kBf16Pair == 0 ? &kernels : nullptr;
}

}  // namespace cpu
}  // namespace flashattn

#else  // no AVX-512 kernels in this build

namespace flashattn {
namespace cpu {
const Bf16Kernels* avx512bf16_kernels() { return nullptr; }
const DecodeKernels* avx512bf16_decode_kernels(DType, int) { return nullptr; }
}  // namespace cpu
}  // namespace flashattn

#endif
