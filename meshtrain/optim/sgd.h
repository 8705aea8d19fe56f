// Stochastic gradient descent with the exact semantics of torch.optim.SGD (maximize=False):
// L2 weight decay added to the gradient, momentum whose buffer starts as the first gradient,
// dampening, and Nesterov momentum. Used for the simple baselines and as the parity anchor.
#pragma once

#include <vector>

#include "meshtrain/optim/optimizer.h"

namespace meshtrain::optim {

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;  // used by the NamedParams constructor; groups carry their own
  bool nesterov = false;
};

class Sgd final : public Optimizer {
 public:
  // One group with options.weight_decay.
  Sgd(const NamedParams& params, const SgdOptions& options);
  // Groups keep their own weight decay.
  Sgd(std::vector<ParamGroup> groups, const SgdOptions& options);

  const SgdOptions& options() const { return options_; }

 private:
  void update(Tensor& param, const Tensor& grad, ParamState& state,
              const ParamGroup& group) override;

  SgdOptions options_;
};

}  // namespace meshtrain::optim
