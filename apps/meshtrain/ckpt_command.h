// `meshtrain ckpt inspect|verify|export DIR`: look into, check and consolidate checkpoints.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace meshtrain::apps {

// Adds the `ckpt` subcommand to `app`; after parsing, the returned function runs whichever of
// its subcommands was chosen and returns the exit status (library errors propagate).
std::function<int()> add_ckpt_command(CLI::App& app);

}  // namespace meshtrain::apps
