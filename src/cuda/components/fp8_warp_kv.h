// The decode kernel's fp8 pipeline (DecodePipeline::fp8, docs/DECISIONS.md D-66, D-83): e4m3
// K/V read at half the bytes of a 16-bit cache, two tiles in flight at 3 CTAs per SM, widened
// straight from shared memory into the registers of the MMA operands.
//
// Stages (Fp8WarpKv). e4m3 tiles stream through Traits::kCopyStages stages in shared memory
// (kernel_traits.h Fp8Storage k_mirror/v_mirror), a key's row kHeadDim bytes, row-major, with
// the 16-byte pieces of each 128-byte line swapped by the line's index (stage_offset), so that
// the operand reads below meet no bank conflict at d = 128. Each warp copies with 16-byte
// cp.async only its own keys of every tile (the kKeysPerWarp rows the keys split gives it) and
// reads only those, so the mainloop has no CTA barrier (splitkeys_kernel.h), only the warp's own.
// Lane l's copy i of a K or V tile is the warp's 16-byte piece l + 32 i in row-major order: row
// l / kPiecesPerRow + i * kRowStep of the warp's keys, columns 16 (l % kPiecesPerRow) on (whole
// rows per pass, as kPiecesPerRow divides 32: tuning.h fp8_warp_kv_head_dim).
//
// Operands (Fp8FragmentMath). Lane (g, t) = (lane / 4, lane % 4) of the warp's m16n8k16 MMAs
// (fp16 products, fp32 sums):
// - S = Q K^T. The B operand's column g of an 8-key block holds, per 16-dim step, the dim pairs
//   (2t, 2t+1) and (2t+8, 2t+9) of key g. The dims are summed over, so their order is ours to
//   choose: lane t reads the kHeadDim / 4 bytes [t d/4, (t+1) d/4) of its key's row, one 4-byte
//   word per step, whose low two bytes stand for the pair (2t, 2t+1) and high two for
//   (2t+8, 2t+9). Q's A operand is read from its tile in the same order (load_q).
// - O += P V. The B operand's column g of an 8-dim block holds keys (2t, 2t+1) and (2t+8, 2t+9)
//   of a 16-key step. Lane g reads the kHeadDim / 8 bytes [g d/8, (g+1) d/8) of those four keys'
//   rows and gives byte j of them to dim block j; a byte permute pairs two keys' bytes for one
//   conversion. So the accumulators' column c (column c % 8 of dim block c / 8) holds O's dim
//   (c % 8) d/8 + c / 8, which the warps' merge puts back in place (DecodeTraits::o_column).
// Each e4m3 pair widens into an fp16 pair in one instruction; nothing passes through an fp16
// tile in shared memory.
#pragma once

#include <cfloat>
#include <cstdint>

#include <cuda_fp16.h>

#include <cute/tensor.hpp>

#include "cuda/components/async_copy.h"
#include "cuda/components/fp8_operand_order.h"
#include "cuda/components/kv_pipeline.h"
#include "cuda/components/online_softmax.h"
#include "cuda/components/score_rules.h"
#include "cuda/components/tile_loads.h"

namespace flashattn {
namespace cuda {
namespace fwd {

template <class Traits>
struct Fp8WarpKv : KvStages<Traits> {
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kPiecesPerRow = kHeadDim / 16;
  static constexpr int kRowStep = 32 / kPiecesPerRow;
  static constexpr int kCopies = Traits::kKeysPerWarp / kRowStep;  // per lane, per K or V tile
  static constexpr int kStages = Traits::kCopyStages;
  static_assert(Traits::kFp8Pipeline && Traits::kKvFp8 && !Traits::kWarpsSplitDims, "keys split, e4m3 K/V");
  static_assert(32 % kPiecesPerRow == 0 && Traits::kKeysPerWarp % kRowStep == 0, "whole rows per pass");
  static_assert(Traits::kKvBuffers == 0, "no Element K/V buffer: the operands are read from the stages");
  using Order = Fp8OperandOrder<kHeadDim>;
  using Rows = PageRows<kCopies>;

  int row0;  // this lane's first row within a tile
  int col;   // its pieces' first column

  __device__ __forceinline__ const uint8_t* k_stage(int n) const { return this->k_mirror(stage_of(n)); }
  __device__ __forceinline__ const uint8_t* v_stage(int n) const { return this->v_mirror(stage_of(n)); }

  // Paged K/V: the pages of this lane's rows of tile n.
  __device__ __forceinline__ Rows lookup(const AttnParams& p, const CtaInfo& c, const CtaKeyTiles& tiles, int n,
                                         int /*tid*/) const {
    if (n >= tiles.lo && reads_page_table<Traits>(p)) {
      return lookup_page_rows<kCopies, kRowStep>(p, c, n * Traits::kBlockN + row0, true);
    }
    return Rows{};
  }

  // This lane's K and V copies of tile n into its stage: always one commit group (empty for n
  // before the first tile).
  __device__ __forceinline__ void issue(const AttnParams& p, const CtaInfo& c, const CtaKeyTiles& tiles, int n,
                                        int /*tid*/, const Rows& rows) const {
    if (n >= tiles.lo) {
      copy_tile<false>(p, c, n, rows, this->k_mirror(stage_of(n)));
      copy_tile<true>(p, c, n, rows, this->v_mirror(stage_of(n)));
    }
    cp_async_commit();
  }

  // Tile n's copies landed, this lane's (its cp_async_wait) and, past this warp barrier, every
  // lane's: the warp reads all of its keys' rows. The barrier also orders the warp's reads of
  // tile n+1's stage before the copies the caller issues into it next.
  __device__ __forceinline__ void widen(int /*n*/, int /*tid*/) const { __syncwarp(); }

 private:
  __device__ __forceinline__ static int stage_of(int n) { return int(unsigned(n) % kStages); }  // n >= 0

  // K (kIsV false) or V: rows past the keys and columns >= head_dim zero-filled.
  template <bool kIsV>
  __device__ __forceinline__ void copy_tile(const AttnParams& p, const CtaInfo& c, int n, const Rows& rows,
                                            uint8_t* mirror) const {
    const uint8_t* base = static_cast<const uint8_t*>(kIsV ? p.v : p.k);
    const int64_t row_stride = kIsV ? p.v_row_stride : p.k_row_stride;
    const int bytes = max(0, min(16, p.head_dim - col));  // head_dim: a multiple of 8
    // Copy i lies i * 512 bytes (4 lines) past copy 0, so its pieces' swap (Order::stage_offset)
    // differs from copy 0's in bit 6 when i is odd: two offsets, not one per copy.
    static_assert(kRowStep * kHeadDim == 512, "32 pieces per pass");
    const uint32_t first = static_cast<uint32_t>(__cvta_generic_to_shared(mirror)) + Order::stage_offset(row0, col);
    auto dst = [&](int i) { return (i % 2 ? first ^ 64u : first) + uint32_t(i * 512); };
    if (!reads_page_table<Traits>(p)) {
      const int j0 = n * Traits::kBlockN + row0;  // this lane's first key
      const uint8_t* src = base + kv_row_offset(p, c.seq, c.b, j0, kIsV ? p.v_batch_stride : p.k_batch_stride,
                                                row_stride, kIsV ? p.v_head_stride : p.k_head_stride, c.hk) +
                           col;
      if (bytes == 16 && (n + 1) * Traits::kBlockN <= c.seq.seqlen_k) {  // every tile but the last: no zero fill
        CUTE_UNROLL
        for (int i = 0; i < kCopies; ++i) cp_async_16_bytes(dst(i), src + i * kRowStep * row_stride, 16);
      } else {
        CUTE_UNROLL
        for (int i = 0; i < kCopies; ++i) {
          const bool valid = j0 + i * kRowStep < c.seq.seqlen_k;
          cp_async_16_bytes(dst(i), valid ? src + i * kRowStep * row_stride : base, valid ? bytes : 0);
        }
      }
    } else {
      const int64_t page_stride = kIsV ? p.v_batch_stride : p.k_batch_stride;
      const uint8_t* head = base + c.hk * (kIsV ? p.v_head_stride : p.k_head_stride) + col;
      const unsigned usable = usable_page_rows(p, c, rows, /*record=*/!kIsV);
      CUTE_UNROLL
      for (int i = 0; i < kCopies; ++i) {
        const bool valid = usable >> i & 1u;
        const uint8_t* src = head + rows.page[i] * page_stride + rows.in_page[i] * row_stride;
        cp_async_16_bytes(dst(i), valid ? src : base, valid ? bytes : 0);
      }
    }
  }
};

// kWords (1, 2 or 4) little-endian words of row `row` of a stage from byte `byte` on, within
// one 16-byte piece.
template <class Order, int kWords>
__device__ __forceinline__ void read_stage_words(const uint8_t* stage, int row, int byte, uint32_t (&words)[kWords]) {
  const uint8_t* at = stage + Order::stage_offset(row, byte);
  if constexpr (kWords == 4) {
    const uint4 w = *reinterpret_cast<const uint4*>(at);
    words[0] = w.x, words[1] = w.y, words[2] = w.z, words[3] = w.w;
  } else if constexpr (kWords == 2) {
    const uint2 w = *reinterpret_cast<const uint2*>(at);
    words[0] = w.x, words[1] = w.y;
  } else {
    static_assert(kWords == 1, "1, 2 or 4 words: one piece at most");
    words[0] = *reinterpret_cast<const uint32_t*>(at);
  }
}

// One m16n8k16 MMA into the four accumulators of an 8-column block (fp16 operands, fp32 sums).
template <class Acc>
__device__ __forceinline__ void mma_into_block(Acc&& c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  cute::SM80_16x8x16_F32F16F16F32_TN::fma(c(0), c(1), c(2), c(3), a[0], a[1], a[2], a[3], b0, b1, c(0), c(1),
                                          c(2), c(3));
}

// One warp's share of a decode tile on the fp8 pipeline, for splitkeys_kernel: Q's A operand
// (16 x d, in registers once loaded), O and the rows' online-softmax state; per tile (step):
// S = Q K_w^T, the score rules, the softmax step, O_w += P V_w, the K and V operands widened from
// the warp's rows of the e4m3 stages (the operand orders at the top of this file). The interface
// of warp_tile_math.h's WarpTileMath. A local type: its members' types are those of the
// fragments made here.
template <class Traits, class SmemQ>
__device__ __forceinline__ auto make_fp8_fragment_math(const Fp8WarpKv<Traits>& kv, const SmemQ& sQ, int warp,
                                                       int lane) {
  using Kv = Fp8WarpKv<Traits>;
  using Order = typename Kv::Order;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kKeys = Traits::kKeysPerWarp;
  static_assert(std::is_same_v<typename Traits::Element, cutlass::half_t>, "fp16 products");
  static_assert(kBlockM == 16 && kHeadDim % 32 == 0 && kKeys % 16 == 0, "whole MMA steps, whole words per lane");
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(lane);
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kKeys>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_to_rowcol(tScS.layout()));  // (rows, cols)
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;
  using AccO = decltype(partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  static_assert(decltype(size<0>(AccO{}))::value == 4 && decltype(size<2>(AccO{}))::value == kHeadDim / 8,
                "four accumulators per 8-dim block");

  constexpr int kDimSteps = kHeadDim / 16;  // MMA steps of S = Q K^T
  constexpr int kKeyBlocks = kKeys / 8;     // 8-key column blocks of S
  constexpr int kKeySteps = kKeys / 16;     // MMA steps of P V
  constexpr int kDimBlocks = kHeadDim / 8;  // 8-dim column blocks of O
  constexpr int kKBytes = Order::kKBytes;   // a lane's bytes of a K row
  constexpr int kVBytes = Order::kVBytes;   // of a V row
  constexpr int kKWordsPerRead = kKBytes < 16 ? kKBytes / 4 : 4;
  constexpr int kVWordsPerRead = kVBytes < 16 ? kVBytes / 4 : 4;

  struct Fp8FragmentMath {
    decltype(tiled_mma) mma;
    AccO acc_o;
    decltype(tScS_rc) tScS_rc;
    const Kv& kv;
    const SmemQ& sQ;
    int warp, g, t;
    uint32_t q[kDimSteps][4];  // Q's A operand per dim step
    SoftmaxRowState rows[kRows];

    // A new run of tiles: O = 0, no row seen.
    __device__ __forceinline__ void start() {
      clear(acc_o);
      start_softmax_rows(rows);
    }
    // Q (landed in shared memory; q_elems: 0, one Q buffer) into registers, in K's dim order.
    __device__ __forceinline__ void load_q(int q_elems) {
      (void)q_elems;
      CUTE_UNROLL
      for (int s = 0; s < kDimSteps; ++s) {
        // Word by word, in the A operand's register order (two 8-byte reads would place top.x
        // and top.y side by side, and every MMA would need them moved).
        const int col = Order::k_byte(t, s);
        q[s][0] = *reinterpret_cast<const uint32_t*>(&sQ(g, col));
        q[s][1] = *reinterpret_cast<const uint32_t*>(&sQ(g + 8, col));
        q[s][2] = *reinterpret_cast<const uint32_t*>(&sQ(g, col + 2));
        q[s][3] = *reinterpret_cast<const uint32_t*>(&sQ(g + 8, col + 2));
      }
    }
    // Key tile n (of the walk tiles), in the stages of tile n.
    __device__ __forceinline__ void step(const AttnParams& p, const CtaInfo& c, const CtaKeyTiles& tiles,
                                         const ScoreScale& sc, int n, int /*stage*/) {
      const int warp_row = warp * kKeys;  // this warp's first row of a stage
      Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kKeys>>{});
      static_assert(decltype(size<0>(acc_s))::value == 4 && decltype(size<2>(acc_s))::value == kKeyBlocks,
                    "four accumulators per 8-key block");
      clear(acc_s);
      const uint8_t* k_stage = kv.k_stage(n);
      CUTE_UNROLL
      for (int j = 0; j < kKeyBlocks; ++j) {
        CUTE_UNROLL
        for (int s0 = 0; s0 < kDimSteps; s0 += kKWordsPerRead) {  // a 16-byte piece (or less) at a time
          uint32_t words[kKWordsPerRead];
          read_stage_words<Order>(k_stage, warp_row + 8 * j + g, Order::k_byte(t, s0), words);
          CUTE_UNROLL
          for (int s = s0; s < s0 + kKWordsPerRead; ++s) {
            const uint32_t word = words[s - s0];
            mma_into_block(acc_s(_, 0, j), q[s], e4m3_pair_to_half2(word, 0), e4m3_pair_to_half2(word, 1));
          }
        }
      }

      Tensor s = make_tensor(acc_s.data(), acc_to_rowcol(acc_s.layout()));  // (kRows, keys)
      const int key0 = n * Traits::kBlockN + warp_row;
      const bool need_mask = !(key0 >= tiles.mask_free_lo && key0 + kKeys <= tiles.mask_free_hi);
      // One warp-uniform test for all three rules: none of them, none of their per-score tests.
      if (need_mask || sc.has_softcap || p.alibi_slopes != nullptr) {
        apply_score_rules(p, c, sc, s, tScS_rc, key0, need_mask);
      }
      Tensor o_rc = make_tensor(acc_o.data(), acc_to_rowcol(acc_o.layout()));  // (kRows, dims)
      online_softmax_step</*kSkipUnitRescale=*/true>(s, o_rc, rows, sc.scale_log2);

      const uint8_t* v_stage = kv.v_stage(n);
      CUTE_UNROLL
      for (int ks = 0; ks < kKeySteps; ++ks) {
        // P's A operand: keys (2t, 2t+1) and (2t+8, 2t+9) of the step, rows g and g+8.
        auto lo = acc_s(_, 0, 2 * ks);
        auto hi = acc_s(_, 0, 2 * ks + 1);
        const uint32_t a[4] = {half2_bits(lo(0), lo(1)), half2_bits(lo(2), lo(3)), half2_bits(hi(0), hi(1)),
                               half2_bits(hi(2), hi(3))};
        CUTE_UNROLL
        for (int j0 = 0; j0 < kDimBlocks; j0 += 4 * kVWordsPerRead) {  // a 16-byte piece (or less) of each row at a time
          uint32_t v[4][kVWordsPerRead];  // the rows of keys 2t, 2t+1, 2t+8, 2t+9
          CUTE_UNROLL
          for (int r = 0; r < 4; ++r) {
            const int row = warp_row + 16 * ks + 2 * t + (r % 2) + 8 * (r / 2);
            read_stage_words<Order>(v_stage, row, Order::v_byte(g, j0), v[r]);
          }
          CUTE_UNROLL
          for (int j = j0; j < j0 + 4 * kVWordsPerRead; ++j) {
            // byte j % 4 of word (j - j0) / 4 of each row; a permute pairs the two keys' bytes
            const int w = (j - j0) / 4;
            const uint32_t selector = j % 4 < 2 ? 0x5140u : 0x7362u;
            const uint32_t first = __byte_perm(v[0][w], v[1][w], selector);
            const uint32_t second = __byte_perm(v[2][w], v[3][w], selector);
            mma_into_block(acc_o(_, 0, j), a, e4m3_pair_to_half2(first, j % 2), e4m3_pair_to_half2(second, j % 2));
          }
        }
      }
    }

    __device__ __forceinline__ static uint32_t half2_bits(float lo, float hi) {
      const __half2 h = __floats2half2_rn(lo, hi);
      return reinterpret_cast<const uint32_t&>(h);
    }
  };
  return Fp8FragmentMath{tiled_mma, partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{}),
                         tScS_rc, kv, sQ, warp, lane / 4, lane % 4, {}, {}};
}

// bf16 q over the fp8 pipeline's fp16 tiles (Traits::kQRescaled): an e4m3 value widens into
// fp16 in one instruction, into bf16 in four, and the widening was a third of the kernel's
// instructions (D-66). Q's bf16 rows landed in their fp16 tile as bits (tile_loads.h
// copy_chunk); each thread converts its own chunks in place, times 2^s: the power of two that
// takes the tile's largest finite |q| into [2^13, 2^14), so every value down to 2^-27 of it is
// exact in fp16 (11 significant bits hold bf16's 8) and none overflows; NaN stays NaN. Returns
// 2^s, for the scores' scale to divide out (ScoreScale::scale_q). max_bits: a shared word that
// was 0 before the CTA's last barrier. One barrier (the caller's next publishes the tile).
template <class Traits, class SmemTensor>
__device__ __forceinline__ float rescale_q_into_fp16(SmemTensor& sQ, int* max_bits, int tid) {
  auto part = copy_partition<Traits, Traits::kBlockM>(sQ, tid);
  auto& tXsX = get<0>(part);  // (CPY, CPY_M, CPY_K)
  const bool copies = tid < Traits::kGmemThreads;
  auto chunk_words = [&](int m, int k) { return reinterpret_cast<uint32_t*>(&tXsX(0, m, k)); };
  auto bf16_value = [](uint32_t word, int half) { return __uint_as_float(half ? word & 0xffff0000u : word << 16); };
  if (copies) {
    float local_max = 0.0f;
    CUTE_UNROLL
    for (int m = 0; m < size<1>(tXsX); ++m) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tXsX); ++k) {
        CUTE_UNROLL
        for (int e = 0; e < 8; ++e) {
          const float x = fabsf(bf16_value(chunk_words(m, k)[e / 2], e % 2));
          if (x <= FLT_MAX) local_max = fmaxf(local_max, x);  // finite only
        }
      }
    }
    atomicMax(max_bits, __float_as_int(local_max));  // non-negative floats order as their bits
  }
  __syncthreads();
  const float q_max = __int_as_float(*max_bits);
  const int shift = q_max > 0.0f ? max(-120, min(120, 13 - ilogbf(q_max))) : 0;
  const float factor = __int_as_float((127 + shift) << 23);  // 2^shift
  if (copies) {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(tXsX); ++m) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tXsX); ++k) {
        uint32_t* words = chunk_words(m, k);
        CUTE_UNROLL
        for (int w = 0; w < 4; ++w) {
          const uint32_t word = words[w];
          const __half2 h = __floats2half2_rn(bf16_value(word, 0) * factor, bf16_value(word, 1) * factor);
          words[w] = reinterpret_cast<const uint32_t&>(h);
        }
      }
    }
  }
  return factor;
}

// The decode kernel's K/V stages: the fp8 pipeline's (above), or the copies into every stage
// (kv_pipeline.h). Paged K/V is read without an offset table (PagedRows).
template <class Traits>
__device__ __forceinline__ auto make_decode_kv(typename Traits::Element* k, typename Traits::Element* v,
                                               char* smem, int warp, int lane) {
  if constexpr (Traits::kFp8Pipeline) {
    constexpr int kPiecesPerRow = Fp8WarpKv<Traits>::kPiecesPerRow;
    return Fp8WarpKv<Traits>{{k, v, nullptr, smem},
                             warp * Traits::kKeysPerWarp + lane / kPiecesPerRow,
                             16 * (lane % kPiecesPerRow)};
  } else {
    (void)warp, (void)lane;
    return KvStages<Traits>{k, v, nullptr, smem};
  }
}

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
