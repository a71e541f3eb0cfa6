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

  // This state's sum rescaled to another max (>= max): 0 for a state that has seen no key.
  FA_SOFTMAX_HD float sum_at(float to_max, float scale_log2) const {
    return max == -INFINITY ? 0.0f : sum * exp2f((max - to_max) * scale_log2);
  }

  // The weight of this part's O in the merge `merged` of the parts, normalised by the merged
  // sum: exp2((max - merged.max) * scale_log2) / merged.sum, or 0 for an empty part or merge.
  // Unnormalised O of the parts: O = sum of weight * O_part; with each part's O normalised by
  // its own sum, weigh by sum * weight (state_of_lse does this for LSE-form parts).
  FA_SOFTMAX_HD float weight_in(const SoftmaxRowState& merged, float scale_log2) const {
    if (max == -INFINITY || merged.sum <= 0.0f) return 0.0f;
    return exp2f((max - merged.max) * scale_log2) / merged.sum;
  }
};

// The merge of kParts states of one row (warps of a CTA, splits of a unit): the max over the
// parts, then the sum of each part's sum rescaled to it (parts with no key add nothing). part(i)
// returns part i's state; a part's O then enters with weight_in(merged).
template <int kParts, class Part>
FA_SOFTMAX_HD SoftmaxRowState merge_states(Part part, float scale_log2) {
  SoftmaxRowState merged = SoftmaxRowState::empty();
  FA_SOFTMAX_UNROLL
  for (int i = 0; i < kParts; ++i) merged.max = fmaxf(merged.max, part(i).max);
  FA_SOFTMAX_UNROLL
  for (int i = 0; i < kParts; ++i) merged.sum += part(i).sum_at(merged.max, scale_log2);
  return merged;
}

// A finished partial result (a split's O normalised by its own sum, and its LSE) as a state in
// natural-log units (scale_log2 = kLog2eSoftmax): max = lse, sum = 1, or empty for lse = -inf.
// The split combines merge these: the merged state's finish(1).lse is the row's LSE, and each
// split's O enters with split_weight(lse_s, lse) = exp(lse_s - lse) (= weight_in(merged)).
FA_SOFTMAX_HD SoftmaxRowState state_of_lse(float lse) {
  return SoftmaxRowState{lse, lse == -INFINITY ? 0.0f : 1.0f};
}
FA_SOFTMAX_HD float split_weight(float split_lse, float lse) {
  return split_lse == -INFINITY || lse == -INFINITY ? 0.0f : expf(split_lse - lse);
}
constexpr float kLog2eSoftmax = 1.4426950408889634f;  // log2(e): the scale_log2 of LSE-form states

}  // namespace flashattn
