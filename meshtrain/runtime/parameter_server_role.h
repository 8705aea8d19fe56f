// The roles of a parameter-server job (parallel.mode = "parameter_server"): of the job's ranks,
// the last parallel.ps.servers serve and the others train. Every rank splits the job's group
// into the workers' group (the Trainer's: data, evaluation, checkpoints) and the servers'
// (their norm exchange); the job's group itself carries the pushes and replies. A server rank
// runs run_parameter_server instead of the Trainer.
#pragma once

#include <optional>
#include <ostream>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/runtime/resolved_config.h"

namespace meshtrain::runtime {

struct PsRoles {
  comm::ProcessGroupPtr job;
  comm::ProcessGroupPtr workers;  // null on a server
  comm::ProcessGroupPtr servers;  // null on a worker
  int workers_count = 0;
  int servers_count = 0;
  int server = -1;  // this rank's index among the servers, -1 on a worker
  bool is_server() const { return server >= 0; }
  // What a worker's engine needs.
  parallel::ParamServerSpec worker_spec(const TrainConfig& config) const;
};

// The workers of a job of `world` ranks (ValueError naming parallel.ps.servers when there would
// be none).
int ps_worker_count(const TrainConfig& config, int world);

// Splits `job` into the roles. Collective over `job`.
PsRoles split_ps_roles(const TrainConfig& config, comm::ProcessGroupPtr job);

// Serves the workers until they are done (parameter_server.h): builds the model to take its
// initial values, keeps this server's key range and its optimizer state. Writes a one-line
// summary to `progress` and <train.out_dir>/ps_server<k>.json. Returns the exit status.
int run_parameter_server(const ResolvedConfig& config, const PsRoles& roles,
                         std::ostream* progress);

}  // namespace meshtrain::runtime
