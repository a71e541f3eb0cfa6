// `flashattn bench`: a grid of problems, a progress bar on stderr, a table on stdout, and
// optionally CSV / JSON files.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "args.h"
#include "cli.h"
#include "json.h"

namespace facli {
namespace {

// FlashAttention-2's benchmark grid (benchmarks/benchmark_flash_attention.py).
constexpr int kFa2Tokens = 16384;  // batch = tokens / seqlen
constexpr int kFa2Hidden = 2048;   // heads = hidden / head_dim
const std::vector<int> kFa2HeadDims = {64, 128, 256};
const std::vector<int> kFa2Seqlens = {512, 1024, 2048, 4096, 8192, 16384};
// On a CPU the default grid is cut to a size that runs in about a minute on a few cores.
constexpr int kCpuTokens = 4096;
const std::vector<int> kCpuSeqlens = {512, 1024, 2048};
// --quick: seconds on a CPU.
constexpr int kQuickTokens = 1024;
constexpr int kQuickHidden = 256;
const std::vector<int> kQuickHeadDims = {64};
const std::vector<int> kQuickSeqlens = {128, 256};
// Decode grid: one query token, 32 heads sharing 8 KV heads (Llama-style GQA), d = 128.
constexpr int kDecodeHeads = 32;
constexpr int kDecodeKvHeads = 8;
constexpr int kDecodeHeadDim = 128;
const std::vector<int> kDecodeBatches = {1, 8, 32, 128};
const std::vector<int> kDecodeContexts = {1024, 4096, 16384, 65536};
const std::vector<int> kQuickDecodeBatches = {1, 8};
const std::vector<int> kQuickDecodeContexts = {1024, 4096};
constexpr int64_t kDecodeMaxTokens = int64_t(1) << 21;     // 2M tokens: 8 GB of bf16 K+V
constexpr int64_t kCpuDecodeMaxTokens = int64_t(1) << 17;  // 128k tokens on a CPU
constexpr int kDefaultRepeatCpu = 1;
constexpr int kDefaultRepeatCuda = 10;
constexpr int kProgressWidth = 30;
constexpr double kTera = 1e12, kGiga = 1e9, kMsPerS = 1e3;

struct Point {
  ProblemSpec spec;
  std::string label;
};

struct Row {
  Point point;
  double ms = 0;
  Counts counts;
  std::string error;
  double tflops() const { return ms > 0 ? counts.flops / (ms / kMsPerS) / kTera : 0; }
  double gbps() const { return ms > 0 ? counts.kv_bytes / (ms / kMsPerS) / kGiga : 0; }
};

ProblemSpec base_spec(const BenchOptions& o) {
  ProblemSpec s;
  s.dtype = o.dtype;
  s.kv_dtype = o.dtype;
  s.random_lengths = false;
  s.fast_fill = true;
  s.seed = o.seed;
  s.threads = o.threads;
  return s;
}

std::vector<bool> causal_modes(CausalModes m) {
  if (m == CausalModes::on) return {true};
  if (m == CausalModes::off) return {false};
  return {false, true};
}

std::vector<Point> prefill_grid(const BenchOptions& o, Device device) {
  const bool cpu = device == Device::cpu;
  const int tokens = o.quick ? kQuickTokens : (cpu ? kCpuTokens : kFa2Tokens);
  const int hidden = o.quick ? kQuickHidden : kFa2Hidden;
  const auto& dims = !o.head_dims.empty() ? o.head_dims : (o.quick ? kQuickHeadDims : kFa2HeadDims);
  const auto& lens = !o.seqlens.empty() ? o.seqlens : (o.quick ? kQuickSeqlens : (cpu ? kCpuSeqlens : kFa2Seqlens));
  std::vector<Point> grid;
  for (bool causal : causal_modes(o.causal)) {
    for (int d : dims) {
      for (int n : lens) {
        ProblemSpec s = base_spec(o);
        s.batch = std::max(1, tokens / n);
        s.heads = s.kv_heads = std::max(1, hidden / d);
        s.head_dim = d;
        s.seqlen_q = s.seqlen_k = n;
        s.causal = causal;
        grid.push_back({s, "hdim=" + std::to_string(d) + " seqlen=" + std::to_string(n) + (causal ? " causal" : "")});
      }
    }
  }
  return grid;
}

std::vector<Point> decode_grid(const BenchOptions& o, Device device) {
  const int64_t max_tokens = device == Device::cpu ? kCpuDecodeMaxTokens : kDecodeMaxTokens;
  const auto& batches = !o.batches.empty() ? o.batches : (o.quick ? kQuickDecodeBatches : kDecodeBatches);
  const auto& contexts = !o.seqlens.empty() ? o.seqlens : (o.quick ? kQuickDecodeContexts : kDecodeContexts);
  const auto& dims = !o.head_dims.empty() ? o.head_dims : std::vector<int>{kDecodeHeadDim};
  std::vector<Point> grid;
  for (int d : dims) {
    for (int b : batches) {
      for (int n : contexts) {
        if (int64_t(b) * n > max_tokens) continue;
        ProblemSpec s = base_spec(o);
        s.mode = Mode::kvcache;
        s.batch = b;
        s.seqlen_q = 1;
        s.seqlen_k = n;
        s.heads = kDecodeHeads;
        s.kv_heads = kDecodeKvHeads;
        s.head_dim = d;
        s.paged = o.page_size > 0;
        s.page_size = o.page_size > 0 ? o.page_size : s.page_size;
        s.splits = o.splits;
        grid.push_back({s, "batch=" + std::to_string(b) + " context=" + std::to_string(n) + " hdim=" + std::to_string(d)});
      }
    }
  }
  return grid;
}

void note_grid_size(const BenchOptions& o, Device device) {
  if (device != Device::cpu || o.quick) return;
  if (!o.decode && o.seqlens.empty())
    std::fprintf(stderr, "flashattn: note: on the CPU the default grid is cut to %d tokens per batch, "
                 "seqlen <= %d (--seqlens to choose, --quick for a small grid)\n", kCpuTokens, kCpuSeqlens.back());
  if (o.decode)
    std::fprintf(stderr, "flashattn: note: on the CPU the decode grid stops at %lld tokens per point\n",
                 (long long)kCpuDecodeMaxTokens);
}

// "[#####-----] 12/36 hdim=128 seqlen=2048 causal": redrawn in place on a terminal, one line
// per point otherwise (logs).
void show_progress(size_t done, size_t total, const std::string& label) {
  static const bool tty = isatty(fileno(stderr));
  const int filled = total ? int(kProgressWidth * done / total) : kProgressWidth;
  const std::string bar = std::string(filled, '#') + std::string(kProgressWidth - filled, '-');
  std::fprintf(stderr, "%s[%s] %zu/%zu %s%s", tty ? "\r\033[K" : "", bar.c_str(), done, total,
               label.c_str(), tty ? "" : "\n");
  if (tty && done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

Row run_point(const Point& point, const ExecConfig& config) {
  Row row;
  row.point = point;
  try {
    check_problem_size(point.spec);
    const HostProblem problem = make_problem(point.spec);
    row.counts = count_work(problem);
    row.ms = median(execute(problem, config, false).times_ms);
  } catch (const flashattn::Error& e) {
    row.error = e.what();
  } catch (const std::bad_alloc&) {
    row.error = "out of host memory";
  } catch (const UsageError& e) {
    row.error = e.what();
  }
  return row;
}

void print_table(const std::vector<Row>& rows) {
  std::printf("%-7s %5s %7s %7s %5s %5s %5s %-6s %10s %9s %9s\n", "mode", "batch", "sq", "sk",
              "heads", "kv", "hdim", "causal", "time_ms", "TFLOP/s", "GB/s");
  for (const Row& r : rows) {
    const ProblemSpec& s = r.point.spec;
    std::printf("%-7s %5d %7d %7d %5d %5d %5d %-6s ", s.mode == Mode::kvcache ? "decode" : "prefill",
                s.batch, s.seqlen_q, s.seqlen_k, s.heads, s.kv_heads, s.head_dim, s.causal ? "yes" : "no");
    if (r.error.empty())
      std::printf("%10.4f %9.3f %9.2f\n", r.ms, r.tflops(), r.gbps());
    else
      std::printf("error: %s\n", r.error.c_str());
  }
}

std::string csv_field(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

void write_csv(std::ostream& os, const std::vector<Row>& rows, const std::string& device) {
  os << "device,dtype,mode,batch,seqlen_q,seqlen_k,heads,kv_heads,head_dim,causal,page_size,splits,"
        "time_ms,tflops,gbps,flops_count,error\n";
  for (const Row& r : rows) {
    const ProblemSpec& s = r.point.spec;
    os << device << ',' << dtype_label(s.dtype) << ',' << (s.mode == Mode::kvcache ? "decode" : "prefill")
       << ',' << s.batch << ',' << s.seqlen_q << ',' << s.seqlen_k << ',' << s.heads << ',' << s.kv_heads
       << ',' << s.head_dim << ',' << (s.causal ? 1 : 0) << ',' << (s.paged ? s.page_size : 0) << ','
       << s.splits << ',' << r.ms << ',' << r.tflops() << ',' << r.gbps() << ','
       << (r.counts.flops_exact ? "exact" : "fa2") << ',' << csv_field(r.error) << '\n';
  }
}

std::string row_json(const Row& r) {
  const ProblemSpec& s = r.point.spec;
  JsonObject j;
  j.add("mode", s.mode == Mode::kvcache ? "decode" : "prefill").add("batch", s.batch);
  j.add("seqlen_q", s.seqlen_q).add("seqlen_k", s.seqlen_k).add("heads", s.heads);
  j.add("kv_heads", s.kv_heads).add("head_dim", s.head_dim).add("causal", s.causal);
  j.add("page_size", s.paged ? s.page_size : 0).add("splits", s.splits);
  j.add("time_ms", r.ms).add("tflops", r.tflops()).add("gbps", r.gbps());
  j.add("flops_count", r.counts.flops_exact ? "exact" : "fa2");
  if (!r.error.empty()) j.add("error", r.error);
  return j.str();
}

void write_json(std::ostream& os, const std::vector<Row>& rows, const std::string& device, const BenchOptions& o) {
  JsonObject j;
  j.add("command", "bench").add("device", device).add("dtype", dtype_label(o.dtype));
  j.add("grid", o.decode ? "decode" : "prefill");
  std::string results = "[";
  for (size_t i = 0; i < rows.size(); ++i) results += (i ? ",\n  " : "\n  ") + row_json(rows[i]);
  j.add_raw("results", results + "\n]");
  os << j.str() << "\n";
}

// Output files are opened before the grid runs, so that a bad path fails at once.
std::unique_ptr<std::ofstream> open_output(const std::string& path) {
  if (path.empty()) return nullptr;
  auto f = std::make_unique<std::ofstream>(path);
  if (!*f) throw UsageError("cannot write '" + path + "'");
  return f;
}

}  // namespace

int bench_command(int argc, char** argv) {
  const BenchOptions o = parse_bench_args(argc, argv);
  if (o.help) {
    std::fputs(bench_help().c_str(), stdout);
    return kExitOk;
  }
  ExecConfig config;
  config.device = resolve_device(o.device);
  config.repeat = o.repeat > 0 ? o.repeat : (config.device == Device::cuda ? kDefaultRepeatCuda : kDefaultRepeatCpu);
  const std::string device = flashattn::device_name(config.device);
  auto csv = open_output(o.csv_path);
  auto json = open_output(o.json_path);
  note_grid_size(o, config.device);

  const std::vector<Point> grid = o.decode ? decode_grid(o, config.device) : prefill_grid(o, config.device);
  std::vector<Row> rows;
  for (size_t i = 0; i < grid.size(); ++i) {
    show_progress(i, grid.size(), grid[i].label);
    rows.push_back(run_point(grid[i], config));
  }
  show_progress(grid.size(), grid.size(), "done");

  print_table(rows);
  if (csv) write_csv(*csv, rows, device);
  if (json) write_json(*json, rows, device, o);
  const bool failed = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return !r.error.empty(); });
  return failed ? kExitFailure : kExitOk;
}

}  // namespace facli
