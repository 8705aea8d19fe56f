// `meshtrain plan`: choose a parallel layout for a model on a cluster and write it as a config.
// `meshtrain place`: place a queue of jobs on a cluster inventory, or simulate a trace.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace meshtrain::apps {

// Each adds its subcommand to `app`; after parsing, the returned function runs it and returns
// the exit status, or -1 when the subcommand was not chosen (library errors propagate).
std::function<int()> add_plan_command(CLI::App& app);
std::function<int()> add_place_command(CLI::App& app);

}  // namespace meshtrain::apps
