// Folding an evaluation-mode batch norm into the convolution before it. With running statistics a
// batch norm is an affine map per channel, y = (x - mean) * scale + beta with
// scale = gamma / sqrt(var + eps), so conv followed by it is one convolution with
//   weight' = weight * scale  (per output channel)   bias' = (bias - mean) * scale + beta,
// one pass over the output instead of two. The products are formed in double and rounded once, so
// weight' and bias' are the exact values to within half an f32 ulp; what differs from running the
// two layers is only where the convolution's sums round (see conv2d_forward_inference).
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// weight [C_out, per_out] (per_out = C_in / groups * KH * KW) and bias [C_out] of the convolution
// (bias may be nullptr: 0); gamma, beta (either may be nullptr: 1 and 0), mean, var [C_out] of the
// batch norm. Writes folded_weight [C_out, per_out] and folded_bias [C_out].
void fold_batch_norm(float* folded_weight, float* folded_bias, const float* weight,
                     const float* bias, const float* gamma, const float* beta, const float* mean,
                     const float* var, double eps, int64_t C_out, int64_t per_out);

}  // namespace meshtrain::cpu
