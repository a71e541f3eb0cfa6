// Memory overlap of strided views (overlap.h).
//
// A view occupies the bytes base + sum_k i_k * step_k + e, 0 <= i_k < n_k, 0 <= e < element
// size, where step_k = |stride_k| * element size (a negative stride moves the base to the
// lowest element). Two views share a byte when sum_A - sum_B lands within the element sizes of
// the base difference: an integer problem over at most 8 bounded coefficients. Terms with the
// same step merge into one coefficient range; the search then fixes the coefficients from the
// largest step down, each time keeping only the values that the smaller steps can still
// correct, which for the usual layouts leaves one or two values per level.
#include "api/overlap.h"

#include <algorithm>
#include <vector>

namespace flashattn {

namespace {

using Wide = __int128;  // products of sizes, strides and element sizes do not fit 64 bits

struct Term {
  Wide step;    // bytes, > 0
  Wide lo, hi;  // coefficient range, lo <= hi
};

struct Footprint {
  Wide base = 0;           // lowest byte address of an element
  Wide element_bytes = 0;
  std::vector<Term> terms;  // one per dimension of size > 1 and stride != 0
  bool empty = false;
};

Footprint footprint(const Tensor& t) {
  Footprint f;
  f.base = Wide(reinterpret_cast<uintptr_t>(t.data));
  f.element_bytes = Wide(dtype_size(t.dtype));
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] <= 0) f.empty = true;
  }
  if (f.empty || !t.defined()) {
    f.empty = true;
    return f;
  }
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 1 || t.stride[i] == 0) continue;
    const Wide step = Wide(t.stride[i]) * f.element_bytes;
    const Wide last = Wide(t.shape[i] - 1);
    if (step < 0) f.base += step * last;
    f.terms.push_back(Term{step < 0 ? -step : step, 0, last});
  }
  return f;
}

Wide lowest(const Footprint& f) { return f.base; }
Wide highest(const Footprint& f) {  // last byte
  Wide end = f.base + f.element_bytes - 1;
  for (const Term& t : f.terms) end += t.step * t.hi;
  return end;
}

// Terms of equal step become one (the sum of two coefficient ranges is a range), largest first.
std::vector<Term> merged(std::vector<Term> terms) {
  std::sort(terms.begin(), terms.end(), [](const Term& a, const Term& b) { return a.step > b.step; });
  std::vector<Term> out;
  for (const Term& t : terms) {
    if (!out.empty() && out.back().step == t.step) {
      out.back().lo += t.lo;
      out.back().hi += t.hi;
    } else {
      out.push_back(t);
    }
  }
  return out;
}

Wide floor_div(Wide a, Wide b) {  // b > 0
  Wide q = a / b;
  if ((a % b != 0) && (a < 0)) --q;
  return q;
}
Wide ceil_div(Wide a, Wide b) { return -floor_div(-a, b); }

// Is there c_k in [lo_k, hi_k] (k >= first) with sum c_k step_k in [target_lo, target_hi]?
// Counts visited nodes in *budget; running out answers yes (overlap assumed).
class Search {
 public:
  explicit Search(std::vector<Term> terms) : terms_(std::move(terms)) {
    min_rest_.assign(terms_.size() + 1, 0);
    max_rest_.assign(terms_.size() + 1, 0);
    for (size_t k = terms_.size(); k-- > 0;) {
      min_rest_[k] = min_rest_[k + 1] + terms_[k].lo * terms_[k].step;
      max_rest_[k] = max_rest_[k + 1] + terms_[k].hi * terms_[k].step;
    }
  }
  bool reachable(Wide target_lo, Wide target_hi) { return visit(0, target_lo, target_hi); }

 private:
  bool visit(size_t k, Wide target_lo, Wide target_hi) {
    if (--budget_ < 0) return true;
    if (target_hi < min_rest_[k] || target_lo > max_rest_[k]) return false;
    if (k == terms_.size()) return true;  // 0 lies in [target_lo, target_hi] (checked above)
    const Term& t = terms_[k];
    const Wide c_lo = std::max(t.lo, ceil_div(target_lo - max_rest_[k + 1], t.step));
    const Wide c_hi = std::min(t.hi, floor_div(target_hi - min_rest_[k + 1], t.step));
    for (Wide c = c_lo; c <= c_hi; ++c) {
      if (visit(k + 1, target_lo - c * t.step, target_hi - c * t.step)) return true;
      if (budget_ < 0) return true;
    }
    return false;
  }

  std::vector<Term> terms_;
  std::vector<Wide> min_rest_, max_rest_;
  long budget_ = kOverlapSearchNodes;
};

}  // namespace

bool views_overlap(const Tensor& a, const Tensor& b) {
  const Footprint fa = footprint(a), fb = footprint(b);
  if (fa.empty || fb.empty) return false;
  if (highest(fa) < lowest(fb) || highest(fb) < lowest(fa)) return false;
  // sum_A - sum_B in [delta - (size_A - 1), delta + (size_B - 1)], delta = base_B - base_A.
  std::vector<Term> terms = fa.terms;
  for (const Term& t : fb.terms) terms.push_back(Term{t.step, -t.hi, -t.lo});
  const Wide delta = fb.base - fa.base;
  return Search(merged(terms)).reachable(delta - (fa.element_bytes - 1),
                                         delta + (fb.element_bytes - 1));
}

bool view_overlaps_itself(const Tensor& t) {
  const Footprint f = footprint(t);
  if (f.empty) return false;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] > 1 && t.stride[i] == 0) return true;
  }
  // Two index vectors i != i' at byte distance below the element size: their difference c has
  // c_k in [-(n_k - 1), n_k - 1], not all zero. Equal steps give c = (1, -1) at once; else the
  // first nonzero c_k (largest step first) may be taken positive.
  std::vector<Term> terms = f.terms;
  std::sort(terms.begin(), terms.end(), [](const Term& x, const Term& y) { return x.step > y.step; });
  for (size_t k = 1; k < terms.size(); ++k) {
    if (terms[k].step == terms[k - 1].step) return true;
  }
  const Wide within = f.element_bytes - 1;
  for (size_t first = 0; first < terms.size(); ++first) {
    std::vector<Term> rest;
    rest.push_back(Term{terms[first].step, 1, terms[first].hi});
    for (size_t k = first + 1; k < terms.size(); ++k) {
      rest.push_back(Term{terms[k].step, -terms[k].hi, terms[k].hi});
    }
    if (Search(rest).reachable(-within, within)) return true;
  }
  return false;
}

Tensor byte_range_view(void* data, size_t bytes, Device device, int device_index) {
  const int64_t words = int64_t((bytes + sizeof(int32_t) - 1) / sizeof(int32_t));
  return Tensor::contiguous(data, DType::i32, {words}, device, device_index);
}

}  // namespace flashattn
