// SGD: argument checks as torch.optim.SGD makes them; the update is the fused CPU kernel.
#include "meshtrain/optim/sgd.h"

#include <cmath>

#include "meshtrain/tensor/cpu/sgd.h"
#include "meshtrain/tensor/device_kernels.h"
#include "meshtrain/util/error.h"

namespace meshtrain::optim {

namespace {

const SgdOptions& checked(const SgdOptions& o) {
  if (!std::isfinite(o.momentum) || o.momentum < 0.0f) {
    MT_THROW(ValueError, "sgd: momentum must be >= 0, got ", o.momentum);
  }
  if (!std::isfinite(o.dampening)) MT_THROW(ValueError, "sgd: dampening must be finite");
  if (o.nesterov && (o.momentum <= 0.0f || o.dampening != 0.0f)) {
    MT_THROW(ValueError, "sgd: Nesterov momentum requires a momentum and zero dampening");
  }
  return o;
}

std::vector<std::string> slots_for(const SgdOptions& o) {
  if (o.momentum == 0.0f) return {};
  return {"momentum_buffer"};
}

}  // namespace

Sgd::Sgd(const NamedParams& params, const SgdOptions& options)
    : Sgd(std::vector<ParamGroup>{ParamGroup{params, options.weight_decay}}, options) {}

Sgd::Sgd(std::vector<ParamGroup> groups, const SgdOptions& options)
    : Optimizer(std::move(groups), options.lr, slots_for(checked(options))), options_(options) {}

void Sgd::update(Tensor& param, const Tensor& grad, ParamState& state, const ParamGroup& group) {
  float* buf = state.slots.empty() ? nullptr : state.slots[0].data<float>();
  if (!param.device().is_cpu()) {
    device_kernels(param.device(), "sgd")
        .sgd_step(param.device(), param.data<float>(), grad.data<float>(), buf, param.numel(), lr(),
                  options_.momentum, options_.dampening, group.weight_decay, options_.nesterov,
                  state.step == 1);
    return;
  }
  cpu::sgd_step(param.data<float>(), grad.data<float>(), buf, param.numel(), lr(),
                options_.momentum, options_.dampening, group.weight_decay, options_.nesterov,
                state.step == 1);
}

}  // namespace meshtrain::optim
