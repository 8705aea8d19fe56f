// A multi-layer perceptron classifier: Linear layers with GELU between them, logits out. The
// smallest complete model, for tests and tutorials that do not need a language model.
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/nn/linear.h"

namespace meshtrain::nn {

class MLPClassifier : public Module {
 public:
  // sizes = {inputs, hidden..., classes}; at least two entries. Weights ~ N(0, 1/sqrt(fan_in)).
  MLPClassifier(const std::vector<int64_t>& sizes, uint64_t seed);
  // x[N, inputs] -> logits[N, classes]
  Tensor forward(const Tensor& x) const;
  // Mean cross-entropy against i32 labels[N].
  Tensor loss(const Tensor& x, const Tensor& labels) const;
  // Class with the highest logit for each row (no graph recorded).
  std::vector<int32_t> predict(const Tensor& x) const;
  // The Linear layers, first to last (module names "0", "1", ...).
  const std::vector<std::shared_ptr<Linear>>& layers() const { return layers_; }

 private:
  std::vector<std::shared_ptr<Linear>> layers_;
};

}  // namespace meshtrain::nn
