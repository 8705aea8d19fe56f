// `meshtrain bench comm|train|gpu|attention [ARGS...]`: runs the benchmark program built beside the
// meshtrain executable (comm_bench, train_bench, gpu_train_bench, attention_bench) with ARGS, so
// that a user finds every benchmark under one command; `meshtrain bench comm --help` shows that
// program's flags.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace meshtrain::apps {

// Adds the subcommand to `app`; after parsing, the returned function runs the chosen benchmark
// (replacing this process) or returns -1 when `bench` was not chosen.
std::function<int()> add_bench_command(CLI::App& app);

}  // namespace meshtrain::apps
