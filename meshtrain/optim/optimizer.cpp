// Group walking, lazy state creation and the checkpoint form of the state, shared by every
// optimizer.
#include "meshtrain/optim/optimizer.h"

#include <cmath>
#include <set>

#include "meshtrain/tensor/ops.h"
#include "meshtrain/util/error.h"

namespace meshtrain::optim {

namespace {

void check_param(const std::string& name, const Tensor& p) {
  MT_CHECK(p.defined(), "optimizer: parameter '", name, "' is undefined");
  if (p.dtype() != DType::f32) {
    MT_THROW(ValueError, "optimizer: parameter '", name, "' is ", p.str(),
             "; the optimizers update f32 tensors");
  }
}

}  // namespace

std::vector<ParamGroup> decay_groups(const NamedParams& params, float weight_decay) {
  ParamGroup decay{{}, weight_decay};
  ParamGroup no_decay{{}, 0.0f};
  for (const auto& [name, p] : params) {
    (p.dim() >= 2 ? decay : no_decay).params.emplace_back(name, p);
  }
  return {std::move(decay), std::move(no_decay)};
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, float lr, std::vector<std::string> slot_names)
    : groups_(std::move(groups)), slot_names_(std::move(slot_names)), lr_(0.0f) {
  set_lr(lr);
  state_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!std::isfinite(groups_[g].weight_decay) || groups_[g].weight_decay < 0.0f) {
      MT_THROW(ValueError, "optimizer: weight decay must be finite and >= 0, got ",
               groups_[g].weight_decay);
    }
    state_[g].resize(groups_[g].params.size());
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const auto& [name, p] = groups_[g].params[i];
      check_param(name, p);
      if (!by_name_.emplace(name, ParamIndex{g, i}).second) {
        MT_THROW(ValueError, "optimizer: parameter name '", name, "' appears twice");
      }
    }
  }
}

void Optimizer::set_lr(float lr) {
  if (!std::isfinite(lr) || lr < 0.0f) {
    MT_THROW(ValueError, "optimizer: learning rate must be finite and >= 0, got ", lr);
  }
  lr_ = lr;
}

void Optimizer::step(float grad_scale) {
  MT_CHECK(std::isfinite(grad_scale), "optimizer: gradient scale must be finite, got ", grad_scale);
  if (grad_scale != 1.0f && !reads_grad_scale()) {
    std::vector<Tensor> grads;
    for (auto& group : groups_)
      for (auto& [name, p] : group.params)
        if (Tensor g = p.grad(); g.defined()) grads.push_back(std::move(g));
    ops::scale_each_(grads, grad_scale);
    grad_scale = 1.0f;
  }
  grad_scale_ = grad_scale;
  try {
    update_all();
  } catch (...) {
    flush_updates();
    grad_scale_ = 1.0f;
    throw;
  }
  flush_updates();
  grad_scale_ = 1.0f;
  ++step_count_;
}

void Optimizer::step_gated(const Tensor& gate) {
  MT_CHECK(reads_step_gate(), "optimizer: this optimizer cannot take its step from a device gate");
  MT_CHECK(
      gate.dtype() == DType::u8 && gate.numel() == sizeof(cpu::StepGate) && !gate.device().is_cpu(),
      "optimizer: ", gate.str(), " holds no device step gate");
  gate_ = static_cast<const cpu::StepGate*>(gate.data_ptr());
  try {
    update_all();
  } catch (...) {
    flush_updates();
    gate_ = nullptr;
    throw;
  }
  flush_updates();
  gate_ = nullptr;
  ++step_count_;
  revertible_ = true;
}

void Optimizer::revert_step() {
  MT_CHECK(step_count_ > 0 && revertible_,
           "optimizer: only the last step, taken from a device gate, can be taken back, once");
  revertible_ = false;
  for (const ParamIndex& at : last_updated_) --state_[at.group][at.index].step;
  last_updated_.clear();
  --step_count_;
}

void Optimizer::update_all() {
  last_updated_.clear();
  revertible_ = false;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      auto& [name, p] = groups_[g].params[i];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (grad.dtype() != DType::f32 || grad.device() != p.device() || grad.shape() != p.shape()) {
        MT_THROW(ValueError, "optimizer: gradient of '", name, "' is ", grad.str(),
                 ", parameter is ", p.str());
      }
      ParamState& st = state_[g][i];
      if (st.slots.empty()) {
        for (size_t s = 0; s < slot_names_.size(); ++s) {
          st.slots.push_back(Tensor::zeros(p.shape(), DType::f32, p.device()));
        }
      }
      ++st.step;
      last_updated_.push_back({g, i});
      update(p, grad, st, groups_[g]);
    }
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& group : groups_) {
    for (auto& [name, p] : group.params) {
      if (set_to_none) {
        if (p.grad().defined()) p.set_grad(Tensor());
      } else if (Tensor g = p.grad(); g.defined()) {
        g.zero_();
      }
    }
  }
}

const Optimizer::ParamIndex& Optimizer::find_param(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) MT_THROW(ValueError, "optimizer: no parameter named '", name, "'");
  return it->second;
}

Tensor Optimizer::state_tensor(const std::string& slot, const std::string& param_name) const {
  const ParamIndex& at = find_param(param_name);
  const ParamState& st = state_[at.group][at.index];
  for (size_t s = 0; s < slot_names_.size(); ++s) {
    if (slot_names_[s] == slot) return st.slots.empty() ? Tensor() : st.slots[s];
  }
  MT_THROW(ValueError, "optimizer: no state slot named '", slot, "'");
}

OptimizerState Optimizer::state_dict() const {
  OptimizerState out = state_view();
  for (auto& [name, t] : out.tensors) t = t.clone();
  return out;
}

OptimizerState Optimizer::state_view() const {
  OptimizerState out;
  out.scalars["step"] = static_cast<double>(step_count_);
  out.scalars["lr"] = static_cast<double>(lr_);
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const std::string& name = groups_[g].params[i].first;
      const ParamState& st = state_[g][i];
      if (st.step == 0) continue;
      out.scalars["step." + name] = static_cast<double>(st.step);
      for (size_t s = 0; s < slot_names_.size(); ++s) {
        out.tensors.emplace_back(slot_names_[s] + "." + name, st.slots[s]);
      }
    }
  }
  return out;
}

void Optimizer::load_state_dict(const OptimizerState& state) {
  // Build the new state aside so that a bad checkpoint leaves this optimizer untouched.
  std::vector<std::vector<ParamState>> fresh(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) fresh[g].resize(groups_[g].params.size());

  auto read_count = [](const std::string& key, double v) {
    if (!std::isfinite(v) || v < 0 || v != std::floor(v) || v > 9.0e15) {
      MT_THROW(ValueError, "optimizer state: '", key, "' must be a whole count, got ", v);
    }
    return static_cast<int64_t>(v);
  };

  int64_t step_count = 0;
  float lr = lr_;
  for (const auto& [key, value] : state.scalars) {
    if (key == "step") {
      step_count = read_count(key, value);
    } else if (key == "lr") {
      lr = static_cast<float>(value);
      if (!std::isfinite(lr) || lr < 0.0f) {
        MT_THROW(ValueError, "optimizer state: bad learning rate ", value);
      }
    } else if (key.rfind("step.", 0) == 0) {
      const std::string name = key.substr(5);
      if (!by_name_.count(name)) {
        MT_THROW(ValueError, "optimizer state: '", key, "' names no parameter of this optimizer");
      }
      const ParamIndex& at = by_name_.at(name);
      fresh[at.group][at.index].step = read_count(key, value);
    } else {
      MT_THROW(ValueError, "optimizer state: unknown scalar '", key, "'");
    }
  }

  std::set<std::string> seen;
  for (const auto& [key, t] : state.tensors) {
    if (!seen.insert(key).second) MT_THROW(ValueError, "optimizer state: '", key, "' twice");
    size_t slot = slot_names_.size();
    for (size_t s = 0; s < slot_names_.size(); ++s) {
      const std::string prefix = slot_names_[s] + ".";
      if (key.rfind(prefix, 0) == 0 && by_name_.count(key.substr(prefix.size()))) slot = s;
    }
    if (slot == slot_names_.size()) {
      MT_THROW(ValueError, "optimizer state: tensor '", key,
               "' names no slot and parameter of this optimizer");
    }
    const std::string name = key.substr(slot_names_[slot].size() + 1);
    const ParamIndex& at = by_name_.at(name);
    const Tensor& p = groups_[at.group].params[at.index].second;
    if (!t.defined() || t.shape() != p.shape() || !is_floating(t.dtype())) {
      MT_THROW(ValueError, "optimizer state: tensor '", key, "' is ",
               t.defined() ? t.str() : std::string("undefined"), ", expected shape ",
               shape_str(p.shape()));
    }
    ParamState& st = fresh[at.group][at.index];
    if (st.slots.empty()) st.slots.resize(slot_names_.size());
    st.slots[slot] = t.to(Device::cpu()).to(DType::f32).clone().to(p.device());
  }

  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      ParamState& st = fresh[g][i];
      const std::string& name = groups_[g].params[i].first;
      bool complete = !st.slots.empty();
      for (const Tensor& s : st.slots) complete = complete && s.defined();
      if (st.step > 0 && !complete && !slot_names_.empty()) {
        MT_THROW(ValueError, "optimizer state: parameter '", name, "' has step ", st.step,
                 " but not all of its state tensors");
      }
      if (st.step == 0 && !st.slots.empty()) {
        MT_THROW(ValueError, "optimizer state: parameter '", name,
                 "' has state tensors but no 'step.", name, "'");
      }
    }
  }

  state_ = std::move(fresh);
  step_count_ = step_count;
  lr_ = lr;
}

}  // namespace meshtrain::optim
