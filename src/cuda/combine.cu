// Split-KV combine (Flash-Decoding's second step): merges the num_splits fp32 partials of each
// query row into the output row and its LSE.
//   lse = log sum_s exp(lse_s)            (max-subtracted)
//   o   = sum_s exp(lse_s - lse) * o_s    (splits with lse_s = -inf are skipped)
// A row whose splits are all empty gets o = 0 and lse = -inf.
//
// One block of 4 warps per query row, built for latency (a decode call has few rows and the
// combine sits on its critical path): no block-wide reduction before the loads. Every warp
// computes the row's lse itself (lanes read the split lse values, warp shuffles reduce them),
// while its lanes already load the partial rows of the warp's splits (warp w takes splits w,
// w + 4, ...; lane l the column chunks l, l + 32, ...), kBatch splits in flight per lane. One
// barrier sums the 4 warps' column sums in shared memory.
#include <cutlass/numeric_types.h>

#include <string>

#include "common/rules.h"
#include "common/softmax_state.h"
#include "api/backend.h"
#include "cuda/grid_dependence.h"
#include "cuda/launch.h"

namespace flashattn {
namespace cuda {

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kBatch = 8;  // partial rows in flight per lane
constexpr int kLseSlots = (kMaxSplits + kWarpSize - 1) / kWarpSize;  // split lse values per lane

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

// The row's merged state over its splits (softmax_state.h, LSE form), computed by one warp
// (every lane gets it): the max over the lanes' split LSEs, then the lanes' sums rescaled to it.
__device__ __forceinline__ SoftmaxRowState merged_splits(const float (&lse_lane)[kLseSlots]) {
  float m = -INFINITY;
  #pragma unroll
  for (int j = 0; j < kLseSlots; ++j) m = fmaxf(m, lse_lane[j]);
  m = warp_max(m);
  if (m == -INFINITY) return SoftmaxRowState::empty();
  float sum = 0.0f;
  #pragma unroll
  for (int j = 0; j < kLseSlots; ++j) sum += state_of_lse(lse_lane[j]).sum_at(m, kLog2eSoftmax);
  return SoftmaxRowState{m, warp_sum(sum)};
}

// The partials and their LSE are read with ld.global.cg, never __ldg: the compiler may move a
// read-only (.nc, invariant) load above griddepcontrol.wait, and did once the wait came after the
// row's geometry, reading partials before the attention grid had written them
// (docs/DECISIONS.md D-38: 44 GPU cases failed).
template <int kVec>
struct Chunk {
  float v[kVec];
  __device__ __forceinline__ void load(const float* src) {
    if constexpr (kVec == 4) {
      const float4 x = __ldcg(reinterpret_cast<const float4*>(src));
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else {
      v[0] = __ldcg(src);
    }
  }
};

template <typename Element, int kVec>
__global__ void __launch_bounds__(kThreads) combine_kernel(const AttnParams p) {
  __shared__ float column_sums[kWarps][kMaxHeadDim];
  // blockIdx.x enumerates (b, head, i) with i fastest.
  const int64_t row = blockIdx.x;
  const int i = int(row % p.seqlen_q);
  const int head = int((row / p.seqlen_q) % p.num_heads);
  const int b = int(row / (int64_t(p.seqlen_q) * p.num_heads));
  // Sequence lengths: inputs, which the attention grid does not write. A sequence with an index
  // fault comes back empty here as it did there (rules.h seq_info_read), which reported it.
  const SeqInfo s = seq_info(p, b);
  if (i >= s.seqlen_q) return;  // varlen padding row: not ours to write (whole block exits)
  // Launched as a programmatic dependent of the attention kernel (launch_combine): the row's
  // geometry above overlaps that grid; wait here until it has finished and its partials are
  // visible.
  wait_for_previous_grid();

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int splits = p.num_splits;
  const int64_t first_row = accum_row(p, 0, b, head, i);
  const int64_t split_rows = accum_row(p, 1, b, head, i) - first_row;  // rows between splits
  const float* lse_of = p.lse_accum + first_row;                       // lse_of[split * split_rows]
  const float* partial_of = p.o_accum + first_row * p.head_dim;        // + split * split_rows * d

  float lse_lane[kLseSlots];
  #pragma unroll
  for (int j = 0; j < kLseSlots; ++j) {
    const int split = lane + j * kWarpSize;
    lse_lane[j] = split < splits ? __ldcg(lse_of + split * split_rows) : -INFINITY;
  }

  const int chunks = p.head_dim / kVec;  // kVec = 4 only when head_dim % 4 == 0
  float lse = -INFINITY;
  bool have_lse = false;  // computed once, after the first loads are in flight
  auto ensure_lse = [&] {
    if (!have_lse) lse = merged_splits(lse_lane).finish(1.0f).lse;
    have_lse = true;
  };
  // Every lane runs the same trip counts (warp-uniform), so the shuffles see the whole warp.
  for (int base = 0; base < chunks; base += kWarpSize) {
    const int chunk = base + lane;
    const bool active = chunk < chunks;
    const int col = chunk * kVec;
    float acc[kVec] = {};
    for (int first = warp; first < splits; first += kWarps * kBatch) {
      Chunk<kVec> part[kBatch];
      float lse_split[kBatch];
      #pragma unroll
      for (int u = 0; u < kBatch; ++u) {  // loads first: they do not wait for the row's lse
        const int split = first + u * kWarps;
        lse_split[u] = split < splits ? __ldcg(lse_of + split * split_rows) : -INFINITY;
        if (split < splits && active) part[u].load(partial_of + split * split_rows * p.head_dim + col);
      }
      ensure_lse();
      #pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (lse_split[u] == -INFINITY || lse == -INFINITY || !active) continue;  // an empty split or row
        const float w = split_weight(lse_split[u], lse);
        #pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] += w * part[u].v[e];
      }
    }
    if (active) {
      #pragma unroll
      for (int e = 0; e < kVec; ++e) column_sums[warp][col + e] = acc[e];
    }
  }
  ensure_lse();  // a warp without splits (splits < kWarps) still knows the row's lse
  __syncthreads();

  Element* out_row = static_cast<Element*>(p.o) + o_offset(p, s, b, i, head);
  for (int col = threadIdx.x; col < p.head_dim; col += kThreads) {
    float sum = 0.0f;
    #pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += column_sums[w][col];
    out_row[col] = Element(sum);
  }
  if (p.lse != nullptr && threadIdx.x == 0) p.lse[lse_offset(p, s, b, i, head)] = lse;
}

template <typename Element>
void launch_combine(const AttnParams& params, bool programmatic, cudaStream_t stream) {
  const int64_t rows = int64_t(params.batch) * params.num_heads * params.seqlen_q;
  constexpr int64_t kMaxGrid = 2147483647;  // gridDim.x limit
  if (rows == 0) return;
  if (rows > kMaxGrid) {
    throw Error(Error::Kind::unsupported, "CUDA combine: " + std::to_string(rows) + " rows exceed the grid limit");
  }
  // float4 loads need every partial row 16-byte aligned: head_dim % 4 == 0 and an aligned base.
  const bool vec4 = params.head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(params.o_accum) % 16 == 0;
  if (params.head_dim > kMaxHeadDim) {
    throw Error(Error::Kind::unsupported, "CUDA combine: head_dim " + std::to_string(params.head_dim) +
                                              " exceeds " + std::to_string(kMaxHeadDim));
  }
  const dim3 grid(static_cast<unsigned>(rows));
  // On sm_90 the combine is a programmatic dependent launch (launch.h
  // may_launch_as_programmatic_dependent): it is scheduled while the attention grid drains (its
  // blocks wait in griddepcontrol.wait), which hides one launch latency per split decode call.
  const auto kernel = vec4 ? &combine_kernel<Element, 4> : &combine_kernel<Element, 1>;
  KernelLaunch launch(grid, kThreads, 0, stream);
  launch.as_programmatic_dependent(reinterpret_cast<const void*>(kernel), params.device_index, programmatic);
  check_cuda(cudaLaunchKernelEx(&launch.config, kernel, params), "cudaLaunchKernelEx(combine_kernel)");
  check_launch("combine_kernel");
}

}  // namespace

void run_combine(const AttnParams& params, bool programmatic, cudaStream_t stream) {
  if (params.num_splits < 1 || params.num_splits > kMaxSplits) {
    throw Error(Error::Kind::unsupported, "CUDA combine: num_splits " + std::to_string(params.num_splits) +
                                              " outside [1, " + std::to_string(kMaxSplits) + "]");
  }
  switch (params.dtype) {
    case DType::bf16: launch_combine<cutlass::bfloat16_t>(params, programmatic, stream); break;
    case DType::f16: launch_combine<cutlass::half_t>(params, programmatic, stream); break;
    default:
      throw Error(Error::Kind::unsupported, "CUDA combine: output dtype must be fp16 or bf16");
  }
}

}  // namespace cuda
}  // namespace flashattn
