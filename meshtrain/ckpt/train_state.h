// Glue between the training objects and a checkpoint: optimizer state as shards plus JSON
// scalars, generator states as JSON. The trainer composes its train_state object from these
// (and from SamplerState::to_json), so every piece has one agreed form.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::ckpt {

// {"seed": S, "counter": C} (unsigned 64-bit JSON integers, exact).
nlohmann::json generator_to_json(const Generator& gen);
void generator_from_json(Generator& gen, const nlohmann::json& j);  // ValueError when malformed

// Adds the optimizer's tensors to `group` (replicated) and returns its scalars as a JSON object
// to store in the train state (e.g. train_state["optimizer"]).
nlohmann::json add_optimizer_state(RankShards& shards, const optim::OptimizerState& state,
                                   const std::string& group = "optim");
// The inverse: every tensor of `group`, loaded whole, plus the scalars.
optim::OptimizerState load_optimizer_state(const Checkpoint& ckpt, const nlohmann::json& scalars,
                                           const std::string& group = "optim");

}  // namespace meshtrain::ckpt
