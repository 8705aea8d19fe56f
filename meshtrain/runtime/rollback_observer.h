// train.rollback_after: after that many consecutive bad steps the run goes back to the newest
// checkpoint taken before them (rollback.h decides when), with the learning rate scaled by
// train.rollback_lr_factor per rollback so far, and (train.rollback_skip_data) without the
// batches that led there.
#pragma once

#include "meshtrain/runtime/bad_batch_skip.h"
#include "meshtrain/runtime/rollback.h"
#include "meshtrain/runtime/step_observer.h"

namespace meshtrain::runtime {

class RollbackObserver : public StepObserver {
 public:
  RollbackObserver(const TrainConfig& config, BadBatchSkip& skip);
  void before_step(RunState& run, StepContext& step) override;
  void on_step_end(RunState& run, StepContext& step) override;

 private:
  RollbackPolicy policy_;
  double lr_factor_ = 1.0;
  bool skip_data_ = true;
  int64_t max_rollbacks_ = 0;
  BadBatchSkip& skip_;
};

}  // namespace meshtrain::runtime
