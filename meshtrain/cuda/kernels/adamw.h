// The fused AdamW update on the device: one kernel over a flat parameter array, with the
// semantics and scalar precision of tensor/cpu/adamw.h (torch.optim.AdamW).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "meshtrain/tensor/cpu/step_gate.h"

namespace meshtrain::cuda {

// One step t (>= 1) over n parameters; param, m and v are updated in place.
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int64_t t,
                cudaStream_t stream);

// One step t over `count` tensors at once (a multi-tensor apply: a launch per up to 48 tensors
// instead of one per tensor; a model's biases and norms are thousands of elements, and a launch
// each costs more than their arithmetic). Tensor i is params[i], grads[i], m[i], v[i] with ns[i]
// elements and weight decay decays[i]; every element gets the bits adamw_step gives it. Each
// gradient is read times grad_scale (a clipping coefficient; tensor/cpu/adamw.h). Where `gate`
// (device memory) is not null it decides instead: its skip leaves everything as it was, its coef
// is the scale (a step decided on the device: step_gate.h).
void adamw_step_many(float* const* params, const float* const* grads, float* const* m,
                     float* const* v, const int64_t* ns, const float* decays, int64_t count,
                     float lr, float beta1, float beta2, float eps, int64_t t, float grad_scale,
                     const cpu::StepGate* gate, cudaStream_t stream);

}  // namespace meshtrain::cuda
