// At the end of a run that was not stopped early, rank 0 prints the task's sample of what the
// model learned (generated text for a language model) and returns it in TrainResult::sample.
#pragma once

#include "meshtrain/runtime/step_observer.h"

namespace meshtrain::runtime {

class Sampling : public StepObserver {
 public:
  void on_end(RunState& run) override;
};

}  // namespace meshtrain::runtime
