// The torchrun environment contract, launcher side: the variables meshrun gives each worker
// (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, MASTER_ADDR,
// MASTER_PORT, TORCHELASTIC_RESTART_COUNT, and meshtrain's MESHTRAIN_TOKEN, MESHTRAIN_STORE_HOST,
// MESHTRAIN_ELASTIC_MIN_NODES of an elastic job and the MESHTRAIN_RDZV_* variables of an etcd
// rendezvous). The worker side reads them in
// dist_env.cpp (discover_dist_env); tests/runtime/worker_environment_test.cpp checks that it
// reads back what this writes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace meshtrain::runtime {

// Where one worker sits in the job, as its launcher tells it.
struct WorkerIdentity {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;  // the node's rank
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;  // the attempt (elastic: the round)
  // > 0: this process replaces its rank's replacement-th failed process of the attempt, which
  // the job went on without (an asynchronous parameter-server worker).
  int replacement = 0;
  int min_nodes = 0;  // --nnodes MIN:MAX's MIN; 0: not elastic
  // SIGTERM to SIGKILL (0: not said): how long a worker has to give up a blocked collective.
  int64_t grace_period_ms = 0;
  std::string token;
  // "tcp" (the agent hosts a TcpStore at master_addr:master_port) or "etcd" (the workers meet in
  // the etcd cluster at rdzv_endpoint under rdzv_id).
  std::string rdzv_backend = "tcp";
  std::string rdzv_endpoint;
  std::string rdzv_id;
};

// Whether a variable of the launcher's own environment must not reach a worker: it would give
// every worker the same identity, or leak the token file's path where the token itself is
// passed.
bool is_worker_identity_variable(const std::string& name);

// The worker's environment: the launcher's `inherited` entries ("NAME=VALUE") without its
// identity variables, then the worker's own.
std::vector<std::string> worker_environment(std::span<const std::string> inherited,
                                            const WorkerIdentity& who);

}  // namespace meshtrain::runtime
