// The fused AdamW update over one flat parameter array (parameters live in one arena, so one call
// can update all of them). Semantics follow torch.optim.AdamW (amsgrad=False, maximize=False).
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// One step t (>= 1) over n parameters, in the order of torch.optim.AdamW:
//   param *= 1 - lr * weight_decay                       (decoupled weight decay)
//   m = beta1 * m + (1 - beta1) * grad
//   v = beta2 * v + (1 - beta2) * grad^2
//   param -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// The scalar factors are computed in double and applied in float, as PyTorch does. grad is read
// times grad_scale (an f32 product: the bits of scaling the gradient in memory first, as gradient
// clipping does), so a clipped step needs no pass of its own over the gradients.
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int64_t t,
                float grad_scale = 1.0f);

}  // namespace meshtrain::cpu
