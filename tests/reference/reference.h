// The test oracle: naive attention in float64 over the full score matrix, written from the
// rules in README.md ("Semantics") and sharing no code with src/. Test-only (the CLI's --check
// links it too).
//
// Everything works on one sequence at a time, on plain row-major arrays:
//   q (sq, h, d), k and v (sk, hk, d), out (sq, h, d), lse (h, sq).
// Callers gather varlen / paged / left-padded / cache_batch_idx layouts into these arrays
// themselves (see gather helpers in tests), so every such rule is written twice: once in src/,
// once in the test.
#pragma once

#include <cstdint>
#include <vector>

namespace flashattn_ref {

enum class Storage { f16, bf16, f32 };

// Round a value to the storage type (round-to-nearest-even), returned as double.
double round_to(Storage s, double x);

struct Options {
  double scale = 0.0;  // 0 = 1/sqrt(d)
  bool causal = false;
  int window_left = -1;   // -1 = unbounded
  int window_right = -1;  // -1 = unbounded
  double softcap = 0.0;   // > 0: s = softcap * tanh(s * scale / softcap)
  const double* alibi_slopes = nullptr;  // (h) slopes of this sequence, or null
};

// float64 attention. lse may be null. A query row with no visible key: out 0, lse -inf.
void attention(const double* q, const double* k, const double* v, int sq, int sk, int h,
               int hk, int d, const Options& opt, double* out, double* lse);

// The same computation the way a careful low-precision implementation would do it: scores and
// softmax in float32, P rounded to `s` before P·V, the output rounded to `s`. Its error against
// attention() sets the tolerance (FlashAttention-2's rule: ours <= 2 * naive + floor).
void attention_lowp(Storage s, const double* q, const double* k, const double* v, int sq,
                    int sk, int h, int hk, int d, const Options& opt, double* out,
                    double* lse);

// Rotary embedding in place on x (rows, heads, d): row r rotated at position positions[r],
// cos/sin (max_position, rotary_dim / 2). Interleaved pairs (2i, 2i+1); otherwise GPT-NeoX
// pairs (i, i + rotary_dim/2). Elements at c >= rotary_dim are untouched.
void rotary(double* x, int rows, int heads, int d, const double* cos, const double* sin,
            int rotary_dim, bool interleaved, const int* positions);

// max |a - b| over n elements; NaN anywhere gives +inf.
double max_abs_diff(const double* a, const double* b, int64_t n);

}  // namespace flashattn_ref
