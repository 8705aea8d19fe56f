#include "meshtrain/runtime/spike_skip.h"

namespace meshtrain::runtime {

SpikeSkip::SpikeSkip(const TrainConfig& c)
    : detector_(c.train.spike_zscore, static_cast<size_t>(c.train.spike_window)) {}

void SpikeSkip::before_step(RunState&, StepContext& step) {
  if (!detector_.enabled()) return;
  step.options.skip_update = [this](float loss, double norm) {
    return detector_.is_spike(loss, norm, &why_);
  };
}

void SpikeSkip::after_step(RunState&, StepContext& step) {
  const parallel::StepOutcome& out = step.outcome;
  if (!out.skipped) detector_.accept(out.loss, out.grad_norm);
  if (!out.spike) return;
  step.spike = why_;
  step.record["spike"] = why_;
}

}  // namespace meshtrain::runtime
