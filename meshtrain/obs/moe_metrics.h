// The experts' routing as metrics, from a step's model metrics ("moe": nn::MoEContext::summarize,
// summed over the data-parallel replicas): on the step's metrics.jsonl line as the object "moe",
// and as gauges meshtrain_moe_expert_load{layer,expert} (tokens an expert took in the step),
// meshtrain_moe_max_mean_load{layer}, meshtrain_moe_balance_loss, meshtrain_moe_z_loss and the
// counter meshtrain_moe_dropped_tokens_total.
#pragma once

#include <nlohmann/json.hpp>

#include "meshtrain/obs/metrics.h"

namespace meshtrain::obs {

class MoEMetrics {
 public:
  explicit MoEMetrics(Registry& registry) : registry_(registry) {}
  // `model` is the step's model metrics (null or without "moe": nothing to do).
  void on_step(const nlohmann::json& model, nlohmann::json& row);

 private:
  Registry& registry_;
};

}  // namespace meshtrain::obs
