// Gather helpers: where key position p of sequence b lives in each K/V layout the API accepts
// (varlen-packed, a contiguous cache with cache_batch_idx, a paged cache), restated here
// independently of src/ so that the oracle sees plain per-sequence arrays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fa_test {

// K or V rows live in a flat (rows, heads_k, d) array; this maps (sequence, key position) to a
// row of that array.
struct KVLayout {
  enum class Kind { packed, cache, paged };
  Kind kind = Kind::cache;
  int heads_k = 0;
  int d = 0;
  // packed (varlen): the keys of sequence b are rows cu_seqlens_k[b] + p
  std::vector<int> cu_seqlens_k;
  // cache: row (batch_idx[b] or b) * capacity + p
  int capacity = 0;
  std::vector<int> batch_idx;
  // paged: row block_table[b][p / page_size] * page_size + p % page_size
  int page_size = 0;
  int max_pages = 0;
  std::vector<int> block_table;  // (batch, max_pages)

  int64_t row_of(int b, int p) const;
  int64_t row_elems() const { return int64_t(heads_k) * d; }
};

// Keys [p0, p1) of sequence b as a plain (p1 - p0, heads_k, d) array.
std::vector<double> gather_keys(const KVLayout& layout, const std::vector<double>& rows, int b,
                                int p0, int p1);
// Writes plain (p1 - p0, heads_k, d) values at positions [p0, p1) of sequence b.
void scatter_keys(const KVLayout& layout, std::vector<double>& rows, int b, int p0, int p1,
                  const std::vector<double>& plain);

// A block table for `batch` sequences of `pages_per_seq` pages each over `num_pages` pages
// (num_pages >= batch * pages_per_seq), pages assigned in a shuffled order (or in order), and
// `extra_columns` more entries per row pointing at pages no sequence owns (when there are any).
std::vector<int> make_block_table(int batch, int pages_per_seq, int num_pages, int extra_columns,
                                  bool shuffled, uint64_t seed);

// Exclusive prefix sums: (n + 1) offsets.
std::vector<int> prefix_offsets(const std::vector<int>& lengths);

}  // namespace fa_test
