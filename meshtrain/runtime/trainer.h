// The training loop: builds the task's data, the engine and the learning-rate schedule from a
// resolved config, then runs the steps through a short list of step observers
// (step_observer.h: bad-batch skip, rollback, spike skip, checkpoint policy, metrics, the
// progress line, the final weights and the sample). What belongs to one kind of model (its
// data, its throughput unit, its printout) is the task's (task.h).
#pragma once

#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/store.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/runtime/language_model_task.h"
#include "meshtrain/runtime/resolved_config.h"
#include "meshtrain/runtime/train_result.h"
#include "meshtrain/util/fault_plan.h"

namespace meshtrain::runtime {

struct TrainerOptions {
  std::ostream* progress = nullptr;  // progress lines; nullptr = quiet
  // Data parallelism: the group of all ranks and the rendezvous store (both null for one
  // process). Rank and world size come from the group.
  comm::ProcessGroupPtr group;
  std::shared_ptr<comm::Store> store;
  // The launcher's environment (DistEnv), read once by the command line.
  int ranks_on_host = 1;  // LOCAL_WORLD_SIZE
  int local_rank = 0;     // LOCAL_RANK: train.device = "cuda" trains on cuda:<local_rank>
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: restarts of the job so far
  // Shared by the ranks of one job and its restarts (DistEnv's job_id): who may take over the
  // run directory's lock (run_dir_lock.h). Empty: this process alone.
  std::string job_id;
  // The group that reduces device gradients (nccl) when train.device is cuda; made from `group`
  // and `store` when null.
  comm::ProcessGroupPtr device_group;
  // A worker of a parameter-server job: `group` is the workers' group, and this the servers
  // the gradients go to (runtime/parameter_server_role.h).
  std::optional<parallel::ParamServerSpec> param_server;
  // The faults a test injects (a crash, NaN or spiking losses, a stalled or slow checkpoint):
  // `meshtrain train` reads them from the MESHTRAIN_TEST_* variables; none by default.
  FaultPlan faults;
};

// Checks that every rank runs the same configuration, through the store; throws ValueError
// naming the first differing key and both values.
void check_config_matches(const TrainConfig& config, comm::Store& store, int rank);

// Sets the OpenMP and OpenBLAS thread counts for this process (0 = the host's cores divided
// among the ranks on it).
void set_num_threads(int64_t threads, int ranks_on_host = 1);

class Trainer {
 public:
  // Resolves `config` for the group's world size (ValueError on a bad key or combination).
  Trainer(TrainConfig config, TrainerOptions options);
  Trainer(ResolvedConfig config, TrainerOptions options);
  ~Trainer();
  TrainResult run();
  nn::GPT& model();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace meshtrain::runtime
