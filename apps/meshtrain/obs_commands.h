// `meshtrain report RUN_DIR [--out FILE]` and `meshtrain trace merge OUT IN...`: the run report
// page and the merging of per-rank traces into one timeline.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace meshtrain::apps {

// Each adds its subcommand to `app`; after parsing, the returned function runs it if it was
// chosen and returns the exit status, or returns -1 when it was not chosen.
std::function<int()> add_report_command(CLI::App& app);
std::function<int()> add_trace_command(CLI::App& app);

}  // namespace meshtrain::apps
