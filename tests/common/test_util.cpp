#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>

#if defined(FLASHATTN_TESTS_CUDA)
#include <cuda_runtime.h>
#endif

namespace fa_test {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr uint16_t kF16QuietNaN = 0x7e00;
constexpr uint16_t kBf16QuietNaN = 0x7fc0;

// Floors of the pass rule, relative to max|output|. 16-bit: about a quarter of bf16's
// half-ulp (2^-9), so the floor matters only when the low-precision error is tiny.
constexpr double kOutputFloor16 = 1e-3;
constexpr double kOutputFloor32 = 2e-5;
// LSE is computed in fp32 by every implementation; absolute floor. The CPU backend's LSE
// error was at most 1e-5 over the whole sweep (--gtest_output=xml records it per check).
constexpr double kLseFloor16 = 2e-4;
constexpr double kLseFloor32 = 2e-4;
// The oracle's two paths must agree this well, or a bug in one of them (which would inflate
// the tolerance) is reported instead of hidden: relative to max|out| for outputs (measured:
// at most 3.8e-3 for 16-bit types), absolute for LSE (measured: 3e-6).
constexpr double kOracleConsistency16 = 2e-2;
constexpr double kOracleConsistency32 = 1e-4;
constexpr double kOracleLseConsistency = 1e-4;
// Outputs are never smaller than this for the floor's purpose (all-masked outputs are 0).
constexpr double kMinMagnitude = 1e-2;

#if defined(FLASHATTN_TESTS_CUDA)
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

}  // namespace

// ---- storage types -------------------------------------------------------------------------

flashattn_ref::Storage storage_of(DType dtype) {
  switch (dtype) {
    case DType::f16: return flashattn_ref::Storage::f16;
    case DType::bf16: return flashattn_ref::Storage::bf16;
    default: return flashattn_ref::Storage::f32;
  }
}

// e4m3 (float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, 0x7f/0xff
// NaN, largest finite 448, smallest normal 2^-6, subnormal step 2^-9.
namespace {
constexpr int kE4m3Bias = 7, kE4m3MantissaBits = 3, kE4m3MinExponent = -6;
constexpr double kE4m3Max = 448.0;
constexpr uint8_t kE4m3NaN = 0x7f;

// Nearest e4m3 value, ties to the even mantissa, saturated at +-448 (the library's contract).
double round_to_e4m3(double x) {
  if (std::isnan(x)) return x;
  const double a = std::fabs(x);
  if (a >= kE4m3Max) return std::copysign(kE4m3Max, x);
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): unit exponent e - 1
  const double step = std::ldexp(1.0, std::max(e - 1, kE4m3MinExponent) - kE4m3MantissaBits);
  return std::copysign(std::nearbyint(a / step) * step, x);  // nearbyint: ties to even
}

uint8_t e4m3_bits(double x) {
  if (std::isnan(x)) return kE4m3NaN;
  const double r = round_to_e4m3(x);
  const uint8_t sign = std::signbit(r) ? uint8_t(0x80) : uint8_t(0);
  const double a = std::fabs(r);
  if (a < std::ldexp(1.0, kE4m3MinExponent)) {  // subnormal (or zero): a / 2^-9
    return uint8_t(sign | uint8_t(std::ldexp(a, kE4m3Bias - 1 + kE4m3MantissaBits)));
  }
  int e = 0;
  const double m = std::frexp(a, &e);
  const int mantissa = int(std::ldexp(m * 2.0 - 1.0, kE4m3MantissaBits));
  return uint8_t(sign | ((e - 1 + kE4m3Bias) << kE4m3MantissaBits) | mantissa);
}

double from_e4m3_bits(uint8_t bits) {
  if ((bits & 0x7f) == kE4m3NaN) return kNaN;
  const int biased = (bits >> kE4m3MantissaBits) & 0xf;
  const int mantissa = bits & 0x7;
  const double value = biased == 0 ? std::ldexp(double(mantissa), 1 - kE4m3Bias - kE4m3MantissaBits)
                                   : std::ldexp(1.0 + mantissa / 8.0, biased - kE4m3Bias);
  return (bits & 0x80) ? -value : value;
}
}  // namespace

double round_to(DType dtype, double x) {
  if (dtype == DType::e4m3) return round_to_e4m3(x);
  return flashattn_ref::round_to(storage_of(dtype), x);
}

const char* short_name(DType dtype) {
  switch (dtype) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::e4m3: return "e4m3";
  }
  return "?";
}

size_t element_size(DType dtype) {
  if (dtype == DType::e4m3) return 1;
  return (dtype == DType::f16 || dtype == DType::bf16) ? 2 : 4;
}

// Encodes a value that is exactly representable after rounding: sign, biased exponent and
// mantissa computed from frexp, subnormals and infinities included.
namespace {
uint16_t encode16(double x, int exponent_bits, int mantissa_bits, uint16_t quiet_nan) {
  if (std::isnan(x)) return quiet_nan;
  const uint16_t sign = std::signbit(x) ? uint16_t(0x8000) : uint16_t(0);
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const uint16_t max_biased = uint16_t((1 << exponent_bits) - 1);
  double a = std::fabs(x);
  if (std::isinf(a)) return uint16_t(sign | (max_biased << mantissa_bits));
  if (a == 0.0) return sign;
  int e;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int biased = e - 1 + bias;
  uint32_t mantissa;
  if (biased <= 0) {  // subnormal: a / 2^(1 - bias - mantissa_bits)
    mantissa = uint32_t(std::ldexp(a, bias - 1 + mantissa_bits));
    biased = 0;
  } else {
    mantissa = uint32_t(std::ldexp(m * 2.0 - 1.0, mantissa_bits));
  }
  return uint16_t(sign | (uint32_t(biased) << mantissa_bits) | mantissa);
}

double decode16(uint16_t bits, int exponent_bits, int mantissa_bits) {
  const bool negative = bits & 0x8000;
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const int max_biased = (1 << exponent_bits) - 1;
  const int biased = (bits >> mantissa_bits) & max_biased;
  const uint32_t mantissa = bits & ((1u << mantissa_bits) - 1);
  double value;
  if (biased == max_biased) {
    value = mantissa ? kNaN : std::numeric_limits<double>::infinity();
  } else if (biased == 0) {
    value = std::ldexp(double(mantissa), 1 - bias - mantissa_bits);
  } else {
    value = std::ldexp(1.0 + std::ldexp(double(mantissa), -mantissa_bits), biased - bias);
  }
  return negative ? -value : value;
}

constexpr int kF16ExponentBits = 5, kF16MantissaBits = 10;
constexpr int kBf16ExponentBits = 8, kBf16MantissaBits = 7;
}  // namespace

uint16_t f16_bits(double x) {
  return encode16(round_to(DType::f16, x), kF16ExponentBits, kF16MantissaBits, kF16QuietNaN);
}
double from_f16_bits(uint16_t bits) { return decode16(bits, kF16ExponentBits, kF16MantissaBits); }
uint16_t bf16_bits(double x) {
  return encode16(round_to(DType::bf16, x), kBf16ExponentBits, kBf16MantissaBits, kBf16QuietNaN);
}
double from_bf16_bits(uint16_t bits) {
  return decode16(bits, kBf16ExponentBits, kBf16MantissaBits);
}

// ---- random inputs ---------------------------------------------------------------------------

std::vector<double> random_normal(int64_t n, uint64_t seed, DType dtype, double stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, stddev);
  std::vector<double> v(size_t(std::max<int64_t>(n, 0)));
  for (double& x : v) x = round_to(dtype, normal(rng));
  return v;
}

std::vector<int> random_ints(int64_t n, uint64_t seed, int lo, int hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<int> v(size_t(std::max<int64_t>(n, 0)));
  for (int& x : v) x = dist(rng);
  return v;
}

// ---- buffers -----------------------------------------------------------------------------------

Buffer::Buffer(Device device, size_t bytes) : device_(device), bytes_(bytes) {
  const size_t alloc = std::max<size_t>(bytes, 1);
  if (device == Device::cpu) {
    data_ = ::operator new(alloc);
    return;
  }
#if defined(FLASHATTN_TESTS_CUDA)
  cuda_check(cudaMalloc(&data_, alloc), "cudaMalloc");
#else
  throw std::runtime_error("tests built without CUDA: cannot allocate on cuda");
#endif
}

void Buffer::release() {
  if (!data_) return;
  if (device_ == Device::cpu) {
    ::operator delete(data_);
  } else {
#if defined(FLASHATTN_TESTS_CUDA)
    cudaFree(data_);
#endif
  }
  data_ = nullptr;
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& o) noexcept : device_(o.device_), data_(o.data_), bytes_(o.bytes_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::upload(const void* host, size_t bytes) {
  if (bytes == 0) return;
  if (device_ == Device::cpu) {
    std::memcpy(data_, host, bytes);
    return;
  }
#if defined(FLASHATTN_TESTS_CUDA)
  cuda_check(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
#endif
}

void Buffer::download(void* host, size_t bytes) const {
  if (bytes == 0) return;
  if (device_ == Device::cpu) {
    std::memcpy(host, data_, bytes);
    return;
  }
#if defined(FLASHATTN_TESTS_CUDA)
  // cudaMemcpy waits for the legacy default stream, where the library ran.
  cuda_check(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
#endif
}

std::vector<uint8_t> Buffer::raw() const {
  std::vector<uint8_t> bytes(bytes_);
  download(bytes.data(), bytes_);
  return bytes;
}

std::vector<uint8_t> encode(const std::vector<double>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * element_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::f16: {
        const uint16_t b = f16_bits(values[i]);
        std::memcpy(&bytes[2 * i], &b, 2);
        break;
      }
      case DType::bf16: {
        const uint16_t b = bf16_bits(values[i]);
        std::memcpy(&bytes[2 * i], &b, 2);
        break;
      }
      case DType::f32: {
        const float f = float(values[i]);
        std::memcpy(&bytes[4 * i], &f, 4);
        break;
      }
      case DType::i32: {
        const int32_t x = int32_t(values[i]);
        std::memcpy(&bytes[4 * i], &x, 4);
        break;
      }
      case DType::e4m3:
        bytes[i] = e4m3_bits(values[i]);
        break;
    }
  }
  return bytes;
}

std::vector<double> decode(const std::vector<uint8_t>& bytes, DType dtype) {
  const size_t n = bytes.size() / element_size(dtype);
  std::vector<double> values(n);
  for (size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::f16: {
        uint16_t b;
        std::memcpy(&b, &bytes[2 * i], 2);
        values[i] = from_f16_bits(b);
        break;
      }
      case DType::bf16: {
        uint16_t b;
        std::memcpy(&b, &bytes[2 * i], 2);
        values[i] = from_bf16_bits(b);
        break;
      }
      case DType::f32: {
        float f;
        std::memcpy(&f, &bytes[4 * i], 4);
        values[i] = f;
        break;
      }
      case DType::i32: {
        int32_t x;
        std::memcpy(&x, &bytes[4 * i], 4);
        values[i] = x;
        break;
      }
      case DType::e4m3:
        values[i] = from_e4m3_bits(bytes[i]);
        break;
    }
  }
  return values;
}

Buffer to_device(const std::vector<double>& values, DType dtype, Device device) {
  const std::vector<uint8_t> bytes = encode(values, dtype);
  Buffer b(device, bytes.size());
  b.upload(bytes.data(), bytes.size());
  return b;
}

std::vector<double> from_device(const Buffer& buffer, DType dtype) {
  return decode(buffer.raw(), dtype);
}

Buffer to_device_i32(const std::vector<int>& values, Device device) {
  Buffer b(device, values.size() * sizeof(int));
  b.upload(values.data(), values.size() * sizeof(int));
  return b;
}

Buffer poisoned(DType dtype, int64_t n, Device device) {
  return to_device(std::vector<double>(size_t(n), kNaN), dtype, device);
}

Tensor i32_tensor(const Buffer& b, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(b.data(), DType::i32, shape, b.device());
}

Tensor f32_vector(const Buffer& b, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(b.data(), DType::f32, shape, b.device());
}

// ---- views -------------------------------------------------------------------------------------

int64_t View::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

int64_t View::extent() const {
  if (numel() == 0) return offset;
  int64_t last = offset;
  for (int i = 0; i < ndim; ++i) last += (shape[i] - 1) * stride[i];
  return last + 1;
}

View contiguous_view(std::initializer_list<int64_t> shape, int64_t offset) {
  View v;
  v.ndim = int(shape.size());
  int i = 0;
  for (int64_t s : shape) v.shape[i++] = s;
  int64_t stride = 1;
  for (i = v.ndim - 1; i >= 0; --i) {
    v.stride[i] = stride;
    stride *= v.shape[i];
  }
  v.offset = offset;
  return v;
}

View strided_view(std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides,
                  int64_t offset) {
  View v;
  v.ndim = int(shape.size());
  int i = 0;
  for (int64_t s : shape) v.shape[i++] = s;
  i = 0;
  for (int64_t s : strides) v.stride[i++] = s;
  v.offset = offset;
  return v;
}

View padded_view(std::initializer_list<int64_t> shape, int64_t pad) {
  View v = contiguous_view(shape);
  int64_t stride = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.stride[i] = stride;
    stride = stride * v.shape[i] + (i > 0 ? pad : 0);  // pad after each d-run, row, batch
  }
  return v;
}

namespace {
// Calls f(flat index in plain order, element offset) for every element of the view.
void for_each_element(const View& view, const std::function<void(int64_t, int64_t)>& f) {
  const int64_t n = view.numel();
  int64_t idx[4] = {0, 0, 0, 0};
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t off = view.offset;
    for (int i = 0; i < view.ndim; ++i) off += idx[i] * view.stride[i];
    f(flat, off);
    for (int i = view.ndim - 1; i >= 0; --i) {
      if (++idx[i] < view.shape[i]) break;
      idx[i] = 0;
    }
  }
}
}  // namespace

void scatter(std::vector<double>& buf, const View& view, const std::vector<double>& plain) {
  if (int64_t(buf.size()) < view.extent()) buf.resize(size_t(view.extent()), kNaN);
  for_each_element(view, [&](int64_t flat, int64_t off) { buf[size_t(off)] = plain[size_t(flat)]; });
}

std::vector<double> gather(const std::vector<double>& buf, const View& view) {
  std::vector<double> plain(size_t(view.numel()));
  for_each_element(view, [&](int64_t flat, int64_t off) { plain[size_t(flat)] = buf[size_t(off)]; });
  return plain;
}

bool poison_outside_view_intact(const std::vector<double>& buf, const View& view) {
  std::vector<bool> inside(buf.size(), false);
  for_each_element(view, [&](int64_t, int64_t off) {
    if (size_t(off) < inside.size()) inside[size_t(off)] = true;
  });
  for (size_t i = 0; i < buf.size(); ++i) {
    if (!inside[i] && !std::isnan(buf[i])) return false;
  }
  return true;
}

Tensor tensor_of(const Buffer& buffer, DType dtype, const View& view) {
  char* base = static_cast<char*>(buffer.data()) + view.offset * int64_t(element_size(dtype));
  Tensor t;
  t.data = base;
  t.dtype = dtype;
  t.device = buffer.device();
  t.ndim = view.ndim;
  for (int i = 0; i < view.ndim; ++i) {
    t.shape[i] = view.shape[i];
    t.stride[i] = view.stride[i];
  }
  return t;
}

// ---- oracle ----------------------------------------------------------------------------------

OracleOut run_oracle(DType dtype, const double* q, const double* k, const double* v, int sq,
                     int sk, int h, int hk, int d, const flashattn_ref::Options& opt) {
  OracleOut r;
  const size_t n_out = size_t(sq) * h * d, n_lse = size_t(h) * sq;
  r.out64.resize(n_out);
  r.out_lowp.resize(n_out);
  r.lse64.resize(n_lse);
  r.lse_lowp.resize(n_lse);
  flashattn_ref::attention(q, k, v, sq, sk, h, hk, d, opt, r.out64.data(), r.lse64.data());
  flashattn_ref::attention_lowp(storage_of(dtype), q, k, v, sq, sk, h, hk, d, opt,
                                r.out_lowp.data(), r.lse_lowp.data());
  return r;
}

// ---- pass rule -------------------------------------------------------------------------------

double output_floor(DType dtype, double magnitude) {
  const double rel = dtype == DType::f32 ? kOutputFloor32 : kOutputFloor16;
  return rel * std::max(magnitude, kMinMagnitude);
}

double lse_floor(DType dtype) { return dtype == DType::f32 ? kLseFloor32 : kLseFloor16; }

namespace {

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

// Index of the largest difference (NaN or a mismatched infinity counts as largest).
int64_t worst_index(const std::vector<double>& a, const std::vector<double>& b) {
  int64_t worst = -1;
  double worst_diff = -1.0;
  for (size_t i = 0; i < a.size(); ++i) {
    double diff;
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      diff = std::numeric_limits<double>::infinity();
    } else if (a[i] == b[i]) {
      diff = 0.0;
    } else {
      diff = std::fabs(a[i] - b[i]);
    }
    if (diff > worst_diff) {
      worst_diff = diff;
      worst = int64_t(i);
    }
  }
  return worst;
}

::testing::AssertionResult check_rule(const std::string& what, const std::vector<double>& impl,
                                      const std::vector<double>& ref64,
                                      const std::vector<double>& lowp, double floor,
                                      double lowp_limit) {
  if (impl.size() != ref64.size() || lowp.size() != ref64.size()) {
    return ::testing::AssertionFailure() << what << ": size mismatch " << impl.size() << " vs "
                                         << ref64.size();
  }
  const int64_t n = int64_t(ref64.size());
  const double err = flashattn_ref::max_abs_diff(impl.data(), ref64.data(), n);
  const double err_lowp = flashattn_ref::max_abs_diff(lowp.data(), ref64.data(), n);
  if (!(err_lowp <= lowp_limit)) {
    return ::testing::AssertionFailure()
           << what << ": the oracle's low-precision and float64 paths disagree by " << err_lowp
           << " (> " << lowp_limit << "): a bug in tests/reference, not in the library";
  }
  const double tol = 2.0 * err_lowp + floor;
  // How close each check came to its tolerance, in the XML report (--gtest_output=xml:FILE).
  ::testing::Test::RecordProperty(what + " share of tolerance", std::to_string(err / tol));
  if (err <= tol) return ::testing::AssertionSuccess();
  const int64_t at = worst_index(impl, ref64);
  std::ostringstream os;
  os << what << ": max|impl - f64| = " << err << " > tolerance " << tol
     << " (2 * max|lowp - f64| = " << 2.0 * err_lowp << ", floor " << floor << "); worst at flat "
     << at << ": impl " << impl[size_t(at)] << ", f64 " << ref64[size_t(at)] << ", lowp "
     << lowp[size_t(at)];
  return ::testing::AssertionFailure() << os.str();
}

}  // namespace

::testing::AssertionResult outputs_close(const std::string& what, const std::vector<double>& impl,
                                         const std::vector<double>& ref64,
                                         const std::vector<double>& lowp, DType dtype) {
  const double magnitude = std::max(max_abs(ref64), kMinMagnitude);
  const double limit = (dtype == DType::f32 ? kOracleConsistency32 : kOracleConsistency16) * magnitude;
  return check_rule(what, impl, ref64, lowp, output_floor(dtype, max_abs(ref64)), limit);
}

::testing::AssertionResult lse_close(const std::string& what, const std::vector<double>& impl,
                                     const std::vector<double>& ref64,
                                     const std::vector<double>& lowp, DType dtype) {
  return check_rule(what, impl, ref64, lowp, lse_floor(dtype), kOracleLseConsistency);
}

::testing::AssertionResult results_agree(const std::string& what, const std::vector<double>& a,
                                         const std::vector<double>& b,
                                         const std::vector<double>& ref64,
                                         const std::vector<double>& lowp, DType dtype) {
  const int64_t n = int64_t(ref64.size());
  const double err_lowp = flashattn_ref::max_abs_diff(lowp.data(), ref64.data(), n);
  const double tol = 2.0 * err_lowp + output_floor(dtype, max_abs(ref64));
  const double diff = flashattn_ref::max_abs_diff(a.data(), b.data(), int64_t(a.size()));
  if (a.size() == b.size() && diff <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max|a - b| = " << diff << " > " << tol;
}

// ---- devices -----------------------------------------------------------------------------------

std::string unavailable_reason(Device device) {
  if (device == Device::cpu) return "";
  if (!flashattn::cuda_available()) return "no CUDA device (or flashattn built without CUDA)";
#if !defined(FLASHATTN_TESTS_CUDA)
  return "tests built without CUDA (FLASHATTN_CUDA=OFF)";
#else
  return "";
#endif
}

const char* device_label(Device device) { return device == Device::cuda ? "cuda" : "cpu"; }

}  // namespace fa_test
