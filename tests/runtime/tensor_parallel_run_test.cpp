// Tensor parallelism end to end with the built meshtrain and meshrun programs on a tiny model:
// tp = 2 (with and without sequence parallelism) and dp 2 x tp 2 train like one rank on the same
// global batch, the final weights file holds the whole tensors, and bad layouts are one line with
// exit status 2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/safetensors.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::CommandResult;
using meshtrain::testing::kMeshrunBin;
using meshtrain::testing::kMeshtrainBin;
using meshtrain::testing::run_command;

class TensorParallelRun : public meshtrain::testing::TrainRunTest {};

// A global batch of 4 sequences: one micro-batch of 1 sequence x accumulation x dp replicas.
std::string layout(int tp, int accum, bool sp = false) {
  return "--set data.batch_size=1 --set train.grad_accum_steps=" + std::to_string(accum) +
         " --set parallel.tp=" + std::to_string(tp) +
         (sp ? " --set parallel.sequence_parallel=true" : "") + " --set model.dropout=0.1";
}

constexpr int64_t kSteps = 8;

TEST_F(TensorParallelRun, TwoAndFourRanksMatchOneRank) {
  const fs::path ref = dir_ / "ref";
  CommandResult one = run_command(kMeshtrainBin + " " + train_args(ref, kSteps, 0, layout(1, 4)));
  ASSERT_EQ(one.status, 0) << one.output;
  const auto reference = losses(ref);
  ASSERT_EQ(reference.size(), static_cast<size_t>(kSteps)) << one.output;
  const auto ref_norms = grad_norms(ref);
  ASSERT_EQ(ref_norms.size(), static_cast<size_t>(kSteps));
  const auto ref_weights = meshtrain::ckpt::load_safetensors((ref / "model.safetensors").string());

  struct Case {
    const char* name;
    int nproc, tp, accum;
    bool sp;
    const char* says;
  };
  for (const Case& c :
       {Case{"tp2", 2, 2, 4, false, "tensor parallelism over 2 ranks x 1 data-parallel replicas"},
        Case{"tp2sp", 2, 2, 4, true, "tensor parallelism over 2 ranks with sequence parallelism"},
        Case{"dp2tp2", 4, 2, 2, false,
             "tensor parallelism over 2 ranks x 2 data-parallel replicas"},
        Case{"dp2tp2sp", 4, 2, 2, true, "with sequence parallelism x 2 data-parallel replicas"}}) {
    SCOPED_TRACE(c.name);
    const fs::path out = dir_ / c.name;
    CommandResult r =
        run_command(meshrun(c.nproc) + train_args(out, kSteps, 0, layout(c.tp, c.accum, c.sp)));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
    const auto got = losses(out);
    ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << r.output;
    double worst = 0;
    for (int64_t step = 1; step <= kSteps; ++step) {
      const double rel = std::fabs(got.at(step) - reference.at(step)) / reference.at(step);
      EXPECT_LE(rel, 1e-5) << "step " << step << ": " << got.at(step) << " vs "
                           << reference.at(step);
      worst = std::max(worst, rel);
    }
    // The norm over unique shards (clipped to optim.grad_clip = 1 here, so it steers the steps).
    const auto norms = grad_norms(out);
    ASSERT_EQ(norms.size(), static_cast<size_t>(kSteps));
    for (int64_t step = 1; step <= kSteps; ++step)
      EXPECT_NEAR(norms.at(step), ref_norms.at(step), 1e-5 * ref_norms.at(step)) << "step " << step;
    std::printf("%s: largest relative loss difference to one rank over %lld steps: %.3g\n", c.name,
                static_cast<long long>(kSteps), worst);
    // The weights file holds the whole tensors, gathered from the shards.
    const auto weights = meshtrain::ckpt::load_safetensors((out / "model.safetensors").string());
    ASSERT_EQ(weights.tensors.size(), ref_weights.tensors.size());
    for (const auto& [name, t] : ref_weights.tensors) {
      ASSERT_TRUE(weights.contains(name)) << name;
      ASSERT_EQ(weights.at(name).shape(), t.shape()) << name;
      const std::vector<float> a = weights.at(name).to_vector(), b = t.to_vector();
      float diff = 0;
      for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - b[i]));
      EXPECT_LE(diff, 1e-4f) << name;
    }
  }
}

// ZeRO-1 and ZeRO-2 over the replicas of dp 2 x tp 2 run through the pipeline's engine as one
// stage; ZeRO-0 through the tensor-parallel engine. The same model, batches and averaged
// gradients, but the two engines add the norm's squares in their own order (and ZeRO-2 shard by
// shard), so the norms agree to 1e-12 relative (measured 5e-15) and the losses, through the
// clipping factor, to 1e-6 (measured: the same bits over these 8 steps).
TEST_F(TensorParallelRun, ZeroOverTheReplicasTrainsLikeZeroStageZero) {
  const fs::path plain = dir_ / "zero0";
  CommandResult p = run_command(meshrun(4) + train_args(plain, kSteps, 0, layout(2, 2)));
  ASSERT_EQ(p.status, 0) << p.output;
  const auto want = losses(plain);
  const auto want_norms = grad_norms(plain);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps)) << p.output;
  for (int stage : {1, 2}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(stage));
    const fs::path out = dir_ / ("zero" + std::to_string(stage));
    CommandResult r = run_command(
        meshrun(4) +
        train_args(out, kSteps, 0,
                   layout(2, 2) + " --set parallel.zero_stage=" + std::to_string(stage)));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("one stage, no pipeline x 2 data-parallel replicas x tensor "
                            "parallelism over 2 ranks"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("ZeRO-" + std::to_string(stage) + " over each stage's 2 replicas"),
              std::string::npos)
        << r.output;
    const auto got = losses(out);
    const auto norms = grad_norms(out);
    ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << r.output;
    ASSERT_EQ(norms.size(), static_cast<size_t>(kSteps));
    double worst = 0, worst_norm = 0;
    for (int64_t step = 1; step <= kSteps; ++step) {
      EXPECT_NEAR(got.at(step), want.at(step), 1e-6 * want.at(step)) << "step " << step;
      EXPECT_NEAR(norms.at(step), want_norms.at(step), 1e-12 * want_norms.at(step))
          << "step " << step;
      worst = std::max(worst, std::fabs(double{got.at(step)} - want.at(step)) / want.at(step));
      worst_norm = std::max(worst_norm,
                            std::fabs(norms.at(step) - want_norms.at(step)) / want_norms.at(step));
    }
    std::printf(
        "ZeRO-%d: largest relative difference to ZeRO-0 over %lld steps: loss %.3g, norm %.3g\n",
        stage, static_cast<long long>(kSteps), worst, worst_norm);
  }
}

TEST_F(TensorParallelRun, BadLayoutsAreOneLineAndStatus2) {
  auto expect_refused = [&](const std::string& cmd, const std::string& says) {
    CommandResult r = run_command(cmd);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << r.output;
  };
  expect_refused(kMeshtrainBin + " " + train_args(dir_, 1, 0, "--set parallel.tp=3"),
                 "model.n_embd (32) is not divisible by parallel.tp (3)");
  expect_refused(
      kMeshtrainBin + " " + train_args(dir_, 1, 0, "--set parallel.tp=4 --set model.n_embd=64"),
      "model.n_head (2) is not divisible by parallel.tp (4)");
  expect_refused(
      kMeshtrainBin + " " + train_args(dir_, 1, 0, "--set parallel.sequence_parallel=true"),
      "parallel.sequence_parallel = true needs tensor parallelism");
  expect_refused(kMeshtrainBin + " " +
                     train_args(dir_, 1, 0, "--set parallel.tp=2 --set parallel.zero_stage=3"),
                 "parallel.tp = 2 and parallel.zero_stage = 3 cannot be combined yet");
  expect_refused(meshrun(2) + train_args(dir_, 1, 0, "--set parallel.tp=4 --set model.n_head=4"),
                 "parallel.pp x parallel.tp = 4 does not divide the 2 ranks");
}

}  // namespace
