#include "meshtrain/parallel/parts/grad_sync.h"

namespace meshtrain::parallel {

void GradSync::zero_grad(const nn::NamedTensors& params) {
  for (const auto& [name, p] : params)
    if (p.grad().defined()) {
      Tensor t = p;
      t.set_grad(Tensor());
    }
}

}  // namespace meshtrain::parallel
