// `meshtrain plan` writes a config the trainer takes, and `meshtrain place` places and
// simulates; bad input is one line and exit status 2. Real processes, real files.
#include <gtest/gtest.h>

#include <unistd.h>

#include <toml++/toml.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "meshtrain/runtime/config.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::run_command;

const std::string kMeshtrain = std::string(MESHTRAIN_BINARY_DIR) + "/meshtrain";

class PlanCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mt_plan_cli_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(PlanCli, WritesAConfigTheTrainerAccepts) {
  const fs::path out = dir_ / "plan.toml";
  auto r = run_command(kMeshtrain + " plan --model-config " + MESHTRAIN_SOURCE_DIR +
                       "/configs/demo.toml --cluster cpu-host --devices-per-node 2"
                       " --global-batch 16 --out " +
                       out.string() + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("layouts fit"), std::string::npos) << r.output;
  // Every key the plan writes is one the trainer declares, [parallel] included.
  const toml::table plan = toml::parse_file(out.string());
  for (const auto& [section, table] : plan) {
    ASSERT_TRUE(table.is_table()) << section.str();
    for (const auto& [key, value] : *table.as_table()) {
      const std::string full = std::string(section.str()) + "." + std::string(key.str());
      // A group of keys ([model.moe]) is a table of its own.
      if (const toml::table* group = value.as_table(); group != nullptr) {
        for (const auto& [name, v] : *group)
          EXPECT_NE(meshtrain::runtime::find_config_key(full + "." + std::string(name.str())),
                    nullptr)
              << "plan wrote a key nobody declares: " << full << "." << name.str();
        continue;
      }
      EXPECT_NE(meshtrain::runtime::find_config_key(full), nullptr)
          << "plan wrote a key nobody declares: " << full;
    }
  }
  EXPECT_FALSE(plan["parallel"]["zero_stage"].value<int64_t>() == std::nullopt);
  EXPECT_EQ(plan["parallel"]["tp"].value_or(int64_t{0}) *
                plan["parallel"]["pp"].value_or(int64_t{0}) *
                (16 / (plan["data"]["batch_size"].value_or(int64_t{1}) *
                       plan["train"]["grad_accum_steps"].value_or(int64_t{1}))),
            2)
      << "dp x tp x pp must be the 2 ranks";
  // The trainer takes the file as it is.
  r = run_command(kMeshtrain + " train --print-config --config " + out.string() + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("batch_size = " +
                          std::to_string(plan["data"]["batch_size"].value_or(int64_t{0}))),
            std::string::npos)
      << r.output;
}

TEST_F(PlanCli, AModelThatFitsNowhereIsOneLine) {
  // stderr alone (run_command adds 2>&1, which then goes where stdout went: nowhere).
  auto r = run_command("{ " + kMeshtrain +
                       " plan --model dense-175b --cluster h100-nvlink-ib --global-batch 64"
                       " 2>&1 >/dev/null; }");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("no layout of dense-175b fits 8 devices"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST_F(PlanCli, AConfigOfAnotherModelKindIsOneLine) {
  auto r = run_command("{ " + kMeshtrain + " plan --model-config " + MESHTRAIN_SOURCE_DIR +
                       "/configs/fashion_resnet.toml 2>&1 >/dev/null; }");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("model.kind = \"resnet\": meshtrain plan models the GPT only"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST_F(PlanCli, PredictWithoutAConfigIsOneLine) {
  auto r = run_command("{ " + kMeshtrain + " plan --model gpt2-124m --predict 2>&1 >/dev/null; }");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--predict needs --model-config FILE"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

// The JSON line --predict ends with.
nlohmann::json predict_json(const std::string& output) {
  const size_t at = output.rfind("\n{");
  if (at == std::string::npos) return {};
  return nlohmann::json::parse(output.substr(at + 1, output.find('\n', at + 1) - at - 1));
}

TEST_F(PlanCli, CalibrateMeasuresTheElementwiseBandwidthAndPredictUsesIt) {
  const fs::path cal = dir_ / "cluster.toml";
  auto r = run_command(kMeshtrain + " plan --calibrate --ranks 2 --threads 1 --calibrate-out " +
                       cal.string() + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("element-wise kernels (LayerNorm, GELU, AdamW) on 2 rank(s)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("GB/s per rank at 1 thread"), std::string::npos) << r.output;
  const toml::table t = toml::parse_file(cal.string());
  const double gbps = t["cluster"]["elementwise_gbps"].value_or(0.0);
  // Any machine that trains streams its element-wise kernels at more than 50 MB/s and less
  // than a TB/s per rank.
  EXPECT_GT(gbps, 0.05) << r.output;
  EXPECT_LT(gbps, 1000) << r.output;
  const fs::path cfg = dir_ / "run.toml";
  std::ofstream(cfg) << "[model]\nn_layer = 2\nn_embd = 64\nn_head = 4\nblock_size = 32\n"
                        "[data]\nbatch_size = 2\n";
  r = run_command(kMeshtrain + " plan --model-config " + cfg.string() + " --cluster " +
                  cal.string() + " --predict 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json p = predict_json(r.output);
  ASSERT_TRUE(p.is_object()) << r.output;
  EXPECT_GT(p["elementwise_s"].get<double>(), 0) << r.output;
  EXPECT_GT(p["optimizer_s"].get<double>(), 0) << r.output;
  EXPECT_NEAR(p["compute_s"].get<double>(),
              p["gemm_s"].get<double>() + p["elementwise_s"].get<double>(), 1e-12)
      << r.output;
}

TEST_F(PlanCli, PredictsThePipelineAndTensorParallelLayoutsOfTheConfig) {
  const std::string base =
      "[model]\nn_layer = 4\nn_embd = 64\nn_head = 4\nblock_size = 32\n"
      "[data]\nbatch_size = 2\n[train]\ngrad_accum_steps = 4\n";
  const fs::path pp = dir_ / "pp.toml", tp = dir_ / "tp.toml";
  std::ofstream(pp) << base << "[parallel]\npp = 2\nschedule = \"gpipe\"\n";
  std::ofstream(tp) << base << "[parallel]\ntp = 2\n";
  const std::string cluster = " --cluster cpu-host --devices-per-node 2 --predict 2>&1";
  auto r = run_command(kMeshtrain + " plan --model-config " + pp.string() + cluster);
  ASSERT_EQ(r.status, 0) << r.output;
  nlohmann::json p = predict_json(r.output);
  ASSERT_TRUE(p.is_object()) << r.output;
  EXPECT_EQ(p["layout"], "dp1 tp1 pp2 z0 B2x4 gpipe") << r.output;
  // (P-1)/(M+P-1) = 1/5 of the pipelined time is the bubble.
  EXPECT_NEAR(
      p["bubble_s"].get<double>() / (p["bubble_s"].get<double>() + p["compute_s"].get<double>()),
      0.2, 1e-9)
      << r.output;
  EXPECT_GT(p["pp_comm_s"].get<double>(), 0) << r.output;
  EXPECT_EQ(p["tp_comm_s"].get<double>(), 0) << r.output;
  r = run_command(kMeshtrain + " plan --model-config " + tp.string() + cluster);
  ASSERT_EQ(r.status, 0) << r.output;
  p = predict_json(r.output);
  ASSERT_TRUE(p.is_object()) << r.output;
  EXPECT_EQ(p["layout"], "dp1 tp2 pp1 z0 B2x4") << r.output;
  EXPECT_GT(p["tp_comm_s"].get<double>(), 0) << r.output;
  EXPECT_EQ(p["bubble_s"].get<double>(), 0) << r.output;
}

TEST_F(PlanCli, PlacesJobsAndWritesTheirFiles) {
  std::ofstream(dir_ / "inv.toml") << "[[node]]\nname = \"a\"\nrack = \"r0\"\ndevices = 4\n"
                                      "[[node]]\nname = \"b\"\nrack = \"r0\"\ndevices = 4\n";
  std::ofstream(dir_ / "jobs.toml") << "[[job]]\nname = \"big\"\ndevices = 8\ntp = 4\n"
                                       "[[job]]\nname = \"late\"\ndevices = 2\n";
  auto r = run_command(kMeshtrain + " place --inventory " + (dir_ / "inv.toml").string() +
                       " --jobs " + (dir_ / "jobs.toml").string() + " --out-dir " +
                       (dir_ / "out").string() + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("job big: 8 ranks (dp 2 tp 4 pp 1) on 2 node(s): a b"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("job late: waits"), std::string::npos) << r.output;
  std::ifstream hf(dir_ / "out" / "big.hostfile");
  std::stringstream ss;
  ss << hf.rdbuf();
  EXPECT_EQ(ss.str(), "a slots=4\nb slots=4\n");

  std::ofstream(dir_ / "bad.toml") << "[[node]]\nname = \"a\"\ndevices = 8\nislands = [4, 2]\n";
  r = run_command(kMeshtrain + " place --inventory " + (dir_ / "bad.toml").string() + " --jobs " +
                  (dir_ / "jobs.toml").string() + " 2>&1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("islands add up to 6 devices but the node has 8"), std::string::npos)
      << r.output;
}

TEST_F(PlanCli, SimulatesThreePolicies) {
  auto r = run_command(kMeshtrain +
                       " place --simulate --trace-jobs 40 --racks 2 "
                       "--nodes-per-rack 4 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* p : {"topology", "round-robin", "first-fit"})
    EXPECT_NE(r.output.find(p), std::string::npos) << r.output;
}

}  // namespace
