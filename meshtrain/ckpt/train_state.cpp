// Conversions between training objects and checkpoint pieces.
#include "meshtrain/ckpt/train_state.h"

#include "meshtrain/util/error.h"

namespace meshtrain::ckpt {

nlohmann::json generator_to_json(const Generator& gen) {
  return {{"seed", gen.seed()}, {"counter", gen.counter()}};
}

void generator_from_json(Generator& gen, const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("seed") || !j.contains("counter") ||
      !j["seed"].is_number_unsigned() || !j["counter"].is_number_unsigned())
    MT_THROW(ValueError, "generator state must be {\"seed\": u64, \"counter\": u64}, got ",
             j.dump());
  gen.set_state(j["seed"].get<uint64_t>(), j["counter"].get<uint64_t>());
}

nlohmann::json add_optimizer_state(RankShards& shards, const optim::OptimizerState& state,
                                   const std::string& group) {
  shards.add_replicated(group, state.tensors);
  nlohmann::json scalars = nlohmann::json::object();
  for (const auto& [k, v] : state.scalars) scalars[k] = v;
  return scalars;
}

optim::OptimizerState load_optimizer_state(const Checkpoint& ckpt, const nlohmann::json& scalars,
                                           const std::string& group) {
  if (!scalars.is_object())
    MT_THROW(ValueError, "optimizer scalars must be a JSON object, got ", scalars.dump());
  optim::OptimizerState state;
  state.tensors = ckpt.load_group(group);
  for (const auto& [k, v] : scalars.items()) {
    if (!v.is_number()) MT_THROW(ValueError, "optimizer scalar '", k, "' is not a number");
    state.scalars[k] = v.get<double>();
  }
  return state;
}

}  // namespace meshtrain::ckpt
