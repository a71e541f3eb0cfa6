// The CUDA backend's entry points (src/api/backend.h): device queries, the choice of the
// compiled (dtype, head dim) instance, and the launch sequence attention -> combine.
#include <cutlass/numeric_types.h>

#include <map>
#include <type_traits>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "api/backend.h"
#include "common/rules.h"
#include "cuda/launch.h"

namespace flashattn {
namespace cuda {

namespace {

// ---- compiled instances ------------------------------------------------------------------
// cmake/cuda.cmake defines FLASHATTN_HAS_<DTYPE>_HDIM<D> for each instance file it builds; an
// instance that is not compiled must never be named in a call (its symbol does not exist).

template <typename Element, int kHeadDim>
constexpr bool kCompiled = false;

#ifdef FLASHATTN_HAS_BF16_HDIM32
template <> constexpr bool kCompiled<cutlass::bfloat16_t, 32> = true;
#endif
#ifdef FLASHATTN_HAS_BF16_HDIM64
template <> constexpr bool kCompiled<cutlass::bfloat16_t, 64> = true;
#endif
#ifdef FLASHATTN_HAS_BF16_HDIM96
template <> constexpr bool kCompiled<cutlass::bfloat16_t, 96> = true;
#endif
#ifdef FLASHATTN_HAS_BF16_HDIM128
template <> constexpr bool kCompiled<cutlass::bfloat16_t, 128> = true;
#endif
#ifdef FLASHATTN_HAS_BF16_HDIM192
template <> constexpr bool kCompiled<cutlass::bfloat16_t, 192> = true;
#endif
#ifdef FLASHATTN_HAS_BF16_HDIM256
template <> constexpr bool kCompiled<cutlass::bfloat16_t, 256> = true;
#endif
#ifdef FLASHATTN_HAS_FP16_HDIM32
template <> constexpr bool kCompiled<cutlass::half_t, 32> = true;
#endif
#ifdef FLASHATTN_HAS_FP16_HDIM64
template <> constexpr bool kCompiled<cutlass::half_t, 64> = true;
#endif
#ifdef FLASHATTN_HAS_FP16_HDIM96
template <> constexpr bool kCompiled<cutlass::half_t, 96> = true;
#endif
#ifdef FLASHATTN_HAS_FP16_HDIM128
template <> constexpr bool kCompiled<cutlass::half_t, 128> = true;
#endif
#ifdef FLASHATTN_HAS_FP16_HDIM192
template <> constexpr bool kCompiled<cutlass::half_t, 192> = true;
#endif
#ifdef FLASHATTN_HAS_FP16_HDIM256
template <> constexpr bool kCompiled<cutlass::half_t, 256> = true;
#endif

// Every head dim an instance can exist for, ascending, so the first fit is the smallest.
#define FLASHATTN_ALL_HEAD_DIMS 32, 64, 96, 128, 192, 256

// The smallest compiled kHeadDim >= head_dim, or 0.
template <typename Element, int D, int... Rest>
int smallest_head_dim(int head_dim) {
  if (kCompiled<Element, D> && head_dim <= D) return D;
  if constexpr (sizeof...(Rest) > 0) {
    return smallest_head_dim<Element, Rest...>(head_dim);
  } else {
    return 0;
  }
}

// Runs run_fwd<Element, kHeadDim> for the smallest fitting compiled kHeadDim; false if none.
template <typename Element, int D, int... Rest>
bool run_for_head_dim(const AttnParams& params, const KernelChoice& choice, cudaStream_t stream) {
  if constexpr (kCompiled<Element, D>) {
    if (params.head_dim <= D) {
      if (params.kv_storage != DType::e4m3) {
        run_fwd<Element, D>(params, choice, stream);
      } else if (params.q_storage == DType::e4m3) {
        // api/validate.cpp: an e4m3 q computes (and writes out) in bf16
        if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
          run_fwd_fp8<Element, D, true>(params, choice, stream);
        } else {
          throw Error(Error::Kind::runtime, "flashattn: an e4m3 q computes in bf16 (validate.cpp compute_dtype)");
        }
      } else {
        run_fwd_fp8<Element, D, false>(params, choice, stream);
      }
      return true;
    }
  }
  if constexpr (sizeof...(Rest) > 0) {
    return run_for_head_dim<Element, Rest...>(params, choice, stream);
  } else {
    return false;
  }
}

// decode_slots<Element, kHeadDim> of the smallest fitting compiled kHeadDim (none: zeros).
template <typename Element, int D, int... Rest>
DecodeSlots slots_for_head_dim(int device_index, int head_dim, bool paged) {
  if constexpr (kCompiled<Element, D>) {
    if (head_dim <= D) return decode_slots<Element, D>(device_index, paged);
  }
  if constexpr (sizeof...(Rest) > 0) {
    return slots_for_head_dim<Element, Rest...>(device_index, head_dim, paged);
  } else {
    return DecodeSlots{};
  }
}

template <typename Element, int D, int... Rest>
void append_compiled(std::string& out) {
  if (kCompiled<Element, D>) out += " " + std::to_string(D);
  if constexpr (sizeof...(Rest) > 0) append_compiled<Element, Rest...>(out);
}

int smallest_compiled(DType dtype, int head_dim) {
  switch (dtype) {
    case DType::bf16: return smallest_head_dim<cutlass::bfloat16_t, FLASHATTN_ALL_HEAD_DIMS>(head_dim);
    case DType::f16: return smallest_head_dim<cutlass::half_t, FLASHATTN_ALL_HEAD_DIMS>(head_dim);
    default: return 0;
  }
}

const char* dtype_label(DType dtype) { return dtype == DType::bf16 ? "bf16" : "fp16"; }

// ---- device --------------------------------------------------------------------------------

// Runs the launches (and allocations) on the device that holds the tensors, and puts the
// caller's current device back afterwards. No switch in the common case.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) {
      check_cuda(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);  // destructor: nothing to throw to
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace

bool available() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: clear the error, report "not available"
    return false;
  }
  return count > 0;
}

namespace {

// What the dispatch asks of a device, read once per device.
struct DeviceInfo {
  int sms = 0;
  int cc_major = 0, cc_minor = 0;
};

// The value of key in cache, made by make() on its first lookup; cache is node-based (std::map,
// std::unordered_map), so the reference stays valid, and guarded by mutex.
template <class Cache, class Make>
const typename Cache::mapped_type& cached(Cache& cache, std::mutex& mutex, const typename Cache::key_type& key,
                                          Make make) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  return cache.emplace(key, make()).first->second;
}

const DeviceInfo& device_info(int device_index) {
  static std::mutex mutex;
  static std::unordered_map<int, DeviceInfo> cache;
  return cached(cache, mutex, device_index, [&] {
    DeviceInfo info;
    check_cuda(cudaDeviceGetAttribute(&info.sms, cudaDevAttrMultiProcessorCount, device_index),
               "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    check_cuda(cudaDeviceGetAttribute(&info.cc_major, cudaDevAttrComputeCapabilityMajor, device_index),
               "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMajor)");
    check_cuda(cudaDeviceGetAttribute(&info.cc_minor, cudaDevAttrComputeCapabilityMinor, device_index),
               "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMinor)");
    return info;
  });
}

}  // namespace

bool may_launch_as_programmatic_dependent(const void* kernel, int device_index) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, bool> cache;
  return cached(cache, mutex, std::make_pair(kernel, device_index), [&] {
    cudaFuncAttributes attributes{};
    const bool waits = cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess && attributes.ptxVersion >= 90;
    cudaGetLastError();  // a refused query leaves no sticky error: the kernel launches plainly
    return waits;
  });
}

bool cluster_fits(const void* kernel, int device_index, dim3 cluster, int threads, int smem_bytes) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, unsigned, unsigned, unsigned>, bool> cache;
  return cached(cache, mutex, std::make_tuple(kernel, device_index, cluster.x, cluster.y, cluster.z), [&] {
    KernelLaunch launch(cluster, threads, smem_bytes, nullptr);  // a grid of one cluster
    launch.in_clusters(cluster);
    int clusters = 0;
    const bool fits =
        cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) == cudaSuccess && clusters > 0;
    cudaGetLastError();  // a refused query leaves no sticky error: the grid launches without clusters
    return fits;
  });
}

int resident_ctas(const void* kernel, int device_index, int threads, int smem_bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> cache;
  return cached(cache, mutex, std::make_pair(kernel, device_index), [&] {
    int per_sm = 0;
    // Allowed that much dynamic shared memory first, as before a launch (needed above 48 KB).
    const bool allowed =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) == cudaSuccess;
    if (!allowed ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, static_cast<size_t>(smem_bytes)) !=
            cudaSuccess) {
      per_sm = 0;
      cudaGetLastError();  // no sticky error: the caller launches one CTA per unit instead
    }
    return per_sm * device_info(device_index).sms;
  });
}

static DeviceProperties query_device_properties(int device_index, DType dtype, int head_dim, bool paged);

DeviceProperties device_properties(int device_index, DType dtype, int head_dim, bool paged) {
  // Cached per (device, dtype, head dim, layout): the occupancy queries behind it are per kernel.
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, bool>, DeviceProperties> cache;
  return cached(cache, mutex, std::make_tuple(device_index, int(dtype), head_dim, paged),
                [&] { return query_device_properties(device_index, dtype, head_dim, paged); });
}

static DeviceProperties query_device_properties(int device_index, DType dtype, int head_dim, bool paged) {
  const DeviceInfo& info = device_info(device_index);
  DeviceProperties d;
  d.sms = info.sms;
#if defined(FLASHATTN_HAS_SM90A)
  d.sm90 = info.cc_major == 9 && info.cc_minor == 0;
#endif
  d.served_head_dim = smallest_compiled(dtype, head_dim);
  DeviceGuard guard(device_index);  // the occupancy queries ask the current device
  DecodeSlots slots;
  if (dtype == DType::bf16) {
    slots = slots_for_head_dim<cutlass::bfloat16_t, FLASHATTN_ALL_HEAD_DIMS>(device_index, head_dim, paged);
  } else if (dtype == DType::f16) {
    slots = slots_for_head_dim<cutlass::half_t, FLASHATTN_ALL_HEAD_DIMS>(device_index, head_dim, paged);
  }
  d.splitkeys_slots = slots.splitkeys;
  d.persistent_slots = slots.persistent;
  d.heads_slots = slots.heads;
  return d;
}

bool supports(DType dtype, int head_dim) {
  return head_dim > 0 && smallest_compiled(dtype, head_dim) > 0;
}

void run_attention(const AttnParams& params, const KernelChoice& choice, void* stream_handle) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  DeviceGuard guard(params.device_index);
  bool launched = false;
  if (params.dtype == DType::bf16) {
    launched = run_for_head_dim<cutlass::bfloat16_t, FLASHATTN_ALL_HEAD_DIMS>(params, choice, stream);
  } else if (params.dtype == DType::f16) {
    launched = run_for_head_dim<cutlass::half_t, FLASHATTN_ALL_HEAD_DIMS>(params, choice, stream);
  }
  if (!launched) {
    throw Error(Error::Kind::unsupported,
                std::string("CUDA backend: no compiled kernel for dtype ") +
                    (params.dtype == DType::bf16 ? "bf16" : params.dtype == DType::f16 ? "fp16" : "f32/i32") +
                    " and head_dim " + std::to_string(params.head_dim) +
                    " (compiled: " + compiled_instances() + ")");
  }
}

void run_append(const AppendParams& params, bool programmatic_launch, void* stream_handle) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  DeviceGuard guard(params.device_index);
  run_append_kernel(params, programmatic_launch, stream);
}

// ---- index faults ----------------------------------------------------------------------------

namespace {
// The status word of each device (common/index_faults.h): one static symbol, so that nothing is
// allocated per call (graph capture, no host synchronisation). A kernel claims it with one
// atomicCAS on the first fault; the host clears it after reading it.
__device__ DeviceStatus g_device_status;
}  // namespace

DeviceStatus* device_status(int device_index) {
  static std::mutex mutex;
  static std::unordered_map<int, DeviceStatus*> cache;
  return cached(cache, mutex, device_index, [&] {
    DeviceGuard guard(device_index);
    void* address = nullptr;
    check_cuda(cudaGetSymbolAddress(&address, g_device_status), "cudaGetSymbolAddress(device status)");
    return static_cast<DeviceStatus*>(address);
  });
}

int current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

bool take_index_fault(void* stream_handle, int device_index, IndexFault& fault) {
  DeviceGuard guard(device_index);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  check_cuda(stream ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize(),
             stream ? "cudaStreamSynchronize" : "cudaDeviceSynchronize");
  DeviceStatus status{};
  check_cuda(cudaMemcpyFromSymbol(&status, g_device_status, sizeof(status)), "cudaMemcpyFromSymbol(device status)");
  if (status.claimed == 0) return false;
  // Cleared for the next fault. A kernel on another stream that faults between the read and the
  // clear loses its record: a status word keeps one fault, not all of them.
  const DeviceStatus clear{};
  check_cuda(cudaMemcpyToSymbol(g_device_status, &clear, sizeof(clear)), "cudaMemcpyToSymbol(device status)");
  fault = status.first;
  return true;
}

namespace {

// Scratch comes from one memory pool per device owned by the library, whose release threshold
// is "never": freed blocks stay in the pool across stream synchronisations, so a call without a
// caller workspace costs a pool lookup, not a fresh device allocation (the device's default
// pool has release threshold 0: it gives memory back at synchronisations and maps it again on
// the next call; D-40). The pools live until the process ends.
cudaMemPool_t scratch_pool(int device_index) {
  static std::mutex mutex;
  static std::unordered_map<int, cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = pools.find(device_index);
  if (found != pools.end()) return found->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device_index;
  cudaMemPool_t pool = nullptr;
  check_cuda(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
  uint64_t keep_everything = UINT64_MAX;
  check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything),
             "cudaMemPoolSetAttribute(release threshold)");
  pools.emplace(device_index, pool);
  return pool;
}

}  // namespace

namespace {

// One stream's cached scratch buffer. `in_use` is held from acquire_scratch to release_scratch.
struct StreamScratch {
  std::mutex in_use;
  void* ptr = nullptr;
  size_t bytes = 0;
};

// The cache entry of a stream, keyed by (device, cudaStreamGetId): a stream id is never reused
// within a process, unlike a destroyed stream's handle. Entries live until the process ends.
StreamScratch& stream_scratch(int device_index, cudaStream_t stream) {
  unsigned long long id = 0;
  check_cuda(cudaStreamGetId(stream, &id), "cudaStreamGetId");
  static std::mutex mutex;
  static std::map<std::pair<int, unsigned long long>, std::unique_ptr<StreamScratch>> entries;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<StreamScratch>& entry = entries[{device_index, id}];
  if (!entry) entry = std::make_unique<StreamScratch>();
  return *entry;
}

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  // An error here (e.g. the legacy stream while another stream captures) also means: do not
  // reuse memory across calls.
  return cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

void* pool_allocate(size_t bytes, cudaStream_t stream, int device_index) {
  void* ptr = nullptr;
  check_cuda(cudaMallocFromPoolAsync(&ptr, bytes, scratch_pool(device_index), stream),
             "cudaMallocFromPoolAsync");
  return ptr;
}

}  // namespace

// An allocation and a free from the pool around each split decode call cost ~0.8 us of GPU
// time per call (D-41).
ScratchLease acquire_scratch(size_t bytes, void* stream_handle, int device_index) {
  ScratchLease lease;
  if (bytes == 0) return lease;
  DeviceGuard guard(device_index);  // the legacy default stream allocates on the current device
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  if (stream_is_capturing(stream)) {
    (void)cudaGetLastError();  // clear a capture-status query error
    lease.ptr = pool_allocate(bytes, stream, device_index);
    return lease;
  }
  StreamScratch& entry = stream_scratch(device_index, stream);
  std::unique_lock<std::mutex> hold(entry.in_use);
  if (entry.bytes < bytes) {
    // The old buffer's last use is earlier on this stream: freeing it here is stream-ordered.
    if (entry.ptr != nullptr) check_cuda(cudaFreeAsync(entry.ptr, stream), "cudaFreeAsync");
    entry.ptr = nullptr;  // empty, not freed memory, if the allocation below throws
    entry.bytes = 0;
    entry.ptr = pool_allocate(bytes, stream, device_index);
    entry.bytes = bytes;
  }
  lease.ptr = entry.ptr;
  lease.stream_entry = &entry;
  hold.release();  // unlocked by release_scratch
  return lease;
}

void release_scratch(const ScratchLease& lease, void* stream_handle) {
  if (lease.stream_entry != nullptr) {
    static_cast<StreamScratch*>(lease.stream_entry)->in_use.unlock();
  } else if (lease.ptr != nullptr) {
    check_cuda(cudaFreeAsync(lease.ptr, static_cast<cudaStream_t>(stream_handle)), "cudaFreeAsync");
  }
}

std::string compiled_instances() {
  std::string bf16, fp16;
  append_compiled<cutlass::bfloat16_t, FLASHATTN_ALL_HEAD_DIMS>(bf16);
  append_compiled<cutlass::half_t, FLASHATTN_ALL_HEAD_DIMS>(fp16);
  std::string out;
  if (!bf16.empty()) out += std::string(dtype_label(DType::bf16)) + ":" + bf16;
  if (!fp16.empty()) out += (out.empty() ? "" : "; ") + std::string(dtype_label(DType::f16)) + ":" + fp16;
  return out.empty() ? "none" : out;
}

}  // namespace cuda
}  // namespace flashattn
