#include "meshtrain/nn/module.h"

#include <set>

namespace meshtrain::nn {

void Module::collect(const std::string& prefix, NamedTensors& out, bool params) const {
  for (const auto& [name, t] : params ? params_ : buffers_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, params);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", out, true);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", out, false);
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out = named_parameters();
  for (auto& nb : named_buffers()) out.push_back(nb);
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  std::set<std::string> used;
  for (auto& [name, t] : state_dict()) {
    auto it = state.find(name);
    if (it == state.end()) {
      if (strict) MT_THROW(ValueError, "weights are missing tensor '", name, "'");
      continue;
    }
    if (it->second.shape() != t.shape())
      MT_THROW(ValueError, "tensor '", name, "' has shape ", shape_str(it->second.shape()),
               " in the weights but ", shape_str(t.shape()), " in the model");
    Tensor dst = t;
    dst.copy_(it->second);
    used.insert(name);
  }
  if (strict) {
    for (auto& [name, t] : state)
      if (!used.count(name)) MT_THROW(ValueError, "weights contain unexpected tensor '", name, "'");
  }
}

void Module::to(Device device) {
  for (auto& [name, t] : state_dict()) {
    Tensor p = t;
    if (p.device() == device) continue;
    p.set_data(p.to(device));
    if (Tensor g = p.grad(); g.defined()) p.set_grad(g.to(device));
  }
}

Device Module::device() const {
  const NamedTensors params = named_parameters();
  return params.empty() ? Device::cpu() : params.front().second.device();
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) {
    Tensor p = t;
    p.set_grad(Tensor());
  }
}

Tensor& Module::register_parameter(const std::string& name, Tensor t) {
  MT_CHECK(name.find('.') == std::string::npos, "parameter name '", name, "' contains a dot");
  t.set_requires_grad(true);
  params_.emplace_back(name, std::move(t));
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, std::move(t));
  return buffers_.back().second;
}

}  // namespace meshtrain::nn
