#include "meshtrain/nn/mlp_classifier.h"

#include <cmath>

#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/nn/top1.h"

namespace meshtrain::nn {

MLPClassifier::MLPClassifier(const std::vector<int64_t>& sizes, uint64_t seed) {
  MT_CHECK(sizes.size() >= 2, "an MLP classifier needs at least input and class sizes");
  Generator gen(seed);
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    MT_CHECK(sizes[i] > 0 && sizes[i + 1] > 0, "MLP layer sizes must be positive");
    const double std = 1.0 / std::sqrt(static_cast<double>(sizes[i]));
    layers_.push_back(register_module(
        std::to_string(i), std::make_shared<Linear>(sizes[i], sizes[i + 1], true, gen, std)));
  }
}

Tensor MLPClassifier::forward(const Tensor& x) const {
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = layers_[i]->forward(h);
    if (i + 1 < layers_.size()) h = autograd::gelu(h);
  }
  return h;
}

Tensor MLPClassifier::loss(const Tensor& x, const Tensor& labels) const {
  return autograd::cross_entropy(forward(x), labels, -1);
}

std::vector<int32_t> MLPClassifier::predict(const Tensor& x) const {
  autograd::NoGradGuard no_grad;
  return top1(forward(x));
}

}  // namespace meshtrain::nn
