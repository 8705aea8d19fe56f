// The optimizer of a ZeRO rank: it keeps state only for the pieces ("segments") of parameters
// that this rank owns, each a flat element range [begin, end) of one parameter, with 1-D views of
// the parameter's values and of its reduced gradient there. AdamW and SGD are elementwise, so
// updating a segment with its parameter's step count and weight decay gives exactly the bits a
// whole-tensor update gives.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/module.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/optim/optimizer.h"

namespace meshtrain::parallel {

// Builds the optimizer over the given groups (AdamW or SGD with the run's settings).
using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

class ShardedOptimizer {
 public:
  struct Segment {
    size_t param = 0;   // index into the whole parameters
    int64_t begin = 0;  // elements of the flattened parameter
    int64_t end = 0;
    Tensor value;  // 1-D [end - begin]: where the update writes
    Tensor grad;   // 1-D [end - begin]: the averaged gradient; stays put from step to step
  };

  // `params`: the whole model's parameters (names, shapes; weight decay follows decay_groups on
  // the whole parameter, since a flat segment has lost its shape).
  ShardedOptimizer(const nn::NamedTensors& params, std::vector<Segment> segments,
                   const OptimizerFactory& make_optimizer, float weight_decay);

  const std::vector<Segment>& segments() const { return segments_; }
  // Sum of squared gradient elements over the segments (double, segment order).
  double local_grad_norm_squared() const;
  // The same per whole parameter this rank holds a segment of: (parameter name, sum).
  std::vector<std::pair<std::string, double>> local_grad_squares_by_param() const;
  // f16: divides the gradient segments by the scale; true when one is not finite.
  bool unscale(const optim::LossScaler& scaler) const;
  void set_lr(float lr) { optimizer_->set_lr(lr); }
  // Gradients taken times grad_scale (a clipping coefficient).
  void step(float grad_scale = 1.0f) { optimizer_->step(grad_scale); }
  const std::vector<std::string>& slot_names() const { return optimizer_->slot_names(); }

  // The state as flat pieces of whole-parameter state tensors ("exp_avg.<param>", with the
  // parameter's shape) in `group`, and the scalars as the unsharded optimizer names them, so a
  // checkpoint loads into either. The state of the parameters named in `others` is left to
  // another rank that holds the same parameter (a pipeline's tied copy).
  nlohmann::json add_to_checkpoint(ckpt::RankShards& shards, const std::string& group,
                                   const std::set<std::string>& others = {}) const;
  // Loads the segments' state from a checkpoint of any layout.
  void restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars);

  // The whole state of every parameter (the ones given to the constructor), as the unsharded
  // optimizer names it ("<slot>.<param>" in the parameter's shape, "step.<param>", "step", "lr"),
  // put together from the segments of the ranks of `group`, whose segments together cover each
  // parameter once (ZeroShards' partition). Collective over `group`; costs, while the result
  // lives, the unsharded state (slots x the parameters' elements) on every rank of it. For
  // checkpoints whose pieces must be parts of the whole model's tensors rather than flat ranges
  // of them (tensor-parallel parts).
  optim::OptimizerState gather_state(const comm::ProcessGroupPtr& group) const;
  // Loads the segments' state out of such a whole state (each "<slot>.<param>" in the
  // parameter's shape; a parameter without "step.<param>", or with 0, was never updated).
  void load_whole_state(const optim::OptimizerState& whole);

 private:
  optim::NamedParams segment_params() const;

  std::vector<std::pair<std::string, Shape>> params_;  // whole: name, shape
  std::vector<Segment> segments_;
  std::vector<std::string> names_;  // per segment: "<param name>#<begin>"
  std::vector<Tensor> handles_;     // per segment: the optimizer's parameter (value, with grad)
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace meshtrain::parallel
