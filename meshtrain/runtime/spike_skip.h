// train.spike_zscore: a step whose loss or gradient norm stands far above the recent window's is
// not applied (spike_detector.h decides; the engine asks it once the step's values are known,
// the same on every rank). Accepted steps feed the window; a skipped step's row in
// metrics.jsonl says why.
#pragma once

#include <string>

#include "meshtrain/runtime/spike_detector.h"
#include "meshtrain/runtime/step_observer.h"

namespace meshtrain::runtime {

class SpikeSkip : public StepObserver {
 public:
  explicit SpikeSkip(const TrainConfig& config);
  void before_step(RunState& run, StepContext& step) override;
  void after_step(RunState& run, StepContext& step) override;

 private:
  SpikeDetector detector_;
  std::string why_;  // the last spike's reason
};

}  // namespace meshtrain::runtime
