// LayerNorm over the last dimension, fused: one pass per row computes the statistics and the
// normalised, scaled output; the backward reuses the saved per-row mean and 1/std.
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// out[N, C] = (inp - mean) * rstd * weight[C] + bias[C], with mean[N] and rstd[N] =
// 1 / sqrt(biased variance + eps) saved for the backward. weight and bias may be nullptr
// (meaning 1 and 0); mean and rstd may be nullptr when no backward follows.
void layer_norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int64_t N, int64_t C, float eps);

// Writes dinp[N, C] and accumulates dweight[C], dbias[C] (each may be nullptr) given dout[N, C]
// and the forward's inp, weight (nullptr for none), mean and rstd. dinp is written rather than
// accumulated so that the caller need not zero-fill it; with `accumulate` the input gradient is
// added to what dinp holds (a gradient summed already: one pass instead of a separate sum, with
// the same bits).
void layer_norm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int64_t N, int64_t C, bool accumulate = false);

}  // namespace meshtrain::cpu
