#include "meshtrain/nn/vocab_table.h"

namespace meshtrain::nn {

Tensor VocabTable::loss_of_hidden(const Tensor& h, const Tensor& targets) const {
  const Tensor l = logits(h);
  // Under sequence parallelism the logits hold every time step while h holds this rank's: the
  // targets are checked against the logits.
  MT_CHECK(l.dim() == 3 && targets.dim() == 2 && l.size(0) == targets.size(0) &&
               l.size(1) == targets.size(1),
           "targets ", shape_str(targets.shape()), " do not match logits ", shape_str(l.shape()));
  return loss(l, targets);
}

}  // namespace meshtrain::nn
