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
  MT_CHECK(step_gate() == nullptr || !param.device().is_cpu(),
           "adamw: a step gated on a device cannot update a parameter on the host");
  if (!param.device().is_cpu()) {
    queued_.push_back(
        {param, grad, state.slots[0], state.slots[1], group.weight_decay, state.step});
    return;
  }
  cpu::adamw_step(param.data<float>(), grad.data<float>(), state.slots[0].data<float>(),
                  state.slots[1].data<float>(), param.numel(), lr(), options_.beta1, options_.beta2,
                  options_.eps, group.weight_decay, state.step, grad_scale());
}

void AdamW::flush_updates() {
  std::vector<Queued> queued;
  queued.swap(queued_);
  // One call per run of tensors on the same device at the same step (in a model: all of them).
  for (size_t begin = 0; begin < queued.size();) {
    const Device dev = queued[begin].param.device();
    const int64_t t = queued[begin].step;
    size_t end = begin;
    std::vector<float*> params, ms, vs;
    std::vector<const float*> grads;
    std::vector<int64_t> ns;
    std::vector<float> decays;
    for (; end < queued.size() && queued[end].param.device() == dev && queued[end].step == t;
         ++end) {
      const Queued& q = queued[end];
      params.push_back(q.param.data<float>());
      grads.push_back(q.grad.data<float>());
      ms.push_back(q.m.data<float>());
      vs.push_back(q.v.data<float>());
      ns.push_back(q.param.numel());
      decays.push_back(q.weight_decay);
    }
    device_kernels(dev, "adamw")
        .adamw_step_many(dev, params.data(), grads.data(), ms.data(), vs.data(), ns.data(),
                         decays.data(), static_cast<int64_t>(ns.size()), lr(), options_.beta1,
                         options_.beta2, options_.eps, t, grad_scale(), step_gate());
    begin = end;
  }
}

}  // namespace meshtrain::optim
