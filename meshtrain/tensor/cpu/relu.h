// ReLU, the activation of the vision models: max(x, 0), with PyTorch's conventions at zero and
// for NaN (relu(NaN) = NaN; the gradient at exactly 0 is 0).
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// out[n] = max(inp[n], 0); out may alias inp.
void relu_forward(float* out, const float* inp, int64_t n);

// dinp[n] = out[n] > 0 ? dout[n] : 0, written (like gelu_backward) rather than accumulated. The
// backward reads the forward's output, not its input, so an in-place ReLU keeps what it needs.
void relu_backward(float* dinp, const float* dout, const float* out, int64_t n);

}  // namespace meshtrain::cpu
