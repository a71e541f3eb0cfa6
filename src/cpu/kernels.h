// The CPU backend's tile micro-kernels: the two products and the row passes of the online
// softmax on fp32 tiles that stay in L1/L2. One portable (scalar, compiler-vectorised) set and
// one AVX-512 set (kernels_avx512.cpp), chosen once at run time by what the CPU has
// (docs/DECISIONS-cpu.md D-CPU-1, D-CPU-2).
//
// Layouts (fp32, row-major, leading dimensions in elements):
//   qt  (d, ld_qt)         the query tile transposed: qt[c][r] = q_r[c]; rows padded to kRowLanes
//   k   (keys, ld_k)       the key tile, one key per row
//   v   (keys, ld_v)       the value tile, one key per row; columns padded to kRowLanes with zeros
//   st  (keys, ld_st)      scores transposed: st[j][r] = q_r . k_j, then probabilities
//   o   (rows, ld_o)       the unnormalised output accumulator
// Scores are kept transposed so that every row pass of the softmax runs across query rows,
// kRowLanes rows per vector, and neither K nor V is ever transposed (D-CPU-3).
#pragma once

namespace flashattn {
namespace cpu {

// Query rows per vector of the row passes; tiles pad their row count to a multiple of it.
constexpr int kRowLanes = 16;

struct TileKernels {
  const char* name;

  // st[j][r] = sum_c k[j][c] * qt[c][r] for j < keys, r < rows_pad (a multiple of kRowLanes).
  void (*scores)(const float* qt, int ld_qt, const float* k, int ld_k, int d, int rows_pad,
                 int keys, float* st, int ld_st);

  // tile_max[r] = max_j st[j][r], NaN ignored (-inf where every score is -inf or NaN).
  void (*tile_max)(const float* st, int ld_st, int rows_pad, int keys, float* tile_max);

  // st[j][r] = exp2(st[j][r] * scale_log2 - offset[r]) in place; tile_sum[r] = sum_j of them.
  void (*exp2_sum)(float* st, int ld_st, int rows_pad, int keys, float scale_log2,
                   const float* offset, float* tile_sum);

  // o[r][c] *= factor[r] for r < rows, c < d_pad.
  void (*scale_rows)(float* o, int ld_o, int rows, int d_pad, const float* factor);

  // o[r][c] += sum_j st[j][r] * v[j][c] for r < rows, c < d_pad (a multiple of kRowLanes).
  void (*pv)(const float* st, int ld_st, const float* v, int ld_v, int rows, int keys, int d_pad,
             float* o, int ld_o);
};

// The portable set: plain loops, vectorised by the compiler for the build's target.
const TileKernels& portable_kernels();

// The AVX-512 set, or nullptr where it is not compiled in (not x86-64, or a compiler without
// the target attribute) or the CPU lacks AVX-512F.
const TileKernels* avx512_kernels();

// The set this process uses: the fastest the CPU runs, unless FLASHATTN_CPU_KERNELS=portable
// is set in the environment (read once; the tests use it to check the portable set).
const TileKernels& tile_kernels();

}  // namespace cpu
}  // namespace flashattn
