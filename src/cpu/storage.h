// Storage element types of the CPU backend and the one switch from DType to a type.
#pragma once

#include <cstdint>
#include <string>

#include "common/half.h"
#include "flashattn/flashattn.h"

namespace flashattn {
namespace cpu {

// Storage<D>::Element is what sits in memory; load/store convert to and from fp32
// (store rounds to nearest even).
template <DType D>
struct Storage;

template <>
struct Storage<DType::f32> {
  using Element = float;
  static float load(Element x) { return x; }
  static Element store(float x) { return x; }
};

template <>
struct Storage<DType::f16> {
  using Element = uint16_t;
  static float load(Element x) { return half_bits_to_float(x); }
  static Element store(float x) { return float_to_half_bits(x); }
};

template <>
struct Storage<DType::bf16> {
  using Element = uint16_t;
  static float load(Element x) { return bf16_bits_to_float(x); }
  static Element store(float x) { return float_to_bf16_bits(x); }
};

// Calls fn(Storage<D>{}) for the run-time dtype (the API layer has checked it).
template <typename Fn>
void dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: fn(Storage<DType::f32>{}); return;
    case DType::f16: fn(Storage<DType::f16>{}); return;
    case DType::bf16: fn(Storage<DType::bf16>{}); return;
    default:
      throw Error(Error::Kind::unsupported,
                  std::string("cpu backend: dtype ") + dtype_name(dtype) + " is not a storage type");
  }
}

// n elements from src (storage) into dst (fp32).
template <typename S>
inline void load_row(const typename S::Element* src, int n, float* dst) {
  for (int c = 0; c < n; ++c) dst[c] = S::load(src[c]);
}

// n elements from src (fp32) into dst (storage), rounded once.
template <typename S>
inline void store_row(const float* src, int n, typename S::Element* dst) {
  for (int c = 0; c < n; ++c) dst[c] = S::store(src[c]);
}

}  // namespace cpu
}  // namespace flashattn
