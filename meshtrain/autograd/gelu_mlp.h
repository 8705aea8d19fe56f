// GPT-2's MLP under autocast as one op: residual + gelu(x @ w_fc^T + b_fc) @ w_proj^T + b_proj.
// As one op, GELU is computed where the first product writes its output, and GELU's gradient
// where the second product writes its input gradient (on cuda, cuBLASLt's GELU_AUX_BIAS and
// DGELU_BGRAD epilogues): the [.., 4C] hidden activation and its gradient are each written once,
// where separate ops write the product, read it for GELU and write again, both ways. The first
// product's bias gradient comes from the same epilogue, the second's from its weight gradient's.
//
// Numerics (the CPU emulates the device's): GELU takes the first product's f32 sum before it is
// rounded, and keeps the rounded copy for its backward; GELU's gradient multiplies the f32 input
// gradient of the second product and is rounded once. Separate ops round each of those first
// (PyTorch's autocast does); this is what fused MLPs (Megatron's, Apex's) compute.
#pragma once

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::autograd {

// x[..., C_in] (f32, or already in autocast's type, whose gradient is then in that type too),
// w_fc[H, C_in], w_proj[C_out, H] (f32); biases f32 or undefined; residual f32 [..., C_out] or
// undefined (none added). Returns f32 [..., C_out]. Under autocast only.
Tensor gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj,
                const Tensor& b_proj, const Tensor& residual = Tensor());

}  // namespace meshtrain::autograd
