#include "meshtrain/parallel/parts/whole_update.h"

#include <set>
#include <string>

#include "meshtrain/parallel/placed_state.h"
#include "meshtrain/tensor/ops.h"

namespace meshtrain::parallel {

WholeUpdate::WholeUpdate(nn::NamedTensors params, std::unique_ptr<optim::Optimizer> optimizer)
    : params_(std::move(params)), optimizer_(std::move(optimizer)) {}

GradSquares whole_grad_squares(const nn::NamedTensors& params, const NormShare& share) {
  std::vector<size_t> which;
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!share.counted[i]) continue;
    Tensor g = params[i].second.grad();
    if (!g.defined()) continue;
    which.push_back(i);
    grads.push_back(std::move(g));
  }
  // All at once: on a device that is one wait for the device, not one per parameter; each sum
  // has the bits of its own sum_squares.
  const std::vector<double> sums = ops::sum_squares_each(grads);
  GradSquares out;
  if (share.layers) out.layers.assign(share.layers->size(), 0.0);
  for (size_t k = 0; k < which.size(); ++k) {
    const size_t i = which[k];
    (share.split[i] ? out.split : out.whole) += sums[k];
    if (share.layers) out.layers[share.layers->index_of(params[i].first)] += sums[k];
  }
  return out;
}

DeviceGatedUpdate* WholeUpdate::device_gated() {
  if (params_.empty() || !optimizer_->reads_step_gate()) return nullptr;
  const Device device = params_.front().second.device();
  if (device.is_cpu()) return nullptr;
  for (const auto& np : params_)
    if (np.second.device() != device) return nullptr;
  return this;
}

optim::DeviceSquares WholeUpdate::unscale_on_device(const optim::LossScaler& scaler) {
  return scaler.unscale_on_device(params_, params_.front().second.device());
}

optim::DeviceSquares WholeUpdate::grad_squares_on_device(const NormShare& share) const {
  // whole_grad_squares's sums, the split ones first: each group keeps its order of addition.
  std::vector<Tensor> split, whole;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!share.counted[i]) continue;
    Tensor g = params_[i].second.grad();
    if (!g.defined()) continue;
    (share.split[i] ? split : whole).push_back(std::move(g));
  }
  optim::DeviceSquares out;
  out.split = static_cast<int64_t>(split.size());
  out.count = out.split + static_cast<int64_t>(whole.size());
  split.insert(split.end(), whole.begin(), whole.end());
  out.sums = ops::sum_squares_each_on_device(split, params_.front().second.device());
  return out;
}

bool WholeUpdate::unscale(const optim::LossScaler& scaler) {
  return scaler.unscale(params_);
}

GradSquares WholeUpdate::grad_squares(const NormShare& share) const {
  return whole_grad_squares(params_, share);
}

nlohmann::json WholeUpdate::add_to_checkpoint(ckpt::RankShards& shards,
                                              const StatePlace& place) const {
  // Experts apart: under expert parallelism the first copy of each rank's experts writes them.
  nn::NamedTensors owned, experts;
  std::set<std::string> expert_names;
  for (const nn::ParamInfo& info : place.infos)
    if (info.expert) expert_names.insert(info.name);
  for (const auto& np : params_)
    if (!place.copies.count(np.first))
      (expert_names.count(np.first) ? experts : owned).push_back(np);
  // Every rank computes its scalars (the trainer keeps rank 0's); the tensors of the replicas
  // that do not write go nowhere. The live tensors are added: the writer copies them while the
  // next step computes.
  ckpt::RankShards unused;
  nlohmann::json scalars = add_placed_state(place.write_parts ? shards : unused, owned, place.infos,
                                            *optimizer_, place.write_replicated);
  if (!experts.empty())
    scalars.update(add_placed_state(place.write_experts ? shards : unused, experts, place.infos,
                                    *optimizer_, place.write_experts));
  return scalars;
}

void WholeUpdate::restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
                          const StatePlace& place) {
  // Both tied copies take the parameter's value and state: they are the same parameter.
  restore_placed_state(checkpoint, scalars, params_, place.infos, *optimizer_);
}

}  // namespace meshtrain::parallel
