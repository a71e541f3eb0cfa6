#include "api/staging.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "api/backend.h"

namespace flashattn {

namespace {

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// The (up to) three outer dims of t as a 4-D array's dims 0..2: leading dims of size 1 added.
struct Outer {
  int64_t shape[3] = {1, 1, 1};
  int64_t stride[3] = {0, 0, 0};
};
Outer outer_of(const Tensor& t) {
  Outer o;
  const int lead = 4 - t.ndim;  // dims of o before t's first
  for (int i = 0; i + 1 < t.ndim; ++i) {
    o.shape[lead + i] = t.shape[i];
    o.stride[lead + i] = t.stride[i];
  }
  return o;
}

cuda::PaddedCopy padded_copy(const Tensor& src, const Tensor& dst) {
  cuda::PaddedCopy c;
  c.device_index = src.device_index;
  c.element_bytes = int(dtype_size(src.dtype));
  c.src = src.data;
  c.dst = dst.data;
  const Outer s = outer_of(src), d = outer_of(dst);
  for (int i = 0; i < 3; ++i) {
    c.shape[i] = s.shape[i];
    c.src_stride[i] = s.stride[i];
    c.dst_stride[i] = d.stride[i];
  }
  c.src_cols = int(src.size(-1));
  c.dst_cols = int(dst.size(-1));
  return c;
}

// FLASHATTN_KERNEL=automatic,stage=cpu (for testing only): CPU calls are staged by the same
// rule as CUDA calls (host copies instead of the copy kernel), so that the CPU sweeps check the
// staging semantics (padding, scale, kv-cache order, paging, splits) where no GPU is.
bool stage_on_cpu() { return kernel_override_from_env().stage_on_cpu; }

bool staged_device(Device device) { return device == Device::cuda || stage_on_cpu(); }

// cuda::copy_padded's copy, run on the host (stage=cpu).
void copy_padded_on_host(const cuda::PaddedCopy& c) {
  const size_t bytes = size_t(c.element_bytes);
  const int copied = c.src_cols < c.dst_cols ? c.src_cols : c.dst_cols;
  for (int64_t i0 = 0; i0 < c.shape[0]; ++i0) {
    for (int64_t i1 = 0; i1 < c.shape[1]; ++i1) {
      for (int64_t i2 = 0; i2 < c.shape[2]; ++i2) {
        const char* src = static_cast<const char*>(c.src) +
                          (i0 * c.src_stride[0] + i1 * c.src_stride[1] + i2 * c.src_stride[2]) * bytes;
        char* dst = static_cast<char*>(c.dst) +
                    (i0 * c.dst_stride[0] + i1 * c.dst_stride[1] + i2 * c.dst_stride[2]) * bytes;
        std::memcpy(dst, src, size_t(copied) * bytes);
        std::memset(dst + size_t(copied) * bytes, 0, size_t(c.dst_cols - copied) * bytes);
      }
    }
  }
}

}  // namespace

int padded_head_dim(int head_dim) { return int(round_up(head_dim, kCudaHeadDimMultiple)); }

int kernel_head_dim(const Problem& p) {
  return staged_device(p.device) ? padded_head_dim(p.head_dim) : p.head_dim;
}

Problem kernel_problem(const Problem& p) {
  Problem k = p;
  k.head_dim = kernel_head_dim(p);
  return k;
}

bool kernel_ready(const Tensor& t) {
  if (!staged_device(t.device) || !t.defined()) return true;
  const int64_t bytes = int64_t(dtype_size(t.dtype));
  const int64_t alignment = std::min<int64_t>(kCudaHeadDimMultiple * bytes, kCudaAlignmentBytes);
  if (t.size(-1) != padded_head_dim(int(t.size(-1)))) return false;
  if (reinterpret_cast<uintptr_t>(t.data) % alignment != 0) return false;
  for (int i = 0; i + 1 < t.ndim; ++i) {
    if (t.shape[i] > 1 && (t.stride[i] * bytes) % alignment != 0) return false;
  }
  return true;
}

Staging::Staging(const Problem& p, void* stream)
    : head_dim_(kernel_head_dim(p)), device_(p.device), device_index_(p.device_index), stream_(stream) {}

Staging::~Staging() {
  if (device_ == Device::cpu) {
    for (void* ptr : allocations_) std::free(ptr);
    return;
  }
  for (void* ptr : allocations_) {
    try {
      cuda::free_async(ptr, stream_, device_index_);
    } catch (...) {  // a destructor has nothing to throw to; the memory stays with the pool
    }
  }
}

Tensor Staging::allocate_like(const Tensor& t) {
  // Contiguous, with the kernels' head dim.
  Tensor s = t;
  s.shape[t.ndim - 1] = head_dim_;
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    s.stride[i] = stride;
    stride *= s.shape[i];
  }
  const size_t bytes = size_t(stride) * dtype_size(t.dtype);
  if (bytes == 0) return s;  // nothing is addressed
  const size_t aligned = (bytes + kCudaAlignmentBytes - 1) / kCudaAlignmentBytes * kCudaAlignmentBytes;
  s.data = device_ == Device::cpu ? std::aligned_alloc(kCudaAlignmentBytes, aligned)
                                  : cuda::allocate_async(bytes, stream_, t.device_index);
  if (s.data == nullptr) throw Error(Error::Kind::runtime, "staging: host allocation failed");
  allocations_.push_back(s.data);
  return s;
}

void Staging::copy(const Tensor& src, const Tensor& dst) {
  if (device_ == Device::cpu) {
    copy_padded_on_host(padded_copy(src, dst));
  } else {
    cuda::copy_padded(padded_copy(src, dst), stream_);
  }
}

Tensor Staging::input(const Tensor& t) {
  if (kernel_ready(t)) return t;
  Tensor s = allocate_like(t);
  if (s.numel() > 0) copy(t, s);
  return s;
}

Tensor Staging::output(const Tensor& t) {
  if (kernel_ready(t)) return t;
  Tensor s = allocate_like(t);
  outputs_.emplace_back(t, s);
  return s;
}

void Staging::finish() {
  for (const auto& [caller, staged] : outputs_) {
    if (caller.numel() > 0) copy(staged, caller);
  }
  outputs_.clear();
}

}  // namespace flashattn
