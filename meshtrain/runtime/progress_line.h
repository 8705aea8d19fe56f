// The progress line on rank 0: every train.log_interval steps, at an evaluation and at the last
// step, "step N/M loss L [val_loss V] lr R norm G <rate> T eta E [scale S] [(skipped: why)]".
#pragma once

#include <chrono>

#include "meshtrain/runtime/step_observer.h"

namespace meshtrain::runtime {

class ProgressLine : public StepObserver {
 public:
  // The ETA counts from here: the first evaluation is part of the run's time.
  void on_start(RunState& run) override;
  void after_step(RunState& run, StepContext& step) override;

 private:
  std::chrono::steady_clock::time_point start_;
};

// "42s", "3m05s", "1h02m"; "?" for a negative or unknown duration.
std::string format_duration(double seconds);

}  // namespace meshtrain::runtime
