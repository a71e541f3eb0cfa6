#include "api/staging.h"

#include <cstdint>

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

}  // namespace

int padded_head_dim(int head_dim) { return int(round_up(head_dim, kCudaHeadDimMultiple)); }

int kernel_head_dim(const Problem& p) {
  return p.device == Device::cuda ? padded_head_dim(p.head_dim) : p.head_dim;
}

Problem kernel_problem(const Problem& p) {
  Problem k = p;
  k.head_dim = kernel_head_dim(p);
  return k;
}

bool kernel_ready(const Tensor& t) {
  if (t.device != Device::cuda || !t.defined()) return true;
  const int64_t bytes = int64_t(dtype_size(t.dtype));
  const int64_t multiple = kCudaAlignmentBytes / bytes;
  if (t.size(-1) % multiple != 0) return false;
  if (reinterpret_cast<uintptr_t>(t.data) % kCudaAlignmentBytes != 0) return false;
  for (int i = 0; i + 1 < t.ndim; ++i) {
    if (t.shape[i] > 1 && t.stride[i] % multiple != 0) return false;
  }
  return true;
}

Staging::Staging(const Problem& p, void* stream)
    : head_dim_(kernel_head_dim(p)), device_index_(p.device_index), stream_(stream) {}

Staging::~Staging() {
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
  s.data = bytes == 0 ? t.data : cuda::allocate_async(bytes, stream_, t.device_index);
  if (bytes != 0) allocations_.push_back(s.data);
  return s;
}

Tensor Staging::input(const Tensor& t) {
  if (kernel_ready(t)) return t;
  Tensor s = allocate_like(t);
  if (s.numel() > 0) cuda::copy_padded(padded_copy(t, s), stream_);
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
    if (caller.numel() > 0) cuda::copy_padded(padded_copy(staged, caller), stream_);
  }
  outputs_.clear();
}

}  // namespace flashattn
