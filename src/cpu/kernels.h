// The CPU backend's tile micro-kernels: the two products and the row passes of the online
// softmax on fp32 tiles that stay in L1/L2. One portable (scalar, compiler-vectorised) set, one
// NEON set for aarch64 (kernels_neon.cpp), one AVX2 set (kernels_avx2.cpp) and one AVX-512 set
// (kernels_avx512.cpp), chosen once at run time by what the CPU has (docs/DECISIONS.md D-50,
// D-51, D-63, D-86); for bf16 on x86-64, the bf16 tile kernels at the end of this file (AMX or
// AVX512-BF16) take the two products where the CPU has either.
//
// Layouts (fp32, row-major, leading dimensions in elements):
//   qt  (d, ld_qt)         the query tile transposed: qt[c][r] = q_r[c]; rows padded to the set's
//                          row_lanes
//   k   (keys, ld_k)       the key tile in blocks of the set's k_block keys, each block column by
//                          column: key j, column c at k[(j / k_block) * k_block * ld_k +
//                          c * k_block + j % k_block] (k_block 1: one key per row of ld_k), so
//                          that a register block's key broadcasts read one stream (D-76)
//   v   (keys, ...)        the value tile in strips of the set's v_cols columns, each strip key by
//                          key: key j, column c at v[(c / v_cols) * ld_v + j * v_cols +
//                          c % v_cols], ld_v the distance between strips (v_cols 0: one key per
//                          row of ld_v); columns padded to kRowLanes with zeros
//   st  (keys, ld_st)      scores transposed: st[j][r] = q_r . k_j, then probabilities
//   o   (rows, ld_o)       the unnormalised output accumulator
// Scores are kept transposed so that every row pass of the softmax runs across query rows,
// kRowLanes rows per vector, and neither K nor V is ever transposed (D-52); the K and V tiles are
// laid out by the walk (attention.cpp), once per call where it packs them (D-58).
#pragma once

#include <cstdint>

#include "flashattn/flashattn.h"

namespace flashattn {
namespace cpu {

// Most query rows per vector of the row passes (AVX-512: 16); a set's row_lanes divides it.
// Tiles pad their columns (d_pad) to a multiple of it, and their rows to the set's row_lanes.
constexpr int kRowLanes = 16;
// Most keys per block of a set's K layout (AVX-512: 8, AVX2: 6); a set's k_block is at most it.
constexpr int kMaxKeyBlock = 8;

struct TileKernels {
  const char* name;
  // rows_pad below is a multiple of it: fp32 lanes of the set's vectors (AVX2: 8), so that a
  // short tile (decode: the 4 query heads of a KV head) computes no more padding rows than the
  // vectors need.
  int row_lanes;
  // Keys per block of the K layout (1: rows) and columns per strip of the V layout (0: rows).
  int k_block;
  int v_cols;

  // st[j][r] = sum_c k[j][c] * qt[c][r] for j < keys, r < rows_pad (a multiple of row_lanes); the
  // set may also write the rows j up to keys rounded up to k_block (k holds that many keys).
  void (*scores)(const float* qt, int ld_qt, const float* k, int ld_k, int d, int rows_pad,
                 int keys, float* st, int ld_st);

  // tile_max[r] = max_j st[j][r], NaN ignored (-inf where every score is -inf or NaN).
  void (*tile_max)(const float* st, int ld_st, int rows_pad, int keys, float* tile_max);

  // st[j][r] = exp2(st[j][r] * scale_log2 - offset[r]) in place; tile_sum[r] = sum_j of them.
  void (*exp2_sum)(float* st, int ld_st, int rows_pad, int keys, float scale_log2,
                   const float* offset, float* tile_sum);

  // o[r][c] *= factor[r] for r < rows, c < d_pad.
  void (*scale_rows)(float* o, int ld_o, int rows, int d_pad, const float* factor);

  // o[r][c] = o[r][c] * factor[r] + sum_j st[j][r] * v[j][c] for r < rows, c < d_pad (a
  // multiple of kRowLanes); factor nullptr: no rescale. The rescale rides on the accumulator
  // loads of the product (bit for bit scale_rows then the product) instead of a pass of its own
  // over o (D-76).
  void (*pv)(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys, int d_pad,
             const float* factor, float* o, int ld_o);

  // dst[c] = bf16 of src[c] * scale for c < n, rounded as half.h float_to_bf16_bits (bit for bit).
  void (*scaled_to_bf16)(const float* src, int n, float scale, uint16_t* dst);

  // dst[c][r] = src[r][c] for r < rows, c < cols (the query tile into qt, D-68).
  void (*transpose)(const float* src, int ld_src, int rows, int cols, float* dst, int ld_dst);
};

// The kernel sets from the most portable to the fastest. A CPU has the NEON set (aarch64) or
// the x86-64 ones, never both, so NEON's place among the x86-64 levels only decides what a cap
// does on the other architecture: a cap at avx2 or above leaves aarch64 on NEON, and cpu=neon
// leaves x86-64 on the portable set.
// FLASHATTN_KERNEL=automatic,cpu=portable|neon|avx2|avx512|avx512bf16|amx in the environment caps
// the level used (read once; the tests use it to check each set).
enum class KernelLevel { portable, neon, avx2, avx512, avx512bf16, amx };
bool kernel_level_allowed(KernelLevel level);

// The portable set: plain loops, vectorised by the compiler for the build's target.
const TileKernels& portable_kernels();

// The AVX2 set (8-lane fp32 vectors with FMA), or nullptr where it is not compiled in (not
// x86-64, or a compiler without the target attribute) or the CPU lacks AVX2 or FMA.
const TileKernels* avx2_kernels();

// The AVX-512 set, or nullptr where it is not compiled in (not x86-64, or a compiler without
// the target attribute) or the CPU lacks AVX-512 F/DQ/VL/BW.
const TileKernels* avx512_kernels();

// The NEON set (4-lane fp32 vectors with FMA; kernels_neon.cpp), or nullptr where it is not
// compiled in (not little-endian aarch64). Every aarch64 CPU has NEON (Advanced SIMD).
const TileKernels* neon_kernels();

// The set this process uses: the fastest the CPU runs within kernel_level_allowed.
const TileKernels& tile_kernels();

// ---- bf16 tile kernels: AMX or AVX512-BF16 -------------------------------------------------------
//
// bf16 inputs take both products with bf16 operands and fp32 accumulators, as the GPU's tensor
// cores do, on the AMX tile unit where the CPU has it, else with AVX512-BF16's VDPBF16PS (a
// zmm of 16 fp32 lanes, each adding the products of a pair of bf16). P is rounded to bf16 before
// P.V in both sets, as on the GPU, while the row sums use fp32 P. Both products reduce over
// pairs of bf16 (the head dim for scores, the keys for P.V), so both sets take the same
// layouts: scores are row-major, K is transposed in pairs (k_vnni) and V interleaved in key
// pairs (v_vnni) by the pack steps, per tile, and Q and P go in as stored (D-53, D-70).
// Layouts (bf16 as uint16_t):
//   q       (rows_pad, d)        query rows; rows_pad a multiple of the set's row_pad, zero past
//                                the last
//   k, v    n rows of d          the key and value tiles, one pointer per key (rows read in
//                                place: contiguous or paged); n a multiple of kBf16Pair
//   k_vnni  (d / 2, n, 2)        k_vnni[c/2][j][c%2] = k[j][c], one block per key tile of
//                                tile_keys keys (the scores of a step span several blocks)
//   v_vnni  (n / 2, d, 2)        v_vnni[j/2][c][j%2] = v[j][c]; consecutive key tiles' blocks
//                                form one block of their keys
//   s       (rows_pad, n) fp32   scores
//   p       (rows_pad, n)        probabilities, 0 past the tile's keys and in the padding rows
// d is a multiple of kBf16Pair.
constexpr int kBf16Pair = 32;  // bf16 per 64-byte row: of a tile register, of a zmm
constexpr int kAmxRows = 16;   // rows of a tile register

struct Bf16Kernels {
  const char* name;
  // rows_pad below is a multiple of it (AMX: a tile register's rows).
  int row_pad;
  // Loads the tile configuration of the calling thread / releases its tile state (AMX; no-ops
  // for AVX512-BF16).
  void (*begin)();
  void (*end)();
  void (*pack_k)(const uint16_t* const* k_rows, int n, int d, uint16_t* k_vnni);
  void (*pack_v)(const uint16_t* const* v_rows, int n, int d, uint16_t* v_vnni);
  // s (rows_pad, n) = q . k^T, k_vnni a run of blocks of tile_keys keys (n <= their keys)
  void (*scores)(const uint16_t* q, int rows_pad, int d, const uint16_t* k_vnni, int tile_keys, int n,
                 float* s);
  // tile_max[r] = max_{j < keys} s[r][j], NaN ignored.
  void (*row_max)(const float* s, int n, int rows, int keys, float* tile_max);
  // p[r][j] = bf16(exp2(s[r][j] * scale_log2 - offset[r])) for r < rows, j < keys (0 past keys
  // and in rows [rows, rows_pad)); tile_sum[r] = the sum of the fp32 values.
  void (*row_exp2_sum)(const float* s, int n, int rows, int rows_pad, int keys, float scale_log2,
                       const float* offset, float* tile_sum, uint16_t* p);
  // o (rows_pad, ld_o) fp32 += p . v
  void (*pv)(const uint16_t* p, int rows_pad, int n, const uint16_t* v_vnni, int d, float* o, int ld_o);
};

// The AMX set, or nullptr where the build, the CPU or the OS lacks it or its level is not
// allowed.
const Bf16Kernels* amx_kernels();

// The AVX512-BF16 set, or nullptr where the build or the CPU lacks it (AVX-512 F/DQ/VL/BW and
// AVX512-BF16) or its level is not allowed.
const Bf16Kernels* avx512bf16_kernels();

// Whether the AVX512-BF16 products outrun the fp32 tiles on this CPU (docs/DECISIONS.md D-88):
// on AMD (Zen 4: 1.8-2.1x, D-70), not on Intel without AMX (0.55-0.8x): an AMD CPU.
bool avx512bf16_products_pay();

// The bf16 set this process uses: AMX, else AVX512-BF16 where its products pay
// (avx512bf16_products_pay) or the kernel cap is exactly avx512bf16 (FLASHATTN_KERNEL=...,
// cpu=avx512bf16: the tests run the set on any CPU that has it), else nullptr (bf16 then takes
// the fp32 tiles of tile_kernels()).
const Bf16Kernels* bf16_kernels();

// ---- decode kernels: one query row against K/V rows read in place (D-72) -----------------------
//
// Decode (one query row per sequence) reads every K and V row once, so it is bound by memory, not
// by the products: the decode walk (attention.cpp) reads each key's rows where they are stored
// (contiguous or paged, bf16 / fp16 / fp32), once for all the query heads that share the KV head
// (GQA), with no conversion into tiles. It takes keys in blocks of kDecodeKeys; per block and KV
// head the set computes the scores of the group's heads, their row max and probabilities, and
// adds P.V into the heads' fp32 output rows. Layouts (fp32 unless stated):
//   q       (heads, d)              the group's query rows: fp32, or bf16 bits as stored where
//                                   the set's bf16_query is true (VDPBF16PS)
//   k_rows  (keys) pointers         a key's row of d elements in the set's storage type
//   s       (heads, kDecodeKeys)    scores, then probabilities (0 past the block's keys)
//   o       (heads, d)              the heads' unnormalised output rows
constexpr int kDecodeKeys = 16;

struct DecodeKernels {
  const char* name;
  bool bf16_query;  // q is given as bf16 bits (the stored bf16 query), not fp32
  // s[h][j] = q_h . k_j for h < heads, j < keys (keys <= kDecodeKeys).
  void (*scores)(const void* q, int heads, int d, const void* const* k_rows, int keys, float* s);
  // out[h] = max_{j < keys} s[h][j], NaN ignored (-inf where every score is -inf or NaN).
  void (*row_max)(const float* s, int heads, int keys, float* out);
  // s[h][j] = exp2(s[h][j] * scale_log2 - offset[h]) for j < keys, 0 for keys <= j < kDecodeKeys;
  // sum[h] = the sum of them.
  void (*exp2_sum)(float* s, int heads, int keys, float scale_log2, const float* offset, float* sum);
  // o[h][c] = o[h][c] * factor[h] + sum_{j < keys} s[h][j] * v_j[c] for c < d.
  void (*pv)(const float* s, int heads, const void* const* v_rows, int keys, int d, const float* factor,
             float* o);
};

// The decode kernels of each set for K/V stored as `storage` (f32, f16, bf16, or e4m3 read as their
// e4m3 values: the caller applies the descales, D-87) and head dim d,
// or nullptr where the set does not serve them (not compiled in, the CPU lacks it, or d is not
// a multiple of its vector). The portable set serves every d.
const DecodeKernels* portable_decode_kernels(DType storage);
const DecodeKernels* neon_decode_kernels(DType storage, int d);
const DecodeKernels* avx2_decode_kernels(DType storage, int d);
const DecodeKernels* avx512_decode_kernels(DType storage, int d);
// AVX-512 with VDPBF16PS scores (bf16 storage only).
const DecodeKernels* avx512bf16_decode_kernels(DType storage, int d);

// The set this process uses for decode: the fastest one serving (storage, d) within
// kernel_level_allowed (AVX512-BF16 counts at its own level; AMX has no decode set of its own).
const DecodeKernels& decode_kernels(DType storage, int d);

}  // namespace cpu
}  // namespace flashattn
