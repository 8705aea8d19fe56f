#include "meshtrain/parallel/placed_state.h"

#include <map>
#include <set>
#include <string>

#include "meshtrain/ckpt/tensor_part.h"
#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

namespace {

std::map<std::string, const nn::ParamInfo*> by_name(const std::vector<nn::ParamInfo>& infos) {
  std::map<std::string, const nn::ParamInfo*> out;
  for (const nn::ParamInfo& info : infos) out.emplace(info.name, &info);
  return out;
}

const nn::ParamInfo& info_of(const std::map<std::string, const nn::ParamInfo*>& infos,
                             const std::string& name) {
  const auto it = infos.find(name);
  MT_CHECK(it != infos.end(), "parameter '", name, "' has no ParamInfo");
  return *it->second;
}

// The parameter a state tensor "<slot>.<name>" belongs to, "" when it is not one of `slots`.
std::string param_of(const std::string& key, const std::vector<std::string>& slots) {
  for (const std::string& slot : slots)
    if (key.size() > slot.size() + 1 && key.compare(0, slot.size() + 1, slot + ".") == 0)
      return key.substr(slot.size() + 1);
  return "";
}

void add_placed(ckpt::RankShards& shards, const std::string& group, const std::string& name,
                const Tensor& t, const nn::ParamInfo& info, bool write_replicated) {
  const nn::TensorShard part = held_part(info);
  if (part.defined())
    ckpt::add_tensor_part(shards, group, name, t, part);
  else if (write_replicated)
    shards.add_replicated(group, name, t);
}

Tensor load_placed(const ckpt::Checkpoint& checkpoint, const std::string& name,
                   const nn::ParamInfo& info, const Tensor& like) {
  if (checkpoint.manifest().find_tensor(name) == nullptr)
    MT_THROW(ValueError, "checkpoint ", checkpoint.dir(), " (step ", checkpoint.step(),
             ") has no tensor '", name, "' for this model");
  const nn::TensorShard part = held_part(info);
  Tensor t = part.defined() ? ckpt::load_tensor_part(checkpoint, name, part)
                            : checkpoint.load_global_tensor(name);
  if (t.shape() != like.shape())
    MT_THROW(ValueError, "checkpoint ", checkpoint.dir(), ": tensor '", name, "' is ",
             shape_str(t.shape()), ", this model's is ", shape_str(like.shape()),
             "; it cannot be resharded into this model");
  return t;
}

}  // namespace

nn::TensorShard held_part(const nn::ParamInfo& info) {
  std::string split;
  for (const auto& [mesh_dim, p] : info.placements) {
    if (p.kind == nn::Placement::Kind::replicate) continue;
    if (p.kind == nn::Placement::Kind::flat_shard)
      MT_THROW(ValueError, "parameter '", info.name, "' is a flat shard over '", mesh_dim,
               "', which a checkpoint of parameter parts cannot describe");
    if (!split.empty())
      MT_THROW(ValueError, "parameter '", info.name, "' is split over both '", split, "' and '",
               mesh_dim, "', which a checkpoint of parameter parts cannot describe yet");
    split = mesh_dim;
  }
  if (split.empty()) return {};
  // Which part (index of parts) lives in the shard its module drew: the placement names the
  // dimension and blocks, the module's TensorShard the rank's coordinate.
  const nn::TensorShard& s = info.init.shard;
  const nn::Placement p = info.placement(split);
  MT_CHECK(s.defined() && s.mesh_dim == split && s.dim == p.dim && s.blocks == p.blocks &&
               s.full == info.shape,
           "parameter '", info.name, "' is placed ", p.str(), " over '", split,
           "' but its module holds no matching part");
  return s;
}

nlohmann::json add_placed_state(ckpt::RankShards& shards, const nn::NamedTensors& params,
                                const std::vector<nn::ParamInfo>& infos,
                                const optim::Optimizer& optimizer, bool write_replicated) {
  return add_placed_state(shards, params, infos, optimizer.state_view(), optimizer.slot_names(),
                          write_replicated);
}

nlohmann::json add_placed_state(ckpt::RankShards& shards, const nn::NamedTensors& params,
                                const std::vector<nn::ParamInfo>& infos,
                                const optim::OptimizerState& st,
                                const std::vector<std::string>& slots, bool write_replicated) {
  const auto infos_by_name = by_name(infos);
  std::set<std::string> names;
  for (const auto& [name, t] : params) {
    add_placed(shards, "model", name, t, info_of(infos_by_name, name), write_replicated);
    names.insert(name);
  }
  for (const auto& [key, t] : st.tensors) {
    const std::string param = param_of(key, slots);
    if (!names.count(param)) continue;
    add_placed(shards, "optim", key, t, info_of(infos_by_name, param), write_replicated);
  }
  nlohmann::json scalars = nlohmann::json::object();
  for (const auto& [k, v] : st.scalars)
    if (k.rfind("step.", 0) != 0 || names.count(k.substr(5))) scalars[k] = v;
  return scalars;
}

PlacedState read_placed_state(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
                              const nn::NamedTensors& params,
                              const std::vector<nn::ParamInfo>& infos,
                              const std::vector<std::string>& slots) {
  if (!scalars.is_object())
    MT_THROW(ValueError, "optimizer scalars must be a JSON object, got ", scalars.dump());
  const auto infos_by_name = by_name(infos);
  PlacedState out;
  std::set<std::string> names;
  for (const auto& [name, p] : params) {
    const nn::ParamInfo& info = info_of(infos_by_name, name);
    out.values.push_back(load_placed(checkpoint, name, info, p));
    if (!names.insert(name).second) continue;  // a tied copy: its state is the parameter's
    for (const std::string& slot : slots) {
      const std::string key = slot + "." + name;
      if (checkpoint.manifest().find_tensor(key) == nullptr) continue;  // never updated
      out.optimizer.tensors.emplace_back(key, load_placed(checkpoint, key, info, p));
    }
  }
  for (const auto& [k, v] : scalars.items()) {
    if (!v.is_number()) MT_THROW(ValueError, "optimizer scalar '", k, "' is not a number");
    if (k.rfind("step.", 0) != 0 || names.count(k.substr(5)))
      out.optimizer.scalars[k] = v.get<double>();
  }
  return out;
}

void restore_placed_state(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
                          const nn::NamedTensors& params, const std::vector<nn::ParamInfo>& infos,
                          optim::Optimizer& optimizer) {
  // Everything is read before anything changes: a checkpoint that does not fit leaves the model
  // as it was.
  const PlacedState read =
      read_placed_state(checkpoint, scalars, params, infos, optimizer.slot_names());
  optimizer.load_state_dict(read.optimizer);
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = params[i].second;
    p.copy_(read.values[i]);
  }
}

}  // namespace meshtrain::parallel
