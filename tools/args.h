// Command-line parsing of `flashattn run` and `flashattn bench`.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cli.h"

namespace facli {

struct RunOptions {
  ProblemSpec spec;
  std::string device = "auto";
  int repeat = 0;  // 0: the device's default
  bool check = false;
  bool json = false;
  bool help = false;
};

enum class CausalModes { both, on, off };

struct BenchOptions {
  std::string device = "auto";
  DType dtype = DType::bf16;
  std::vector<int> head_dims;  // empty: the grid's default
  std::vector<int> seqlens;    // prefill: seqlen; decode: context length
  std::vector<int> batches;    // decode only
  CausalModes causal = CausalModes::both;
  int repeat = 0;
  bool quick = false;
  bool decode = false;
  int page_size = 0;  // decode: > 0 pages the cache
  int splits = 0;
  int threads = 0;
  uint64_t seed = 0;
  std::string csv_path, json_path;
  bool help = false;
};

// Both throw UsageError. argv[0] is the subcommand name.
RunOptions parse_run_args(int argc, char** argv);
BenchOptions parse_bench_args(int argc, char** argv);

std::string run_help();
std::string bench_help();

// ---- helpers shared with the subcommands --------------------------------------------------
int parse_int(const std::string& flag, const std::string& text, int min_value);
std::vector<int> parse_int_list(const std::string& flag, const std::string& text, int min_value);

}  // namespace facli
