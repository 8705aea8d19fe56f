#include "meshtrain/parallel/parts/whole_update.h"

#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/parallel/placed_state.h"
#include "meshtrain/tensor/ops.h"

namespace meshtrain::parallel {

WholeUpdate::WholeUpdate(nn::NamedTensors params, std::unique_ptr<optim::Optimizer> optimizer)
    : params_(std::move(params)), optimizer_(std::move(optimizer)) {}

bool WholeUpdate::unscale(const optim::LossScaler& scaler) {
  return scaler.unscale(params_);
}

GradSquares WholeUpdate::grad_squares(const NormShare& share) const {
  GradSquares out;
  if (share.layers) out.layers.assign(share.layers->size(), 0.0);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!share.counted[i]) continue;
    const Tensor g = params_[i].second.grad();
    if (!g.defined()) continue;
    const double sq = ops::sum_squares(g);
    (share.split[i] ? out.split : out.whole) += sq;
    if (share.layers) out.layers[share.layers->index_of(params_[i].first)] += sq;
  }
  return out;
}

void WholeUpdate::clip(double total_norm, double max_norm) {
  // Tied copies are scaled alike and updated alike, so they stay the same bits.
  optim::clip_grad_norm_with_total(params_, total_norm, max_norm);
}

nlohmann::json WholeUpdate::add_to_checkpoint(ckpt::RankShards& shards,
                                              const StatePlace& place) const {
  nn::NamedTensors owned;
  for (const auto& np : params_)
    if (!place.copies.count(np.first)) owned.push_back(np);
  // Every rank computes its scalars (the trainer keeps rank 0's); the tensors of the replicas
  // that do not write go nowhere. The live tensors are added: the writer copies them while the
  // next step computes.
  ckpt::RankShards unused;
  return add_placed_state(place.write_parts ? shards : unused, owned, place.infos, *optimizer_,
                          place.write_replicated);
}

void WholeUpdate::restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
                          const StatePlace& place) {
  // Both tied copies take the parameter's value and state: they are the same parameter.
  restore_placed_state(checkpoint, scalars, params_, place.infos, *optimizer_);
}

}  // namespace meshtrain::parallel
