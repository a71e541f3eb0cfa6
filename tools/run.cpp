// `flashattn run`: one problem on seeded random inputs, timed, optionally checked.
#include <cstdio>

#include "args.h"
#include "cli.h"

namespace facli {
namespace {

constexpr int kDefaultRepeatCpu = 3;
constexpr int kDefaultRepeatCuda = 20;
constexpr int kWarmupRuns = 1;  // the first (untimed) run is the one --check looks at

ExecConfig exec_config(const RunOptions& o) {
  ExecConfig c;
  c.device = resolve_device(o.device);
  c.repeat = o.repeat > 0 ? o.repeat : (c.device == Device::cuda ? kDefaultRepeatCuda : kDefaultRepeatCpu);
  c.warmup = kWarmupRuns;
  return c;
}

}  // namespace

int run_command(int argc, char** argv) {
  const RunOptions o = parse_run_args(argc, argv);
  if (o.help) {
    std::fputs(run_help().c_str(), stdout);
    return kExitOk;
  }
  const ExecConfig config = exec_config(o);
  const HostProblem problem = make_problem(o.spec);
  const RunOutput output = execute(problem, config, o.check);

  RunReport report;
  report.device_name = flashattn::device_name(config.device);
  report.problem = &problem;
  report.counts = count_work(problem);
  report.median_ms = median(output.times_ms);
  report.repeat = config.repeat;
  report.splits_used = output.splits_used;
  report.checked = o.check;
  if (o.check) report.check = check(problem, output);

  if (o.json)
    print_report_json(report);
  else
    print_report_text(report);
  return (o.check && !report.check.pass) ? kExitFailure : kExitOk;
}

}  // namespace facli
