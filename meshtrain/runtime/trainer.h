// The training loop: builds the model, data, optimizer and schedule from a TrainConfig, runs the
// steps with a progress line (step, loss, lr, tokens/s, ETA), evaluates periodically, writes the
// metrics history (JSON lines) and the final weights into the run directory, and samples text.
// The data-parallel layer extends this loop through the hooks in TrainerHooks rather than by
// copying it.
#pragma once

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/store.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/runtime/resolved_config.h"
#include "meshtrain/util/fault_plan.h"

namespace meshtrain::runtime {

struct TrainResult {
  std::vector<float> train_losses;                    // one per step
  std::vector<std::pair<int64_t, float>> val_losses;  // (step, loss)
  int64_t skipped_steps = 0;                          // non-finite loss or gradient norm
  int64_t rollbacks = 0;                              // back to a checkpoint after bad steps
  int64_t overflow_steps = 0;  // f16: skipped by the loss scaler (non-finite gradients)
  double loss_scale = 0;       // f16: the loss scale after the last step; 0 otherwise
  double tokens_per_s = 0;     // median over steps after the first
  std::string weights_path;    // empty when not saved
  std::string sample;          // generated text, empty when sample_tokens == 0
  // Checkpoints: the step this run resumed from (0 = a fresh start), the last step it ran, and
  // whether it stopped early on SIGTERM/SIGINT (after writing a checkpoint when enabled).
  int64_t resumed_step = 0;
  int64_t last_step = 0;
  bool preempted = false;
};

struct TrainerOptions {
  std::ostream* progress = nullptr;  // progress lines; nullptr = quiet
  // Data parallelism: the group of all ranks and the rendezvous store (both null for one
  // process). Rank and world size come from the group.
  comm::ProcessGroupPtr group;
  std::shared_ptr<comm::Store> store;
  int ranks_on_host = 1;  // LOCAL_WORLD_SIZE
  int local_rank = 0;     // LOCAL_RANK: train.device = "cuda" trains on cuda:<local_rank>
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: restarts of the job so far
  // The group that reduces device gradients (nccl) when train.device is cuda; made from `group`
  // and `store` when null.
  comm::ProcessGroupPtr device_group;
  // The faults a test injects (a crash, NaN or spiking losses, a stalled or slow checkpoint):
  // `meshtrain train` reads them from the MESHTRAIN_TEST_* variables; none by default.
  FaultPlan faults;
};

// Checks that every rank runs the same configuration, through the store; throws ValueError
// naming the first differing key and both values.
void check_config_matches(const TrainConfig& config, comm::Store& store, int rank);

// Maps the [model] section onto the model's configuration.
nn::GPTConfig gpt_config(const ResolvedConfig& config);

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
