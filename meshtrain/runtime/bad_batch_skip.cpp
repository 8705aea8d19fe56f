#include "meshtrain/runtime/bad_batch_skip.h"

#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

void BadBatchSkip::before_step(RunState& run, StepContext& step) {
  const auto it = skip_at_.find(step.step);
  if (it == skip_at_.end()) return;
  const int64_t batches = it->second * run.config.config.train.grad_accum_steps;
  const data::SamplerState from = run.loader.state();
  for (int64_t k = 0; k < batches; ++k) run.loader.next();
  const data::SamplerState to = run.loader.state();
  run.log(
      detail::str_cat("skipped the ", batches, " batches of steps ", step.step, "..",
                      step.step + it->second - 1,
                      " that preceded the rollback (data position epoch ", from.epoch, " offset ",
                      from.offset, " -> epoch ", to.epoch, " offset ", to.offset, ")"),
      nlohmann::json{{"skipped_data_from", from.to_json()}, {"skipped_data_to", to.to_json()}});
  skip_at_.erase(it);
}

}  // namespace meshtrain::runtime
