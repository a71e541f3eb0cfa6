// The online-softmax state of one query row, the one definition that every kernel, the split
// merges (inside a CTA, inside a cluster, the combine kernel) and the CPU backend use.
//
// A row's logits are kept in the caller's score units x (the raw q·k, or tanh(...) with a
// softcap); scale_log2 turns them into base-2 exponents: exp(logit - max) == exp2((x - max) *
// scale_log2). The state holds the running max of x and the sum of exp2((x - max) *
// scale_log2) over the keys seen so far. A row that has seen no key has max -inf and sum 0; it
// finishes as output 0 and LSE -inf (README "Semantics").
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define FA_SOFTMAX_HD __host__ __device__ __forceinline__
#define FA_SOFTMAX_UNROLL _Pragma("unroll")
#else
#define FA_SOFTMAX_HD inline
#define FA_SOFTMAX_UNROLL
#endif

namespace flashattn {

// What a finished row writes: O is multiplied by out_scale (1 / sum, or 0 for a row with no
// key), and lse is the natural log of the row's sum of exp(logit).
struct SoftmaxResult {
  float out_scale;
  float lse;
};

struct SoftmaxRowState {
  float max;  // running max of the row's scores (-inf: no key seen)
  float sum;  // sum of exp2((x - max) * scale_log2) over the keys seen

  FA_SOFTMAX_HD static SoftmaxRowState empty() { return SoftmaxRowState{-INFINITY, 0.0f}; }

  // The base-2 exponent offset of a max: exp2(x * scale_log2 - offset) is a probability. A row
  // that has seen no key uses 0, so that -inf - -inf never occurs.
  FA_SOFTMAX_HD static float exp2_offset(float max, float scale_log2) {
    return max == -INFINITY ? 0.0f : max * scale_log2;
  }
  FA_SOFTMAX_HD float exp2_offset(float scale_log2) const { return exp2_offset(max, scale_log2); }

  // One online step: new_max (>= max, the max over this state and the new scores) becomes the
  // row's max. Returns the factor that the row's O accumulator must be multiplied by; the sum
  // is rescaled here, and the caller then adds the new probabilities to it.
  FA_SOFTMAX_HD float raise_max(float new_max, float scale_log2) {
    const float correction = exp2f(max * scale_log2 - exp2_offset(new_max, scale_log2));
    max = new_max;
    sum *= correction;
    return correction;
  }

  // The row's result once every key has been seen: raw_scale turns score units into logits
  // (lse = max * raw_scale + log(sum)). A NaN score makes the sum NaN, and the row's output
  // and LSE NaN (not the 0 and -inf of a row without keys).
  FA_SOFTMAX_HD SoftmaxResult finish(float raw_scale) const {
    if (sum > 0.0f) return SoftmaxResult{1.0f / sum, max * raw_scale + logf(sum)};
    if (sum == 0.0f) return SoftmaxResult{0.0f, -INFINITY};
    return SoftmaxResult{NAN, NAN};
  }

  // The weight of this partial state's O (already normalised by its own sum, or not) in the
  // merged state `merged`: exp2((max - merged.max) * scale_log2), 0 for an empty part.
  FA_SOFTMAX_HD float weight_in(const SoftmaxRowState& merged, float scale_log2) const {
    if (max == -INFINITY || merged.sum <= 0.0f) return 0.0f;
    return exp2f((max - merged.max) * scale_log2);
  }
};

// The merge of kParts states of one row (warps of a CTA, splits of a unit): the max over the
// parts, then the sum of each part's sum rescaled to it; parts with no key add nothing.
// part(i) returns part i's state. A part's O then enters with weight_in(merged) (and the
// merged O is divided by merged.sum where the parts' O were unnormalised).
template <int kParts, class Part>
FA_SOFTMAX_HD SoftmaxRowState merge_states(Part part, float scale_log2) {
  SoftmaxRowState merged = SoftmaxRowState::empty();
  FA_SOFTMAX_UNROLL
  for (int i = 0; i < kParts; ++i) merged.max = fmaxf(merged.max, part(i).max);
  FA_SOFTMAX_UNROLL
  for (int i = 0; i < kParts; ++i) {
    const SoftmaxRowState s = part(i);
    if (s.max != -INFINITY) merged.sum += s.sum * exp2f((s.max - merged.max) * scale_log2);
  }
  return merged;
}

// A finished partial result (a split's O normalised by its own sum, and its LSE) as a state in
// natural-log units (scale_log2 = log2(e)): max = lse, sum = 1; an empty part (lse = -inf) has
// sum 0. The split combines merge these: the merged finish(1) gives the row's LSE, and each
// part's O enters with weight exp(lse_s - lse) = weight_in(merged) / merged.sum.
FA_SOFTMAX_HD SoftmaxRowState state_of_lse(float lse) {
  return SoftmaxRowState{lse, lse == -INFINITY ? 0.0f : 1.0f};
}

}  // namespace flashattn
