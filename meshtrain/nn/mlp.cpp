#include "meshtrain/nn/mlp.h"

#include "meshtrain/autograd/functional.h"

namespace meshtrain::nn {

MLP::MLP(int64_t n_embd, bool bias, Generator& gen, double proj_init_std) {
  c_fc_ = register_module("c_fc", std::make_shared<Linear>(n_embd, 4 * n_embd, bias, gen));
  c_proj_ = register_module("c_proj",
                            std::make_shared<Linear>(4 * n_embd, n_embd, bias, gen, proj_init_std));
}

Tensor MLP::forward(const Tensor& x) const {
  return c_proj_->forward(autograd::gelu(c_fc_->forward(x)));
}

}  // namespace meshtrain::nn
