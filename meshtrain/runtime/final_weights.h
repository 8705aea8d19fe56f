// train.save_weights: at the end of a run that was not stopped early, the whole model as
// <train.out_dir>/model.safetensors (with the config in its metadata, which `meshtrain sample`
// reads), written by rank 0, its latency and size recorded like a checkpoint's. Under ZeRO-3 the
// parameters are gathered onto rank 0 first, also when only the task's printout needs them.
#pragma once

#include "meshtrain/runtime/metrics_observer.h"
#include "meshtrain/runtime/step_observer.h"

namespace meshtrain::runtime {

class FinalWeights : public StepObserver {
 public:
  explicit FinalWeights(MetricsObserver& metrics) : metrics_(metrics) {}
  void on_end(RunState& run) override;

 private:
  MetricsObserver& metrics_;
};

}  // namespace meshtrain::runtime
