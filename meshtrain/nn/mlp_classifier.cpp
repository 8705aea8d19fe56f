#include "meshtrain/nn/mlp_classifier.h"

#include <cmath>

#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"

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
  Tensor logits = forward(x);
  const int64_t n = logits.size(0), k = logits.size(1);
  const float* p = logits.data<float>();
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int32_t best = 0;
    for (int64_t j = 1; j < k; ++j)
      if (p[i * k + j] > p[i * k + best]) best = static_cast<int32_t>(j);
    out[static_cast<size_t>(i)] = best;
  }
  return out;
}

}  // namespace meshtrain::nn
