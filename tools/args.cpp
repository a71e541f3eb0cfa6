// Command-line parsing: one table of flags per subcommand (name, value, help, action); the help
// text is printed from the same table, so it cannot drift from what is parsed.
#include "args.h"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace facli {
namespace {

template <class Opts>
struct Flag {
  const char* name;
  const char* metavar;  // nullptr: a switch without a value
  const char* help;
  std::function<void(Opts&, const std::string&)> apply;
};

template <class Opts>
const Flag<Opts>* find_flag(const std::vector<Flag<Opts>>& flags, const std::string& name) {
  for (const auto& f : flags)
    if (name == f.name) return &f;
  return nullptr;
}

// Splits "--flag=value" and takes the value from the next argument otherwise.
template <class Opts>
void parse_flags(int argc, char** argv, const std::vector<Flag<Opts>>& flags, Opts& opts) {
  const std::string cmd = argv[0];
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (arg == "-h") arg = "--help";
    const size_t eq = arg.find('=');
    const bool inline_value = arg.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    const Flag<Opts>* flag = find_flag(flags, arg);
    if (!flag)
      throw UsageError("unknown option '" + arg + "' for '" + cmd + "' (see 'flashattn " + cmd +
                       " --help')");
    if (flag->metavar && !inline_value) {
      if (i + 1 >= argc) throw UsageError(arg + " needs a value (" + flag->metavar + ")");
      value = argv[++i];
    } else if (!flag->metavar && inline_value) {
      throw UsageError(arg + " takes no value");
    }
    flag->apply(opts, value);
  }
}

template <class Opts>
std::string flags_help(const std::vector<Flag<Opts>>& flags) {
  constexpr size_t kColumn = 26;  // where the help text starts
  std::ostringstream os;
  for (const auto& f : flags) {
    std::string left = std::string("  ") + f.name + (f.metavar ? std::string(" ") + f.metavar : "");
    if (left.size() + 1 > kColumn) left += "\n" + std::string(kColumn - 1, ' ');
    os << left << std::string(left.size() < kColumn ? kColumn - left.size() : 1, ' ')
       << f.help << "\n";
  }
  return os.str();
}

float parse_float(const std::string& flag, const std::string& text, float min_value) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(x) || x < min_value)
    throw UsageError(flag + ": expected a number >= " + std::to_string(min_value) + ", got '" +
                     text + "'");
  return float(x);
}

DType parse_dtype(const std::string& flag, const std::string& text) {
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  if (text == "fp16" || text == "f16" || text == "float16") return DType::f16;
  if (text == "e4m3" || text == "fp8" || text == "float8_e4m3fn") return DType::e4m3;
  throw UsageError(flag + ": expected bf16, fp16 or e4m3, got '" + text + "'");
}

std::string parse_device_name(const std::string& text) {
  if (text == "cpu" || text == "cuda" || text == "auto") return text;
  throw UsageError("--device: expected cpu, cuda or auto, got '" + text + "'");
}

void parse_window(const std::string& text, ProblemSpec& s) {
  const size_t comma = text.find(',');
  if (comma == std::string::npos)
    throw UsageError("--window: expected LEFT,RIGHT (-1 = unbounded), got '" + text + "'");
  s.window_left = parse_int("--window", text.substr(0, comma), -1);
  s.window_right = parse_int("--window", text.substr(comma + 1), -1);
}

Rotary parse_rotary(const std::string& text) {
  if (text == "interleaved") return Rotary::interleaved;
  if (text == "neox") return Rotary::neox;
  throw UsageError("--rotary: expected interleaved or neox, got '" + text + "'");
}

CausalModes parse_causal_modes(const std::string& text) {
  if (text == "both") return CausalModes::both;
  if (text == "on") return CausalModes::on;
  if (text == "off") return CausalModes::off;
  throw UsageError("--causal: expected both, on or off, got '" + text + "'");
}

// ---- run -------------------------------------------------------------------------------------

using RunFlag = Flag<RunOptions>;

const std::vector<RunFlag>& run_flags() {
  static const std::vector<RunFlag> flags = {
      {"--device", "cpu|cuda|auto", "backend (auto: cuda when a GPU is visible) [auto]",
       [](RunOptions& o, const std::string& v) { o.device = parse_device_name(v); }},
      {"--dtype", "bf16|fp16|e4m3",
       "storage type of q, k, v, out [bf16]; e4m3: FP8 q, k, v, out bf16",
       [](RunOptions& o, const std::string& v) { o.spec.dtype = parse_dtype("--dtype", v); }},
      {"--kv-dtype", "bf16|fp16|e4m3",
       "--kvcache: storage type of the cache (e4m3: FP8) [= --dtype]",
       [](RunOptions& o, const std::string& v) { o.spec.kv_dtype = parse_dtype("--kv-dtype", v); }},
      {"--batch", "B", "sequences [2]",
       [](RunOptions& o, const std::string& v) { o.spec.batch = parse_int("--batch", v, 1); }},
      {"--seqlen-q", "N", "queries per sequence (varlen: the maximum) [512]",
       [](RunOptions& o, const std::string& v) { o.spec.seqlen_q = parse_int("--seqlen-q", v, 1); }},
      {"--seqlen-k", "N", "keys per sequence (kvcache: cache capacity) [= seqlen-q]",
       [](RunOptions& o, const std::string& v) { o.spec.seqlen_k = parse_int("--seqlen-k", v, 1); }},
      {"--heads", "H", "query heads [8]",
       [](RunOptions& o, const std::string& v) { o.spec.heads = parse_int("--heads", v, 1); }},
      {"--kv-heads", "HK", "key/value heads, H % HK == 0 (GQA/MQA) [= heads]",
       [](RunOptions& o, const std::string& v) { o.spec.kv_heads = parse_int("--kv-heads", v, 1); }},
      {"--head-dim", "D", "head dimension [128]",
       [](RunOptions& o, const std::string& v) { o.spec.head_dim = parse_int("--head-dim", v, 1); }},
      {"--causal", nullptr, "causal mask (bottom-right aligned)",
       [](RunOptions& o, const std::string&) { o.spec.causal = true; }},
      {"--window", "L,R", "sliding window, -1 = unbounded side",
       [](RunOptions& o, const std::string& v) { parse_window(v, o.spec); }},
      {"--alibi", nullptr, "ALiBi slopes 2^(-8(i+1)/H)",
       [](RunOptions& o, const std::string&) { o.spec.alibi = true; }},
      {"--softcap", "X", "score soft-capping X*tanh(s/X) (0 = off)",
       [](RunOptions& o, const std::string& v) { o.spec.softcap = parse_float("--softcap", v, 0); }},
      {"--varlen", nullptr, "packed sequences of random lengths <= seqlen",
       [](RunOptions& o, const std::string&) { o.spec.mode = Mode::varlen; }},
      {"--kvcache", nullptr, "attend over a KV cache with random cache_seqlens",
       [](RunOptions& o, const std::string&) { o.spec.mode = Mode::kvcache; }},
      {"--paged", nullptr, "paged K/V with a shuffled block table (--kvcache or --varlen)",
       [](RunOptions& o, const std::string&) { o.spec.paged = true; }},
      {"--page-size", "P", "rows per page (implies --paged) [256]",
       [](RunOptions& o, const std::string& v) {
         o.spec.page_size = parse_int("--page-size", v, 1);
         o.spec.paged = true;
       }},
      {"--splits", "S", "split-KV count for --kvcache (0 = heuristic) [0]",
       [](RunOptions& o, const std::string& v) {
         o.spec.splits = parse_int("--splits", v, 0);
       }},
      {"--append", "N", "--kvcache: append N new keys/values per sequence first",
       [](RunOptions& o, const std::string& v) { o.spec.append = parse_int("--append", v, 0); }},
      {"--rotary", "interleaved|neox", "--kvcache: rotary embedding of q and the new keys",
       [](RunOptions& o, const std::string& v) { o.spec.rotary = parse_rotary(v); }},
      {"--check", nullptr, "compare with the float64 reference; exit 1 on a mismatch",
       [](RunOptions& o, const std::string&) { o.check = true; }},
      {"--repeat", "N", "timed runs, median reported [cpu 3, cuda 20]",
       [](RunOptions& o, const std::string& v) { o.repeat = parse_int("--repeat", v, 1); }},
      {"--seed", "N", "seed of the random inputs [0]",
       [](RunOptions& o, const std::string& v) { o.spec.seed = uint64_t(parse_int("--seed", v, 0)); }},
      {"--threads", "N", "CPU backend threads (0 = all) [0]",
       [](RunOptions& o, const std::string& v) { o.spec.threads = parse_int("--threads", v, 0); }},
      {"--json", nullptr, "print one JSON object instead of text",
       [](RunOptions& o, const std::string&) { o.json = true; }},
      {"--help", nullptr, "this help", [](RunOptions& o, const std::string&) { o.help = true; }},
  };
  return flags;
}

// Combinations the tool cannot build. Shape rules the library owns (h % hk, head dims) are
// left to it, so that its own message is what the user sees.
void validate_run(const RunOptions& o) {
  const ProblemSpec& s = o.spec;
  const bool kvcache = s.mode == Mode::kvcache;
  if (s.paged && s.mode == Mode::dense) throw UsageError("--paged needs --kvcache or --varlen");
  if (s.splits > flashattn::kMaxSplits)
    throw UsageError("--splits: at most " + std::to_string(flashattn::kMaxSplits) + ", got " +
                     std::to_string(s.splits));
  if (!kvcache && s.splits > 0) throw UsageError("--splits needs --kvcache");
  if (!kvcache && s.append > 0) throw UsageError("--append needs --kvcache");
  if (!kvcache && s.rotary != Rotary::none) throw UsageError("--rotary needs --kvcache");
  if (!kvcache && s.kv_dtype != s.dtype)
    throw UsageError("--kv-dtype needs --kvcache (for prefill --dtype sets q, k and v)");
  if (kvcache && s.append > s.seqlen_k)
    throw UsageError("--append " + std::to_string(s.append) + " does not fit the cache (--seqlen-k " +
                     std::to_string(s.seqlen_k) + ")");
  check_problem_size(s);
}

bool has_flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == name || a.rfind(name + "=", 0) == 0) return true;
  }
  return false;
}

}  // namespace

int parse_int(const std::string& flag, const std::string& text, int min_value) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || x < min_value || x > INT_MAX)
    throw UsageError(flag + ": expected an integer >= " + std::to_string(min_value) + ", got '" +
                     text + "'");
  return int(x);
}

std::vector<int> parse_int_list(const std::string& flag, const std::string& text, int min_value) {
  std::vector<int> values;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) values.push_back(parse_int(flag, item, min_value));
  if (values.empty()) throw UsageError(flag + ": expected a comma-separated list, got '" + text + "'");
  return values;
}

RunOptions parse_run_args(int argc, char** argv) {
  RunOptions o;
  parse_flags(argc, argv, run_flags(), o);
  if (has_flag(argc, argv, "--varlen") && has_flag(argc, argv, "--kvcache"))
    throw UsageError("--varlen and --kvcache cannot be combined");
  if (!has_flag(argc, argv, "--seqlen-k")) o.spec.seqlen_k = o.spec.seqlen_q;
  if (!has_flag(argc, argv, "--kv-heads")) o.spec.kv_heads = o.spec.heads;
  if (!has_flag(argc, argv, "--kv-dtype")) o.spec.kv_dtype = o.spec.dtype;
  if (!o.help) validate_run(o);
  return o;
}

static std::string fp8_rtol_text() {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", kFp8Rtol);
  return buf;
}

std::string run_help() {
  return "usage: flashattn run [options]\n"
         "Solves one attention problem on seeded random normal inputs and prints its time and\n"
         "TFLOP/s (GB/s of K and V read for --kvcache).\n\noptions:\n" +
         flags_help(run_flags()) +
         "\nFP8 (e4m3): the random inputs are quantized with one descale = amax / 448 (fp32) per\n"
         "(batch, KV head), given as q/k/v_descale; appended keys/values (in out's dtype) are\n"
         "quantized into an e4m3 cache by the library. --check compares with the float64\n"
         "reference on the dequantized inputs: max err <= " + fp8_rtol_text() + " * max|reference|.\n"
         "\nexamples:\n"
         "  flashattn run --device cpu --check --causal --seqlen-q 300 --head-dim 64\n"
         "  flashattn run --kvcache --paged --page-size 16 --splits 3 --heads 8 --kv-heads 2 \\\n"
         "      --seqlen-q 5 --append 5 --rotary neox --causal --check\n"
         "  flashattn run --dtype e4m3 --causal --check            (FP8 prefill)\n"
         "  flashattn run --kvcache --kv-dtype e4m3 --append 1 --check   (FP8 KV cache)\n";
}

// ---- bench -----------------------------------------------------------------------------------

namespace {

using BenchFlag = Flag<BenchOptions>;

const std::vector<BenchFlag>& bench_flags() {
  static const std::vector<BenchFlag> flags = {
      {"--device", "cpu|cuda|auto", "backend [auto]",
       [](BenchOptions& o, const std::string& v) { o.device = parse_device_name(v); }},
      {"--dtype", "bf16|fp16", "storage type [bf16]",
       [](BenchOptions& o, const std::string& v) { o.dtype = parse_dtype("--dtype", v); }},
      {"--head-dims", "D,D,..", "head dims [64,128,256; decode 128]",
       [](BenchOptions& o, const std::string& v) { o.head_dims = parse_int_list("--head-dims", v, 1); }},
      {"--seqlens", "N,N,..", "sequence lengths (decode: context lengths)",
       [](BenchOptions& o, const std::string& v) { o.seqlens = parse_int_list("--seqlens", v, 1); }},
      {"--batches", "B,B,..", "decode batch sizes [1,8,32,128]",
       [](BenchOptions& o, const std::string& v) { o.batches = parse_int_list("--batches", v, 1); }},
      {"--causal", "both|on|off", "causal modes of the prefill grid [both]",
       [](BenchOptions& o, const std::string& v) { o.causal = parse_causal_modes(v); }},
      {"--repeat", "N", "timed runs per point, median reported [cpu 1, cuda 10]",
       [](BenchOptions& o, const std::string& v) { o.repeat = parse_int("--repeat", v, 1); }},
      {"--quick", nullptr, "a small grid (seconds on a CPU)",
       [](BenchOptions& o, const std::string&) { o.quick = true; }},
      {"--decode", nullptr, "the decode grid: q_len 1, 32 heads, 8 KV heads, KV cache",
       [](BenchOptions& o, const std::string&) { o.decode = true; }},
      {"--page-size", "P", "decode: page the KV cache with P rows per page",
       [](BenchOptions& o, const std::string& v) { o.page_size = parse_int("--page-size", v, 1); }},
      {"--splits", "S", "decode: split-KV count (0 = heuristic) [0]",
       [](BenchOptions& o, const std::string& v) { o.splits = parse_int("--splits", v, 0); }},
      {"--threads", "N", "CPU backend threads (0 = all) [0]",
       [](BenchOptions& o, const std::string& v) { o.threads = parse_int("--threads", v, 0); }},
      {"--seed", "N", "seed of the random inputs [0]",
       [](BenchOptions& o, const std::string& v) { o.seed = uint64_t(parse_int("--seed", v, 0)); }},
      {"--csv", "FILE", "write the results as CSV",
       [](BenchOptions& o, const std::string& v) { o.csv_path = v; }},
      {"--json", "FILE", "write the results as JSON",
       [](BenchOptions& o, const std::string& v) { o.json_path = v; }},
      {"--help", nullptr, "this help", [](BenchOptions& o, const std::string&) { o.help = true; }},
  };
  return flags;
}

}  // namespace

BenchOptions parse_bench_args(int argc, char** argv) {
  BenchOptions o;
  parse_flags(argc, argv, bench_flags(), o);
  if (o.help) return o;
  if (o.dtype == DType::e4m3) throw UsageError("--dtype e4m3: FP8 is measured with 'flashattn run'");
  if (!o.decode && (o.page_size > 0 || o.splits > 0 || !o.batches.empty()))
    throw UsageError("--page-size, --splits and --batches need --decode");
  if (o.splits > flashattn::kMaxSplits)
    throw UsageError("--splits: at most " + std::to_string(flashattn::kMaxSplits));
  return o;
}

std::string bench_help() {
  return "usage: flashattn bench [options]\n"
         "Times a grid of problems; a progress bar on stderr, a table on stdout.\n"
         "Default grid (FlashAttention-2's): 16k tokens per batch, hidden 2048, head dims\n"
         "64/128/256, seqlen 512..16k, causal and not (on a CPU: 4k tokens, seqlen <= 2048).\n"
         "Decode grid: batch {1,8,32,128} x context {1k,4k,16k,64k}, at most 2M tokens\n"
         "(on a CPU: at most 128k tokens).\n\noptions:\n" +
         flags_help(bench_flags()) +
         "\nexamples:\n"
         "  flashattn bench --device cpu --quick\n"
         "  flashattn bench --decode --page-size 256 --csv decode.csv\n";
}

}  // namespace facli
