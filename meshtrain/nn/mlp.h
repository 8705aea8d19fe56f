// GPT-2 feed-forward block: c_fc (C -> 4C), GELU (tanh form), c_proj (4C -> C).
#pragma once

#include <memory>

#include "meshtrain/nn/linear.h"

namespace meshtrain::nn {

class MLP : public Module {
 public:
  MLP(int64_t n_embd, bool bias, Generator& gen, double proj_init_std);
  Tensor forward(const Tensor& x) const;

 private:
  std::shared_ptr<Linear> c_fc_;
  std::shared_ptr<Linear> c_proj_;
};

}  // namespace meshtrain::nn
