// flashattn: the command-line tool. `flashattn run` solves one problem, `flashattn bench`
// times a grid. Every error is one line on stderr: "flashattn: error: ...".
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cli.h"

namespace {

const char* kUsage =
    "usage: flashattn <command> [options]\n"
    "commands:\n"
    "  run     solve one attention problem on random inputs: time, TFLOP/s, --check\n"
    "  bench   time a grid of problems (FlashAttention-2's grid by default; --decode)\n"
    "  info    print the build: version, backends, compiled head dims and dtypes\n"
    "'flashattn <command> --help' lists the options of a command.\n";

int report_error(const char* message, int status) {
  std::fprintf(stderr, "flashattn: error: %s\n", message);
  return status;
}

// The library's invalid_argument / type_error come from the problem the user described
// (an impossible shape): a usage error. Its runtime / unsupported errors are failures.
int library_error_status(const flashattn::Error& e) {
  using Kind = flashattn::Error::Kind;
  const bool users_input = e.kind() == Kind::invalid_argument || e.kind() == Kind::type_error;
  return users_input ? facli::kExitUsage : facli::kExitFailure;
}

int dispatch(int argc, char** argv) {
  const std::string command = argv[1];
  if (command == "run") return facli::run_command(argc - 1, argv + 1);
  if (command == "bench") return facli::bench_command(argc - 1, argv + 1);
  if (command == "info" || command == "--version") {
    std::printf("%s\n", flashattn::build_info().c_str());
    return facli::kExitOk;
  }
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return facli::kExitOk;
  }
  throw facli::UsageError("unknown command '" + command + "' (expected run, bench or info; see 'flashattn --help')");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return facli::kExitUsage;
  }
  try {
    return dispatch(argc, argv);
  } catch (const facli::UsageError& e) {
    return report_error(e.what(), facli::kExitUsage);
  } catch (const flashattn::Error& e) {
    return report_error(e.what(), library_error_status(e));
  } catch (const std::bad_alloc&) {
    return report_error("out of host memory", facli::kExitFailure);
  } catch (const std::exception& e) {
    return report_error(e.what(), facli::kExitFailure);
  }
}
