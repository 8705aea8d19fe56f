#include "meshtrain/nn/linear.h"

#include "meshtrain/autograd/functional.h"

namespace meshtrain::nn {

Linear::Linear(int64_t in, int64_t out, bool bias, Generator& gen, double init_std) {
  Tensor w = Tensor::empty({out, in});
  normal_(w, gen, 0.0, init_std);
  weight_ = register_parameter("weight", w, ParamInit::normal(init_std));
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({out}), ParamInit::zeros());
}

Tensor Linear::forward(const Tensor& x) const {
  return autograd::linear(x, weight_, bias_);
}

Tensor Linear::forward_as(const Tensor& x, DType out_type) const {
  return autograd::linear(x, weight_, bias_, out_type);
}

Tensor Linear::forward_residual(const Tensor& residual, const Tensor& x) const {
  return autograd::linear_residual(residual, x, weight_, bias_);
}

}  // namespace meshtrain::nn
