// Staging copies for the API layer (src/api/staging.h): a strided 4-D copy of 16-bit (fp16,
// bf16) or 8-bit (e4m3) elements
// whose last dimension may grow (zero-filled) or shrink, and stream-ordered device memory for
// the staged tensors. The attention kernels never see this: they read the staged copies.
//
// One warp copies one row (the last dimension) at a time, its lanes over the columns, so each
// warp's loads and stores are consecutive elements; the rows are shared out grid-stride.
#include <cstdint>
#include <string>

#include "api/backend.h"
#include "cuda/launch.h"

namespace flashattn {
namespace cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int64_t kMaxBlocks = 65535 * 8;  // grid-stride beyond this

// The copy moves bits: uint16_t for fp16 and bf16, uint8_t for e4m3.
template <typename Bits>
__global__ void __launch_bounds__(kThreads) copy_padded_kernel(const PaddedCopy c) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  const int64_t rows = c.shape[0] * c.shape[1] * c.shape[2];
  const int copied = c.src_cols < c.dst_cols ? c.src_cols : c.dst_cols;
  const Bits* src = static_cast<const Bits*>(c.src);
  Bits* dst = static_cast<Bits*>(c.dst);
  for (int64_t row = warp; row < rows; row += warps) {
    const int64_t i2 = row % c.shape[2];
    const int64_t i1 = (row / c.shape[2]) % c.shape[1];
    const int64_t i0 = row / (c.shape[2] * c.shape[1]);
    const Bits* src_row = src + i0 * c.src_stride[0] + i1 * c.src_stride[1] + i2 * c.src_stride[2];
    Bits* dst_row = dst + i0 * c.dst_stride[0] + i1 * c.dst_stride[1] + i2 * c.dst_stride[2];
    for (int col = lane; col < c.dst_cols; col += kWarpSize) {
      dst_row[col] = col < copied ? src_row[col] : Bits(0);
    }
  }
}

// Makes `device` current for the launch (the legacy default stream runs on the current
// device) and puts the caller's device back.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~CurrentDevice() { cudaSetDevice(previous_); }  // destructor: nothing to throw to
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

void copy_padded(const PaddedCopy& c, void* stream_handle) {
  const int64_t rows = c.shape[0] * c.shape[1] * c.shape[2];
  if (rows == 0 || c.dst_cols == 0) return;
  if (c.element_bytes != 2 && c.element_bytes != 1) {
    throw Error(Error::Kind::unsupported, "copy_padded: only 16-bit and 8-bit elements are staged on cuda (got " +
                                              std::to_string(c.element_bytes) + " bytes)");
  }
  CurrentDevice current(c.device_index);
  int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  const auto kernel = c.element_bytes == 2 ? &copy_padded_kernel<uint16_t> : &copy_padded_kernel<uint8_t>;
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream_handle)>>>(c);
  check_launch("copy_padded_kernel");
}

// Stream-ordered memory from the pool current to the stream's device (its default pool unless
// the application set another): allowed while the stream is being captured into a CUDA graph
// (the allocation becomes a graph memory node).
void* allocate_async(size_t bytes, void* stream_handle, int device_index) {
  if (bytes == 0) return nullptr;
  CurrentDevice current(device_index);
  void* ptr = nullptr;
  check_cuda(cudaMallocAsync(&ptr, bytes, static_cast<cudaStream_t>(stream_handle)), "cudaMallocAsync(staging)");
  return ptr;
}

void free_async(void* ptr, void* stream_handle, int device_index) {
  if (ptr == nullptr) return;
  CurrentDevice current(device_index);
  check_cuda(cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream_handle)), "cudaFreeAsync(staging)");
}

}  // namespace cuda
}  // namespace flashattn
