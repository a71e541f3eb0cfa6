// Tiles on cache-line boundaries: a std::vector whose storage starts at a multiple of 64 bytes,
// so that the kernels' full-vector loads and stores never straddle two lines (docs/DECISIONS.md
// D-66).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace flashattn {
namespace cpu {

constexpr std::size_t kCacheLineBytes = 64;

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kCacheLineBytes)));
  }
  void deallocate(T* ptr, std::size_t) { ::operator delete(ptr, std::align_val_t(kCacheLineBytes)); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};

template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace cpu
}  // namespace flashattn
