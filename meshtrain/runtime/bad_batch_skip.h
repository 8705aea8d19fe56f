// train.rollback_skip_data: after a rollback, the batches of the steps that led to it are not
// trained on again. The rollback observer says which steps; when the loop reaches the first of
// them again, this skips their batches (every rank the same ones, so the replicas stay apart).
#pragma once

#include <cstdint>
#include <map>

#include "meshtrain/runtime/step_observer.h"

namespace meshtrain::runtime {

class BadBatchSkip : public StepObserver {
 public:
  // When the loop runs `first_bad` again, skip the batches of `steps` steps.
  void schedule(int64_t first_bad, int64_t steps) { skip_at_[first_bad] = steps; }
  void before_step(RunState& run, StepContext& step) override;

 private:
  std::map<int64_t, int64_t> skip_at_;  // first bad step -> steps to skip
};

}  // namespace meshtrain::runtime
