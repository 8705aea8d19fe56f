// train.log_layer_norms as metrics: one gauge series per layer in the Prometheus text, and the
// per-layer object on the metrics.jsonl row.
#include "meshtrain/obs/layer_norm_metrics.h"

#include <gtest/gtest.h>

#include <string>

namespace meshtrain::obs {
namespace {

TEST(LayerNormMetrics, GaugePerLayerAndAnObjectOnTheRow) {
  Registry registry;
  LayerNormMetrics metrics(registry);
  nlohmann::json row = {{"step", 3}};
  metrics.on_step({{"wte", 0.5}, {"h.0", 1.25}}, row);
  metrics.on_step({{"wte", 0.75}, {"h.0", 2.5}}, row);  // the next step replaces the values
  const std::string text = registry.render();
  EXPECT_NE(text.find("# TYPE meshtrain_layer_grad_norm gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("meshtrain_layer_grad_norm{layer=\"wte\"} 0.75"), std::string::npos) << text;
  EXPECT_NE(text.find("meshtrain_layer_grad_norm{layer=\"h.0\"} 2.5"), std::string::npos) << text;
  EXPECT_EQ(row["layer_grad_norms"], (nlohmann::json{{"wte", 0.75}, {"h.0", 2.5}}));
}

TEST(LayerNormMetrics, NothingWhenOff) {
  Registry registry;
  LayerNormMetrics metrics(registry);
  nlohmann::json row = nlohmann::json::object();
  metrics.on_step({}, row);
  EXPECT_FALSE(row.contains("layer_grad_norms"));
  EXPECT_EQ(registry.render().find("meshtrain_layer_grad_norm"), std::string::npos);
}

}  // namespace
}  // namespace meshtrain::obs
