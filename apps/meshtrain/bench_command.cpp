// The benchmarks are programs of their own (bench/*.cpp); this subcommand finds the one asked for
// next to /proc/self/exe and execs it with the remaining arguments.
#include "apps/meshtrain/bench_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain::apps {
namespace {

struct Bench {
  const char* name;
  const char* program;
  const char* what;
};

constexpr Bench kBenches[] = {
    {"comm", "comm_bench",
     "collective bandwidth and latency, nccl-tests style (bench/comm_compare.sh adds Gloo and "
     "Open MPI side by side)"},
    {"train", "train_bench", "GPT training throughput on the CPU against PyTorch"},
    {"gpu", "gpu_train_bench", "GPT-2 training throughput on a CUDA device against PyTorch"},
    {"attention", "attention_bench",
     "flash attention's kernels on a CUDA device against PyTorch's SDPA flash backend"},
};

int exec_bench(const Bench& b, const std::vector<std::string>& args) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const auto path = (ec ? std::filesystem::path(".") : self.parent_path()) / b.program;
  if (::access(path.c_str(), X_OK) != 0) {
    std::cerr << "meshtrain: error: " << path.string()
              << " is not built (configure with -DMESHTRAIN_BENCH=ON and build it)" << std::endl;
    return 2;
  }
  std::vector<std::string> argv_s{path.string()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(path.c_str(), argv.data());
  std::cerr << "meshtrain: error: cannot run " << path.string() << ": " << std::strerror(errno)
            << std::endl;
  return 2;
}

}  // namespace

std::function<int()> add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "run a benchmark (the program built beside meshtrain)");
  cmd->require_subcommand(1);
  std::vector<std::pair<CLI::App*, const Bench*>> subs;
  for (const Bench& b : kBenches) {
    auto* sub = cmd->add_subcommand(b.name, b.what);
    // Every argument, --help included, belongs to the benchmark program.
    sub->set_help_flag();
    sub->allow_extras();
    sub->prefix_command();
    subs.emplace_back(sub, &b);
  }
  return [cmd, subs] {
    if (!cmd->parsed()) return -1;
    for (const auto& [sub, bench] : subs)
      if (sub->parsed()) return exec_bench(*bench, sub->remaining());
    return 2;
  };
}

}  // namespace meshtrain::apps
