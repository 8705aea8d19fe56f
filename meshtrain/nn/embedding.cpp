#include "meshtrain/nn/embedding.h"

#include "meshtrain/autograd/functional.h"

namespace meshtrain::nn {

Embedding::Embedding(int64_t num, int64_t dim, Generator& gen, double init_std) {
  Tensor w = Tensor::empty({num, dim});
  normal_(w, gen, 0.0, init_std);
  weight_ = register_parameter("weight", w, ParamInit::normal(init_std));
}

Tensor Embedding::forward(const Tensor& ids) const {
  return autograd::embedding(ids, weight_);
}

}  // namespace meshtrain::nn
