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

namespace flashattn {

namespace {

using Wide = __int128;  // products of sizes, strides and element sizes do not fit 64 bits

struct Term {
  Wide step;    // bytes, > 0
  Wide lo, hi;  // coefficient range, lo <= hi
};

// At most two views of kMaxDims dimensions: a fixed array, so that the common case (disjoint
// allocations, decided by the byte ranges) allocates nothing.
constexpr int kMaxTerms = 2 * kMaxDims;
struct Terms {
  Term term[kMaxTerms];
  int count = 0;
  void add(const Term& t) { term[count++] = t; }
  Term* begin() { return term; }
  Term* end() { return term + count; }
  const Term* begin() const { return term; }
  const Term* end() const { return term + count; }
};

struct Footprint {
  Wide base = 0;  // lowest byte address of an element
  Wide element_bytes = 0;
  Terms terms;    // one per dimension of size > 1 and stride != 0
  bool empty = false;
};

Footprint footprint(const Tensor& t) {
  Footprint f;
  f.base = Wide(reinterpret_cast<uintptr_t>(t.data));
  f.element_bytes = Wide(dtype_size(t.dtype));
  f.empty = !t.defined() || t.ndim < 1;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] <= 0) f.empty = true;
  }
  if (f.empty) return f;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 1 || t.stride[i] == 0) continue;
    const Wide step = Wide(t.stride[i]) * f.element_bytes;
    const Wide last = Wide(t.shape[i] - 1);
    if (step < 0) f.base += step * last;
    f.terms.add(Term{step < 0 ? -step : step, 0, last});
  }
  return f;
}

Wide lowest(const Footprint& f) { return f.base; }
Wide highest(const Footprint& f) {  // last byte
  Wide end = f.base + f.element_bytes - 1;
  for (const Term& t : f.terms) end += t.step * t.hi;
  return end;
}

void sort_largest_first(Terms& terms) {
  std::sort(terms.begin(), terms.end(), [](const Term& a, const Term& b) { return a.step > b.step; });
}

// Terms of equal step become one (the sum of two coefficient ranges is a range), largest first.
Terms merged(Terms terms) {
  sort_largest_first(terms);
  Terms out;
  for (const Term& t : terms) {
    if (out.count > 0 && out.term[out.count - 1].step == t.step) {
      out.term[out.count - 1].lo += t.lo;
      out.term[out.count - 1].hi += t.hi;
    } else {
      out.add(t);
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
  explicit Search(const Terms& terms) : terms_(terms) {
    min_rest_[terms_.count] = max_rest_[terms_.count] = 0;
    for (int k = terms_.count - 1; k >= 0; --k) {
      min_rest_[k] = min_rest_[k + 1] + terms_.term[k].lo * terms_.term[k].step;
      max_rest_[k] = max_rest_[k + 1] + terms_.term[k].hi * terms_.term[k].step;
    }
  }
  bool reachable(Wide target_lo, Wide target_hi) { return visit(0, target_lo, target_hi); }

 private:
  bool visit(int k, Wide target_lo, Wide target_hi) {
    if (--budget_ < 0) return true;
    if (target_hi < min_rest_[k] || target_lo > max_rest_[k]) return false;
    if (k == terms_.count) return true;  // 0 lies in [target_lo, target_hi] (checked above)
    const Term& t = terms_.term[k];
    const Wide c_lo = std::max(t.lo, ceil_div(target_lo - max_rest_[k + 1], t.step));
    const Wide c_hi = std::min(t.hi, floor_div(target_hi - min_rest_[k + 1], t.step));
    for (Wide c = c_lo; c <= c_hi; ++c) {
      if (visit(k + 1, target_lo - c * t.step, target_hi - c * t.step)) return true;
      if (budget_ < 0) return true;
    }
    return false;
  }

  Terms terms_;
  Wide min_rest_[kMaxTerms + 1], max_rest_[kMaxTerms + 1];
  long budget_ = kOverlapSearchNodes;
};

}  // namespace

ByteSpan byte_span(const Tensor& t) {
  const Footprint f = footprint(t);
  if (f.empty) return ByteSpan{};
  return ByteSpan{lowest(f), highest(f)};
}

bool views_overlap(const Tensor& a, const Tensor& b) {
  const Footprint fa = footprint(a), fb = footprint(b);
  if (fa.empty || fb.empty) return false;
  if (highest(fa) < lowest(fb) || highest(fb) < lowest(fa)) return false;
  // sum_A - sum_B in [delta - (size_A - 1), delta + (size_B - 1)], delta = base_B - base_A.
  Terms terms = fa.terms;
  for (const Term& t : fb.terms) terms.add(Term{t.step, -t.hi, -t.lo});
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
  Terms terms = f.terms;
  sort_largest_first(terms);
  for (int k = 1; k < terms.count; ++k) {
    if (terms.term[k].step == terms.term[k - 1].step) return true;
  }
  const Wide within = f.element_bytes - 1;
  for (int first = 0; first < terms.count; ++first) {
    Terms rest;
    rest.add(Term{terms.term[first].step, 1, terms.term[first].hi});
    for (int k = first + 1; k < terms.count; ++k) {
      rest.add(Term{terms.term[k].step, -terms.term[k].hi, terms.term[k].hi});
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
