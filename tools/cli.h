// The flashattn command-line tool: shared types of its steps.
//
//   args.cpp     command line -> RunOptions / BenchOptions (UsageError on anything wrong)
//   problem.cpp  ProblemSpec -> HostProblem: shapes, random inputs, lengths, block table
//   execute.cpp  HostProblem -> buffers on the device, library call, timing
//   check.cpp    library result vs the float64 oracle (tests/reference)
//   report.cpp   FLOP / byte counts, human and JSON output
//   run.cpp      `flashattn run`      bench.cpp  `flashattn bench`      main.cpp  dispatch
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"

namespace facli {

using flashattn::Device;
using flashattn::DType;

// A bad command line: printed as "flashattn: error: ..." with exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // check mismatch, library error, no device
constexpr int kExitUsage = 2;

// ---- the problem -----------------------------------------------------------------------------

enum class Mode { dense, varlen, kvcache };
enum class Rotary { none, interleaved, neox };

struct ProblemSpec {
  DType dtype = DType::bf16;     // q (and k, v unless kv_dtype says otherwise): bf16, fp16, e4m3
  DType kv_dtype = DType::bf16;  // k and v (the KV cache): dtype, or e4m3 under a bf16/fp16 q
  Mode mode = Mode::dense;
  int batch = 2;
  int seqlen_q = 512;
  int seqlen_k = 512;  // kvcache: the cache capacity of a row
  int heads = 8;
  int kv_heads = 8;
  int head_dim = 128;
  bool causal = false;
  int window_left = -1;  // -1 = unbounded
  int window_right = -1;
  bool alibi = false;
  float softcap = 0.0f;
  bool paged = false;
  int page_size = 256;
  int splits = 0;  // kvcache num_splits; 0 = the library's heuristic
  int append = 0;  // kvcache: new keys per sequence
  Rotary rotary = Rotary::none;
  // Varlen lengths / cache_seqlens drawn at random (run) or all at their maximum (bench).
  bool random_lengths = true;
  // Bench: inputs tiled from a pool of random values (their values do not matter for timing).
  bool fast_fill = false;
  uint64_t seed = 0;
  int threads = 0;  // CPU backend threads, 0 = all
};

bool is_local(const ProblemSpec& s);  // a sliding window on either side
// The dtype of out (and of k_new, v_new, the rotary tables): bf16 for an e4m3 q, else q's.
DType out_dtype(const ProblemSpec& s);
bool is_fp8(const ProblemSpec& s);  // q or k/v stored as e4m3

// Throws UsageError when the arrays of the problem cannot be sized: a count the library takes as
// int32 (packed varlen rows, page indices) reaches 2^31, or an array's bytes pass 2^62 (its size
// product would overflow, or no host could hold it).
void check_problem_size(const ProblemSpec& s);

// Inputs in host memory, in the physical layout the library is given: one storage code per
// element (16-bit bits; an e4m3 element's 8 bits in the low byte, packed to 1 byte per element
// when uploaded). An e4m3 tensor comes with its descale factors, one per (batch, KV head):
// random normal values x are stored as e4m3(x / descale), descale = amax / 448 of the values it
// scales (fp32); the real value of a code c is descale * c.
struct HostProblem {
  ProblemSpec spec;
  std::vector<int> len_q;  // per sequence: query rows
  std::vector<int> len_k;  // per sequence: keys attended (kvcache: cache_seqlens + append)
  std::vector<int32_t> cu_q, cu_k;         // varlen (b + 1)
  std::vector<int32_t> cache_seqlens;      // kvcache (b)
  std::vector<int32_t> block_table;        // paged (b, max_pages)
  int max_pages = 0;
  int64_t q_rows = 0;   // rows of q / out: b*sq or total_q
  int64_t kv_rows = 0;  // rows of the k / v arrays: b*sk, total_k or num_pages*page_size
  int rotary_positions = 0;  // rows of rotary cos / sin
  std::vector<uint16_t> q, k, v, k_new, v_new, rot_cos, rot_sin;
  std::vector<float> alibi;  // (h)
  std::vector<float> q_descale, k_descale, v_descale;  // (b, hk) for e4m3 q / k, v; else empty

  int64_t q_row(int b, int i) const;      // row of query i of sequence b in q / out
  int64_t kv_row(int b, int pos) const;   // row of key position pos of sequence b in k / v
  int64_t lse_index(int b, int head, int i) const;
  int64_t lse_size() const;
};

HostProblem make_problem(const ProblemSpec& spec);

// ---- execution ---------------------------------------------------------------------------------

struct ExecConfig {
  Device device = Device::cpu;
  int repeat = 1;  // timed runs
  int warmup = 1;  // untimed runs before them (the first one is the checked one)
};

// What a run brings back: times, and (when asked) the outputs in host memory.
struct RunOutput {
  std::vector<double> times_ms;  // one per timed run
  std::vector<uint16_t> out;     // q_rows * h * d
  std::vector<float> lse;
  std::vector<uint16_t> k_cache, v_cache;  // kvcache with append: the caches after the call
  int splits_used = 0;                     // kvcache: plan_kvcache(...).num_splits
};

// Poisons out/lse, runs the library warmup + repeat times; fetch = copy results back.
RunOutput execute(const HostProblem& problem, const ExecConfig& config, bool fetch);

Device resolve_device(const std::string& name);  // cpu | cuda | auto; fails without CUDA
bool built_with_cuda();

// ---- counts, check, report -----------------------------------------------------------------

struct Counts {
  double flops = 0;           // matmul FLOPs of QK^T and PV
  bool flops_exact = false;   // visible (query, key) pairs counted; else FA2's 4bhsqskd(/2)
  double kv_bytes = 0;        // bytes of K and V read (each visible key once per KV head)
};

Counts count_work(const HostProblem& problem);
bool is_decode(const ProblemSpec& s);  // reported in GB/s rather than TFLOP/s
double median(std::vector<double> values);

// The FP8 bound of --check (e4m3 q or k/v): the oracle runs on the dequantized inputs, so what
// remains is the bf16/fp16 compute: max|out - f64| <= kFp8Rtol * max|f64| (LSE: the usual rule;
// tests/python/conftest.py FP8_RTOL is the same bound).
constexpr double kFp8Rtol = 2e-2;

struct CheckResult {
  double out_err = 0, out_tol = 0;
  double lse_err = 0, lse_tol = 0;
  bool cache_checked = false;
  double cache_err_ulps = 0;  // the written / kept cache rows, in units of the storage ulp
  bool pass = false;
};

CheckResult check(const HostProblem& problem, const RunOutput& result);

struct RunReport {
  std::string device_name;
  const HostProblem* problem = nullptr;
  Counts counts;
  double median_ms = 0;
  int repeat = 0;
  int splits_used = 0;
  bool checked = false;
  CheckResult check;
};

void print_report_text(const RunReport& report);
void print_report_json(const RunReport& report);

std::string describe_problem(const ProblemSpec& s);  // "b=2 sq=512 sk=512 h=8 hk=8 d=128 causal"
const char* dtype_label(DType t);                    // bf16 | fp16 | e4m3

// ---- subcommands -------------------------------------------------------------------------------

int run_command(int argc, char** argv);    // argv[0] = "run"
int bench_command(int argc, char** argv);  // argv[0] = "bench"

}  // namespace facli
