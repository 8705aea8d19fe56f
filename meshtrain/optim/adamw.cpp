// AdamW: argument checks as torch.optim.AdamW makes them; the update is the fused CPU kernel.
// State slots are "exp_avg" and "exp_avg_sq", torch's names, so checkpoints read alike.
#include "meshtrain/optim/adamw.h"

#include <cmath>

#include "meshtrain/tensor/cpu/adamw.h"
#include "meshtrain/tensor/device_kernels.h"
#include "meshtrain/util/error.h"

namespace meshtrain::optim {

namespace {

const AdamWOptions& checked(const AdamWOptions& o) {
  if (!std::isfinite(o.beta1) || o.beta1 < 0.0f || o.beta1 >= 1.0f) {
    MT_THROW(ValueError, "adamw: beta1 must be in [0, 1), got ", o.beta1);
  }
  if (!std::isfinite(o.beta2) || o.beta2 < 0.0f || o.beta2 >= 1.0f) {
    MT_THROW(ValueError, "adamw: beta2 must be in [0, 1), got ", o.beta2);
  }
  if (!std::isfinite(o.eps) || o.eps < 0.0f) {
    MT_THROW(ValueError, "adamw: eps must be >= 0, got ", o.eps);
  }
  return o;
}

}  // namespace

AdamW::AdamW(const NamedParams& params, const AdamWOptions& options)
    : AdamW(std::vector<ParamGroup>{ParamGroup{params, options.weight_decay}}, options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : Optimizer(std::move(groups), options.lr, {"exp_avg", "exp_avg_sq"}),
      options_(checked(options)) {}

void AdamW::update(Tensor& param, const Tensor& grad, ParamState& state, const ParamGroup& group) {
  if (!param.device().is_cpu()) {
    device_kernels(param.device(), "adamw")
        .adamw_step(param.device(), param.data<float>(), grad.data<float>(),
                    state.slots[0].data<float>(), state.slots[1].data<float>(), param.numel(), lr(),
                    options_.beta1, options_.beta2, options_.eps, group.weight_decay, state.step);
    return;
  }
  cpu::adamw_step(param.data<float>(), grad.data<float>(), state.slots[0].data<float>(),
                  state.slots[1].data<float>(), param.numel(), lr(), options_.beta1, options_.beta2,
                  options_.eps, group.weight_decay, state.step);
}

}  // namespace meshtrain::optim
