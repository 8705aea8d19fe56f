// nn.Linear: y = x W^T + b with W stored [out, in] as in PyTorch, so weights move between the two
// without transposing.
#pragma once

#include "meshtrain/nn/layer.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::nn {

class Linear : public Layer {
 public:
  // Weights ~ N(0, init_std), bias zero (GPT-2 initialisation).
  Linear(int64_t in, int64_t out, bool bias, Generator& gen, double init_std = 0.02);
  Tensor forward(const Tensor& x) const override;
  bool takes_half_input() const override { return true; }
  bool gives_half_output() const override { return true; }
  Tensor forward_as(const Tensor& x, DType out_type) const override;
  Tensor forward_residual(const Tensor& residual, const Tensor& x) const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  Tensor weight_;
  Tensor bias_;
};

}  // namespace meshtrain::nn
