// GELU (tanh approximation, GPT-2's) on the device; the semantics of tensor/cpu/gelu.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

// out[n] = gelu(inp[n]).
void gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream);
// dinp[n] = gelu'(inp[n]) * dout[n] (written, not accumulated).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n,
                   cudaStream_t stream);

}  // namespace meshtrain::cuda
