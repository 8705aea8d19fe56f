// See obs_commands.h.
#include "apps/meshtrain/obs_commands.h"

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/obs/report.h"
#include "meshtrain/obs/trace.h"
#include "meshtrain/util/atomic_file.h"

namespace meshtrain::apps {

std::function<int()> add_report_command(CLI::App& app) {
  struct Args {
    std::string run_dir, out;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "report", "draw a run's loss, throughput and step-time plots into one HTML page");
  cmd->add_option("run_dir", args->run_dir, "run directory (train.out_dir)")->required();
  cmd->add_option("--out", args->out, "output file (default RUN_DIR/report.html)");
  return [cmd, args]() -> int {
    if (!cmd->parsed()) return -1;
    const auto path = obs::write_report(args->run_dir, args->out);
    std::cout << "report: " << path.string() << std::endl;
    return 0;
  };
}

std::function<int()> add_trace_command(CLI::App& app) {
  struct Args {
    std::string out;
    std::vector<std::string> inputs;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("trace", "trace file tools");
  cmd->require_subcommand(1);
  auto* merge = cmd->add_subcommand("merge", "merge per-rank traces into one, a track per rank");
  merge->add_option("out", args->out, "merged trace file")->required();
  merge->add_option("inputs", args->inputs, "per-rank trace files")->required();
  return [merge, args]() -> int {
    if (!merge->parsed()) return -1;
    std::vector<std::filesystem::path> in(args->inputs.begin(), args->inputs.end());
    const auto merged = obs::merge_traces(in);
    write_file_atomic(args->out, merged.dump());
    std::cout << "trace merge: " << in.size() << " file(s), " << merged["traceEvents"].size()
              << " events -> " << args->out << std::endl;
    return 0;
  };
}

}  // namespace meshtrain::apps
