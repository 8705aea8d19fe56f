// A rank's parameters and their optimizer state in a checkpoint, by placement. Each parameter's
// ParamInfo says which part of the whole tensor the rank holds: a part split over a mesh
// dimension (tensor parallelism's Shard{dim}, the packed q, k and v in blocks, a padded
// vocabulary) is written as that piece of the whole tensor, a replicated one whole, and the
// optimizer's state tensors ("<slot>.<name>") follow their parameter. The checkpoint so holds the
// plain model's tensors under their global names, and reading back cuts each rank's part out of
// them whatever layout wrote them: DDP, ZeRO, pipeline stages or tensor-parallel shards, of any
// world size.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/nn/module.h"
#include "meshtrain/nn/param_info.h"
#include "meshtrain/optim/optimizer.h"

namespace meshtrain::parallel {

// The part of its whole tensor that a parameter's holder has: undefined when every mesh
// dimension replicates it. ValueError naming the parameter for a placement no checkpoint of
// parts can describe (a flat shard, a split over two mesh dimensions).
nn::TensorShard held_part(const nn::ParamInfo& info);

// Adds `params` (this rank's tensors under their global names, each with a ParamInfo of that
// name in `infos`) to `shards` ("model") and their optimizer state ("optim"): every part of a
// split parameter, the replicated ones only when `write_replicated` (one holder of each is
// enough). Returns the optimizer's scalars of these parameters ("step.<name>", "step", "lr")
// for the train state. The live tensors are added, not copies (the writer snapshots them).
nlohmann::json add_placed_state(ckpt::RankShards& shards, const nn::NamedTensors& params,
                                const std::vector<nn::ParamInfo>& infos,
                                const optim::Optimizer& optimizer, bool write_replicated);

// The same from an optimizer's state (live or gathered: "<slot>.<name>" tensors in the shape
// of their parameter's part, and its scalars) and its slot names.
nlohmann::json add_placed_state(ckpt::RankShards& shards, const nn::NamedTensors& params,
                                const std::vector<nn::ParamInfo>& infos,
                                const optim::OptimizerState& state,
                                const std::vector<std::string>& slots, bool write_replicated);

// What restore_placed_state reads before it changes anything: the parameters' values (in the
// order of `params`) and the optimizer state of them ("<slot>.<name>" in each part's shape, the
// scalars of these parameters). ValueError as restore_placed_state's.
struct PlacedState {
  std::vector<Tensor> values;
  optim::OptimizerState optimizer;
};
PlacedState read_placed_state(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
                              const nn::NamedTensors& params,
                              const std::vector<nn::ParamInfo>& infos,
                              const std::vector<std::string>& slots);

// Loads every tensor of `params` (its part or its whole, as its ParamInfo says) and the
// optimizer's state of them from `checkpoint`, whichever layout wrote it; `scalars` is the
// train state's optimizer scalars. ValueError naming the tensor and the checkpoint when it lacks
// one or holds it in another whole shape.
void restore_placed_state(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
                          const nn::NamedTensors& params, const std::vector<nn::ParamInfo>& infos,
                          optim::Optimizer& optimizer);

}  // namespace meshtrain::parallel
