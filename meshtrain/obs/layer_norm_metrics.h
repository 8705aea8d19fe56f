// train.log_layer_norms as metrics: each layer's gradient norm (before clipping, as the engine
// computed it over the unique shards) as the gauge meshtrain_layer_grad_norm{layer="h.3"} and
// as the object "layer_grad_norms": {"wte": ..., "h.0": ...} on the step's metrics.jsonl line.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/obs/metrics.h"

namespace meshtrain::obs {

class LayerNormMetrics {
 public:
  explicit LayerNormMetrics(Registry& registry) : registry_(registry) {}
  void on_step(const std::vector<std::pair<std::string, double>>& norms, nlohmann::json& row);

 private:
  Registry& registry_;
};

}  // namespace meshtrain::obs
