// The roles of a parameter-server job (parallel.mode = "parameter_server"): of the job's ranks,
// the last parallel.ps.servers serve and the others train. Every rank splits the job's group
// into the workers' group (the Trainer's: data, evaluation, checkpoints) and the servers'
// (their norm exchange). In sync mode the job's group carries the pushes and replies. In async
// and ssp mode every (worker, server) pair has a link of its own and the workers never meet
// (their group is a DetachedGroup), so that a worker that fails is replaced alone: its launcher
// starts another process for its rank, which joins with join_ps_job. A server rank runs
// run_parameter_server instead of the Trainer.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/param_server/ps_links.h"
#include "meshtrain/runtime/resolved_config.h"

namespace meshtrain::runtime {

struct PsRoles {
  comm::ProcessGroupPtr job;  // null in a replacement
  // A worker's channel to each server, a server's to each worker (parallel/param_server/
  // ps_links.h), and how a server makes a new one to a worker's replacement.
  std::vector<parallel::PsPeer> links;
  parallel::PsLinkOptions link_options;
  comm::ProcessGroupPtr workers;  // null on a server
  comm::ProcessGroupPtr servers;  // null on a worker
  int workers_count = 0;
  int servers_count = 0;
  int server = -1;           // this rank's index among the servers, -1 on a worker
  bool replacement = false;  // made by join_ps_job
  bool is_server() const { return server >= 0; }
  // What a worker's engine needs.
  parallel::ParamServerSpec worker_spec(const TrainConfig& config) const;
};

// The workers of a job of `world` ranks (ValueError naming parallel.ps.servers when there would
// be none).
int ps_worker_count(const TrainConfig& config, int world);

// Splits `job` into the roles and makes the links. Collective over `job`.
PsRoles split_ps_roles(const TrainConfig& config, comm::ProcessGroupPtr job,
                       std::shared_ptr<comm::Store> store);

// A process replacing worker `rank` of an asynchronous job that goes on: links of a new
// generation to every server (which wait for them). `world`: the job's ranks; `group`: the
// options the job's groups were made with. ValueError in sync mode, or for a server's rank.
PsRoles join_ps_job(const TrainConfig& config, int rank, int world,
                    std::shared_ptr<comm::Store> store, const comm::ProcessGroupOptions& group);

// Serves the workers until they are done (parameter_server.h): builds the model to take its
// initial values, keeps this server's key range and its optimizer state. Writes a one-line
// summary to `progress` and <train.out_dir>/ps_server<k>.json. Returns the exit status.
int run_parameter_server(const ResolvedConfig& config, const PsRoles& roles,
                         std::ostream* progress);

}  // namespace meshtrain::runtime
