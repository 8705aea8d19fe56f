// Differentiable tensor operations: each computes its result with tensor/ops and, when an input
// requires grad, records a node whose backward is written next to the forward. The fused layer
// operations (layer norm, attention, cross-entropy, ...) are in autograd/functional.h.
#pragma once

#include <vector>

#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::autograd {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor affine(const Tensor& a, float alpha, float beta);  // a * alpha + beta
inline Tensor scale(const Tensor& a, float s) {
  return affine(a, s, 0.0f);
}
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor pow(const Tensor& a, float exponent);

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

Tensor reshape(const Tensor& a, const Shape& shape);  // a view; -1 inferred
// Merges dimensions start_dim..last into one (a view): [N, C, 1, 1] -> [N, C] with start_dim 1.
Tensor flatten(const Tensor& a, int64_t start_dim = 1);
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length);
Tensor cat(const std::vector<Tensor>& parts, int64_t dim);

Tensor sum(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& a, int64_t dim, bool keepdim = false);  // gradient to the first argmax
Tensor sum_all(const Tensor& a);
Tensor mean_all(const Tensor& a);

}  // namespace meshtrain::autograd
