// See moe_metrics.h.
#include "meshtrain/obs/moe_metrics.h"

#include <string>

namespace meshtrain::obs {

void MoEMetrics::on_step(const nlohmann::json& model, nlohmann::json& row) {
  if (!model.is_object() || !model.contains("moe")) return;
  const nlohmann::json& moe = model["moe"];
  for (const auto& [layer, m] : moe["layers"].items()) {
    const auto& load = m["load"];
    for (size_t e = 0; e < load.size(); ++e)
      registry_
          .gauge("meshtrain_moe_expert_load",
                 "Tokens (assignments kept after the capacity cut) one expert took in the last "
                 "step, over every data-parallel replica.",
                 {{"layer", layer}, {"expert", std::to_string(e)}})
          .set(load[e].get<double>());
    registry_
        .gauge("meshtrain_moe_max_mean_load",
               "The busiest expert's routed tokens over the mean, in the last step (1 = even).",
               {{"layer", layer}})
        .set(m["max_mean_load"].get<double>());
  }
  registry_.gauge("meshtrain_moe_balance_loss", "Mean load-balancing loss of the last step.")
      .set(moe["balance_loss"].get<double>());
  registry_.gauge("meshtrain_moe_z_loss", "Mean router z-loss of the last step.")
      .set(moe["z_loss"].get<double>());
  registry_
      .counter("meshtrain_moe_dropped_tokens_total",
               "Token assignments dropped past an expert's capacity.")
      .inc(moe["dropped"].get<double>());
  if (moe.contains("all_to_all_s"))
    registry_
        .counter("meshtrain_moe_all_to_all_seconds_total",
                 "Seconds a rank spent exchanging tokens with the other expert-parallel ranks "
                 "(forward and backward, every layer).")
        .inc(moe["all_to_all_s"].get<double>());
  row["moe"] = moe;
}

}  // namespace meshtrain::obs
