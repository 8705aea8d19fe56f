// The step's scalar factors are computed on the host in double and passed by value, exactly as
// the CPU kernel computes them; each element is then independent.
#include <cmath>

#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/adamw.h"
#include "meshtrain/cuda/kernels/block_plan.cuh"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

struct AdamWScalars {
  float decay, beta1, beta2, one_minus_b1, one_minus_b2, neg_step_size, bias2_sqrt, eps, grad_scale;
};

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n,
                             AdamWScalars s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = grad[i] * s.grad_scale;
    const float p = param[i] * s.decay;
    const float mi = m[i] * s.beta1 + g * s.one_minus_b1;
    const float vi = v[i] * s.beta2 + (g * g) * s.one_minus_b2;
    m[i] = mi;
    v[i] = vi;
    param[i] = p + s.neg_step_size * (mi / (sqrtf(vi) / s.bias2_sqrt + s.eps));
  }
}

// Tensors per launch: their descriptors travel as the kernel's argument (under 4 KiB).
constexpr int kManyTensors = 48;
constexpr int64_t kManyChunk = 64 * 1024;  // elements per block

struct ManyTensors {
  float* param[kManyTensors];
  const float* grad[kManyTensors];
  float* m[kManyTensors];
  float* v[kManyTensors];
  float decay[kManyTensors];
  detail::BlockPlan<kManyTensors, kManyChunk> plan;
};

__global__ void adamw_many_kernel(ManyTensors ts, AdamWScalars s, const cpu::StepGate* gate) {
  float grad_scale = s.grad_scale;
  if (gate != nullptr) {
    if (gate->skip) return;
    grad_scale = gate->coef;
  }
  int64_t begin, end;
  const int i = ts.plan.locate(begin, end);
  float* param = ts.param[i];
  const float* grad = ts.grad[i];
  float* m = ts.m[i];
  float* v = ts.v[i];
  const float decay = ts.decay[i];
  for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
    // A separate product (rounded): nothing adds to it, so nvcc cannot fuse it.
    const float g = grad[k] * grad_scale;
    const float p = param[k] * decay;
    const float mi = m[k] * s.beta1 + g * s.one_minus_b1;
    const float vi = v[k] * s.beta2 + (g * g) * s.one_minus_b2;
    m[k] = mi;
    v[k] = vi;
    param[k] = p + s.neg_step_size * (mi / (sqrtf(vi) / s.bias2_sqrt + s.eps));
  }
}

AdamWScalars scalars(float lr, float beta1, float beta2, float eps, float weight_decay, int64_t t,
                     float grad_scale = 1.0f) {
  MT_CHECK(t >= 1, "adamw_step: step must be >= 1, got ", t);
  const double bias1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bias2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  return AdamWScalars{
      static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay),
      beta1,
      beta2,
      static_cast<float>(1.0 - beta1),
      static_cast<float>(1.0 - beta2),
      static_cast<float>(-(static_cast<double>(lr) / bias1)),
      static_cast<float>(std::sqrt(bias2)),
      eps,
      grad_scale,
  };
}

}  // namespace

void adamw_step_many(float* const* params, const float* const* grads, float* const* m,
                     float* const* v, const int64_t* ns, const float* decays, int64_t count,
                     float lr, float beta1, float beta2, float eps, int64_t t, float grad_scale,
                     const cpu::StepGate* gate, cudaStream_t stream) {
  const AdamWScalars s = scalars(lr, beta1, beta2, eps, 0.0f, t, grad_scale);
  ManyTensors ts{};
  auto launch = [&] {
    if (ts.plan.count == 0) return;
    adamw_many_kernel<<<ts.plan.blocks(), detail::kBlock, 0, stream>>>(ts, s, gate);
    MT_CUDA_CHECK_LAUNCH();
    ts = ManyTensors{};
  };
  for (int64_t i = 0; i < count; ++i) {
    if (ns[i] <= 0) continue;
    const int k = ts.plan.add(ns[i]);
    ts.param[k] = params[i];
    ts.grad[k] = grads[i];
    ts.m[k] = m[i];
    ts.v[k] = v[i];
    // The decay factor as adamw_step computes it, per tensor.
    ts.decay[k] = scalars(lr, beta1, beta2, eps, decays[i], t).decay;
    if (ts.plan.full()) launch();
  }
  launch();
}

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int64_t t,
                cudaStream_t stream) {
  const AdamWScalars s = scalars(lr, beta1, beta2, eps, weight_decay, t);
  if (n <= 0) return;
  adamw_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(param, grad, m, v, n, s);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda
