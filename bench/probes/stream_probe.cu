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
//   pf256       the .L2::256B prefetch-size hint (.L2::128B measured as plain)
//   evict_first .L2::cache_hint with the evict-first policy (CuTe's CacheHintSm90::EVICT_FIRST)
// and what the Hopper tensor memory accelerator (TMA) does instead of cp.async: one thread per
// CTA issues each stage's tile copies (cp.async.bulk.tensor.3d, completion on an mbarrier):
//   tma_sw128   64 x 64-element boxes in the 128-byte swizzle (the kernels' smem layout), two per
//               K (or V) tile, no L2 promotion
//   tma_sw128_p256   the same with the tensor map's 256-byte L2 promotion
//   tma_flat    one 64 x 128-element box per K (or V) tile, no swizzle, no L2 promotion
// Then, per point, the start and the walk of the decode kernels (plain copies): each CTA reading
// its sequence's length before its first copy, and the tiles walked from the last down; and the
// same grids reading whole key rows (consecutive bytes) instead of one head's.
//
// The dirty flush is a cudaMemsetAsync of 256 MB by default; `--kernel-flush` writes the zeros
// with a kernel instead, as do_bench's `cache.zero_()` does, so that the probe is timed in the
// benchmark's exact order (flush kernel, start event, kernel, stop event). `--plain` measures
// only the plain copies of the one-head grids. `--persistent` times the 128 x 1k and 32 x 4k
// copies on persistent grids (persistent_stream_kernel: whole units handed out statically, or
// units or chunks of them claimed from a counter as the CTAs go) against a CTA per unit.
// `--dram` runs only the 32 x 4k grid's plain and evict-first copies a few times each, for
// Nsight Compute to read their DRAM bytes (`ncu --cache-control none -k regex:stream_kernel
// --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum`).
//
//   nvcc -O3 -arch=sm_90a -std=c++17 -o stream_probe bench/probes/stream_probe.cu && ./stream_probe
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int kThreads = 128;
constexpr int kRowBytes = 256;     // d = 128, bf16
constexpr int kTileRows = 64;
constexpr int kTileBytes = kTileRows * kRowBytes;  // one of K or V
constexpr int kChunksPerThread = kTileBytes / 16 / kThreads;
constexpr uint64_t kEvictFirst = 0x12F0000000000000ull;  // createpolicy.fractional evict_first, 1.0

enum Hint { plain, pf256, evict_first, tma_sw128, tma_sw128_p256, tma_flat, kHints };
const char* const kHintNames[kHints] = {"plain", "pf256", "evict_first", "tma_sw128", "tma_sw128_p256", "tma_flat"};
__host__ __device__ constexpr bool is_tma(int hint) { return hint >= tma_sw128; }

template <int kHint>
__device__ __forceinline__ void copy16(uint32_t dst, const char* src) {
  if constexpr (kHint == plain) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
  } else if constexpr (kHint == pf256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
  } else {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "l"(kEvictFirst));
  }
}

// ---- TMA: the K and V tensors as 3-d maps (d, heads_k, batch x rows); a stage's copies
// complete on the stage's mbarrier.
struct TmaMaps {
  CUtensorMap k, v;
};

__device__ __forceinline__ void mbar_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar));
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes));
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity));
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

struct Grid {
  const char *k, *v;
  int64_t row_stride;  // bytes between a head's consecutive rows
  int64_t batch_stride;
  int rows, splits, heads_k;
  const int* lengths;  // per batch, read before the first copy when set (the decode kernels' start)
  bool descending;     // tiles walked from the last down, as the decode kernels walk them
};

// CTA (split, batch * heads_k + hk): its split's tiles of K and V, kStages - 1 tiles in flight
// while one is "computed" (a barrier), as in splitkeys_kernel.h.
template <int kHint, int kStages>
__global__ void __launch_bounds__(kThreads) stream_kernel(Grid g, const __grid_constant__ TmaMaps maps, int* sink) {
  extern __shared__ __align__(1024) char smem[];
  const int tid = threadIdx.x;
  const int b = blockIdx.y / g.heads_k, hk = blockIdx.y % g.heads_k;
  const int rows = g.lengths != nullptr ? min(g.rows, __ldg(g.lengths + b)) : g.rows;
  const int tiles = rows / kTileRows;
  const int per_split = (tiles + g.splits - 1) / g.splits;
  const int lo = blockIdx.x * per_split, hi = min(tiles, lo + per_split);
  const int64_t base = b * g.batch_stride + hk * kRowBytes;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // TMA: the stages' mbarriers after the K/V stages; thread 0 issues, every thread waits.
  const uint32_t bars = smem0 + kStages * 2 * kTileBytes;
  if constexpr (is_tma(kHint)) {
    if (tid == 0) {
      for (int s = 0; s < kStages; ++s) mbar_init(bars + 8 * s);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::);
    }
    __syncthreads();
  }
  auto issue_tma = [&](int t) {
    if (tid != 0 || t >= hi) return;
    const uint32_t stage = smem0 + (t % kStages) * 2 * kTileBytes, bar = bars + 8 * (t % kStages);
    const int row = b * g.rows + t * kTileRows;
    mbar_expect(bar, 2 * kTileBytes);
    if constexpr (kHint == tma_flat) {
      tma_load_3d(stage, &maps.k, 0, hk, row, bar);
      tma_load_3d(stage + kTileBytes, &maps.v, 0, hk, row, bar);
    } else {
      for (int half = 0; half < 2; ++half) {
        tma_load_3d(stage + half * kTileBytes / 2, &maps.k, half * 64, hk, row, bar);
        tma_load_3d(stage + kTileBytes + half * kTileBytes / 2, &maps.v, half * 64, hk, row, bar);
      }
    }
  };
  if constexpr (is_tma(kHint)) {
    for (int s = 0; s < kStages - 1; ++s) issue_tma(lo + s);
    int acc = 0;
    for (int t = lo; t < hi; ++t) {
      mbar_wait(bars + 8 * (t % kStages), ((t - lo) / kStages) & 1);
      __syncthreads();  // every thread is done with tile t-1's stage, which tile t+kStages-1 refills
      issue_tma(t + kStages - 1);
      acc ^= reinterpret_cast<const int*>(smem + (t % kStages) * 2 * kTileBytes)[tid];
    }
    if (acc == 0x7fffffff) *sink = acc;
    return;
  }
  auto issue = [&](int t) {
    if (t < hi) {
      const uint32_t stage = smem0 + (t % kStages) * 2 * kTileBytes;
      for (int i = 0; i < kChunksPerThread; ++i) {
        const int c = tid + i * kThreads, row = c / (kRowBytes / 16), col = (c % (kRowBytes / 16)) * 16;
        const int tile = g.descending ? lo + hi - 1 - t : t;
        const int64_t off = base + int64_t(tile * kTileRows + row) * g.row_stride + col;
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

// The same copies on a persistent grid: each CTA walks work items (a unit is one (batch, KV
// head); an item is chunk_tiles of its tiles), the ring of stages running on from one item to
// the next, as persistent_decode_kernel.h does. Static: CTA c takes items c, c + gridDim.x, ...
// Dynamic: each CTA claims its next item from a counter (atomicAdd by thread 0, two items
// ahead, published through shared memory at the loop's barrier), so CTAs that stream faster
// take more.
template <int kStages, bool kDynamic>
__global__ void __launch_bounds__(kThreads) persistent_stream_kernel(Grid g, int units, int chunk_tiles, int* counter, int* sink) {
  extern __shared__ __align__(1024) char smem[];
  // Claimed items, a ring by switch: switch n (the producer's n-th item) reads ring[n % 3],
  // and thread 0 then claims switch n + 2's into ring[(n + 2) % 3] (read a barrier later).
  __shared__ int ring[3];
  const int tid = threadIdx.x;
  const int tiles_per_unit = g.rows / kTileRows;
  const int chunks_per_unit = tiles_per_unit / chunk_tiles;
  const int items = units * chunks_per_unit;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  int static_k = 0;  // thread 0's claims so far (static)
  auto claim = [&] { return kDynamic ? atomicAdd(counter, 1) : int(blockIdx.x) + (static_k++) * int(gridDim.x); };
  if (tid == 0) {
    ring[0] = claim();
    ring[1] = claim();
  }
  __syncthreads();
  int switches = 0;
  // The producer: its item, the next tile of it and the tiles left.
  int item = -1, tile = 0, left = 0, issued = 0, stage = 0;
  int64_t base = 0;
  bool producing = true;
  auto issue = [&] {
    const bool switching = producing && left == 0;
    if (switching) {
      item = ring[switches % 3];
      if (item >= items) {
        producing = false;
      } else {
        const int unit = item / chunks_per_unit, chunk = item % chunks_per_unit;
        const int b = unit / g.heads_k, hk = unit % g.heads_k;
        base = b * g.batch_stride + hk * kRowBytes;
        tile = chunk * chunk_tiles;
        left = chunk_tiles;
      }
    }
    if (producing) {
      const uint32_t dst = smem0 + stage * 2 * kTileBytes;
      for (int i = 0; i < kChunksPerThread; ++i) {
        const int c = tid + i * kThreads, row = c / (kRowBytes / 16), col = (c % (kRowBytes / 16)) * 16;
        const int64_t off = base + int64_t(tile * kTileRows + row) * g.row_stride + col;
        copy16<plain>(dst + c * 16, g.k + off);
        copy16<plain>(dst + kTileBytes + c * 16, g.v + off);
      }
      ++tile, --left, ++issued;
      stage = stage + 1 == kStages ? 0 : stage + 1;
    }
    asm volatile("cp.async.commit_group;\n" ::);
    if (switching) {  // after the copies: the claim's round trip delays none of them
      if (tid == 0) ring[(switches + 2) % 3] = claim();
      ++switches;
    }
  };
  for (int s = 0; s < kStages - 1; ++s) {
    issue();
    __syncthreads();  // ring[] as thread 0 left it
  }
  int acc = 0, consumed = 0, cstage = 0;
  while (consumed < issued) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2));
    __syncthreads();
    issue();
    acc ^= reinterpret_cast<const int*>(smem + cstage * 2 * kTileBytes)[tid];
    cstage = cstage + 1 == kStages ? 0 : cstage + 1;
    ++consumed;
  }
  if (acc == 0x7fffffff) *sink = acc;
}

// do_bench's flush: zeros written over the buffer by a kernel (what PyTorch's zero_() launches).
__global__ void write_flush(int4* buf, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    buf[i] = make_int4(0, 0, 0, 0);
  }
}

bool g_kernel_flush = false;  // --kernel-flush
bool g_plain_only = false;    // --plain
bool g_persistent = false;    // --persistent
bool g_dram = false;          // --dram
int g_reps = 40;              // timed repetitions per measurement (the first 5 are dropped)

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

// The median time of launch() between two events, each after the flush: dirty (zeros written
// by a kernel with --kernel-flush, else a memset) or clean (a 256 MB read); prepare() runs
// before each flush.
template <class Prepare, class Launch>
float median_after_flush(bool dirty, char* flush_buf, size_t flush_bytes, int* sink, Prepare prepare, Launch launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  for (int rep = 0; rep < g_reps; ++rep) {
    prepare();
    if (dirty && g_kernel_flush) {
      write_flush<<<1024, 256>>>(reinterpret_cast<int4*>(flush_buf), int64_t(flush_bytes / 16));
    } else if (dirty) {
      check(cudaMemsetAsync(flush_buf, rep & 1, flush_bytes), "memset");
    } else {
      read_flush<<<1024, 256>>>(reinterpret_cast<const int4*>(flush_buf), int64_t(flush_bytes / 16), sink);
    }
    cudaEventRecord(start);
    launch();
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

// Pads a kernel's shared memory so that exactly ctas_per_sm CTAs fit an SM (228 KB per SM, 1 KB
// each reserved), and allows it that much.
template <class Kernel>
int smem_for(Kernel kernel, int used, int ctas_per_sm) {
  const int smem = std::max(used, (228 * 1024) / ctas_per_sm - 1024 - 1024);
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem attr");
  return smem;
}

template <int kHint, int kStages>
float median_us(const Grid& g, const TmaMaps& maps, int batch, bool dirty, char* flush_buf, size_t flush_bytes, int* sink, int ctas_per_sm) {
  const auto kernel = stream_kernel<kHint, kStages>;
  const int smem = smem_for(kernel, kStages * 2 * kTileBytes + 64, ctas_per_sm);
  const dim3 grid(g.splits, batch * g.heads_k);
  return median_after_flush(dirty, flush_buf, flush_bytes, sink, [] {},
                            [&] { kernel<<<grid, kThreads, smem>>>(g, maps, sink); });
}

// persistent_stream_kernel on `ctas` CTAs after the dirty flush; the counter is reset before it.
template <int kStages, bool kDynamic>
float persistent_median_us(const Grid& g, int batch, int ctas, int chunk_tiles, char* flush_buf, size_t flush_bytes,
                           int* counter, int* sink, int ctas_per_sm) {
  const auto kernel = persistent_stream_kernel<kStages, kDynamic>;
  const int smem = smem_for(kernel, kStages * 2 * kTileBytes + 64, ctas_per_sm);
  return median_after_flush(
      true, flush_buf, flush_bytes, sink, [&] { check(cudaMemsetAsync(counter, 0, sizeof(int)), "counter"); },
      [&] { kernel<<<ctas, kThreads, smem>>>(g, batch * g.heads_k, chunk_tiles, counter, sink); });
}

template <int kStages, int kHint = 0>
void run_hints(const Grid& g, const TmaMaps (&maps)[3], int batch, double bytes, char* flush_buf, size_t flush_bytes, int* sink, int ctas_per_sm) {
  if constexpr (kHint < kHints) {
    if (g_plain_only && kHint != plain) return;
    const TmaMaps& m = maps[kHint == tma_flat ? 2 : kHint == tma_sw128_p256 ? 1 : 0];
    const float dirty = median_us<kHint, kStages>(g, m, batch, true, flush_buf, flush_bytes, sink, ctas_per_sm);
    const float clean = median_us<kHint, kStages>(g, m, batch, false, flush_buf, flush_bytes, sink, ctas_per_sm);
    std::printf("%4d x %-6d splits %2d stages %d ctas/SM %d %-18s dirty %7.1f us %5.2f TB/s   clean %7.1f us %5.2f TB/s\n",
                batch, g.rows, g.splits, kStages, ctas_per_sm, kHintNames[kHint], dirty, bytes / dirty / 1e6,
                clean, bytes / clean / 1e6);
    std::fflush(stdout);
    run_hints<kStages, kHint + 1>(g, maps, batch, bytes, flush_buf, flush_bytes, sink, ctas_per_sm);
  }
}

// K or V (batch x rows of heads_k x 128 bf16) as the map (d, heads_k, batch x rows) with boxes of
// 64 rows of one head: 64 elements wide in the 128-byte swizzle, or 128 wide unswizzled.
CUtensorMap make_map(const char* base, int64_t total_rows, int heads_k, bool swizzled, CUtensorMapL2promotion promo) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q),
          "cuTensorMapEncodeTiled");
    return reinterpret_cast<Encode>(fn);
  }();
  const cuuint64_t dims[3] = {128, cuuint64_t(heads_k), cuuint64_t(total_rows)};
  const cuuint64_t strides[2] = {kRowBytes, cuuint64_t(heads_k) * kRowBytes};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {swizzled ? 64u : 128u, 1, kTileRows};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<char*>(base), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            swizzled ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, promo,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", int(r));
    std::exit(1);
  }
  return map;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--kernel-flush") {
      g_kernel_flush = true;
    } else if (arg == "--plain") {
      g_plain_only = true;
    } else if (arg == "--persistent") {
      g_persistent = true;
    } else if (arg == "--dram") {
      g_dram = true;
      g_reps = 8;
    } else {
      std::fprintf(stderr, "usage: %s [--kernel-flush] [--plain] [--persistent] [--dram]\n", argv[0]);
      return 2;
    }
  }
  constexpr int kHeadsK = 8;
  constexpr size_t kFlushBytes = size_t(256) << 20;
  const size_t kv_bytes = size_t(128) * 1024 * kHeadsK * kRowBytes;  // 128k tokens of K (or V)
  char *k, *v, *flush_buf;
  int* sink;
  check(cudaMalloc(&k, kv_bytes), "malloc k");
  check(cudaMalloc(&v, kv_bytes), "malloc v");
  check(cudaMalloc(&flush_buf, kFlushBytes), "malloc flush");
  check(cudaMalloc(&sink, sizeof(int)), "malloc sink");
  int* lengths;
  check(cudaMalloc(&lengths, 1024 * sizeof(int)), "malloc lengths");
  cudaMemset(k, 1, kv_bytes);
  cudaMemset(v, 2, kv_bytes);
  const double bytes = 2.0 * kv_bytes;
  // The benchmark's 128k-token points with the plan's splits: 8 x 16k (4 splits) and 32 x 4k
  // (unsplit) are both 256 CTAs of 64 tiles; 128 x 1k is 1,024 CTAs of 16 tiles. The same grids
  // also read whole key rows (all KV heads' 2 KB, heads_k 1 over rows x 8 rows of 256 bytes):
  // each tile is then 16 KB of consecutive bytes, what a CTA covering every KV head of a batch
  // would read, against 64 rows of 256 bytes 2 KB apart.
  struct Point {
    int batch, rows, splits, heads_k;
  };
  const Point points[] = {{8, 16384, 4, kHeadsK}, {128, 1024, 1, kHeadsK}, {32, 4096, 1, kHeadsK},
                          {8, 16384 * kHeadsK, 4 * kHeadsK, 1}, {128, 1024 * kHeadsK, kHeadsK, 1}};
  // An unsplit grid over one head's rows of K and V, `rows` keys per sequence.
  auto one_head_grid = [&](int rows) {
    const int64_t row_stride = int64_t(kHeadsK) * kRowBytes;
    return Grid{k, v, row_stride, rows * row_stride, rows, 1, kHeadsK, nullptr, false};
  };
  if (g_dram) {
    // For Nsight Compute (--cache-control none): the 32 x 4k grid's plain and evict-first
    // copies after the dirty flush, a few times each, so that each kernel's DRAM bytes read and
    // written can be read off (what the evict-first hint does to the flush's write-back).
    const Grid g = one_head_grid(4096);
    const TmaMaps none{};
    std::printf("plain dirty %.1f us\n", median_us<plain, 3>(g, none, 32, true, flush_buf, kFlushBytes, sink, 2));
    std::printf("evict_first dirty %.1f us\n", median_us<evict_first, 3>(g, none, 32, true, flush_buf, kFlushBytes, sink, 2));
    return 0;
  }
  if (g_persistent) {
    // One-head grids at 3 stages x 2 CTAs per SM: a CTA per unit, against persistent grids of
    // whole units (static) and of items claimed as the CTAs go (dynamic), whole units or chunks.
    int* counter;
    check(cudaMalloc(&counter, sizeof(int)), "malloc counter");
    for (int round = 0; round < 2; ++round) {
      for (const Point pt : {Point{128, 1024, 1, kHeadsK}, Point{32, 4096, 1, kHeadsK}}) {
        const Grid g = one_head_grid(pt.rows);
        const TmaMaps none{};
        const int tiles = pt.rows / kTileRows;
        auto report = [&](const char* what, float us) {
          std::printf("%4d x %-6d %-40s dirty %7.1f us %5.2f TB/s\n", pt.batch, pt.rows, what, us, bytes / us / 1e6);
          std::fflush(stdout);
        };
        report("a CTA per unit", median_us<plain, 3>(g, none, pt.batch, true, flush_buf, kFlushBytes, sink, 2));
        for (int ctas : {264, 256}) {
          char what[64];
          std::snprintf(what, sizeof(what), "static units, %d CTAs", ctas);
          report(what, persistent_median_us<3, false>(g, pt.batch, ctas, tiles, flush_buf, kFlushBytes, counter, sink, 2));
        }
        for (int chunk : {tiles, 16, 4, 2, 1}) {
          if (chunk != tiles && chunk >= tiles) continue;  // whole units first, then chunks of fewer tiles
          char what[64];
          std::snprintf(what, sizeof(what), "dynamic chunks of %d tiles, 264 CTAs", chunk);
          report(what, persistent_median_us<3, true>(g, pt.batch, 264, chunk, flush_buf, kFlushBytes, counter, sink, 2));
        }
      }
    }
    return 0;
  }
  for (const Point pt : points) {
    if (g_plain_only && pt.heads_k == 1) continue;
    const int64_t row_stride = int64_t(pt.heads_k) * kRowBytes;
    Grid g{k, v, row_stride, int64_t(pt.rows) * row_stride, pt.rows, pt.splits, pt.heads_k, nullptr, false};
    const int64_t total_rows = int64_t(pt.batch) * pt.rows;
    const int hk = pt.heads_k;
    const TmaMaps maps[3] = {
        {make_map(k, total_rows, hk, true, CU_TENSOR_MAP_L2_PROMOTION_NONE),
         make_map(v, total_rows, hk, true, CU_TENSOR_MAP_L2_PROMOTION_NONE)},
        {make_map(k, total_rows, hk, true, CU_TENSOR_MAP_L2_PROMOTION_L2_256B),
         make_map(v, total_rows, hk, true, CU_TENSOR_MAP_L2_PROMOTION_L2_256B)},
        {make_map(k, total_rows, hk, false, CU_TENSOR_MAP_L2_PROMOTION_NONE),
         make_map(v, total_rows, hk, false, CU_TENSOR_MAP_L2_PROMOTION_NONE)}};
    std::printf("-- heads_k %d (%s)\n", hk, hk == 1 ? "whole key rows, consecutive bytes" : "one head's rows");
    run_hints<2>(g, maps, pt.batch, bytes, flush_buf, kFlushBytes, sink, 3);  // the default pipeline
    run_hints<3>(g, maps, pt.batch, bytes, flush_buf, kFlushBytes, sink, 2);
    run_hints<5>(g, maps, pt.batch, bytes, flush_buf, kFlushBytes, sink, 1);  // the deep pipeline's stages
    if (hk == 1 || g_plain_only) continue;
    // Each CTA reads its sequence's length (flushed out of the L2 like everything else) before
    // its first copy, as the decode kernels do: what that dependent read costs the stream.
    std::vector<int> host_lengths(pt.batch, pt.rows);
    check(cudaMemcpy(lengths, host_lengths.data(), pt.batch * sizeof(int), cudaMemcpyHostToDevice), "lengths");
    Grid with_length = g, descending = g;
    with_length.lengths = lengths;
    descending.descending = true;
    for (const Grid& gg : {g, with_length, descending}) {
      const char* what = gg.descending ? "descending tiles" : gg.lengths != nullptr ? "length read first" : "no length read";
      std::printf("%4d x %-6d %-18s 2 stages x 3 CTAs/SM dirty %7.1f us   3 x 2 dirty %7.1f us\n", pt.batch, pt.rows,
                  what, median_us<plain, 2>(gg, maps[0], pt.batch, true, flush_buf, kFlushBytes, sink, 3),
                  median_us<plain, 3>(gg, maps[0], pt.batch, true, flush_buf, kFlushBytes, sink, 2));
    }
  }
  return 0;
}
