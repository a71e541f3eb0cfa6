// Tensor view helpers and names.
#include <sstream>

#include "flashattn/flashattn.h"

namespace flashattn {

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

static Tensor make_view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                        const int64_t* strides, Device device, int device_index) {
  if (shape.size() < 1 || shape.size() > size_t(kMaxDims)) {
    throw Error(Error::Kind::invalid_argument,
                "Tensor: shape must have 1 to 4 dims (got " + std::to_string(shape.size()) + ")");
  }
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_index = device_index;
  t.ndim = int(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  if (strides) {
    for (i = 0; i < t.ndim; ++i) t.stride[i] = strides[i];
  } else {
    int64_t s = 1;
    for (i = t.ndim - 1; i >= 0; --i) {
      t.stride[i] = s;
      s *= t.shape[i];
    }
  }
  return t;
}

Tensor Tensor::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                          Device device, int device_index) {
  return make_view(data, dtype, shape, nullptr, device, device_index);
}

Tensor Tensor::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> strides, Device device, int device_index) {
  if (strides.size() != shape.size()) {
    throw Error(Error::Kind::invalid_argument, "Tensor: strides must have as many entries as shape");
  }
  int64_t s[kMaxDims];
  int i = 0;
  for (int64_t v : strides) s[i++] = v;
  return make_view(data, dtype, shape, s, device, device_index);
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::f32: return "fp32";
    case DType::i32: return "int32";
    case DType::e4m3: return "e4m3";
  }
  return "?";
}

const char* device_name(Device device) { return device == Device::cuda ? "cuda" : "cpu"; }

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::e4m3: return 1;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::f32:
    case DType::i32: return 4;
  }
  return 0;
}

static std::string join(const int64_t* v, int n) {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < n; ++i) os << (i ? ", " : "") << v[i];
  if (n == 1) os << ",";
  os << ")";
  return os.str();
}

std::string shape_string(const Tensor& t) { return join(t.shape, t.ndim); }

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream os;
  os << dtype_name(t.dtype) << " " << device_name(t.device);
  if (t.device == Device::cuda) os << ":" << t.device_index;
  os << " " << join(t.shape, t.ndim) << " strides " << join(t.stride, t.ndim);
  return os.str();
}

}  // namespace flashattn
