#include "meshtrain/runtime/sampling.h"

namespace meshtrain::runtime {

void Sampling::on_end(RunState& run) {
  if (run.result.preempted || run.rank != 0 || !run.task.prints_sample()) return;
  run.result.sample = run.task.sample(run.engine);
  run.log(run.task.sample_heading() + run.result.sample, nullptr);
}

}  // namespace meshtrain::runtime
