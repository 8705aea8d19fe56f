// The ResNet through `meshtrain train` and `meshrun` on a small image set in Fashion-MNIST's IDX
// format (written by the test: 28 x 28 images whose class is a brightness pattern): two ranks with
// SyncBatchNorm follow one process on the global batch; ZeRO-1/2/3 give DDP's weights bit for bit;
// a run resumed from a checkpoint ends with the weights of one that never stopped (the batch-norm
// running statistics are in the checkpoint); what the ResNet cannot do yet is refused in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <utility>

#include "meshtrain/ckpt/safetensors.h"
#include "tests/runtime/band_images.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::CommandResult;
using meshtrain::testing::kMeshtrainBin;
using meshtrain::testing::run_command;

class ResNetRun : public meshtrain::testing::TrainRunTest {
 protected:
  void SetUp() override {
    TrainRunTest::SetUp();
    images_ = dir_ / "images";
    fs::create_directories(images_);
    meshtrain::testing::write_band_images(images_, "train", 96, 1);
    meshtrain::testing::write_band_images(images_, "t10k", 24, 2);
  }
  // A ResNet with one block per stage at width 4, SGD with momentum at a constant rate.
  std::string args(const fs::path& out, int steps, const std::string& extra) const {
    return "train --set model.kind=resnet --set data.kind=fashion_mnist --set data.image_dir=" +
           images_.string() + " --set train.out_dir=" + out.string() +
           " --set model.resnet=tiny --set optim.name=sgd --set optim.lr=0.05"
           " --set optim.schedule=constant --set optim.warmup_steps=0 --set train.threads=1"
           " --set train.log_interval=1 --set train.eval_interval=0 --set data.val_batches=2"
           " --set dist.timeout_s=30 --set train.steps=" +
           std::to_string(steps) + " " + extra;
  }
  fs::path images_;
};

// Two ranks with SyncBatchNorm normalise over both halves of the batch, as one process does
// over the whole: the same losses and weights up to the order of the gradient sums.
TEST_F(ResNetRun, SyncBatchNormOnTwoRanksFollowsOneProcess) {
  const fs::path one = dir_ / "one", two = dir_ / "two";
  CommandResult a = run_command(kMeshtrainBin + " " + args(one, 4, "--set data.batch_size=8"));
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_NE(a.output.find("test accuracy"), std::string::npos) << a.output;
  CommandResult b = run_command(
      meshrun(2) + args(two, 4, "--set data.batch_size=4 --set model.sync_batch_norm=true"));
  ASSERT_EQ(b.status, 0) << b.output;
  const auto want = losses(one), got = losses(two);
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(got.size(), 4u);
  for (const auto& [step, l] : want) EXPECT_NEAR(got.at(step), l, 1e-4f * std::fabs(l)) << step;
  const float worst = weights_difference(two, one);
  EXPECT_LT(worst, 1e-4f);
  std::printf("largest weight difference (running statistics included): %.3g\n", worst);
  // Without synchronisation each rank normalises over its own half: the runs part.
  const fs::path plain = dir_ / "plain";
  CommandResult c = run_command(meshrun(2) + args(plain, 4, "--set data.batch_size=4"));
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_GT(weights_difference(plain, one), 10 * worst);
}

// data.crop_padding and data.horizontal_flip decide the training images; train.label_smoothing
// the loss. Without augmentation two runs are the same bits; with it (the defaults) the first
// step already sees other images; label smoothing changes the first step's loss of the same
// weights and images and still trains.
TEST_F(ResNetRun, AugmentationAndLabelSmoothingKeysReachTheRun) {
  const std::string plain =
      "--set data.batch_size=8 --set data.crop_padding=0 "
      "--set data.horizontal_flip=false ";
  const fs::path a = dir_ / "plain_a", b = dir_ / "plain_b", aug = dir_ / "aug",
                 smooth = dir_ / "smooth";
  for (const auto& [out, flags] : {std::pair{a, plain}, std::pair{b, plain},
                                   std::pair{aug, std::string("--set data.batch_size=8")},
                                   std::pair{smooth, plain + "--set train.label_smoothing=0.1"}}) {
    CommandResult r = run_command(kMeshtrainBin + " " + args(out, 3, flags));
    ASSERT_EQ(r.status, 0) << r.output;
  }
  const auto la = losses(a), lb = losses(b), laug = losses(aug), ls = losses(smooth);
  ASSERT_EQ(la.size(), 3u);
  ASSERT_EQ(laug.size(), 3u);
  ASSERT_EQ(ls.size(), 3u);
  for (const auto& [step, l] : la) EXPECT_EQ(lb.at(step), l) << step;
  EXPECT_NE(laug.at(1), la.at(1));
  EXPECT_NE(ls.at(1), la.at(1));
  for (const auto& [step, l] : ls) EXPECT_TRUE(std::isfinite(l)) << step;
  CommandResult bad =
      run_command(kMeshtrainBin + " " + args(dir_ / "bad", 1, "--set data.crop_padding=-1"));
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_NE(bad.output.find("data.crop_padding"), std::string::npos) << bad.output;
}

TEST_F(ResNetRun, ZeroStagesGiveTheWeightsOfDdp) {
  const fs::path ddp = dir_ / "ddp";
  const std::string common = "--set data.batch_size=4 --set model.sync_batch_norm=true ";
  CommandResult a = run_command(meshrun(2) + args(ddp, 3, common));
  ASSERT_EQ(a.status, 0) << a.output;
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(stage));
    const fs::path out = dir_ / ("zero" + std::to_string(stage));
    CommandResult r = run_command(
        meshrun(2) + args(out, 3, common + "--set parallel.zero_stage=" + std::to_string(stage)));
    ASSERT_EQ(r.status, 0) << r.output;
    bool same = false;
    const float worst = weights_difference(out, ddp, &same);
    EXPECT_TRUE(same) << "largest difference " << worst;
  }
}

// The running statistics are state: a resumed run that lost them would evaluate differently.
TEST_F(ResNetRun, ResumesWithItsRunningStatistics) {
  const fs::path straight = dir_ / "straight", resumed = dir_ / "resumed";
  const std::string common = "--set data.batch_size=8 ";
  CommandResult a = run_command(kMeshtrainBin + " " + args(straight, 6, common));
  ASSERT_EQ(a.status, 0) << a.output;
  CommandResult b =
      run_command(kMeshtrainBin + " " + args(resumed, 3, common + "--set ckpt.interval=3"));
  ASSERT_EQ(b.status, 0) << b.output;
  CommandResult c =
      run_command(kMeshtrainBin + " " + args(resumed, 6, common + "--set ckpt.interval=3"));
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(c.output.find("(step 3 of 6)"), std::string::npos) << c.output;
  bool same = false;
  const float worst = weights_difference(resumed, straight, &same);
  EXPECT_TRUE(same) << "largest difference " << worst;
  const auto w = meshtrain::ckpt::load_safetensors((straight / "model.safetensors").string());
  EXPECT_TRUE(w.contains("layer1.0.bn1.running_var"));
  EXPECT_TRUE(w.contains("bn1.num_batches_tracked"));
}

TEST_F(ResNetRun, WhatItCannotDoYetIsOneLine) {
  const fs::path out = dir_ / "bad";
  const std::pair<std::string, std::string> cases[] = {
      {"--set parallel.pp=2", "model.kind = \"resnet\" and parallel.pp = 2"},
      {"--set train.precision=bf16", "model.kind = \"resnet\" and train.precision"},
      {"--set model.resnet=resnet34", "model.resnet = \"resnet34\" is not one of"},
  };
  for (const auto& [flags, message] : cases) {
    SCOPED_TRACE(flags);
    CommandResult r = run_command(kMeshtrainBin + " " + args(out, 1, flags));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  CommandResult missing = run_command(kMeshtrainBin + " " + args(out, 1, "") +
                                      " --set data.image_dir=" + (dir_ / "nowhere").string());
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.output.find("nowhere"), std::string::npos) << missing.output;
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
}

// One image per rank leaves a training-mode BatchNorm nothing but that image's pixels: refused in
// one line naming the key, unless SyncBatchNorm spreads the statistics over 2 or more ranks.
TEST_F(ResNetRun, OneImagePerRankIsRefusedUnlessBatchNormSpansRanks) {
  const std::string one = "--set data.batch_size=1 ";
  const std::pair<std::string, std::string> refused[] = {
      {kMeshtrainBin + " " + args(dir_ / "single", 2, one),
       "or model.sync_batch_norm = true over 2 or more ranks"},
      {kMeshtrainBin + " " +
           args(dir_ / "single_sync", 2, one + "--set model.sync_batch_norm=true"),
       "or launch 2 or more ranks"},
      {meshrun(2) + args(dir_ / "two", 2, one), "or model.sync_batch_norm = true"},
  };
  for (const auto& [command, fix] : refused) {
    SCOPED_TRACE(command);
    CommandResult r = run_command(command);
    // One process exits 2 (a refused configuration); meshrun reports its failed workers.
    if (command.starts_with(kMeshtrainBin)) {
      EXPECT_EQ(r.status, 2) << r.output;
    } else {
      EXPECT_NE(r.status, 0) << r.output;
    }
    const std::string line =
        "config: data.batch_size = 1 and model.kind = \"resnet\": in training each BatchNorm";
    EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(fix), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step 1"), std::string::npos) << r.output;  // refused before training
  }
  // SyncBatchNorm over two ranks normalises over both ranks' images: legal.
  const fs::path synced = dir_ / "synced";
  CommandResult ok =
      run_command(meshrun(2) + args(synced, 2, one + "--set model.sync_batch_norm=true"));
  EXPECT_EQ(ok.status, 0) << ok.output;
  EXPECT_TRUE(fs::exists(synced / "model.safetensors"));
}

}  // namespace
