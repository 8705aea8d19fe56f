// AdamW with the exact semantics of torch.optim.AdamW (amsgrad=False, maximize=False):
// decoupled weight decay (param *= 1 - lr * wd), bias-corrected moments, eps added after the
// square root of the bias-corrected second moment. Each parameter is updated in one fused pass
// (tensor/cpu/adamw.h), threaded with OpenMP for large arrays.
#pragma once

#include <vector>

#include "meshtrain/optim/optimizer.h"

namespace meshtrain::optim {

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;  // used by the NamedParams constructor; groups carry their own
};

class AdamW final : public Optimizer {
 public:
  // One group with options.weight_decay (torch's default of 0.01 applies to every parameter;
  // use decay_groups() for the GPT convention).
  AdamW(const NamedParams& params, const AdamWOptions& options);
  // Groups keep their own weight decay.
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options);

  const AdamWOptions& options() const { return options_; }

 private:
  void update(Tensor& param, const Tensor& grad, ParamState& state,
              const ParamGroup& group) override;
  void flush_updates() override;
  bool reads_grad_scale() const override { return true; }
  bool reads_step_gate() const override { return true; }

  // Device updates of the current step, applied together by flush_updates() (one launch per
  // few dozen tensors instead of one each). The tensors are held until then.
  struct Queued {
    Tensor param, grad, m, v;
    float weight_decay;
    int64_t step;
  };
  AdamWOptions options_;
  std::vector<Queued> queued_;
};

}  // namespace meshtrain::optim
