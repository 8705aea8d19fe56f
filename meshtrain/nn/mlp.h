// GPT-2 feed-forward block: c_fc (C -> 4C), GELU (tanh form), c_proj (4C -> C). Built through a
// layer factory: tensor-parallel, c_fc is column-parallel and c_proj row-parallel, so the 4C
// hidden features are split and one all-reduce (or reduce-scatter) joins them.
#pragma once

#include <memory>

#include "meshtrain/nn/gpt_layers.h"

namespace meshtrain::nn {

class MLP : public Module {
 public:
  // `hidden` features (0: GPT-2's 4 * n_embd).
  MLP(int64_t n_embd, bool bias, const GPTLayers& layers, Generator& gen, double proj_init_std,
      int64_t hidden = 0);
  Tensor forward(const Tensor& x) const;
  // residual + forward(x), the sum made by c_proj (Layer::forward_residual).
  Tensor forward_residual(const Tensor& residual, const Tensor& x) const;
  // Whether forward takes x in autocast's type too (its first op is c_fc's product).
  bool takes_half_input() const { return c_fc_->takes_half_input(); }

 private:
  // GELU's output, the input of c_proj.
  Tensor hidden(const Tensor& x) const;
  // residual (where defined) + forward(x) as one op where it can be (autograd::gelu_mlp);
  // undefined where it cannot.
  Tensor fused(const Tensor& x, const Tensor& residual) const;

  std::shared_ptr<Layer> c_fc_;
  std::shared_ptr<Layer> c_proj_;
};

}  // namespace meshtrain::nn
