// Starting one worker process for the launcher agent: its own process group, PR_SET_PDEATHSIG
// (it dies with the agent), stdin from /dev/null, stdout and stderr into pipes the agent
// forwards, the given signal mask and core binding, then exec. A worker that cannot be bound or
// executed says so on the agent's stderr and exits 127, to be reaped like any failed worker.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace meshtrain::runtime {

struct WorkerSpawn {
  int rank = 0;                   // for messages
  std::vector<std::string> argv;  // program (looked up in PATH) and arguments
  std::vector<std::string> env;   // "NAME=VALUE", the whole environment
  std::vector<int> cores;         // empty: no binding
  sigset_t mask{};                // the signal mask the worker starts with
};

struct SpawnedWorker {
  pid_t pid = -1;
  int out_fd = -1;  // the read ends of the worker's stdout and stderr (close-on-exec)
  int err_fd = -1;
};

// Throws IoError when the pipes or the fork cannot be made.
SpawnedWorker spawn_worker(const WorkerSpawn& spec);

}  // namespace meshtrain::runtime
