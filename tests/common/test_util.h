// Shared test helpers: storage conversions, random inputs, device buffers, strided views,
// NaN poisoning and the pass rule. Written independently of src/ (nothing from src/ is
// included), so that a mistake in the library cannot hide in its own check.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"
#include "reference.h"

namespace fa_test {

using flashattn::Device;
using flashattn::DType;
using flashattn::Tensor;

// ---- storage types -------------------------------------------------------------------------

flashattn_ref::Storage storage_of(DType dtype);
double round_to(DType dtype, double x);
const char* short_name(DType dtype);  // "bf16", "f16", "f32"
size_t element_size(DType dtype);

// Bits of a value in binary16 / bfloat16 (rounded to nearest even first) and back.
uint16_t f16_bits(double x);
double from_f16_bits(uint16_t bits);
uint16_t bf16_bits(double x);
double from_bf16_bits(uint16_t bits);

// ---- random inputs ---------------------------------------------------------------------------

// n values ~ N(0, stddev^2), fixed seed, rounded to the storage type.
std::vector<double> random_normal(int64_t n, uint64_t seed, DType dtype, double stddev = 1.0);
// n integers uniform in [lo, hi].
std::vector<int> random_ints(int64_t n, uint64_t seed, int lo, int hi);

// ---- buffers on the device under test ----------------------------------------------------------

// Owns raw memory on the host (Device::cpu) or the GPU (Device::cuda, only when the tests are
// built with CUDA: FLASHATTN_TESTS_CUDA).
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  std::vector<uint8_t> raw() const;  // all bytes

 private:
  void release();
  Device device_ = Device::cpu;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Values (NaN allowed) encoded in dtype, and back.
std::vector<uint8_t> encode(const std::vector<double>& values, DType dtype);
std::vector<double> decode(const std::vector<uint8_t>& bytes, DType dtype);

Buffer to_device(const std::vector<double>& values, DType dtype, Device device);
std::vector<double> from_device(const Buffer& buffer, DType dtype);
Buffer to_device_i32(const std::vector<int>& values, Device device);
// n elements of dtype, every one a NaN (outputs are poisoned before each call).
Buffer poisoned(DType dtype, int64_t n, Device device);

// Tensors over a buffer.
Tensor i32_tensor(const Buffer& b, std::initializer_list<int64_t> shape);
Tensor f32_vector(const Buffer& b, std::initializer_list<int64_t> shape);

// ---- strided views -------------------------------------------------------------------------------

// A strided view into a flat array of elements: the element at index (i0, i1, ...) lives at
// offset + sum(i_k * stride[k]).
struct View {
  int ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};
  int64_t offset = 0;

  int64_t numel() const;
  int64_t extent() const;  // one past the largest element offset (0 if empty)
};

View contiguous_view(std::initializer_list<int64_t> shape, int64_t offset = 0);
View strided_view(std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides,
                  int64_t offset = 0);
// A view with `pad` extra elements after each head, each row and each batch entry of a
// (b, s, h, d) or (s, h, d) shape: exercises strides that are not the contiguous ones.
View padded_view(std::initializer_list<int64_t> shape, int64_t pad);

// Writes the row-major `plain` array into buf at the view's elements (buf grows as needed).
void scatter(std::vector<double>& buf, const View& view, const std::vector<double>& plain);
// Reads the view's elements of buf into a row-major array.
std::vector<double> gather(const std::vector<double>& buf, const View& view);
// True if every element of buf outside the view is still a NaN (poison not overwritten).
bool poison_outside_view_intact(const std::vector<double>& buf, const View& view);

Tensor tensor_of(const Buffer& buffer, DType dtype, const View& view);

// ---- the oracle, per sequence ------------------------------------------------------------------

struct OracleOut {
  std::vector<double> out64, out_lowp;  // (sq, h, d)
  std::vector<double> lse64, lse_lowp;  // (h, sq)
};
OracleOut run_oracle(DType dtype, const double* q, const double* k, const double* v, int sq,
                     int sk, int h, int hk, int d, const flashattn_ref::Options& opt);

// ---- the pass rule -----------------------------------------------------------------------------

// Output: max|impl - f64| <= 2 * max|lowp - f64| + floor, floor relative to the output's size.
double output_floor(DType dtype, double magnitude);
// LSE: the same rule with an absolute floor.
double lse_floor(DType dtype);

::testing::AssertionResult outputs_close(const std::string& what, const std::vector<double>& impl,
                                         const std::vector<double>& ref64,
                                         const std::vector<double>& lowp, DType dtype);
::testing::AssertionResult lse_close(const std::string& what, const std::vector<double>& impl,
                                     const std::vector<double>& ref64,
                                     const std::vector<double>& lowp, DType dtype);
// Two implementation results (e.g. num_splits 1 vs 3) agree within the pass rule's tolerance
// of this problem (2 * max|lowp - f64| + floor).
::testing::AssertionResult results_agree(const std::string& what, const std::vector<double>& a,
                                         const std::vector<double>& b,
                                         const std::vector<double>& ref64,
                                         const std::vector<double>& lowp, DType dtype);

// ---- devices ---------------------------------------------------------------------------------

// Empty when the device can run, else why it cannot (tests GTEST_SKIP with it).
std::string unavailable_reason(Device device);
const char* device_label(Device device);

// Cases on CUDA need 16-byte aligned strides: pads are multiples of this many elements.
constexpr int64_t kPadElements = 8;

}  // namespace fa_test

// Runs the body of a sweep test: skips when the device is unavailable or the library reports
// the case unsupported (a CUDA head dim not compiled in); any other Error fails the test.
#define FA_RUN_CASE(device, body)                                                   \
  do {                                                                              \
    const std::string fa_reason_ = ::fa_test::unavailable_reason(device);           \
    if (!fa_reason_.empty()) GTEST_SKIP() << fa_reason_;                            \
    try {                                                                           \
      body;                                                                         \
    } catch (const flashattn::Error& e) {                                           \
      if (e.kind() == flashattn::Error::Kind::unsupported) GTEST_SKIP() << e.what(); \
      FAIL() << "flashattn::Error: " << e.what();                                  \
    }                                                                               \
  } while (0)
