#include "meshtrain/parallel/parts/sharded_update.h"

#include "meshtrain/parallel/parts/whole_update.h"
#include "meshtrain/parallel/placed_state.h"
#include "meshtrain/tensor/ops.h"

namespace meshtrain::parallel {

namespace {

bool has_parts(const std::vector<nn::ParamInfo>& infos) {
  for (const nn::ParamInfo& info : infos)
    if (info.init.shard.defined()) return true;
  return false;
}

}  // namespace

ShardedUpdate::ShardedUpdate(nn::NamedTensors params, ShardedOptimizer& optimizer, Holds holds)
    : params_(std::move(params)), optimizer_(optimizer), holds_(holds) {}

bool ShardedUpdate::unscale(const optim::LossScaler& scaler) {
  // ZeRO-1: the whole gradients, which the norm reads; the segments are views of them.
  if (holds_ == Holds::whole_gradients) return scaler.unscale(params_);
  return optimizer_.unscale(scaler);
}

GradSquares ShardedUpdate::grad_squares(const NormShare& share) const {
  GradSquares out;
  if (share.layers) out.layers.assign(share.layers->size(), 0.0);
  if (holds_ == Holds::whole_gradients) return whole_grad_squares(params_, share);
  for (const ShardedOptimizer::Segment& seg : optimizer_.segments()) {
    if (!share.counted[seg.param]) continue;
    const double sq = ops::sum_squares(seg.grad);
    (share.split[seg.param] ? out.split : out.whole) += sq;
    if (share.layers) out.layers[share.layers->index_of(params_[seg.param].first)] += sq;
  }
  return out;
}

nlohmann::json ShardedUpdate::add_to_checkpoint(ckpt::RankShards& shards,
                                                const StatePlace& place) const {
  if (holds_ == Holds::parameter_shards) {
    // The parameters' own pieces: the values of this rank's segments, flat, so that no rank
    // gathers the model.
    for (const ShardedOptimizer::Segment& seg : optimizer_.segments()) {
      const auto& [name, p] = params_[seg.param];
      shards.add_flat("model", name, seg.value, p.shape(), seg.begin);
    }
    return optimizer_.add_to_checkpoint(shards, "optim", place.copies);
  }
  nn::NamedTensors owned;
  for (const auto& np : params_)
    if (!place.copies.count(np.first)) owned.push_back(np);
  ckpt::RankShards unused;
  ckpt::RankShards& mine = place.write_parts ? shards : unused;
  if (has_parts(place.infos)) {
    // A flat piece of a tensor-parallel part is no piece of the whole tensor: the replicas put
    // their state together (for the moment of the save every replica holds the unsharded state
    // of its part) and the first replica writes it by placement.
    const optim::OptimizerState whole = optimizer_.gather_state(place.dp_group);
    return add_placed_state(mine, owned, place.infos, whole, optimizer_.slot_names(),
                            place.write_replicated);
  }
  // The parameters by placement, the state as this rank's flat pieces, so that no rank gathers
  // it.
  add_placed_state(mine, owned, place.infos, optim::OptimizerState{}, {}, place.write_replicated);
  return optimizer_.add_to_checkpoint(shards, "optim", place.copies);
}

void ShardedUpdate::restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
                            const StatePlace& place) {
  if (holds_ == Holds::parameter_shards) {
    for (const ShardedOptimizer::Segment& seg : optimizer_.segments()) {
      Tensor piece = checkpoint.load_flat_range(params_[seg.param].first, seg.begin, seg.end);
      Tensor dst = seg.value;
      dst.copy_(piece);
    }
    optimizer_.restore(checkpoint, scalars);
    return;
  }
  const bool parts = has_parts(place.infos);
  // Everything is read before anything changes.
  const PlacedState read =
      read_placed_state(checkpoint, scalars, params_, place.infos,
                        parts ? optimizer_.slot_names() : std::vector<std::string>{});
  if (parts)
    optimizer_.load_whole_state(read.optimizer);
  else
    optimizer_.restore(checkpoint, scalars);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i].second;
    p.copy_(read.values[i]);
  }
}

}  // namespace meshtrain::parallel
