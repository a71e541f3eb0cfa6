#include "layouts.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace fa_test {

int64_t KVLayout::row_of(int b, int p) const {
  switch (kind) {
    case Kind::packed: return int64_t(cu_seqlens_k[size_t(b)]) + p;
    case Kind::cache: {
      const int row = batch_idx.empty() ? b : batch_idx[size_t(b)];
      return int64_t(row) * capacity + p;
    }
    case Kind::paged: {
      const int page = block_table[size_t(b) * size_t(max_pages) + size_t(p / page_size)];
      return int64_t(page) * page_size + p % page_size;
    }
  }
  return -1;
}

std::vector<double> gather_keys(const KVLayout& layout, const std::vector<double>& rows, int b,
                                int p0, int p1) {
  const int64_t width = layout.row_elems();
  std::vector<double> plain(size_t(std::max(p1 - p0, 0)) * size_t(width));
  for (int p = p0; p < p1; ++p) {
    const int64_t src = layout.row_of(b, p) * width;
    std::copy(rows.begin() + src, rows.begin() + src + width,
              plain.begin() + int64_t(p - p0) * width);
  }
  return plain;
}

void scatter_keys(const KVLayout& layout, std::vector<double>& rows, int b, int p0, int p1,
                  const std::vector<double>& plain) {
  const int64_t width = layout.row_elems();
  for (int p = p0; p < p1; ++p) {
    const int64_t dst = layout.row_of(b, p) * width;
    std::copy(plain.begin() + int64_t(p - p0) * width, plain.begin() + int64_t(p - p0 + 1) * width,
              rows.begin() + dst);
  }
}

std::vector<int> make_block_table(int batch, int pages_per_seq, int num_pages, int extra_columns,
                                  bool shuffled, uint64_t seed) {
  std::vector<int> pages(static_cast<size_t>(num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::mt19937_64 rng(seed);
  if (shuffled) std::shuffle(pages.begin(), pages.end(), rng);
  const int owned = batch * pages_per_seq;
  const int columns = pages_per_seq + extra_columns;
  std::vector<int> table(size_t(batch) * size_t(columns));
  for (int b = 0; b < batch; ++b) {
    for (int j = 0; j < columns; ++j) {
      int page;
      if (j < pages_per_seq) {
        page = pages[size_t(b * pages_per_seq + j)];
      } else if (num_pages > owned) {  // an unowned (NaN-filled) page
        page = pages[size_t(owned + (b + j) % (num_pages - owned))];
      } else {
        page = pages[0];
      }
      table[size_t(b) * size_t(columns) + size_t(j)] = page;
    }
  }
  return table;
}

std::vector<int> prefix_offsets(const std::vector<int>& lengths) {
  std::vector<int> off(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) off[i + 1] = off[i] + lengths[i];
  return off;
}

}  // namespace fa_test
