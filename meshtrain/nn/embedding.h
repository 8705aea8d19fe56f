// nn.Embedding: a [num, dim] table looked up by i32 ids (weights ~ N(0, 0.02) as in GPT-2).
#pragma once

#include "meshtrain/nn/module.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::nn {

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, Generator& gen, double init_std = 0.02);
  Tensor forward(const Tensor& ids) const;
  const Tensor& weight() const { return weight_; }

 private:
  Tensor weight_;
};

}  // namespace meshtrain::nn
