// Split-KV combine (Flash-Decoding's second step): merges the num_splits fp32 partials of each
// query row into the output row and its LSE.
//   lse = log sum_s exp(lse_s)            (max-subtracted)
//   o   = sum_s exp(lse_s - lse) * o_s    (splits with lse_s = -inf are skipped, not read)
// A row whose splits are all empty gets o = 0 and lse = -inf.
//
// One block per (query row, column slice). The row's weights are computed once per block into
// shared memory; then the threads tile the slice as (split group) x (column chunk): a chunk is
// one float4 when the partial rows are 16-byte aligned, each group walks every groups-th split,
// and the groups are summed in shared memory. A slice is the whole row unless there are too few
// rows to fill the GPU (decode), see choose_width.
#include <cutlass/numeric_types.h>

#include <string>

#include "common/rules.h"
#include "api/backend.h"
#include "cuda/launch.h"

namespace flashattn {
namespace cuda {

namespace {

constexpr int kThreads = 128;  // 4 warps per row: 4 split groups of 32 float4 chunks at d = 128
constexpr int kWarpSize = 32;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kSplitUnroll = 4;  // independent partial-row loads in flight per thread
constexpr int kTargetBlocksPerSm = 4;  // column slicing goes on until this many blocks exist
constexpr int kMinWidth = 4;          // narrowest slice: 4 float4 = 64 contiguous bytes per split
constexpr int kMinBlocksPerSm = 8;  // 1024 threads per SM: lets ptxas use up to 64 registers (no spill)

struct CombineShared {
  float weight[kMaxSplits];           // exp(lse_s - lse) per split
  float partial[kThreads * 4];        // per (group, chunk) sums, up to float4 each
  float reduce[kWarps];               // block max / sum
  float lse;
};

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Block-wide max (kMax) or sum of one value per thread; every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float x, float* scratch) {
  x = kMax ? warp_max(x) : warp_sum(x);
  const int warp = threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) scratch[warp] = x;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();  // scratch is reused by the next reduction
  return r;
}

// The row's LSE and the split weights exp(lse_s - lse) into shared memory.
__device__ void combine_weights(const AttnParams& p, int b, int head, int i, CombineShared& sh) {
  float local_max = -INFINITY;
  for (int s = threadIdx.x; s < p.num_splits; s += kThreads) {
    const float lse_s = p.lse_accum[accum_row(p, s, b, head, i)];
    sh.weight[s] = lse_s;
    local_max = fmaxf(local_max, lse_s);
  }
  const float max_lse = block_reduce<true>(local_max, sh.reduce);
  float local_sum = 0.0f;
  if (max_lse != -INFINITY) {
    for (int s = threadIdx.x; s < p.num_splits; s += kThreads) local_sum += expf(sh.weight[s] - max_lse);
  }
  const float sum = block_reduce<false>(local_sum, sh.reduce);
  const float lse = (max_lse == -INFINITY || !(sum > 0.0f)) ? -INFINITY : max_lse + logf(sum);
  for (int s = threadIdx.x; s < p.num_splits; s += kThreads) {
    sh.weight[s] = (lse == -INFINITY) ? 0.0f : expf(sh.weight[s] - lse);
  }
  if (threadIdx.x == 0) sh.lse = lse;
  __syncthreads();
}

template <int kVec>
struct VecF;
template <>
struct VecF<4> {
  using Type = float4;
  __device__ static void add(float (&acc)[4], float w, const float* src) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(src));
    acc[0] += w * v.x; acc[1] += w * v.y; acc[2] += w * v.z; acc[3] += w * v.w;
  }
};
template <>
struct VecF<1> {
  __device__ static void add(float (&acc)[1], float w, const float* src) { acc[0] += w * __ldg(src); }
};

template <typename Element, int kVec>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) combine_kernel(const AttnParams p, int width) {
  __shared__ CombineShared sh;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the attention kernel (launch_combine): wait here
  // until that grid has finished and its partials are visible.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  // blockIdx.x enumerates (b, head, i) with i fastest; blockIdx.y is the column slice.
  const int64_t row = blockIdx.x;
  const int i = int(row % p.seqlen_q);
  const int head = int((row / p.seqlen_q) % p.num_heads);
  const int b = int(row / (int64_t(p.seqlen_q) * p.num_heads));
  const SeqInfo s = seq_info(p, b);
  if (i >= s.seqlen_q) return;  // varlen padding row: not ours to write (whole block exits)

  combine_weights(p, b, head, i, sh);

  // This block's threads: `groups` split groups x `width` column chunks of kVec floats.
  const int chunks = (p.head_dim + kVec - 1) / kVec;  // kVec > 1 only when head_dim % kVec == 0
  const int groups = kThreads / width;
  const int group = threadIdx.x / width;
  const int lane = threadIdx.x % width;
  const int chunk = blockIdx.y * width + lane;
  const int col = chunk * kVec;
  const bool active = group < groups && chunk < chunks;
  const int64_t split_stride = int64_t(p.batch) * p.num_heads * p.seqlen_q * p.head_dim;
  const float* partial_row = p.o_accum + accum_row(p, 0, b, head, i) * p.head_dim;
  Element* out_row = static_cast<Element*>(p.o) + o_offset(p, s, b, i, head);

  float acc[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) acc[e] = 0.0f;
  if (active) {
#pragma unroll kSplitUnroll
    for (int split = group; split < p.num_splits; split += groups) {
      const float w = sh.weight[split];
      if (w != 0.0f) VecF<kVec>::add(acc, w, partial_row + split * split_stride + col);
    }
  }
  if (groups > 1) {  // sum the groups' partial sums of each chunk in shared memory
    if (active) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) sh.partial[(group * width + lane) * kVec + e] = acc[e];
    }
    __syncthreads();
    if (group == 0 && active) {
      for (int g = 1; g < groups; ++g) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] += sh.partial[(g * width + lane) * kVec + e];
      }
    }
  }
  if (group == 0 && active) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) out_row[col + e] = Element(acc[e]);
  }
  if (p.lse != nullptr && blockIdx.y == 0 && threadIdx.x == 0) p.lse[lse_offset(p, s, b, i, head)] = sh.lse;
}

// Threads per split group (= column chunks per block). A whole row per block when there are
// enough rows; for decode (few rows, many splits) the row is cut into column slices so that
// more blocks, and more loads, are in flight: b=1, h=32, d=128, 128 splits ran at 188 GB/s with
// one block per row on H200 (32 blocks for 132 SMs).
int choose_width(const AttnParams& p, int64_t rows, int chunks) {
  const int64_t target_blocks = int64_t(kTargetBlocksPerSm) * num_sms(p.device_index);
  int width = chunks < kThreads ? chunks : kThreads;
  auto slices = [&](int w) { return int64_t((chunks + w - 1) / w); };
  while (width > kMinWidth && rows * slices(width) < target_blocks &&
         kThreads / ((width + 1) / 2) <= p.num_splits) {
    width = (width + 1) / 2;
  }
  return width;
}

template <typename Element>
void launch_combine(const AttnParams& params, cudaStream_t stream) {
  const int64_t rows = int64_t(params.batch) * params.num_heads * params.seqlen_q;
  constexpr int64_t kMaxGrid = 2147483647;  // gridDim.x limit
  if (rows == 0) return;
  if (rows > kMaxGrid) {
    throw Error(Error::Kind::unsupported, "CUDA combine: " + std::to_string(rows) + " rows exceed the grid limit");
  }
  // float4 loads need every partial row 16-byte aligned: head_dim % 4 == 0 and an aligned base.
  const bool vec4 = params.head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(params.o_accum) % 16 == 0;
  const int chunks = vec4 ? params.head_dim / 4 : params.head_dim;
  const int width = choose_width(params, rows, chunks);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((chunks + width - 1) / width));
  // On sm_90 the combine is a programmatic dependent launch: it is scheduled while the attention
  // grid drains (its blocks wait in griddepcontrol.wait), which hides one launch latency per
  // split decode call.
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (compute_capability_major(params.device_index) >= 9) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  if (vec4) {
    check_cuda(cudaLaunchKernelEx(&config, combine_kernel<Element, 4>, params, width), "cudaLaunchKernelEx(combine_kernel)");
  } else {
    check_cuda(cudaLaunchKernelEx(&config, combine_kernel<Element, 1>, params, width), "cudaLaunchKernelEx(combine_kernel)");
  }
  check_launch("combine_kernel");
}

}  // namespace

void run_combine(const AttnParams& params, cudaStream_t stream) {
  if (params.num_splits < 1 || params.num_splits > kMaxSplits) {
    throw Error(Error::Kind::unsupported, "CUDA combine: num_splits " + std::to_string(params.num_splits) +
                                              " outside [1, " + std::to_string(kMaxSplits) + "]");
  }
  switch (params.dtype) {
    case DType::bf16: launch_combine<cutlass::bfloat16_t>(params, stream); break;
    case DType::f16: launch_combine<cutlass::half_t>(params, stream); break;
    default:
      throw Error(Error::Kind::unsupported, "CUDA combine: output dtype must be fp16 or bf16");
  }
}

}  // namespace cuda
}  // namespace flashattn
