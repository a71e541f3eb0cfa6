// The score rules of a tile (rules.h definitions applied to a block of raw scores): softcap,
// ALiBi and the causal/local mask.
#pragma once

#include <cute/tensor.hpp>

#include "common/params.h"
#include "common/rules.h"
#include "common/softmax_state.h"
#include "cuda/components/cta_geometry.h"

namespace flashattn {
namespace cuda {
namespace fwd {

using namespace cute;
using cute::Tensor;  // not flashattn::Tensor (the public view)

// Scores are kept "raw": x = q·k (or tanh(q·k·scale/softcap) with softcap) so that the
// logit is x * raw_scale and exp(logit - max) = exp2(x * scale_log2 - max * scale_log2).
// FP8 (rules.h qk_descale, v_descale): q·k of the stored values times the unit's q and k
// descales is the real q·k, so the product joins the softmax scale; the v descale joins each
// row's output factor (finish). fp8 is the kernel's Traits::kKvFp8 (a constant: kernels of
// 16-bit inputs fold the factors away, rather than read them and hold them in registers —
// +88 bytes of spills in the splitkeys kernel at d = 128 when they did).
struct ScoreScale {
  bool has_softcap;
  float raw_scale, scale_log2, softcap_in_scale, out_descale;
  __device__ __forceinline__ ScoreScale(const AttnParams& p, int b, int hk, bool fp8) {
    const float scale = fp8 ? p.softmax_scale * qk_descale(p, b, hk) : p.softmax_scale;
    has_softcap = p.softcap > 0.0f;
    raw_scale = has_softcap ? p.softcap : scale;
    scale_log2 = raw_scale * kLog2e;
    softcap_in_scale = has_softcap ? scale / p.softcap : 0.0f;
    out_descale = fp8 ? v_descale(p, b, hk) : 1.0f;
  }
  // Scores of q times f (fp8_warp_kv.h rescale_q_into_fp16): the scale divides f out again.
  __device__ __forceinline__ void scale_q(float f) {
    if (has_softcap) {
      softcap_in_scale /= f;
    } else {
      raw_scale /= f;
      scale_log2 /= f;
    }
  }
  // A finished row: its output factor (with the v descale) and LSE.
  __device__ __forceinline__ SoftmaxResult finish(const SoftmaxRowState& row) const {
    SoftmaxResult result = row.finish(raw_scale);
    result.out_scale *= out_descale;
    return result;
  }
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

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
