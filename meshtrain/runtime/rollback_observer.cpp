#include "meshtrain/runtime/rollback_observer.h"

#include <cmath>

#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

RollbackObserver::RollbackObserver(const TrainConfig& c, BadBatchSkip& skip)
    : policy_(c.train.rollback_after, c.train.max_rollbacks),
      lr_factor_(c.train.rollback_lr_factor),
      skip_data_(c.train.rollback_skip_data),
      max_rollbacks_(c.train.max_rollbacks),
      skip_(skip) {}

void RollbackObserver::before_step(RunState&, StepContext& step) {
  step.lr *= std::pow(lr_factor_, static_cast<double>(policy_.rollbacks()));
}

void RollbackObserver::on_step_end(RunState& run, StepContext& step) {
  const parallel::StepOutcome& out = step.outcome;
  // An f16 gradient overflow is the loss scaler's business (it backed off), not a bad state.
  // Nor is a spike: the step was skipped and the state is good.
  const bool bad = out.skipped && !out.spike && !(out.overflow && std::isfinite(out.loss));
  if (!policy_.on_step(step.step, bad)) return;
  const int64_t first_bad = policy_.first_bad_step(), bad_steps = policy_.bad_steps();
  const int64_t to = run.checkpoints->rollback(first_bad - 1, run.group, run.engine, run.loader);
  policy_.rolled_back();
  run.rollbacks = policy_.rollbacks();
  run.job_metrics.on_rollback();
  if (skip_data_) skip_.schedule(first_bad, step.step - first_bad + 1);
  run.log(detail::str_cat("rolled back to the checkpoint of step ", to, " after ", bad_steps,
                          " consecutive non-finite steps (", first_bad, "..", step.step,
                          "); rollback ", policy_.rollbacks(), " of ", max_rollbacks_),
          nullptr);
  ++run.result.rollbacks;
  step.rewind_to = to;
}

}  // namespace meshtrain::runtime
