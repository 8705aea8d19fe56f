// A language model's output head and loss as one op: the mean cross-entropy of the logits
// h @ weight^T against the targets. Under autocast the logits are kept in the half type (bf16
// or f16) as PyTorch's autocast keeps its LM head's output, and the cross-entropy reads them
// widened (f32 arithmetic). Under bf16, when a gradient is wanted, it writes the gradient of the
// mean loss over them in the same pass (rounded once): at a GPT vocabulary the logits are the
// largest tensor of a step, they are read once, and they take one half-precision buffer from the
// head's forward to its backward; the incoming gradient of the loss scales the backward's two
// products (their alpha; exact when it is a power of two). Under f16 the backward writes the
// gradient already scaled by the incoming gradient (a loss scale) before rounding it, as
// PyTorch's autocast does: f16 would round most of an unscaled gradient to zero or near it. Without
// autocast it is linear() followed by cross_entropy(), the same bits.
#pragma once

#include <cstdint>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::autograd {

// h[..., C] (f32, or under autocast already in its type, whose gradient is then in that type
// too), weight[V, C] (f32), targets (i32, one per row of h, -1 = ignore_index skipped) ->
// the mean loss, a scalar.
Tensor linear_cross_entropy(const Tensor& h, const Tensor& weight, const Tensor& targets,
                            int32_t ignore_index = -1);

}  // namespace meshtrain::autograd
