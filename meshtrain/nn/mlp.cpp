#include "meshtrain/nn/mlp.h"

#include "meshtrain/autograd/functional.h"

namespace meshtrain::nn {

MLP::MLP(int64_t n_embd, bool bias, const GPTLayers& layers, Generator& gen, double proj_init_std) {
  c_fc_ = register_module("c_fc", layers.column(n_embd, 4 * n_embd, bias, 0.02, 1, gen));
  c_proj_ = register_module("c_proj", layers.row(4 * n_embd, n_embd, bias, proj_init_std, gen));
}

Tensor MLP::forward(const Tensor& x) const {
  return c_proj_->forward(autograd::gelu(c_fc_->forward(x)));
}

}  // namespace meshtrain::nn
