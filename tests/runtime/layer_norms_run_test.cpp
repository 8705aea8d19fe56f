// train.log_layer_norms end to end: two ranks under ZeRO-2 write each step's per-layer gradient
// norms into metrics.jsonl, one per layer of the model, whose squares add up to the step's
// global gradient norm squared.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;

class LayerNormsRun : public TrainRunTest {};

TEST_F(LayerNormsRun, MetricsCarryPerLayerNormsThatAddUpToTheGlobalNorm) {
  const fs::path out = dir_ / "run";
  const CommandResult r = run_command(
      kMeshrunBin + " --nproc-per-node 2 --grace-period 5 -- " + kMeshtrainBin + " " +
      train_args(out, 4, 0, "--set parallel.zero_stage=2 --set train.log_layer_norms=true"));
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(out / "metrics.jsonl");
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    ++rows;
    ASSERT_TRUE(j.contains("layer_grad_norms")) << line;
    const auto& layers = j["layer_grad_norms"];
    // model.n_layer = 1: wte, wpe, h.0, ln_f.
    EXPECT_EQ(layers.size(), 4u) << line;
    for (const char* name : {"wte", "wpe", "h.0", "ln_f"})
      EXPECT_TRUE(layers.contains(name)) << line;
    double sum = 0;
    for (const auto& [layer, n] : layers.items()) sum += n.get<double>() * n.get<double>();
    const double global = j["grad_norm"].get<double>();
    EXPECT_NEAR(sum, global * global, 1e-9 * sum) << line;
  }
  EXPECT_EQ(rows, 4);
}

}  // namespace
}  // namespace meshtrain::testing
