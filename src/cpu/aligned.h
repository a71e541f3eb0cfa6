// Tiles on cache-line boundaries: a std::vector whose storage starts at a multiple of 64 bytes,
// so that the kernels' full-vector loads and stores never straddle two lines, and whose
// elements are left uninitialised by resize() (assign() still fills). Buffers of 2 MB or more
// (the K/V packed once per call) start on a 2 MB boundary and ask Linux for huge pages, so that
// their first touch takes one page fault per 2 MB rather than per 4 KB (docs/DECISIONS.md D-67).
#pragma once

#include <cstddef>
#include <new>
#include <utility>
#include <vector>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace flashattn {
namespace cpu {

constexpr std::size_t kCacheLineBytes = 64;
constexpr std::size_t kHugePageBytes = std::size_t(2) << 20;

inline std::size_t buffer_alignment(std::size_t bytes) {
  return bytes >= kHugePageBytes ? kHugePageBytes : kCacheLineBytes;
}

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    void* ptr = ::operator new(bytes, std::align_val_t(buffer_alignment(bytes)));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes >= kHugePageBytes) madvise(ptr, bytes / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);  // advice only
#endif
    return static_cast<T*>(ptr);
  }
  void deallocate(T* ptr, std::size_t n) {
    ::operator delete(ptr, std::align_val_t(buffer_alignment(n * sizeof(T))));
  }
  // resize() default-initialises (no fill for floats); explicit values are constructed as given.
  template <typename U>
  void construct(U* ptr) {
    ::new (static_cast<void*>(ptr)) U;
  }
  template <typename U, typename... Args>
  void construct(U* ptr, Args&&... args) {
    ::new (static_cast<void*>(ptr)) U(std::forward<Args>(args)...);
  }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};

template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace cpu
}  // namespace flashattn
