#include "meshtrain/nn/module.h"

#include <set>

namespace meshtrain::nn {

void Module::collect(const std::string& prefix, NamedTensors& out, bool params) const {
  for (const auto& [name, t] : params ? params_ : buffers_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, params);
}

void Module::collect_inits(std::vector<ParamInit>& out) const {
  out.insert(out.end(), inits_.begin(), inits_.end());
  for (const auto& [name, child] : children_) child->collect_inits(out);
}

std::vector<ParamInfo> Module::param_infos() const {
  std::vector<ParamInit> inits;
  collect_inits(inits);
  const NamedTensors params = named_parameters();
  std::vector<ParamInfo> out;
  for (size_t i = 0; i < params.size(); ++i) {
    ParamInfo info;
    info.name = params[i].first;
    info.shape = params[i].second.shape();
    info.weight_decay = params[i].second.dim() >= 2;
    info.init = inits[i];
    if (const TensorShard& shard = info.init.shard; shard.defined()) {
      info.shape = shard.full;
      info.placements[shard.mesh_dim] = Placement::shard(shard.dim, shard.blocks);
    }
    out.push_back(std::move(info));
  }
  return out;
}

void Module::init_parameters(uint64_t seed) {
  NamedTensors params = named_parameters();
  const std::vector<ParamInfo> infos = param_infos();
  for (size_t i = 0; i < params.size(); ++i)
    init_parameter(params[i].second, infos[i].init, seed, infos[i].name);
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

Tensor& Module::register_parameter(const std::string& name, Tensor t, ParamInit init) {
  MT_CHECK(name.find('.') == std::string::npos, "parameter name '", name, "' contains a dot");
  t.set_requires_grad(true);
  params_.emplace_back(name, std::move(t));
  inits_.push_back(init);
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, std::move(t));
  return buffers_.back().second;
}

}  // namespace meshtrain::nn
