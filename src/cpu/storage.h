// Storage element types of the CPU backend and the one switch from DType to a type.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

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

// FP8 (flashattn.h DType::e4m3): stored values only; the real value is descale * stored
// (AttentionOptions), applied where the rows are loaded.
template <>
struct Storage<DType::e4m3> {
  using Element = uint8_t;
  static float load(Element x) { return e4m3_bits_to_float(x); }
  static Element store(float x) { return float_to_e4m3_bits(x); }
};
using E4m3 = Storage<DType::e4m3>;

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

// Calls fn(E4m3{}) when storage is e4m3, else fn(compute): the storage of q or of k and v
// (AttnParams q_storage, kv_storage) given the call's compute type.
template <typename Compute, typename Fn>
void dispatch_storage(DType storage, Compute compute, Fn&& fn) {
  if (storage == DType::e4m3) {
    fn(E4m3{});
  } else {
    fn(compute);
  }
}

// The value of a stored element: an e4m3 one times its descale, any other as it is (only e4m3
// tensors have descales, validate.cpp check_fp8), so that 16-bit and fp32 loads pay nothing.
template <typename S>
inline float value_of(typename S::Element x, float descale) {
  if constexpr (std::is_same_v<S, E4m3>) {
    return S::load(x) * descale;
  } else {
    return S::load(x);
  }
}

// n elements from src (storage) into dst (fp32); e4m3 ones times their descale (value_of).
template <typename S>
inline void load_row(const typename S::Element* src, int n, float* dst, float descale = 1.0f) {
  for (int c = 0; c < n; ++c) dst[c] = value_of<S>(src[c], descale);
}

// n elements from src (fp32) into dst (storage), rounded once.
template <typename S>
inline void store_row(const float* src, int n, typename S::Element* dst) {
  for (int c = 0; c < n; ++c) dst[c] = S::store(src[c]);
}

}  // namespace cpu
}  // namespace flashattn
