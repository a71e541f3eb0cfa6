// Pieces the sweep bodies share: ALiBi slopes, options for the API and for the oracle.
#pragma once

#include <vector>

#include "sweeps.h"

namespace fa_test {

struct AlibiData {
  Alibi kind = Alibi::none;
  int heads = 0;
  std::vector<double> slopes;  // (h) or (b, h), fp32 values
  Buffer buffer;
  const double* of_sequence(int b) const;  // (h) slopes of sequence b, or null
  Tensor tensor(int batch) const;          // undefined when kind == none
};

AlibiData make_alibi(Alibi kind, int batch, int heads, Device device, uint64_t seed);

// The descale factors of an FP8 case, exact in fp32: q, k and v, each one scalar (per_tensor)
// or one per (batch, KV head).
struct Fp8Scales {
  Fp8 kind = Fp8::none;
  int batch = 0, heads_k = 0;
  std::vector<double> q, k, v;  // (1) or (batch * heads_k)
  Buffer q_buffer, k_buffer, v_buffer;

  double at(const std::vector<double>& factors, int b, int hk) const;
  // Rows (rows, heads, d) of sequence b times their factors: head h has KV head
  // h / (heads / heads_k). Identity without FP8.
  std::vector<double> descaled(const std::vector<double>& factors, const double* x, int64_t rows,
                               int heads, int d, int b) const;
  // Sets q_descale (with_q) and k_descale / v_descale on the options.
  void set_options(flashattn::AttentionOptions& o, bool with_q) const;
};
Fp8Scales make_fp8_scales(Fp8 kind, int batch, int heads_k, Device device, uint64_t seed);

// An FP8 output's stated bound, beside the pass rule of its output type: max|impl - f64| <=
// kFp8OutputBound x max|f64| (docs/DECISIONS.md D-64).
constexpr double kFp8OutputBound = 2e-2;
::testing::AssertionResult fp8_output_within_bound(const std::vector<double>& impl,
                                                   const std::vector<double>& ref64);

flashattn::AttentionOptions api_options(const Features& f, const AlibiData& alibi, int batch,
                                        const Tensor& lse);
flashattn_ref::Options ref_options(const Features& f, const AlibiData& alibi, int b);

// Copies a per-sequence oracle result into whole-problem arrays: out rows [row0, row0 + sq) of
// a (rows, h, d) array; lse into a (.., h, lse_row_stride) array at lse_base + head *
// lse_head_stride + i.
void place_out(std::vector<double>& all, const std::vector<double>& seq, int64_t row0, int sq,
               int h, int d);
void place_lse(std::vector<double>& all, const std::vector<double>& seq, int64_t lse_base,
               int64_t lse_head_stride, int sq, int h);

}  // namespace fa_test
