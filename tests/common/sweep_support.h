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
