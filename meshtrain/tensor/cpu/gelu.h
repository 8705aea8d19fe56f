// GELU with the tanh approximation used by GPT-2 (PyTorch's approximate='tanh'):
// gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// out[n] = gelu(inp[n]).
void gelu_forward(float* out, const float* inp, int64_t n);

// dinp[n] = gelu'(inp[n]) * dout[n] (written, not accumulated: a zero-filled buffer to add into
// costs a memory pass); the input, not the output, is what the backward needs.
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);

}  // namespace meshtrain::cpu
