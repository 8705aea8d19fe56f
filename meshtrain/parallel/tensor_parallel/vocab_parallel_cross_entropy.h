// Cross-entropy over logits split by vocabulary columns, without ever gathering them: each rank
// holds logits[N, Vl] for the global columns [begin, begin + valid) (plus padding columns, which
// are ignored). The softmax's max and sum of exponentials, and the target's logit, are reduced
// over tp as N floats each (three all-reduces of N floats), so every rank ends with the same
// mean loss; the backward needs no communication at all: each rank's gradient is
// softmax - onehot on its own columns.
#pragma once

#include <cstdint>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::parallel::tp {

// Mean over the rows whose target is not ignore_index (as autograd::cross_entropy).
Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets,
                                    int64_t begin, int64_t valid,
                                    const comm::ProcessGroupPtr& group, int32_t ignore_index = -1);

}  // namespace meshtrain::parallel::tp
