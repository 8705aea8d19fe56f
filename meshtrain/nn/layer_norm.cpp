#include "meshtrain/nn/layer_norm.h"

#include "meshtrain/autograd/functional.h"

namespace meshtrain::nn {

LayerNorm::LayerNorm(int64_t dim, bool bias, float eps) : eps_(eps) {
  weight_ = register_parameter("weight", Tensor::ones({dim}), ParamInit::ones());
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({dim}), ParamInit::zeros());
}

Tensor LayerNorm::forward(const Tensor& x, DType out_type) const {
  return autograd::layer_norm(x, weight_, bias_, eps_, out_type);
}

}  // namespace meshtrain::nn
