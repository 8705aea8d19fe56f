// The training loop as a short sequence of step observers. The loop (trainer.cpp) runs the
// steps; everything a run does around them (rolling back, skipping spikes and bad batches,
// metrics, the progress line, checkpoints, the final weights and the sample) is an observer
// with a few hooks, called in the order the trainer lists them:
//   on_start     once, before the first step (after the resume and the first evaluation)
//   before_step  shapes the step: its learning rate, its StepOptions, the batches it skips
//   after_step   records the finished step (metrics, the progress line); no control flow
//   on_step_end  acts on it: may rewind the loop to an earlier step or stop it, after which
//                the observers later in the list are not called for this step
//   on_end       once, after the last step, however the loop ended
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/data/prefetch_loader.h"
#include "meshtrain/obs/job_metrics.h"
#include "meshtrain/obs/phase_clock.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/runtime/checkpointing.h"
#include "meshtrain/runtime/resolved_config.h"
#include "meshtrain/runtime/task.h"
#include "meshtrain/runtime/train_result.h"

namespace meshtrain::runtime {

// A progress line on rank 0 (text, or a JSON line with `fields` merged in).
using RunLog = std::function<void(const std::string& line, const nlohmann::json& fields)>;

// What every observer of one run shares. The trainer owns all of it.
struct RunState {
  const ResolvedConfig& config;
  int rank = 0;
  int world = 1;
  int dp_world = 1;  // data-parallel replicas
  Device device;
  parallel::TrainEngine& engine;
  data::PrefetchingLoader& loader;
  const Task& task;
  comm::ProcessGroup* group = nullptr;        // all ranks; null for one process
  TrainerCheckpoints* checkpoints = nullptr;  // null when checkpoints are off
  obs::JobMetrics& job_metrics;
  RunLog log;
  TrainResult& result;
  int64_t start_step = 0;  // the step the run resumed from (0: a fresh start)
  int64_t rollbacks = 0;   // so far in this run
};

struct StepContext {
  int64_t step = 0;
  bool last = false;       // step == train.steps
  obs::PhaseClock phases;  // data / forward / backward / comm / optimizer, from the step's start
  // before_step: the schedule's learning rate, which observers may scale, and the step's
  // options, which they fill in (options.lr is the rate the step ran with).
  double lr = 0;
  parallel::StepOptions options;
  // after_step: what the step did.
  parallel::StepOutcome outcome;
  double step_s = 0;
  double throughput = 0;          // units per second, the median over the run's steps so far
  std::optional<float> val_loss;  // evaluated at this step
  std::string spike;              // why the spike detector skipped it (outcome.spike)
  bool new_best = false;          // ckpt.keep_best: val_loss is the best so far
  nlohmann::json record;          // this step's metrics.jsonl row
  // after_step: an observer asks for a checkpoint at this step, whatever the policy's
  // schedule (the straggler watch, before the job meets again without a node).
  bool checkpoint_now = false;
  // on_step_end: go on from the step after this one (a rollback), or stop the loop.
  std::optional<int64_t> rewind_to;
  bool stop = false;
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void on_start(RunState&) {}
  virtual void before_step(RunState&, StepContext&) {}
  virtual void after_step(RunState&, StepContext&) {}
  virtual void on_step_end(RunState&, StepContext&) {}
  virtual void on_end(RunState&) {}
};

}  // namespace meshtrain::runtime
