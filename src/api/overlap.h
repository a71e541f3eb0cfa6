// Whether strided views share memory: validation refuses an output (out, softmax_lse, a KV cache
// being appended to, the workspace) whose bytes another argument, or the output itself, also
// occupies, since the result would then depend on the order in which elements are written.
//
// Exact for the layouts met in practice (slices and transposes of one buffer, interleaved K/V
// slices of a packed cache are disjoint; views of the same elements overlap). A layout whose
// proof would take too long counts as overlapping (the search is bounded, kOverlapSearchNodes).
#pragma once

#include "flashattn/flashattn.h"

namespace flashattn {

// Index combinations the search may visit before it gives up and answers "overlap".
constexpr int kOverlapSearchNodes = 1 << 16;

// a and b have a byte in common. Views with no elements never do.
bool views_overlap(const Tensor& a, const Tensor& b);

// The bytes from a view's lowest to its highest element: views whose spans do not meet cannot
// overlap (the quick test before views_overlap, for many pairs).
struct ByteSpan {
  __int128 first = 0, last = -1;  // last < first: no bytes
  bool meets(const ByteSpan& o) const { return first <= last && o.first <= o.last && first <= o.last && o.first <= last; }
};
ByteSpan byte_span(const Tensor& t);

// Two different elements of t occupy a common byte (e.g. a stride of 0 over a size above 1).
bool view_overlaps_itself(const Tensor& t);

// A plain byte range [data, data + bytes) (the workspace) as a one-dimensional view.
Tensor byte_range_view(void* data, size_t bytes, Device device, int device_index);

}  // namespace flashattn
