// flashattn._C: the nanobind extension under the `flashattn` Python package.
//
// It is deliberately thin: every argument arrives as a DLPack tensor of any framework on any
// device (nb::ndarray), becomes a non-owning flashattn::Tensor view, and goes to the C++ API,
// which validates everything. Output allocation, framework detection and flash_attn-compatible
// signatures live in the pure-Python layer (flashattn/interface.py).
//
// Errors: flashattn::Error surfaces with its message unchanged, as
//   invalid_argument -> ValueError, type_error -> TypeError,
//   unsupported -> NotImplementedError, runtime -> RuntimeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "flashattn/flashattn.h"

namespace nb = nanobind;

namespace {

using flashattn::Device;
using flashattn::DType;
using flashattn::Error;
using flashattn::Tensor;

// The Python layer marks an integer array that holds the bit patterns of a dtype DLPack cannot
// export as the tuple (tag, integer view): bfloat16 (NumPy with ml_dtypes.bfloat16) as a uint16
// view, float8_e4m3fn (torch, NumPy with ml_dtypes) as a uint8 view.
constexpr int kBits8 = 8;
constexpr int kBits16 = 16;
constexpr int kBits32 = 32;

struct BitsTag {
  const char* tag;
  int bits;  // of the integer view
  DType dtype;
};
constexpr BitsTag kBf16Bits{"bfloat16_bits", kBits16, DType::bf16};
constexpr BitsTag kE4m3Bits{"float8_e4m3fn_bits", kBits8, DType::e4m3};
constexpr BitsTag kBitsTags[] = {kBf16Bits, kE4m3Bits};

[[noreturn]] void fail(Error::Kind kind, const std::string& message) { throw Error(kind, message); }

std::string py_type_name(nb::handle obj) {
  return nb::cast<std::string>(nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())))));
}

// "int64", "float64", "bool8", ... for messages.
std::string dlpack_dtype_name(const nb::dlpack::dtype& dt) {
  using Code = nb::dlpack::dtype_code;
  std::string kind;
  switch (static_cast<Code>(dt.code)) {
    case Code::Int: kind = "int"; break;
    case Code::UInt: kind = "uint"; break;
    case Code::Float: kind = "float"; break;
    case Code::Bfloat: kind = "bfloat"; break;
    case Code::Complex: kind = "complex"; break;
    case Code::Bool: kind = "bool"; break;
    default: kind = "dlpack_code" + std::to_string(int(dt.code)) + "_"; break;
  }
  std::string name = kind + std::to_string(int(dt.bits));
  if (dt.lanes != 1) name += "x" + std::to_string(int(dt.lanes));
  return name;
}

// bits: the tag the Python layer put on an integer view (nullptr: none).
DType to_dtype(const nb::dlpack::dtype& dt, const BitsTag* bits, const char* name) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(dt.code);
  if (dt.lanes == 1) {
    if (code == Code::Float && dt.bits == kBits16) return DType::f16;
    if (code == Code::Float && dt.bits == kBits32) return DType::f32;
    if (code == Code::Bfloat && dt.bits == kBits16) return DType::bf16;
    if (code == Code::Float8_E4M3FN && dt.bits == kBits8) return DType::e4m3;
    if (code == Code::Int && dt.bits == kBits32) return DType::i32;
    if (bits && (code == Code::UInt || code == Code::Int) && dt.bits == bits->bits)
      return bits->dtype;
  }
  fail(Error::Kind::type_error, std::string(name) + ": dtype " + dlpack_dtype_name(dt) +
                                    " is not supported; expected float16, bfloat16, " +
                                    "float8_e4m3fn, float32 or int32");
}

Device to_device(int device_type, const char* name) {
  if (device_type == nb::device::cpu::value) return Device::cpu;
  if (device_type == nb::device::cuda::value) return Device::cuda;
  fail(Error::Kind::invalid_argument,
       std::string(name) + ": DLPack device type " + std::to_string(device_type) +
           " is not supported; expected CPU (1) or CUDA (2)");
}

// How many dimensions an argument may have at least: 1, or 0 for the FP8 descale factors
// (a scalar may have shape ()).
enum class MinDims { one, zero };

// A flashattn::Tensor view of an imported DLPack array (strides in elements, as DLPack has).
template <typename Array>
Tensor view_of(const Array& a, const BitsTag* bits, const char* name, MinDims min_dims) {
  const int ndim = static_cast<int>(a.ndim());
  const int least = min_dims == MinDims::zero ? 0 : 1;
  if (ndim < least || ndim > flashattn::kMaxDims)
    fail(Error::Kind::invalid_argument, std::string(name) + ": has " + std::to_string(ndim) +
                                            " dimensions; flashattn tensors have " +
                                            std::to_string(least) + " to " +
                                            std::to_string(flashattn::kMaxDims));
  Tensor t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = to_dtype(a.dtype(), bits, name);
  t.device = to_device(a.device_type(), name);
  t.device_index = t.device == Device::cuda ? a.device_id() : 0;
  t.ndim = ndim;
  bool empty = false;
  for (int i = 0; i < ndim; ++i) {
    t.shape[i] = static_cast<int64_t>(a.shape(i));
    t.stride[i] = a.stride(i);
    empty = empty || t.shape[i] == 0;
  }
  // The stride of a dimension of size 1 (or of any dimension of an empty tensor) never
  // addresses anything, and frameworks export arbitrary values there (NumPy: 0 for empty
  // arrays; torch: anything for size-1 dims). Normalise them to the row-major value, so that
  // the library's layout rules (e.g. "last dimension contiguous") see the real layout.
  int64_t row_major = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (empty || t.shape[i] == 1) t.stride[i] = row_major;
    row_major *= std::max<int64_t>(t.shape[i], 1);
  }
  return t;
}

// One tensor argument: the imported array (which keeps the producer's buffer alive for the
// call) and its view. An argument given as None stays undefined.
struct TensorArg {
  nb::ndarray<nb::ro> input;   // read-only import (inputs)
  nb::ndarray<> output;        // writable import (out, softmax_lse, caches, workspace)
  Tensor tensor;
};

// Unwraps a (tag, array) marker of the Python layer (kBitsTags); *bits: its tag, or nullptr.
nb::handle unwrap(nb::handle obj, const BitsTag** bits) {
  *bits = nullptr;
  if (nb::isinstance<nb::tuple>(obj)) {
    nb::tuple tup = nb::borrow<nb::tuple>(obj);
    if (tup.size() == 2 && nb::isinstance<nb::str>(tup[0])) {
      const std::string tag = nb::cast<std::string>(tup[0]);
      for (const BitsTag& known : kBitsTags) {
        if (tag == known.tag) {
          *bits = &known;
          return tup[1];
        }
      }
    }
  }
  return obj;
}

TensorArg import_input(nb::handle obj, const char* name, MinDims min_dims = MinDims::one) {
  TensorArg arg;
  if (obj.is_none()) return arg;
  const BitsTag* bits = nullptr;
  nb::handle src = unwrap(obj, &bits);
  if (!nb::try_cast(src, arg.input, /*convert=*/false))
    fail(Error::Kind::type_error, std::string(name) + ": expected a DLPack tensor (NumPy, " +
                                      "PyTorch, CuPy, JAX), got " + py_type_name(src));
  arg.tensor = view_of(arg.input, bits, name, min_dims);
  return arg;
}

TensorArg import_output(nb::handle obj, const char* name) {
  TensorArg arg;
  if (obj.is_none()) return arg;
  const BitsTag* bits = nullptr;
  nb::handle src = unwrap(obj, &bits);
  if (!nb::try_cast(src, arg.output, /*convert=*/false))
    fail(Error::Kind::type_error, std::string(name) + ": expected a writable DLPack tensor " +
                                      "(NumPy, PyTorch, CuPy), got " + py_type_name(src) +
                                      " (read-only or not a tensor)");
  arg.tensor = view_of(arg.output, bits, name, MinDims::one);
  return arg;
}

// The FP8 descale factors of a call (AttentionOptions::q/k/v_descale), None where not given.
struct Descales {
  TensorArg q, k, v;
  Descales(nb::handle q_descale, nb::handle k_descale, nb::handle v_descale)
      : q(import_input(q_descale, "q_descale", MinDims::zero)),
        k(import_input(k_descale, "k_descale", MinDims::zero)),
        v(import_input(v_descale, "v_descale", MinDims::zero)) {}
};

flashattn::AttentionOptions make_options(std::optional<float> softmax_scale, bool causal,
                                         int window_left, int window_right, float softcap,
                                         const Tensor& alibi_slopes, const Tensor& softmax_lse,
                                         const Descales& descales, std::uintptr_t stream,
                                         int num_threads) {
  flashattn::AttentionOptions o;
  o.q_descale = descales.q.tensor;
  o.k_descale = descales.k.tensor;
  o.v_descale = descales.v.tensor;
  o.softmax_scale = softmax_scale;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = softcap;
  o.alibi_slopes = alibi_slopes;
  o.softmax_lse = softmax_lse;
  o.stream = reinterpret_cast<void*>(stream);
  o.num_threads = num_threads;
  return o;
}

// ---- entry points ------------------------------------------------------------------------------

void forward(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle softmax_lse,
             nb::handle alibi_slopes, nb::handle q_descale, nb::handle k_descale,
             nb::handle v_descale, std::optional<float> softmax_scale, bool causal,
             int window_left, int window_right, float softcap, std::uintptr_t stream,
             int num_threads) {
  TensorArg tq = import_input(q, "q"), tk = import_input(k, "k"), tv = import_input(v, "v");
  TensorArg to = import_output(out, "out"), tl = import_output(softmax_lse, "softmax_lse");
  TensorArg ta = import_input(alibi_slopes, "alibi_slopes");
  Descales descales(q_descale, k_descale, v_descale);
  auto options = make_options(softmax_scale, causal, window_left, window_right, softcap,
                              ta.tensor, tl.tensor, descales, stream, num_threads);
  nb::gil_scoped_release nogil;
  flashattn::forward(tq.tensor, tk.tensor, tv.tensor, to.tensor, options);
}

void forward_varlen(nb::handle q, nb::handle k, nb::handle v, nb::handle out,
                    nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int max_seqlen_q,
                    int max_seqlen_k, nb::handle seqused_k, nb::handle leftpad_k,
                    nb::handle block_table, nb::handle softmax_lse, nb::handle alibi_slopes,
                    nb::handle q_descale, nb::handle k_descale, nb::handle v_descale,
                    std::optional<float> softmax_scale, bool causal, int window_left,
                    int window_right, float softcap, std::uintptr_t stream, int num_threads) {
  TensorArg tq = import_input(q, "q"), tk = import_input(k, "k"), tv = import_input(v, "v");
  TensorArg to = import_output(out, "out"), tl = import_output(softmax_lse, "softmax_lse");
  TensorArg ta = import_input(alibi_slopes, "alibi_slopes");
  TensorArg tcq = import_input(cu_seqlens_q, "cu_seqlens_q");
  TensorArg tck = import_input(cu_seqlens_k, "cu_seqlens_k");
  TensorArg tsu = import_input(seqused_k, "seqused_k");
  TensorArg tlp = import_input(leftpad_k, "leftpad_k");
  TensorArg tbt = import_input(block_table, "block_table");
  flashattn::VarlenArgs args;
  args.cu_seqlens_q = tcq.tensor;
  args.cu_seqlens_k = tck.tensor;
  args.max_seqlen_q = max_seqlen_q;
  args.max_seqlen_k = max_seqlen_k;
  args.seqused_k = tsu.tensor;
  args.leftpad_k = tlp.tensor;
  args.block_table = tbt.tensor;
  Descales descales(q_descale, k_descale, v_descale);
  auto options = make_options(softmax_scale, causal, window_left, window_right, softcap,
                              ta.tensor, tl.tensor, descales, stream, num_threads);
  nb::gil_scoped_release nogil;
  flashattn::forward_varlen(tq.tensor, tk.tensor, tv.tensor, to.tensor, args, options);
}

// The tensors of a kv-cache call, imported once for plan_kvcache and forward_kvcache.
struct KVCacheCall {
  TensorArg q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens,
      cache_batch_idx, cache_leftpad, block_table, alibi_slopes, softmax_lse;
  flashattn::KVCacheArgs args;

  KVCacheCall(nb::handle q_, nb::handle k_cache_, nb::handle v_cache_, nb::handle k_,
              nb::handle v_, nb::handle rotary_cos_, nb::handle rotary_sin_,
              nb::handle cache_seqlens_, nb::handle cache_batch_idx_, nb::handle cache_leftpad_,
              nb::handle block_table_, nb::handle alibi_slopes_, nb::handle softmax_lse_,
              bool rotary_interleaved, int num_splits) {
    q = import_input(q_, "q");
    // The caches are written only when k/v are appended: import them writable then.
    const bool appends = !k_.is_none() || !v_.is_none();
    k_cache = appends ? import_output(k_cache_, "k_cache") : import_input(k_cache_, "k_cache");
    v_cache = appends ? import_output(v_cache_, "v_cache") : import_input(v_cache_, "v_cache");
    k_new = import_input(k_, "k");
    v_new = import_input(v_, "v");
    rotary_cos = import_input(rotary_cos_, "rotary_cos");
    rotary_sin = import_input(rotary_sin_, "rotary_sin");
    cache_seqlens = import_input(cache_seqlens_, "cache_seqlens");
    cache_batch_idx = import_input(cache_batch_idx_, "cache_batch_idx");
    cache_leftpad = import_input(cache_leftpad_, "cache_leftpad");
    block_table = import_input(block_table_, "block_table");
    alibi_slopes = import_input(alibi_slopes_, "alibi_slopes");
    softmax_lse = import_output(softmax_lse_, "softmax_lse");
    args.cache_seqlens = cache_seqlens.tensor;
    args.cache_batch_idx = cache_batch_idx.tensor;
    args.cache_leftpad = cache_leftpad.tensor;
    args.block_table = block_table.tensor;
    args.k_new = k_new.tensor;
    args.v_new = v_new.tensor;
    args.rotary_cos = rotary_cos.tensor;
    args.rotary_sin = rotary_sin.tensor;
    args.rotary_interleaved = rotary_interleaved;
    args.num_splits = num_splits;
  }
};

std::tuple<int, bool, size_t, std::string> plan_kvcache(
    nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle k, nb::handle v,
    nb::handle rotary_cos, nb::handle rotary_sin, nb::handle cache_seqlens,
    nb::handle cache_batch_idx, nb::handle cache_leftpad, nb::handle block_table,
    nb::handle alibi_slopes, nb::handle q_descale, nb::handle k_descale, nb::handle v_descale,
    std::optional<float> softmax_scale, bool causal, int window_left, int window_right,
    float softcap, bool rotary_interleaved, int num_splits) {
  KVCacheCall call(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                   cache_batch_idx, cache_leftpad, block_table, alibi_slopes, nb::none(),
                   rotary_interleaved, num_splits);
  Descales descales(q_descale, k_descale, v_descale);
  auto options = make_options(softmax_scale, causal, window_left, window_right, softcap,
                              call.alibi_slopes.tensor, Tensor{}, descales, 0, 0);
  flashattn::Plan plan =
      flashattn::plan_kvcache(call.q.tensor, call.k_cache.tensor, call.v_cache.tensor,
                              call.args, options);
  return {plan.num_splits, plan.pack_gqa, plan.workspace_bytes, flashattn::kernel_name(plan.kernel)};
}

// The workspace: a contiguous writable buffer of any dtype on q's device.
void attach_workspace(const TensorArg& ws, const Tensor& q, flashattn::KVCacheArgs* args) {
  if (!ws.output.is_valid()) return;
  const Device device = to_device(ws.output.device_type(), "workspace");
  const int index = device == Device::cuda ? ws.output.device_id() : 0;
  if (device != q.device || index != q.device_index)
    fail(Error::Kind::invalid_argument,
         std::string("workspace: must be on q's device (") + flashattn::device_name(q.device) +
             ":" + std::to_string(q.device_index) + "), got " +
             flashattn::device_name(device) + ":" + std::to_string(index));
  // Frameworks export an arbitrary address (and strides) for zero elements: an empty workspace
  // becomes an aligned placeholder of 0 bytes, never touched (enough when
  // plan.workspace_bytes == 0, a "too small" error otherwise).
  alignas(256) static unsigned char empty_workspace[1];
  if (ws.output.nbytes() == 0) {
    args->workspace = empty_workspace;
    args->workspace_bytes = 0;
    return;
  }
  int64_t expected = 1;
  for (int i = static_cast<int>(ws.output.ndim()) - 1; i >= 0; --i) {
    if (ws.output.shape(i) != 1 && ws.output.stride(i) != expected)
      fail(Error::Kind::invalid_argument, "workspace: must be contiguous");
    expected *= static_cast<int64_t>(ws.output.shape(i));
  }
  args->workspace = ws.output.data();
  args->workspace_bytes = ws.output.nbytes();
}

void forward_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out,
                     nb::handle k, nb::handle v, nb::handle rotary_cos, nb::handle rotary_sin,
                     nb::handle cache_seqlens, nb::handle cache_batch_idx,
                     nb::handle cache_leftpad, nb::handle block_table, nb::handle softmax_lse,
                     nb::handle alibi_slopes, nb::handle q_descale, nb::handle k_descale,
                     nb::handle v_descale, std::optional<float> softmax_scale, bool causal,
                     int window_left, int window_right, float softcap, bool rotary_interleaved,
                     int num_splits, nb::handle workspace, std::uintptr_t stream,
                     int num_threads) {
  KVCacheCall call(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                   cache_batch_idx, cache_leftpad, block_table, alibi_slopes, softmax_lse,
                   rotary_interleaved, num_splits);
  TensorArg to = import_output(out, "out");
  TensorArg ws;
  if (!workspace.is_none() && !nb::try_cast(workspace, ws.output, /*convert=*/false))
    fail(Error::Kind::type_error,
         "workspace: expected a writable DLPack tensor, got " + py_type_name(workspace));
  attach_workspace(ws, call.q.tensor, &call.args);
  Descales descales(q_descale, k_descale, v_descale);
  auto options = make_options(softmax_scale, causal, window_left, window_right, softcap,
                              call.alibi_slopes.tensor, call.softmax_lse.tensor, descales, stream,
                              num_threads);
  nb::gil_scoped_release nogil;
  flashattn::forward_kvcache(call.q.tensor, call.k_cache.tensor, call.v_cache.tensor, to.tensor,
                             call.args, options);
}

// Waits for the stream (0: the whole current device), then throws the first index fault its
// kernels recorded (flashattn::check_device_status).
void check_device_status(std::uintptr_t stream) {
  nb::gil_scoped_release nogil;
  flashattn::check_device_status(reinterpret_cast<void*>(stream));
}

// Address of an array's first element (for aligning a workspace slice in Python).
std::uintptr_t data_ptr(nb::handle obj) {
  nb::ndarray<nb::ro> array;
  if (!nb::try_cast(obj, array, /*convert=*/false))
    fail(Error::Kind::type_error, "array: expected a DLPack tensor, got " + py_type_name(obj));
  return reinterpret_cast<std::uintptr_t>(array.data());
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    PyObject* type = PyExc_RuntimeError;
    switch (e.kind()) {
      case Error::Kind::invalid_argument: type = PyExc_ValueError; break;
      case Error::Kind::type_error: type = PyExc_TypeError; break;
      case Error::Kind::unsupported: type = PyExc_NotImplementedError; break;
      case Error::Kind::runtime: type = PyExc_RuntimeError; break;
    }
    PyErr_SetString(type, e.what());
  }
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashattn C++ extension (use the `flashattn` package, not this module)";
  nb::register_exception_translator(translate);

  // Every tensor argument accepts None, so that a missing one reaches the library's validation
  // ("k: is required") rather than nanobind's signature listing.
  m.def("forward", &forward, nb::arg("q").none(), nb::arg("k").none(), nb::arg("v").none(),
        nb::arg("out").none(),
        nb::arg("softmax_lse").none(), nb::arg("alibi_slopes").none(),
        nb::arg("q_descale").none(), nb::arg("k_descale").none(), nb::arg("v_descale").none(),
        nb::arg("softmax_scale").none(), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap"), nb::arg("stream"), nb::arg("num_threads"));
  m.def("forward_varlen", &forward_varlen, nb::arg("q").none(), nb::arg("k").none(),
        nb::arg("v").none(), nb::arg("out").none(), nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(),
        nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("seqused_k").none(),
        nb::arg("leftpad_k").none(), nb::arg("block_table").none(),
        nb::arg("softmax_lse").none(), nb::arg("alibi_slopes").none(),
        nb::arg("q_descale").none(), nb::arg("k_descale").none(), nb::arg("v_descale").none(),
        nb::arg("softmax_scale").none(), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap"), nb::arg("stream"), nb::arg("num_threads"));
  m.def("plan_kvcache", &plan_kvcache, nb::arg("q").none(), nb::arg("k_cache").none(),
        nb::arg("v_cache").none(),
        nb::arg("k").none(), nb::arg("v").none(), nb::arg("rotary_cos").none(),
        nb::arg("rotary_sin").none(), nb::arg("cache_seqlens").none(),
        nb::arg("cache_batch_idx").none(), nb::arg("cache_leftpad").none(),
        nb::arg("block_table").none(), nb::arg("alibi_slopes").none(),
        nb::arg("q_descale").none(), nb::arg("k_descale").none(), nb::arg("v_descale").none(),
        nb::arg("softmax_scale").none(), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap"), nb::arg("rotary_interleaved"),
        nb::arg("num_splits"),
        "Returns (num_splits, pack_gqa, workspace_bytes) of the matching forward_kvcache call.");
  m.def("forward_kvcache", &forward_kvcache, nb::arg("q").none(), nb::arg("k_cache").none(),
        nb::arg("v_cache").none(), nb::arg("out").none(), nb::arg("k").none(), nb::arg("v").none(),
        nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(),
        nb::arg("cache_seqlens").none(), nb::arg("cache_batch_idx").none(),
        nb::arg("cache_leftpad").none(), nb::arg("block_table").none(),
        nb::arg("softmax_lse").none(), nb::arg("alibi_slopes").none(),
        nb::arg("q_descale").none(), nb::arg("k_descale").none(), nb::arg("v_descale").none(),
        nb::arg("softmax_scale").none(), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap"), nb::arg("rotary_interleaved"),
        nb::arg("num_splits"), nb::arg("workspace").none(), nb::arg("stream"),
        nb::arg("num_threads"));
  m.def("data_ptr", &data_ptr, nb::arg("array"));
  m.def("check_device_status", &check_device_status, nb::arg("stream"));
  m.def("cuda_available", &flashattn::cuda_available);
  m.def("build_info", &flashattn::build_info);
  m.attr("BF16_BITS_TAG") = kBf16Bits.tag;
  m.attr("E4M3_BITS_TAG") = kE4m3Bits.tag;
  m.attr("MAX_SPLITS") = flashattn::kMaxSplits;
}
