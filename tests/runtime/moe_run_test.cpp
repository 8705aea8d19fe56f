// Mixture-of-experts blocks through `meshtrain train` with the built programs: a tiny MoE GPT
// trained data-parallel (DDP and ZeRO-1/2/3 over 2 ranks) ends with one process's weights bit
// for bit (the experts' auxiliary losses included, which enter every backward at the loss's
// scale), every step's metrics carry the experts' loads summed over the ranks, a checkpoint
// resumes bitwise, and settings that cannot run yet are one line and exit status 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/runtime/train_run_fixture.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::CommandResult;
using meshtrain::testing::kMeshtrainBin;
using meshtrain::testing::run_command;

class MoERun : public meshtrain::testing::TrainRunTest {
 protected:
  // Two blocks, the second with 4 experts, top-2 and a capacity that drops tokens.
  static std::string moe(const std::string& extra) {
    return "--set model.n_layer=2 --set model.moe.every=2 --set model.moe.num_experts=4"
           " --set model.moe.top_k=2 --set model.moe.capacity_factor=1.0"
           " --set model.moe.aux_loss_weight=0.1 --set model.moe.z_loss_weight=0.01 " +
           extra;
  }
};

TEST_F(MoERun, DataParallelLayoutsEqualOneProcessBitwiseWithExpertLoads) {
  const fs::path one = dir_ / "one";
  CommandResult a = run_command(
      kMeshtrainBin + " " +
      train_args(one, 6, 0, moe("--set data.batch_size=1 --set train.grad_accum_steps=2")));
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_NE(a.output.find(" experts max/mean "), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("layers, width 32, 4 experts (top-2) in one block of every 2;"),
            std::string::npos)
      << a.output;
  // Every training step's record carries the experts' loads.
  const auto rows = by_step<nlohmann::json>(one, "moe");
  ASSERT_EQ(rows.size(), 6u) << a.output;
  ASSERT_EQ(losses(one).size(), 6u) << a.output;
  for (const auto& [step, moe] : rows) {
    const auto& layer = moe["layers"]["h.1"];
    double kept = 0;
    for (double v : layer["load"]) kept += v;
    // Two micro-batches of 32 tokens, two choices each.
    EXPECT_EQ(kept + layer["dropped"].get<double>(), 2 * 32 * 2) << moe.dump();
    EXPECT_GE(layer["max_mean_load"].get<double>(), 1.0);
  }
  const struct {
    std::string name, flags;
  } layouts[] = {{"ddp", ""},
                 {"zero1", "--set parallel.zero_stage=1"},
                 {"zero2", "--set parallel.zero_stage=2"},
                 {"zero3", "--set parallel.zero_stage=3"}};
  for (const auto& layout : layouts) {
    SCOPED_TRACE(layout.name);
    const fs::path out = dir_ / layout.name;
    CommandResult r = run_command(
        meshrun(2) + train_args(out, 6, 0, moe("--set data.batch_size=1 " + layout.flags)));
    ASSERT_EQ(r.status, 0) << r.output;
    bool same_bits = false;
    const float worst = weights_difference(out, one, &same_bits);
    EXPECT_TRUE(same_bits) << "largest difference " << worst;
    // The loads are the sum over both ranks: the same as the one process's.
    const auto got = by_step<nlohmann::json>(out, "moe");
    ASSERT_EQ(got.size(), rows.size());
    for (const auto& [step, moe] : rows)
      EXPECT_EQ(got.at(step)["layers"]["h.1"]["load"], moe["layers"]["h.1"]["load"])
          << "step " << step;
  }
}

TEST_F(MoERun, ResumesFromACheckpointBitwise) {
  const fs::path straight = dir_ / "straight", resumed = dir_ / "resumed";
  CommandResult a = run_command(meshrun(2) + train_args(straight, 8, 0, moe("")));
  ASSERT_EQ(a.status, 0) << a.output;
  CommandResult b = run_command(meshrun(2) + train_args(resumed, 4, 4, moe("")));
  ASSERT_EQ(b.status, 0) << b.output;
  CommandResult c = run_command(meshrun(2) + train_args(resumed, 8, 4, moe("")));
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(c.output.find("(step 4 of 8)"), std::string::npos) << c.output;
  bool same_bits = false;
  const float worst = weights_difference(resumed, straight, &same_bits);
  EXPECT_TRUE(same_bits) << "largest difference " << worst;
}

// The per-step losses, grad norms and dropped fractions of a run.
struct StepTrace {
  std::map<int64_t, double> loss, norm, dropped;
};

StepTrace step_trace(const fs::path& out) {
  StepTrace t;
  std::ifstream in(out / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("loss") || !j.contains("step") || !j.contains("moe"))
      continue;
    const int64_t s = j["step"].get<int64_t>();
    t.loss[s] = j["loss"].get<double>();
    t.norm[s] = j["grad_norm"].get<double>();
    t.dropped[s] = j["moe"]["dropped_fraction"].get<double>();
  }
  return t;
}

void expect_same_steps(const StepTrace& got, const StepTrace& want, int64_t from) {
  ASSERT_EQ(got.loss.size(), want.loss.size());
  for (const auto& [s, loss] : want.loss) {
    if (s < from) continue;
    // The forward is each rank's own computation; only the experts' gradient sums (one GEMM
    // over every rank's rows, then over the copies) and the norm's sum run in another order.
    EXPECT_NEAR(got.loss.at(s), loss, 1e-6 * loss) << "step " << s;
    EXPECT_NEAR(got.norm.at(s), want.norm.at(s), 1e-6 * want.norm.at(s)) << "step " << s;
    EXPECT_EQ(got.dropped.at(s), want.dropped.at(s)) << "step " << s;
  }
}

TEST_F(MoERun, ExpertParallelEqualsDataParallelAtEveryStep) {
  // Four ranks, dropless: ep = 2 (two blocks, each expert with two copies) and ep = 4 (one copy)
  // against ep = 1 (every rank every expert). Each rank balances its own micro-batch's choice,
  // whatever the ep size, so every layout routes alike and the sum over ranks is even.
  const std::string flags =
      "--set data.batch_size=2 --set model.moe.drop_tokens=false "
      "--set model.moe.router_balance=batch ";
  const fs::path one = dir_ / "ep1";
  CommandResult a = run_command(meshrun(4) + train_args(one, 6, 0, moe(flags)));
  ASSERT_EQ(a.status, 0) << a.output;
  const StepTrace want = step_trace(one);
  ASSERT_EQ(want.loss.size(), 6u) << a.output;
  for (const auto& [step, moe] : by_step<nlohmann::json>(one, "moe"))
    EXPECT_LE(moe["max_mean_load"].get<double>(), 1.1) << "step " << step << ": " << moe.dump();
  for (int ep : {2, 4}) {
    SCOPED_TRACE("ep " + std::to_string(ep));
    const fs::path out = dir_ / ("ep" + std::to_string(ep));
    CommandResult r = run_command(
        meshrun(4) + train_args(out, 6, 0, moe(flags + "--set parallel.ep=" + std::to_string(ep))));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(
        r.output.find("experts shared out over " + std::to_string(ep) + " expert-parallel ranks"),
        std::string::npos)
        << r.output;
    expect_same_steps(step_trace(out), want, 1);
    // Every step says how long this rank spent exchanging tokens.
    for (const auto& [step, moe] : by_step<nlohmann::json>(out, "moe"))
      EXPECT_GT(moe.value("all_to_all_s", 0.0), 0.0) << "step " << step << ": " << moe.dump();
    // The final weights hold every expert once, under the whole model's names.
    const float worst = weights_difference(out, one);
    EXPECT_LT(worst, 1e-5f);
  }
}

TEST_F(MoERun, ExpertParallelCheckpointResumesAtOtherSizes) {
  // Saved at ep = 2 on four ranks (top-2 with a capacity that drops tokens, the experts'
  // balancing biases moving every step), resumed at ep = 1 and ep = 4: the same steps as a run
  // that never stopped, so the biases came back with the checkpoint.
  const std::string flags = "--set data.batch_size=2 --set model.moe.bias_update_rate=0.05 ";
  const fs::path straight = dir_ / "straight", saved = dir_ / "saved";
  CommandResult a = run_command(meshrun(4) + train_args(straight, 6, 0, moe(flags)));
  ASSERT_EQ(a.status, 0) << a.output;
  // The biases moved (each step's row has those its routing used), and they change what is
  // computed.
  bool moved = false;
  for (const auto& [step, moe] : by_step<nlohmann::json>(straight, "moe"))
    moved = moved || moe["layers"]["h.1"]["expert_bias"].get<std::vector<float>>() !=
                         std::vector<float>(4, 0.0f);
  EXPECT_TRUE(moved) << a.output;
  const fs::path unbiased = dir_ / "unbiased";
  CommandResult u =
      run_command(meshrun(4) + train_args(unbiased, 6, 0, moe("--set data.batch_size=2 ")));
  ASSERT_EQ(u.status, 0) << u.output;
  EXPECT_NE(step_trace(unbiased).loss, step_trace(straight).loss);
  CommandResult b =
      run_command(meshrun(4) + train_args(saved, 3, 3, moe(flags + "--set parallel.ep=2")));
  ASSERT_EQ(b.status, 0) << b.output;
  const StepTrace want = step_trace(straight);
  for (int ep : {1, 4}) {
    SCOPED_TRACE("resumed at ep " + std::to_string(ep));
    const fs::path out = dir_ / ("resumed" + std::to_string(ep));
    fs::copy(saved, out, fs::copy_options::recursive);
    CommandResult r = run_command(
        meshrun(4) + train_args(out, 6, 3, moe(flags + "--set parallel.ep=" + std::to_string(ep))));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("(step 3 of 6)"), std::string::npos) << r.output;
    expect_same_steps(step_trace(out), want, 4);
    EXPECT_LT(weights_difference(out, straight), 1e-5f);
  }
}

TEST_F(MoERun, SettingsThatCannotRunYetAreOneLine) {
  const fs::path out = dir_ / "bad";
  const struct {
    std::string flags, words;
  } cases[] = {
      {"--set parallel.pp=2", "model.moe.every = 2 and parallel.pp = 2 cannot be combined"},
      {"--set model.moe.top_k=3", "model.moe.top_k"},
      {"--set model.moe.router_noise=gauss", "model.moe.router_noise"},
      {"--set parallel.ep=3", "parallel.ep = 3 does not divide model.moe.num_experts = 4"},
      {"--set parallel.ep=2", "parallel.ep = 2 does not divide the 1 data-parallel ranks"},
      {"--set parallel.ep=2 --set parallel.zero_stage=1",
       "parallel.ep = 2 and parallel.zero_stage = 1 cannot be combined"},
      {"--set parallel.ep=2 --set model.moe.every=0",
       "parallel.ep = 2 shares out mixture-of-experts blocks, and this model has none"},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.flags);
    CommandResult r = run_command(kMeshtrainBin + " " + train_args(out, 2, 0, moe(k.flags)));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(k.words), std::string::npos) << r.output;
  }
  EXPECT_FALSE(fs::exists(out / "metrics.jsonl"));
}

}  // namespace
