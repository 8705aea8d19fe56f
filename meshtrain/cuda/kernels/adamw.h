// The fused AdamW update on the device: one kernel over a flat parameter array, with the
// semantics and scalar precision of tensor/cpu/adamw.h (torch.optim.AdamW).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

// One step t (>= 1) over n parameters; param, m and v are updated in place.
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int64_t t,
                cudaStream_t stream);

}  // namespace meshtrain::cuda
