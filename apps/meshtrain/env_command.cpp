// See env_command.h.
#include "apps/meshtrain/env_command.h"

#include <cstdlib>
#include <iostream>
#include <memory>

#include "meshtrain/runtime/dist_env.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"

namespace meshtrain::apps {

std::function<int()> add_env_command(CLI::App& app) {
  auto all = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "env",
      "list the MESHTRAIN_* environment variables meshtrain and meshrun read, with their current "
      "values, types, defaults and meanings; a set MESHTRAIN_* variable that is none of them "
      "(a misspelling) is named on stderr with the closest known name");
  cmd->add_flag("--all", *all, "also list the variables only the tests and their fault hooks read");
  return [cmd, all]() -> int {
    if (!cmd->parsed()) return -1;
    std::cout << env_report(*all);
    return 0;
  };
}

void warn_unknown_env() {
  // meshrun has said it for the whole node already, and one rank says it for a job that another
  // launcher started.
  if (env_value(Env::store_host) == "agent") return;
  try {
    if (runtime::discover_dist_env().rank != 0) return;
  } catch (const ValueError&) {
    // A malformed launcher variable is reported where the run reads it.
  }
  for (const std::string& line : unknown_env_warnings())
    std::cerr << "meshtrain: warning: " << line << std::endl;
}

}  // namespace meshtrain::apps
