// The optimizer over the flat shards a rank owns (ZeRO-1/2: ZeroShards' segments of the bucket
// arenas; ZeRO-3: FsdpUnits' segments of the units). The parameters are written to checkpoints
// by placement like every layout's (ZeRO-3's as flat pieces, since no rank holds them whole), and
// the state as flat pieces of the whole state tensors.
#pragma once

#include "meshtrain/parallel/parts/update.h"
#include "meshtrain/parallel/zero/sharded_optimizer.h"

namespace meshtrain::parallel {

class ShardedUpdate : public Update {
 public:
  // What the gradients and parameters of the ranks are between steps.
  enum class Holds {
    whole_gradients,  // ZeRO-1: every rank holds the whole averaged gradients (bucket views)
    gradient_shards,  // ZeRO-2: only this rank's shards of them
    parameter_shards  // ZeRO-3: and of the parameters, which hold no memory at rest
  };
  // `params`: the runner's parameters, whose indices the segments hold.
  ShardedUpdate(nn::NamedTensors params, ShardedOptimizer& optimizer, Holds holds);

  void set_lr(float lr) override { optimizer_.set_lr(lr); }
  bool unscale(const optim::LossScaler& scaler) override;
  GradSquares grad_squares(const NormShare& share) const override;
  void step(float grad_scale) override { optimizer_.step(grad_scale); }
  // ZeRO-1's norm is taken over the whole gradients, as DDP's, so that the two agree bit for bit.
  bool sharded() const override { return holds_ != Holds::whole_gradients; }
  nlohmann::json add_to_checkpoint(ckpt::RankShards& shards,
                                   const StatePlace& place) const override;
  void restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
               const StatePlace& place) override;

 private:
  nn::NamedTensors params_;
  ShardedOptimizer& optimizer_;
  Holds holds_;
};

}  // namespace meshtrain::parallel
