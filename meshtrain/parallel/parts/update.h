// Update: the optimizer part of the engine, over whole tensors (whole_update.h) or over the flat
// shards a rank owns (ZeRO-1/2/3: sharded_update.h). It reads the gradients the GradSync left,
// gives the one gradient norm (grad_norm.h) this rank's sums of squares, clips, steps, and
// writes and reads its parameters and state in checkpoints by their placements.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/param_info.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/optim/step_gate.h"
#include "meshtrain/parallel/layer_grad_norms.h"

namespace meshtrain::parallel {

// Sums of squared gradient elements this rank holds: of tensor-parallel parts (`split`) and of
// the rest (`whole`), kept apart so that adding them up over ranks keeps one association
// whatever the layout; and per layer, with per-layer norms.
struct GradSquares {
  double split = 0.0;
  double whole = 0.0;
  std::vector<double> layers;
};

// Which parameters (indices of the runner's parameters) this rank counts in the norm, and
// which of them are tensor-parallel parts.
struct NormShare {
  std::vector<bool> counted;
  std::vector<bool> split;
  const LayerGroups* layers = nullptr;  // non-null: fill GradSquares::layers
};

// Where this rank's parameters and state go in a checkpoint: which of them it writes (the first
// data-parallel replica writes parts, and the first tp rank of it the replicated tensors), the
// tied copies it leaves to their owner, and the group of its replicas.
struct StatePlace {
  std::vector<nn::ParamInfo> infos;  // of the runner's parameters, in their order
  std::set<std::string> copies;
  bool write_parts = true;
  bool write_replicated = true;
  // Expert parallelism: this rank writes its experts (the first copy of them does).
  bool write_experts = true;
  comm::ProcessGroupPtr dp_group;
};

// The update decided on the device (optim/step_gate.h), where an Update can take it: the sums of
// squares of the f16 unscaling and of the norm stay on the device, the optimizer reads the
// gate's decision there, and the host takes the step's counts back once it reads that the gate
// skipped it.
class DeviceGatedUpdate {
 public:
  virtual ~DeviceGatedUpdate() = default;
  virtual optim::DeviceSquares unscale_on_device(const optim::LossScaler& scaler) = 0;
  // The sums Update::grad_squares adds up (share.layers is not read), tensor-parallel parts
  // first, each group in the order grad_squares adds it.
  virtual optim::DeviceSquares grad_squares_on_device(const NormShare& share) const = 0;
  virtual void step_gated(const Tensor& gate) = 0;
  virtual void revert_step() = 0;
};

class Update {
 public:
  virtual ~Update() = default;
  virtual void set_lr(float lr) = 0;
  // f16: divides the gradients this rank reads by the scale; true when one is not finite.
  virtual bool unscale(const optim::LossScaler& scaler) = 0;
  virtual GradSquares grad_squares(const NormShare& share) const = 0;
  // Updates the parameters this rank holds from its gradients taken times grad_scale (the
  // clipping coefficient, optim::clip_coefficient; 1 without clipping).
  virtual void step(float grad_scale) = 0;
  // True when each rank of the data-parallel group reads other gradient elements (shards): the
  // norm then adds up every rank's sums.
  virtual bool sharded() const = 0;
  // This update's device-decided form (null: the host decides; a step over host parameters, or
  // an update that cannot).
  virtual DeviceGatedUpdate* device_gated() { return nullptr; }
  // This rank's parameters and optimizer state (returned: its scalars, for the train state).
  virtual nlohmann::json add_to_checkpoint(ckpt::RankShards& shards,
                                           const StatePlace& place) const = 0;
  // Loads parameters and state from a checkpoint of any layout.
  virtual void restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
                       const StatePlace& place) = 0;
};

}  // namespace meshtrain::parallel
