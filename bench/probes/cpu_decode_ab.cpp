// Probe: CPU decode calls of bench/cpu_bench.py's decode points through the C++ API, for A/B of two library builds.
//
// bf16, 32 query heads over 8 KV heads, d 128, one query row; batch 1 and 8, context 4k and 32k,
// contiguous and paged (page 16, pages shuffled as cpu_bench.py's paged_copy does). Prints GB/s of
// the K and V bytes per point (best of --repeat calls, each after a 50 ms pause, as cpu_bench.py)
// next to a one-thread plain C sum over as many fp32 bytes. Build it against each library and
// run the two binaries in turns (one process each, several rounds), e.g.
//
//   g++ -O2 -std=c++17 -Iinclude bench/probes/cpu_decode_ab.cpp -Lbuild/cpu -lflashattn -ldl -o /tmp/decode_ab
//   for i in 1 2 3; do for lib in /tmp/base /tmp/new; do
//     LD_LIBRARY_PATH=$lib FLASHATTN_KERNEL=automatic,cpu=avx2 /tmp/decode_ab; done; done
//
// Arguments: [repeat (5)] [points: a subset such as "1x4k/16,8x32k/0" (all)] [threads (0: all)]
// [num_splits (0: the library's choice)]. With FLASHATTN_AB="libA.so libB.so" in the environment
// the probe loads both libraries (dlopen) and times their forward_kvcache in turns, call by call
// within each point (A, B, A, B, ...), so that the shared machine's drifts touch both alike; it
// prints both and the ratio of their best times (A / B).
#include <dlfcn.h>
#include <flashattn/flashattn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128, kPage = 16;

uint16_t bf16_of(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return uint16_t((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

std::vector<uint16_t> random_bf16(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> x(n);
  for (auto& e : x) e = bf16_of(normal(rng));
  return x;
}

using ForwardKvcache = void (*)(const flashattn::Tensor&, const flashattn::Tensor&, const flashattn::Tensor&,
                               const flashattn::Tensor&, const flashattn::KVCacheArgs&,
                               const flashattn::AttentionOptions&);
std::vector<ForwardKvcache> ab_calls;  // FLASHATTN_AB's libraries, in order
std::vector<std::string> ab_names;

void load_ab() {
  const char* env = std::getenv("FLASHATTN_AB");
  if (env == nullptr) return;
  std::string list = env;
  for (size_t at = 0; at < list.size();) {
    size_t end = list.find(' ', at);
    if (end == std::string::npos) end = list.size();
    const std::string path = list.substr(at, end - at);
    at = end + 1;
    if (path.empty()) continue;
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) std::fprintf(stderr, "%s\n", dlerror()), std::exit(1);
    auto fn = reinterpret_cast<ForwardKvcache>(
        dlsym(lib, "_ZN9flashattn15forward_kvcacheERKNS_6TensorES2_S2_S2_RKNS_11KVCacheArgsERKNS_16AttentionOptionsE"));
    if (fn == nullptr) std::fprintf(stderr, "no forward_kvcache in %s\n", path.c_str()), std::exit(1);
    ab_calls.push_back(fn), ab_names.push_back(path);
  }
}

template <typename F>
double best_seconds(F&& fn, int repeat) {
  fn();  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto start = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

// A plain sum of x[lo, hi) (16 partial sums, which g++ vectorizes at -O2).
float sum_range(const float* x, size_t lo, size_t hi) {
  float acc[16] = {};
  for (size_t i = lo; i + 16 <= hi; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += x[i + l];
  return std::accumulate(acc, acc + 16, 0.0f);
}

// GB/s of a sum over `bytes` of fp32 on `threads` threads (each a contiguous part).
double sum_gbs(size_t bytes, int threads, int repeat) {
  std::vector<float> x(bytes / 4, 1.0f);
  std::vector<float> part(threads);
  volatile float sink = 0;
  const size_t n = x.size(), chunk = n / threads;
  const double s = best_seconds([&] {
    std::vector<std::thread> helpers;
    for (int t = 1; t < threads; ++t) helpers.emplace_back([&, t] { part[t] = sum_range(x.data(), t * chunk, (t + 1) * chunk); });
    part[0] = sum_range(x.data(), 0, chunk);
    for (auto& h : helpers) h.join();
    sink = std::accumulate(part.begin(), part.end(), 0.0f);
  }, repeat);
  return bytes / s / 1e9;
}

void point(int b, int ctx, int page, int repeat, int threads, int splits) {
  using flashattn::DType;
  using flashattn::Tensor;
  const size_t kv_elems = size_t(b) * ctx * kKvHeads * kHeadDim;
  auto q = random_bf16(size_t(b) * kHeads * kHeadDim, 1);
  auto k = random_bf16(kv_elems, 2), v = random_bf16(kv_elems, 3);
  std::vector<uint16_t> out(q.size());
  std::vector<int32_t> seqlens(b, ctx), table;
  flashattn::KVCacheArgs args;
  args.cache_seqlens = Tensor::contiguous(seqlens.data(), DType::i32, {b});
  args.num_splits = splits;
  Tensor tk, tv;
  if (page == 0) {
    tk = Tensor::contiguous(k.data(), DType::bf16, {b, ctx, kKvHeads, kHeadDim});
    tv = Tensor::contiguous(v.data(), DType::bf16, {b, ctx, kKvHeads, kHeadDim});
  } else {  // pages shuffled: sequence page i lives at perm[i]
    const int per_seq = ctx / page, pages = b * per_seq;
    std::vector<int32_t> perm(pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
    const size_t page_elems = size_t(page) * kKvHeads * kHeadDim;
    std::vector<uint16_t> pk(kv_elems), pv(kv_elems);
    for (int i = 0; i < pages; ++i) {
      std::memcpy(&pk[perm[i] * page_elems], &k[i * page_elems], page_elems * 2);
      std::memcpy(&pv[perm[i] * page_elems], &v[i * page_elems], page_elems * 2);
    }
    k.swap(pk), v.swap(pv);
    table.assign(perm.begin(), perm.end());
    args.block_table = Tensor::contiguous(table.data(), DType::i32, {b, per_seq});
    tk = Tensor::contiguous(k.data(), DType::bf16, {pages, page, kKvHeads, kHeadDim});
    tv = Tensor::contiguous(v.data(), DType::bf16, {pages, page, kKvHeads, kHeadDim});
  }
  const Tensor tq = Tensor::contiguous(q.data(), DType::bf16, {b, 1, kHeads, kHeadDim});
  const Tensor to = Tensor::contiguous(out.data(), DType::bf16, {b, 1, kHeads, kHeadDim});
  const size_t bytes = 2 * kv_elems * 2;
  flashattn::AttentionOptions options;
  options.num_threads = threads;
  if (!ab_calls.empty()) {
    std::vector<double> best(ab_calls.size(), 1e30);
    for (auto fn : ab_calls) fn(tq, tk, tv, to, args, options);  // warm-up
    for (int r = 0; r < repeat; ++r) {
      for (size_t i = 0; i < ab_calls.size(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const auto start = Clock::now();
        ab_calls[i](tq, tk, tv, to, args, options);
        best[i] = std::min(best[i], std::chrono::duration<double>(Clock::now() - start).count());
      }
    }
    std::printf("%d x %5d page %2d ", b, ctx, page);
    for (size_t i = 0; i < best.size(); ++i) std::printf(" %8.3f ms %6.2f GB/s |", best[i] * 1e3, bytes / best[i] / 1e9);
    std::printf(" A/B time %.3f\n", best[0] / best.back());
    std::fflush(stdout);
    return;
  }
  const double s = best_seconds([&] { flashattn::forward_kvcache(tq, tk, tv, to, args, options); }, repeat);
  std::printf("%d x %5d page %2d  %8.3f ms  %6.2f GB/s  (C sum 1 thread %6.2f, 2 threads %6.2f GB/s)\n", b, ctx,
              page, s * 1e3, bytes / s / 1e9, sum_gbs(bytes, 1, repeat), sum_gbs(bytes, 2, repeat));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  load_ab();
  const int repeat = argc > 1 ? std::atoi(argv[1]) : 5;
  const std::string only = argc > 2 ? argv[2] : "";
  const int threads = argc > 3 ? std::atoi(argv[3]) : 0;
  const int splits = argc > 4 ? std::atoi(argv[4]) : 0;
  for (int b : {1, 8}) {
    for (int ctx : {4096, 32768}) {
      for (int page : {0, kPage}) {
        const std::string name = std::to_string(b) + "x" + std::to_string(ctx / 1024) + "k/" + std::to_string(page);
        if (!only.empty() && only.find(name) == std::string::npos) continue;
        point(b, ctx, page, repeat, threads, splits);
      }
    }
  }
}
