// The trainer's record of the best validation loss (ckpt.keep_best): what counts as a new best,
// and what a resume takes from the checkpoint root, including the repair of a `best` pointer
// that a crash left behind the checkpoint saved as the new best.
#include "meshtrain/runtime/best_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::runtime {
namespace {

namespace fs = std::filesystem;
using meshtrain::testing::TempDir;

TEST(BestCheckpoint, OnlyAFiniteStrictlyLowerLossIsANewBest) {
  BestCheckpoint best(true);
  EXPECT_TRUE(best.improves(3.0f));
  EXPECT_FALSE(best.improves(std::nanf("")));
  EXPECT_FALSE(best.improves(INFINITY));
  best.accept(10, 3.0f);
  EXPECT_FALSE(best.improves(3.0f));  // a tie keeps the older step
  EXPECT_FALSE(best.improves(3.5f));
  EXPECT_TRUE(best.improves(2.5f));
  EXPECT_EQ(best.step(), 10);
}

// Saves steps with train states as the trainer writes them.
void save(const std::string& root, int64_t step, float val_loss, bool best,
          bool move_pointer = true) {
  ckpt::WriterOptions wo;
  wo.root = root;
  ckpt::CheckpointWriter writer(wo);
  ckpt::RankShards shards;
  shards.add_replicated("model", "w", Tensor::zeros({2}, DType::f32));
  nlohmann::json st = {{"step", step}, {"val_loss", val_loss}};
  if (best) st["best"] = true;
  writer.save(step, shards, st, best && move_pointer);
  writer.wait();
}

TEST(BestCheckpoint, ResumeTakesTheLossOfTheStepBestNames) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  save(root, 5, 2.0f, true);
  save(root, 10, 2.5f, false);
  std::vector<std::string> lines;
  BestCheckpoint best(true);
  best.restore(root, 10, {{"step", 10}, {"val_loss", 2.5f}}, 0, nullptr,
               [&](const std::string& l) { lines.push_back(l); });
  EXPECT_EQ(best.step(), 5);
  EXPECT_EQ(best.loss(), std::optional<float>(2.0f));
  EXPECT_TRUE(lines.empty());
  EXPECT_EQ(ckpt::read_best(root), std::optional<std::string>("step_5"));
}

TEST(BestCheckpoint, ResumeRepairsAPointerThatACrashLeftBehind) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  save(root, 5, 2.0f, true);
  save(root, 10, 1.5f, true, /*move_pointer=*/false);  // committed, then killed before `best`
  ASSERT_EQ(ckpt::read_best(root), std::optional<std::string>("step_5"));
  std::vector<std::string> lines;
  BestCheckpoint best(true);
  best.restore(root, 10, {{"step", 10}, {"val_loss", 1.5f}, {"best", true}}, 0, nullptr,
               [&](const std::string& l) { lines.push_back(l); });
  EXPECT_EQ(best.step(), 10);
  EXPECT_EQ(best.loss(), std::optional<float>(1.5f));
  EXPECT_EQ(ckpt::read_best(root), std::optional<std::string>("step_10"));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("interrupted"), std::string::npos) << lines[0];
}

TEST(BestCheckpoint, AFreshRootHasNoBest) {
  TempDir dir;
  BestCheckpoint best(true);
  best.restore(dir.file("none"), 0, nullptr, 0, nullptr, [](const std::string&) {});
  EXPECT_EQ(best.step(), -1);
  EXPECT_FALSE(best.loss());
  EXPECT_TRUE(best.improves(9.0f));
}

}  // namespace
}  // namespace meshtrain::runtime
