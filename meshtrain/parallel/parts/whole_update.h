// The optimizer over whole tensors: DDP, tensor-parallel parts, pipeline stages. Each rank
// updates every parameter it holds (its tp part of a split one) with the same gradients as its
// replicas, so the replicas stay the same bits without communication.
#pragma once

#include <memory>

#include "meshtrain/optim/optimizer.h"
#include "meshtrain/parallel/parts/update.h"

namespace meshtrain::parallel {

// The sums of squares of whole gradients (those `share` counts), as the norm takes them.
GradSquares whole_grad_squares(const nn::NamedTensors& params, const NormShare& share);

class WholeUpdate : public Update, private DeviceGatedUpdate {
 public:
  WholeUpdate(nn::NamedTensors params, std::unique_ptr<optim::Optimizer> optimizer);

  void set_lr(float lr) override { optimizer_->set_lr(lr); }
  bool unscale(const optim::LossScaler& scaler) override;
  GradSquares grad_squares(const NormShare& share) const override;
  void step(float grad_scale) override { optimizer_->step(grad_scale); }
  bool sharded() const override { return false; }
  nlohmann::json add_to_checkpoint(ckpt::RankShards& shards,
                                   const StatePlace& place) const override;
  void restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
               const StatePlace& place) override;
  // Where every parameter is on one device and the optimizer reads a gate (AdamW).
  DeviceGatedUpdate* device_gated() override;

 private:
  optim::DeviceSquares unscale_on_device(const optim::LossScaler& scaler) override;
  optim::DeviceSquares grad_squares_on_device(const NormShare& share) const override;
  void step_gated(const Tensor& gate) override { optimizer_->step_gated(gate); }
  void revert_step() override { optimizer_->revert_step(); }

  nn::NamedTensors params_;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace meshtrain::parallel
