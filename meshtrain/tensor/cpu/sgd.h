// The fused SGD update over one flat parameter array, matching torch.optim.SGD (maximize=False):
// weight decay, momentum with dampening, and Nesterov momentum.
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// One step over n parameters, in the order of torch.optim.SGD:
//   d = grad + weight_decay * param
//   if momentum != 0:
//     buf = d on the first step (first_step: the buffer does not exist yet; it is written),
//           else momentum * buf + (1 - dampening) * d
//     d = nesterov ? d + momentum * buf : buf
//   param -= lr * d
// momentum_buf may be nullptr only when momentum == 0.
void sgd_step(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
              float momentum, float dampening, float weight_decay, bool nesterov, bool first_step);

}  // namespace meshtrain::cpu
