#include "meshtrain/parallel/zero/sharded_optimizer.h"

#include <map>

#include "meshtrain/tensor/ops.h"

namespace meshtrain::parallel {
namespace {

// "exp_avg.h.0.attn.c_attn.weight#128" -> {"exp_avg", "h.0.attn.c_attn.weight#128"}.
std::pair<std::string, std::string> split_slot(const std::string& name) {
  const size_t dot = name.find('.');
  MT_CHECK(dot != std::string::npos, "optimizer state tensor '", name, "' names no slot");
  return {name.substr(0, dot), name.substr(dot + 1)};
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(const nn::NamedTensors& params, std::vector<Segment> segments,
                                   const OptimizerFactory& make_optimizer, float weight_decay)
    : segments_(std::move(segments)) {
  for (const auto& [name, p] : params) params_.emplace_back(name, p.shape());
  std::map<std::string, bool> decays;
  for (const optim::ParamGroup& g :
       optim::decay_groups(optim::NamedParams(params.begin(), params.end()), weight_decay))
    for (const auto& [name, p] : g.params) decays[name] = g.weight_decay > 0;
  optim::ParamGroup decayed{{}, weight_decay}, plain{{}, 0.0f};
  for (const Segment& seg : segments_) {
    MT_CHECK(seg.param < params_.size() && seg.begin < seg.end, "bad optimizer segment");
    const std::string& name = params_[seg.param].first;
    names_.push_back(name + "#" + std::to_string(seg.begin));
    // A handle of its own per segment, so that setting its gradient touches no other view.
    Tensor h = seg.value.detach();
    h.set_grad(seg.grad);
    handles_.push_back(h);
    (decays.at(name) ? decayed : plain).params.emplace_back(names_.back(), h);
  }
  // Always both groups (possibly empty), so every rank's optimizer has the same structure.
  std::vector<optim::ParamGroup> groups;
  groups.push_back(std::move(decayed));
  groups.push_back(std::move(plain));
  optimizer_ = make_optimizer(std::move(groups));
}

optim::NamedParams ShardedOptimizer::segment_params() const {
  optim::NamedParams out;
  for (size_t s = 0; s < handles_.size(); ++s) out.emplace_back(names_[s], handles_[s]);
  return out;
}

double ShardedOptimizer::local_grad_norm_squared() const {
  double total = 0;
  for (const Segment& seg : segments_) total += ops::sum_squares(seg.grad);
  return total;
}

std::vector<std::pair<std::string, double>> ShardedOptimizer::local_grad_squares_by_param() const {
  std::vector<std::pair<std::string, double>> out;
  for (const Segment& seg : segments_)
    out.emplace_back(params_[seg.param].first, ops::sum_squares(seg.grad));
  return out;
}

bool ShardedOptimizer::unscale(const optim::LossScaler& scaler) const {
  return scaler.unscale(segment_params());
}

nlohmann::json ShardedOptimizer::add_to_checkpoint(ckpt::RankShards& shards,
                                                   const std::string& group,
                                                   const std::set<std::string>& others) const {
  std::map<std::string, size_t> by_name;
  for (size_t s = 0; s < names_.size(); ++s) by_name[names_[s]] = s;
  const optim::OptimizerState st = optimizer_->state_view();
  for (const auto& [name, t] : st.tensors) {
    const auto [slot, seg_name] = split_slot(name);
    const Segment& seg = segments_.at(by_name.at(seg_name));
    const auto& [param_name, shape] = params_[seg.param];
    if (others.count(param_name)) continue;
    shards.add_flat(group, slot + "." + param_name, t, shape, seg.begin);
  }
  // A parameter's update count is the one of any of its segments (they are updated together);
  // parameters this rank holds no piece of were updated at every step (a dense model).
  nlohmann::json scalars = nlohmann::json::object();
  const double steps = st.scalars.at("step");
  scalars["step"] = steps;
  scalars["lr"] = st.scalars.at("lr");
  if (steps > 0) {
    for (const auto& [name, shape] : params_) scalars["step." + name] = steps;
    for (size_t s = 0; s < segments_.size(); ++s) {
      const auto it = st.scalars.find("step." + names_[s]);
      if (it != st.scalars.end()) scalars["step." + params_[segments_[s].param].first] = it->second;
    }
  }
  return scalars;
}

void ShardedOptimizer::restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars) {
  if (!scalars.is_object())
    MT_THROW(ValueError, "optimizer scalars must be a JSON object, got ", scalars.dump());
  optim::OptimizerState st;
  std::map<std::string, double> param_steps;
  for (const auto& [k, v] : scalars.items()) {
    if (!v.is_number()) MT_THROW(ValueError, "optimizer scalar '", k, "' is not a number");
    if (k.rfind("step.", 0) == 0)
      param_steps[k.substr(5)] = v.get<double>();
    else
      st.scalars[k] = v.get<double>();
  }
  for (size_t s = 0; s < segments_.size(); ++s) {
    const Segment& seg = segments_[s];
    const std::string& param_name = params_[seg.param].first;
    const auto it = param_steps.find(param_name);
    if (it == param_steps.end() || it->second == 0) continue;  // never updated: no state
    st.scalars["step." + names_[s]] = it->second;
    for (const std::string& slot : optimizer_->slot_names())
      st.tensors.emplace_back(
          slot + "." + names_[s],
          checkpoint.load_flat_range(slot + "." + param_name, seg.begin, seg.end));
  }
  optimizer_->load_state_dict(st);
}

optim::OptimizerState ShardedOptimizer::gather_state(const comm::ProcessGroupPtr& group) const {
  ckpt::RankShards unused;  // only the scalars are wanted (the pieces are live views)
  const nlohmann::json scalars = add_to_checkpoint(unused, "optim");
  optim::OptimizerState out;
  for (const auto& [k, v] : scalars.items()) out.scalars[k] = v.get<double>();
  // Every rank has the same step count, so every rank takes this branch together.
  if (out.scalars.at("step") == 0) return out;
  std::vector<int64_t> offset(params_.size() + 1, 0);
  for (size_t i = 0; i < params_.size(); ++i)
    offset[i + 1] = offset[i] + shape_numel(params_[i].second);
  const int64_t n = offset.back();
  std::map<std::string, size_t> by_name;
  for (size_t s = 0; s < names_.size(); ++s) by_name[names_[s]] = s;
  const optim::OptimizerState st = optimizer_->state_view();
  for (const std::string& slot : optimizer_->slot_names()) {
    // Each element has one owner over the group and zero bits everywhere else: a sum of the
    // bit patterns as integers is the owner's bits exactly (a float sum would turn -0 into +0).
    Tensor flat = Tensor::zeros({n});
    for (const auto& [name, t] : st.tensors) {
      const auto [state_slot, seg_name] = split_slot(name);
      if (state_slot != slot) continue;
      const Segment& seg = segments_.at(by_name.at(seg_name));
      const int64_t at = offset[seg.param];
      flat.slice(at + seg.begin, at + seg.end).copy_(t.view({seg.end - seg.begin}));
    }
    if (group && group->size() > 1) {
      comm::AllReduceOptions o;
      o.op = comm::ReduceOp::sum;
      o.async_op = false;
      group->all_reduce(flat.data_ptr(), static_cast<size_t>(n), DType::i32, o)->wait();
    }
    for (size_t i = 0; i < params_.size(); ++i)
      out.tensors.emplace_back(slot + "." + params_[i].first,
                               flat.slice(offset[i], offset[i + 1]).view(params_[i].second));
  }
  return out;
}

void ShardedOptimizer::load_whole_state(const optim::OptimizerState& whole) {
  optim::OptimizerState st;
  std::map<std::string, double> param_steps;
  for (const auto& [k, v] : whole.scalars) {
    if (k.rfind("step.", 0) == 0)
      param_steps[k.substr(5)] = v;
    else
      st.scalars[k] = v;
  }
  const std::map<std::string, Tensor> tensors(whole.tensors.begin(), whole.tensors.end());
  for (size_t s = 0; s < segments_.size(); ++s) {
    const Segment& seg = segments_[s];
    const auto& [param_name, shape] = params_[seg.param];
    const auto it = param_steps.find(param_name);
    if (it == param_steps.end() || it->second == 0) continue;  // never updated: no state
    st.scalars["step." + names_[s]] = it->second;
    for (const std::string& slot : optimizer_->slot_names()) {
      const auto t = tensors.find(slot + "." + param_name);
      MT_CHECK(t != tensors.end(), "no optimizer state '", slot, ".", param_name,
               "' for a parameter updated ", it->second, " times");
      MT_CHECK(t->second.shape() == shape, "optimizer state '", slot, ".", param_name, "' is ",
               shape_str(t->second.shape()), ", the parameter ", shape_str(shape));
      st.tensors.emplace_back(
          slot + "." + names_[s],
          t->second.view({shape_numel(shape)}).slice(seg.begin, seg.end).clone());
    }
  }
  optimizer_->load_state_dict(st);
}

}  // namespace meshtrain::parallel
