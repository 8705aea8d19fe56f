#include "meshtrain/parallel/parts/grad_sync.h"

#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

void GradSync::zero_grad(const nn::NamedTensors& params) {
  for (const auto& [name, p] : params)
    if (p.grad().defined()) {
      Tensor t = p;
      t.set_grad(Tensor());
    }
}

float GradSync::finish_with_record(const StepRecord& /*mine*/, StepOutcome& /*out*/) {
  MT_THROW(Error, "this gradient synchronisation does not carry the step's records");
}

}  // namespace meshtrain::parallel
