// nn.LayerNorm over the last dimension (weight 1, bias 0 at start; eps 1e-5 as in GPT-2).
#pragma once

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, bool bias = true, float eps = 1e-5f);
  // out_type: f32, or under autocast its type (autograd::layer_norm).
  Tensor forward(const Tensor& x, DType out_type = DType::f32) const;

 private:
  Tensor weight_;
  Tensor bias_;
  float eps_;
};

}  // namespace meshtrain::nn
