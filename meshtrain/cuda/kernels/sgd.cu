// See sgd.h: one thread per element in a grid-stride loop.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/launch.cuh"
#include "meshtrain/cuda/kernels/sgd.h"

namespace meshtrain::cuda {
namespace {

__global__ void sgd_kernel(float* param, const float* grad, float* buf, int64_t n, float neg_lr,
                           float momentum, float keep, float weight_decay, bool nesterov,
                           bool first) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float d = grad[i];
    if (weight_decay != 0.0f) d = d + weight_decay * param[i];
    if (momentum != 0.0f) {
      const float b = first ? d : buf[i] * momentum + keep * d;
      buf[i] = b;
      d = nesterov ? d + momentum * b : b;
    }
    param[i] = param[i] + neg_lr * d;
  }
}

}  // namespace

void sgd_step(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
              float momentum, float dampening, float weight_decay, bool nesterov, bool first_step,
              cudaStream_t stream) {
  if (n <= 0) return;
  const float keep = static_cast<float>(1.0 - static_cast<double>(dampening));
  sgd_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(
      param, grad, momentum_buf, n, -lr, momentum, keep, weight_decay, nesterov, first_step);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace meshtrain::cuda
