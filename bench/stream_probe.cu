// The read-bandwidth floor of the decode kernels' K/V stream, with and without L2 hints.
//
// A decode CTA (batch, KV head, split) of the 128-key split-keys kernel reads 64-row tiles of K
// and of V, 256 bytes per row (d = 128, bf16), rows hk * 256 bytes apart, with 16-byte cp.async
// copies into a ring of shared-memory stages (splitkeys_kernel.h). This program does exactly
// that copying, with no math, for the same grids as the benchmark's 128k-token decode points,
// and times it as do_bench does (after writing zeros over 256 MB: the L2 is left full of dirty
// lines) and after reading 256 MB (clean lines). So it says what the copies alone can reach in
// each L2 state, and what each cp.async L2 hint does to that:
//   plain       cp.async.cg (what the kernels issue)
//   pf128/256   .L2::128B / .L2::256B prefetch-size hints
//   evict_first .L2::cache_hint with the evict-first policy (CuTe's CacheHintSm90::EVICT_FIRST)
//
//   nvcc -O3 -arch=sm_90a -std=c++17 -o stream_probe bench/stream_probe.cu && ./stream_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int kThreads = 128;
constexpr int kRowBytes = 256;     // d = 128, bf16
constexpr int kTileRows = 64;
constexpr int kTileBytes = kTileRows * kRowBytes;  // one of K or V
constexpr int kChunksPerThread = kTileBytes / 16 / kThreads;
constexpr uint64_t kEvictFirst = 0x12F0000000000000ull;  // createpolicy.fractional evict_first, 1.0

enum Hint { plain, pf128, pf256, evict_first, evict_first_pf256, kHints };
const char* const kHintNames[kHints] = {"plain", "pf128", "pf256", "evict_first", "evict_first+pf256"};

template <int kHint>
__device__ __forceinline__ void copy16(uint32_t dst, const char* src) {
  if constexpr (kHint == plain) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
  } else if constexpr (kHint == pf128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
  } else if constexpr (kHint == pf256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
  } else if constexpr (kHint == evict_first) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "l"(kEvictFirst));
  } else {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "l"(kEvictFirst));
  }
}

struct Grid {
  const char *k, *v;
  int64_t row_stride;  // bytes between a head's consecutive rows
  int64_t batch_stride;
  int rows, splits, heads_k;
};

// CTA (split, batch * heads_k + hk): its split's tiles of K and V, kStages - 1 tiles in flight
// while one is "computed" (a barrier), as in splitkeys_kernel.h.
template <int kHint, int kStages>
__global__ void __launch_bounds__(kThreads) stream_kernel(Grid g, int* sink) {
  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x;
  const int b = blockIdx.y / g.heads_k, hk = blockIdx.y % g.heads_k;
  const int tiles = g.rows / kTileRows;
  const int per_split = (tiles + g.splits - 1) / g.splits;
  const int lo = blockIdx.x * per_split, hi = min(tiles, lo + per_split);
  const int64_t base = b * g.batch_stride + hk * kRowBytes;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  auto issue = [&](int t) {
    if (t < hi) {
      const uint32_t stage = smem0 + (t % kStages) * 2 * kTileBytes;
      for (int i = 0; i < kChunksPerThread; ++i) {
        const int c = tid + i * kThreads, row = c / (kRowBytes / 16), col = (c % (kRowBytes / 16)) * 16;
        const int64_t off = base + int64_t(t * kTileRows + row) * g.row_stride + col;
        copy16<kHint>(stage + c * 16, g.k + off);
        copy16<kHint>(stage + kTileBytes + c * 16, g.v + off);
      }
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
  for (int s = 0; s < kStages - 1; ++s) issue(lo + s);
  int acc = 0;
  for (int t = lo; t < hi; ++t) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2));
    __syncthreads();
    issue(t + kStages - 1);
    acc ^= reinterpret_cast<const int*>(smem + (t % kStages) * 2 * kTileBytes)[tid];
  }
  if (acc == 0x7fffffff) *sink = acc;  // keeps the shared-memory reads
}

__global__ void read_flush(const int4* buf, int64_t n, int* sink) {
  int acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int4 x = buf[i];
    acc ^= x.x ^ x.y ^ x.z ^ x.w;
  }
  if (acc == 0x7fffffff) *sink = acc;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <int kHint, int kStages>
float median_us(const Grid& g, int batch, bool dirty, char* flush_buf, size_t flush_bytes, int* sink, int ctas_per_sm) {
  constexpr int kSmemUsed = kStages * 2 * kTileBytes;
  // Pad the shared memory so that exactly ctas_per_sm CTAs fit an SM (228 KB per SM, 1 KB each reserved).
  const int smem = std::max(kSmemUsed, (228 * 1024) / ctas_per_sm - 1024 - 1024);
  check(cudaFuncSetAttribute(stream_kernel<kHint, kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem attr");
  const dim3 grid(g.splits, batch * g.heads_k);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  for (int rep = 0; rep < 40; ++rep) {
    if (dirty) {
      check(cudaMemsetAsync(flush_buf, rep & 1, flush_bytes), "memset");
    } else {
      read_flush<<<1024, 256>>>(reinterpret_cast<const int4*>(flush_buf), int64_t(flush_bytes / 16), sink);
    }
    cudaEventRecord(start);
    stream_kernel<kHint, kStages><<<grid, kThreads, smem>>>(g, sink);
    cudaEventRecord(stop);
    check(cudaEventSynchronize(stop), "kernel");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (rep >= 5) times.push_back(ms * 1e3f);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <int kStages, int kHint = 0>
void run_hints(const Grid& g, int batch, double bytes, char* flush_buf, size_t flush_bytes, int* sink, int ctas_per_sm) {
  if constexpr (kHint < kHints) {
    const float dirty = median_us<kHint, kStages>(g, batch, true, flush_buf, flush_bytes, sink, ctas_per_sm);
    const float clean = median_us<kHint, kStages>(g, batch, false, flush_buf, flush_bytes, sink, ctas_per_sm);
    std::printf("%4d x %-6d splits %2d stages %d ctas/SM %d %-18s dirty %7.1f us %5.2f TB/s   clean %7.1f us %5.2f TB/s\n",
                batch, g.rows, g.splits, kStages, ctas_per_sm, kHintNames[kHint], dirty, bytes / dirty / 1e6,
                clean, bytes / clean / 1e6);
    std::fflush(stdout);
    run_hints<kStages, kHint + 1>(g, batch, bytes, flush_buf, flush_bytes, sink, ctas_per_sm);
  }
}

}  // namespace

int main() {
  constexpr int kHeadsK = 8;
  constexpr size_t kFlushBytes = size_t(256) << 20;
  const size_t kv_bytes = size_t(128) * 1024 * kHeadsK * kRowBytes;  // 128k tokens of K (or V)
  char *k, *v, *flush_buf;
  int* sink;
  check(cudaMalloc(&k, kv_bytes), "malloc k");
  check(cudaMalloc(&v, kv_bytes), "malloc v");
  check(cudaMalloc(&flush_buf, kFlushBytes), "malloc flush");
  check(cudaMalloc(&sink, sizeof(int)), "malloc sink");
  cudaMemset(k, 1, kv_bytes);
  cudaMemset(v, 2, kv_bytes);
  const double bytes = 2.0 * kv_bytes;
  struct Point {
    int batch, rows, splits;
  };
  // The benchmark's 128k-token points with the plan's splits: 8 x 16k (4 splits) and 32 x 4k
  // (unsplit) are both 256 CTAs of 64 tiles; 128 x 1k is 1,024 CTAs of 16 tiles.
  for (const Point pt : {Point{8, 16384, 4}, Point{128, 1024, 1}, Point{8, 16384, 6}}) {
    Grid g{k, v, int64_t(kHeadsK) * kRowBytes, int64_t(pt.rows) * kHeadsK * kRowBytes, pt.rows, pt.splits, kHeadsK};
    run_hints<2>(g, pt.batch, bytes, flush_buf, kFlushBytes, sink, 3);  // the default pipeline
    run_hints<3>(g, pt.batch, bytes, flush_buf, kFlushBytes, sink, 2);
    run_hints<5>(g, pt.batch, bytes, flush_buf, kFlushBytes, sink, 1);  // the deep pipeline's stages
  }
  return 0;
}
