// A few thousand multiplications per layer, against the millions of the convolution it feeds: one
// thread, no vectorisation hints.
#include "meshtrain/tensor/cpu/batch_norm_fold.h"

#include <cmath>

namespace meshtrain::cpu {

void fold_batch_norm(float* folded_weight, float* folded_bias, const float* weight,
                     const float* bias, const float* gamma, const float* beta, const float* mean,
                     const float* var, double eps, int64_t C_out, int64_t per_out) {
  for (int64_t c = 0; c < C_out; ++c) {
    const double g = gamma != nullptr ? gamma[c] : 1.0;
    const double scale = g / std::sqrt(static_cast<double>(var[c]) + eps);
    const float* w = weight + c * per_out;
    float* fw = folded_weight + c * per_out;
    for (int64_t i = 0; i < per_out; ++i) fw[i] = static_cast<float>(w[i] * scale);
    const double b = bias != nullptr ? bias[c] : 0.0;
    const double shift = beta != nullptr ? beta[c] : 0.0;
    folded_bias[c] = static_cast<float>((b - mean[c]) * scale + shift);
  }
}

}  // namespace meshtrain::cpu
