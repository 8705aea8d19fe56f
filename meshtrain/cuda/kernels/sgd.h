// One SGD step on the device: tensor/cpu/sgd.h's semantics (weight decay added to the gradient,
// momentum with dampening, Nesterov), elementwise, the same float operations in the same order,
// each rounded on its own on both sides (no fused multiply-add: see CMakeLists.txt), so the same
// bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

void sgd_step(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
              float momentum, float dampening, float weight_decay, bool nesterov, bool first_step,
              cudaStream_t stream);

}  // namespace meshtrain::cuda
