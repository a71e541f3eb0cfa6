// HostProblem -> buffers on the chosen device -> library call, timed.
// CPU runs are timed with std::chrono, CUDA runs with CUDA events on the legacy default stream
// (the stream the library is given). Built with CUDA, the tool uses the CUDA runtime directly:
// FLASHATTN_CLI_CUDA is set by tools/CMakeLists.txt when FLASHATTN_CUDA is ON.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>

#include "cli.h"

#if defined(FLASHATTN_CLI_CUDA)
#include <cuda_runtime.h>
#endif

namespace facli {
namespace {

using flashattn::Error;
using flashattn::Tensor;

constexpr unsigned char kPoisonByte = 0xFF;  // 0xFFFF / 0xFFFFFFFF: NaN in fp16, bf16 and fp32

#if defined(FLASHATTN_CLI_CUDA)
void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(Error::Kind::runtime, std::string("CUDA ") + what + ": " + cudaGetErrorString(status));
}
#endif

// Memory on the CPU (malloc) or the GPU (cudaMalloc), moved, never copied.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, size_t bytes) : device_(device), bytes_(bytes) {
    if (bytes == 0) return;
#if defined(FLASHATTN_CLI_CUDA)
    if (device == Device::cuda) {
      check_cuda(cudaMalloc(&ptr_, bytes), "cudaMalloc");
      return;
    }
#endif
    ptr_ = std::malloc(bytes);
    if (!ptr_) throw Error(Error::Kind::runtime, "out of host memory (" + std::to_string(bytes) + " bytes)");
  }
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    release();
    std::swap(device_, o.device_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void* data() const { return ptr_; }

  void upload(const void* src) {
    if (bytes_ == 0) return;
#if defined(FLASHATTN_CLI_CUDA)
    if (device_ == Device::cuda) return check_cuda(cudaMemcpy(ptr_, src, bytes_, cudaMemcpyHostToDevice), "upload");
#endif
    std::memcpy(ptr_, src, bytes_);
  }
  void download(void* dst) const {
    if (bytes_ == 0) return;
#if defined(FLASHATTN_CLI_CUDA)
    if (device_ == Device::cuda) return check_cuda(cudaMemcpy(dst, ptr_, bytes_, cudaMemcpyDeviceToHost), "download");
#endif
    std::memcpy(dst, ptr_, bytes_);
  }
  void poison() {
    if (bytes_ == 0) return;
#if defined(FLASHATTN_CLI_CUDA)
    if (device_ == Device::cuda) return check_cuda(cudaMemset(ptr_, kPoisonByte, bytes_), "memset");
#endif
    std::memset(ptr_, kPoisonByte, bytes_);
  }

 private:
  void release() {
    if (!ptr_) return;
#if defined(FLASHATTN_CLI_CUDA)
    if (device_ == Device::cuda) {
      cudaFree(ptr_);
      ptr_ = nullptr;
      return;
    }
#endif
    std::free(ptr_);
    ptr_ = nullptr;
  }
  Device device_ = Device::cpu;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <class T>
Buffer to_device(Device device, const std::vector<T>& host) {
  Buffer b(device, host.size() * sizeof(T));
  b.upload(host.data());
  return b;
}

// Storage codes (HostProblem) on the device: as they are, or one byte each for e4m3.
Buffer codes_to_device(Device device, const std::vector<uint16_t>& codes, DType t) {
  if (flashattn::dtype_size(t) == sizeof(uint16_t)) return to_device(device, codes);
  std::vector<uint8_t> bytes(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) bytes[i] = uint8_t(codes[i]);
  return to_device(device, bytes);
}

void download_codes(const Buffer& b, DType t, std::vector<uint16_t>& codes) {
  if (flashattn::dtype_size(t) == sizeof(uint16_t)) return b.download(codes.data());
  std::vector<uint8_t> bytes(codes.size());
  b.download(bytes.data());
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = bytes[i];
}

struct DeviceProblem {
  Buffer q, k, v, out, lse, k_new, v_new, cos, sin, alibi;
  Buffer cu_q, cu_k, cache_seqlens, block_table;
  Buffer q_descale, k_descale, v_descale;
};

DeviceProblem upload(const HostProblem& p, Device d) {
  const ProblemSpec& s = p.spec;
  DeviceProblem m;
  m.q = codes_to_device(d, p.q, s.dtype);
  m.k = codes_to_device(d, p.k, s.kv_dtype);
  m.v = codes_to_device(d, p.v, s.kv_dtype);
  m.q_descale = to_device(d, p.q_descale);
  m.k_descale = to_device(d, p.k_descale);
  m.v_descale = to_device(d, p.v_descale);
  m.out = Buffer(d, p.q.size() * sizeof(uint16_t));
  m.lse = Buffer(d, size_t(p.lse_size()) * sizeof(float));
  m.k_new = to_device(d, p.k_new);
  m.v_new = to_device(d, p.v_new);
  m.cos = to_device(d, p.rot_cos);
  m.sin = to_device(d, p.rot_sin);
  m.alibi = to_device(d, p.alibi);
  m.cu_q = to_device(d, p.cu_q);
  m.cu_k = to_device(d, p.cu_k);
  m.cache_seqlens = to_device(d, p.cache_seqlens);
  m.block_table = to_device(d, p.block_table);
  return m;
}

// The arguments of one library call, as views of the device buffers.
struct Call {
  Tensor q, k, v, out;
  flashattn::AttentionOptions options;
  flashattn::VarlenArgs varlen;
  flashattn::KVCacheArgs kvcache;
};

void set_kv_views(const HostProblem& p, const DeviceProblem& m, Device d, Call& c) {
  const ProblemSpec& s = p.spec;
  const int64_t hk = s.kv_heads, dim = s.head_dim;
  const DType t = s.kv_dtype;
  if (s.paged) {
    const int64_t pages = int64_t(p.block_table.size());
    c.k = Tensor::contiguous(m.k.data(), t, {pages, s.page_size, hk, dim}, d);
    c.v = Tensor::contiguous(m.v.data(), t, {pages, s.page_size, hk, dim}, d);
  } else if (s.mode == Mode::varlen) {
    c.k = Tensor::contiguous(m.k.data(), t, {p.kv_rows, hk, dim}, d);
    c.v = Tensor::contiguous(m.v.data(), t, {p.kv_rows, hk, dim}, d);
  } else {
    c.k = Tensor::contiguous(m.k.data(), t, {s.batch, s.seqlen_k, hk, dim}, d);
    c.v = Tensor::contiguous(m.v.data(), t, {s.batch, s.seqlen_k, hk, dim}, d);
  }
}

void set_varlen_args(const HostProblem& p, const DeviceProblem& m, Device d, Call& c) {
  const ProblemSpec& s = p.spec;
  c.varlen.cu_seqlens_q = Tensor::contiguous(m.cu_q.data(), DType::i32, {s.batch + 1}, d);
  c.varlen.cu_seqlens_k = Tensor::contiguous(m.cu_k.data(), DType::i32, {s.batch + 1}, d);
  c.varlen.max_seqlen_q = s.seqlen_q;
  c.varlen.max_seqlen_k = s.seqlen_k;
  if (s.paged)
    c.varlen.block_table = Tensor::contiguous(m.block_table.data(), DType::i32, {s.batch, p.max_pages}, d);
}

void set_kvcache_args(const HostProblem& p, const DeviceProblem& m, Device d, Call& c) {
  const ProblemSpec& s = p.spec;
  flashattn::KVCacheArgs& a = c.kvcache;
  a.cache_seqlens = Tensor::contiguous(m.cache_seqlens.data(), DType::i32, {s.batch}, d);
  if (s.paged) a.block_table = Tensor::contiguous(m.block_table.data(), DType::i32, {s.batch, p.max_pages}, d);
  if (s.append > 0) {
    a.k_new = Tensor::contiguous(m.k_new.data(), out_dtype(s), {s.batch, s.append, s.kv_heads, s.head_dim}, d);
    a.v_new = Tensor::contiguous(m.v_new.data(), out_dtype(s), {s.batch, s.append, s.kv_heads, s.head_dim}, d);
  }
  if (s.rotary != Rotary::none) {
    a.rotary_cos = Tensor::contiguous(m.cos.data(), out_dtype(s), {p.rotary_positions, s.head_dim / 2}, d);
    a.rotary_sin = Tensor::contiguous(m.sin.data(), out_dtype(s), {p.rotary_positions, s.head_dim / 2}, d);
    a.rotary_interleaved = s.rotary == Rotary::interleaved;
  }
  a.num_splits = s.splits;
}

void set_options(const HostProblem& p, const DeviceProblem& m, Device d, Call& c) {
  const ProblemSpec& s = p.spec;
  flashattn::AttentionOptions& o = c.options;
  o.causal = s.causal;
  o.window_left = s.window_left;
  o.window_right = s.window_right;
  o.softcap = s.softcap;
  o.num_threads = s.threads;
  if (s.alibi) o.alibi_slopes = Tensor::contiguous(m.alibi.data(), DType::f32, {s.heads}, d);
  // FP8: one descale per (batch, KV head), for the e4m3 tensors only.
  const auto descale = [&](const Buffer& b, const std::vector<float>& host) {
    return host.empty() ? Tensor{} : Tensor::contiguous(b.data(), DType::f32, {s.batch, s.kv_heads}, d);
  };
  o.q_descale = descale(m.q_descale, p.q_descale);
  o.k_descale = descale(m.k_descale, p.k_descale);
  o.v_descale = descale(m.v_descale, p.v_descale);
  if (s.mode == Mode::varlen)
    o.softmax_lse = Tensor::contiguous(m.lse.data(), DType::f32, {s.heads, p.q_rows}, d);
  else
    o.softmax_lse = Tensor::contiguous(m.lse.data(), DType::f32, {s.batch, s.heads, s.seqlen_q}, d);
}

Call make_call(const HostProblem& p, const DeviceProblem& m, Device d) {
  const ProblemSpec& s = p.spec;
  Call c;
  if (s.mode == Mode::varlen) {
    c.q = Tensor::contiguous(m.q.data(), s.dtype, {p.q_rows, s.heads, s.head_dim}, d);
    c.out = Tensor::contiguous(m.out.data(), out_dtype(s), {p.q_rows, s.heads, s.head_dim}, d);
    set_varlen_args(p, m, d, c);
  } else {
    c.q = Tensor::contiguous(m.q.data(), s.dtype, {s.batch, s.seqlen_q, s.heads, s.head_dim}, d);
    c.out = Tensor::contiguous(m.out.data(), out_dtype(s), {s.batch, s.seqlen_q, s.heads, s.head_dim}, d);
  }
  set_kv_views(p, m, d, c);
  if (s.mode == Mode::kvcache) set_kvcache_args(p, m, d, c);
  set_options(p, m, d, c);
  return c;
}

void invoke(Mode mode, const Call& c) {
  switch (mode) {
    case Mode::dense: return flashattn::forward(c.q, c.k, c.v, c.out, c.options);
    case Mode::varlen: return flashattn::forward_varlen(c.q, c.k, c.v, c.out, c.varlen, c.options);
    case Mode::kvcache: return flashattn::forward_kvcache(c.q, c.k, c.v, c.out, c.kvcache, c.options);
  }
}

void synchronize(Device d) {
#if defined(FLASHATTN_CLI_CUDA)
  if (d == Device::cuda) check_cuda(cudaDeviceSynchronize(), "synchronize");
#endif
  (void)d;
}

double time_ms(Device d, const std::function<void()>& fn) {
#if defined(FLASHATTN_CLI_CUDA)
  if (d == Device::cuda) {
    cudaEvent_t start, stop;
    check_cuda(cudaEventCreate(&start), "event");
    check_cuda(cudaEventCreate(&stop), "event");
    check_cuda(cudaEventRecord(start, nullptr), "event record");
    fn();
    check_cuda(cudaEventRecord(stop, nullptr), "event record");
    check_cuda(cudaEventSynchronize(stop), "event sync");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "event time");
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return ms;
  }
#endif
  (void)d;
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void fetch_results(const HostProblem& p, const DeviceProblem& m, RunOutput& r) {
  r.out.resize(p.q.size());
  m.out.download(r.out.data());
  r.lse.resize(size_t(p.lse_size()));
  m.lse.download(r.lse.data());
  if (p.spec.mode == Mode::kvcache && p.spec.append > 0) {
    r.k_cache.resize(p.k.size());
    r.v_cache.resize(p.v.size());
    download_codes(m.k, p.spec.kv_dtype, r.k_cache);
    download_codes(m.v, p.spec.kv_dtype, r.v_cache);
  }
}

}  // namespace

bool built_with_cuda() {
#if defined(FLASHATTN_CLI_CUDA)
  return true;
#else
  return false;
#endif
}

Device resolve_device(const std::string& name) {
  const bool gpu = built_with_cuda() && flashattn::cuda_available();
  if (name == "cpu") return Device::cpu;
  if (name == "auto") return gpu ? Device::cuda : Device::cpu;
  if (!built_with_cuda())
    throw Error(Error::Kind::unsupported, "--device cuda: this build has no CUDA backend (FLASHATTN_CUDA=OFF)");
  if (!gpu) throw Error(Error::Kind::runtime, "--device cuda: no CUDA device is visible");
  return Device::cuda;
}

// Outputs are poisoned (NaN) first; with fetch the first call's results come back, so an
// element the library never writes shows up as NaN in the check.
RunOutput execute(const HostProblem& p, const ExecConfig& config, bool fetch) {
  const Device d = config.device;
  DeviceProblem m = upload(p, d);
  const Call call = make_call(p, m, d);
  m.out.poison();
  m.lse.poison();
  RunOutput r;
  if (p.spec.mode == Mode::kvcache)
    r.splits_used = flashattn::plan_kvcache(call.q, call.k, call.v, call.kvcache, call.options).num_splits;
  const auto once = [&] { invoke(p.spec.mode, call); };
  for (int i = 0; i < config.warmup; ++i) {
    once();
    synchronize(d);
    if (i == 0 && fetch) fetch_results(p, m, r);
  }
  for (int i = 0; i < config.repeat; ++i) r.times_ms.push_back(time_ms(d, once));
  synchronize(d);
  if (config.warmup == 0 && fetch) fetch_results(p, m, r);
  return r;
}

}  // namespace facli
