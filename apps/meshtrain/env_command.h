// `meshtrain env`: every MESHTRAIN_* environment variable with its current value, type, default,
// reader and meaning, and a warning for each set MESHTRAIN_* variable that is not one of them.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace meshtrain::apps {

// Adds the subcommand to `app`; after parsing, the returned function runs it if it was chosen
// and returns the exit status, or returns -1 when it was not chosen.
std::function<int()> add_env_command(CLI::App& app);

// Writes one warning line to stderr per unknown MESHTRAIN_* variable in this environment, once
// per job: not in a meshrun worker (meshrun warned) nor in a rank other than 0.
void warn_unknown_env();

}  // namespace meshtrain::apps
