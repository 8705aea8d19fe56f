// See layer_norm_metrics.h.
#include "meshtrain/obs/layer_norm_metrics.h"

namespace meshtrain::obs {

void LayerNormMetrics::on_step(const std::vector<std::pair<std::string, double>>& norms,
                               nlohmann::json& row) {
  if (norms.empty()) return;
  nlohmann::json layers = nlohmann::json::object();
  for (const auto& [layer, norm] : norms) {
    // The registry hands back the same series for the same labels, so this is a lookup after
    // the first step.
    registry_
        .gauge("meshtrain_layer_grad_norm",
               "Gradient L2 norm of one layer before clipping (train.log_layer_norms).",
               {{"layer", layer}})
        .set(norm);
    layers[layer] = norm;
  }
  row["layer_grad_norms"] = std::move(layers);
}

}  // namespace meshtrain::obs
