// Retention: the newest K plus every M-th step survive, `latest` always survives, and only
// complete checkpoints are deleted.
#include "meshtrain/ckpt/retention.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/util/atomic_file.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::ckpt {
namespace {

namespace fs = std::filesystem;
using meshtrain::testing::TempDir;

TEST(Retention, KeepsLastKAndEveryMth) {
  std::vector<int64_t> steps = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(steps_to_delete(steps, 10, {.keep_last = 2, .keep_every = 4}),
            (std::vector<int64_t>{1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(steps_to_delete(steps, 10, {.keep_last = 3}),
            (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(steps_to_delete(steps, 10, {.keep_last = 0, .keep_every = 4}).empty());
  EXPECT_TRUE(steps_to_delete(steps, 10, {.keep_last = 20}).empty());
}

TEST(Retention, NeverDeletesLatest) {
  // `latest` rolled back to step 3 by hand: it stays although it is not among the newest.
  std::vector<int64_t> steps = {1, 2, 3, 4, 5};
  EXPECT_EQ(steps_to_delete(steps, 3, {.keep_last = 1}), (std::vector<int64_t>{1, 2, 4}));
}

TEST(Retention, WriterAppliesThePolicy) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  // Something that is not a complete checkpoint must survive: a step dir without manifest.
  fs::create_directories(fs::path(root) / "step_0");
  WriterOptions wo;
  wo.root = root;
  wo.retention = {.keep_last = 2, .keep_every = 4};
  {
    CheckpointWriter writer(wo);
    for (int64_t s = 1; s <= 10; ++s) {
      RankShards shards;
      shards.add_replicated("model", "w", testing::pattern({3}, static_cast<float>(s)));
      writer.save(s, shards);
    }
    writer.wait();
  }
  EXPECT_EQ(list_complete_steps(root), (std::vector<int64_t>{4, 8, 9, 10}));
  EXPECT_TRUE(fs::exists(fs::path(root) / "step_0"));
  EXPECT_TRUE(list_tmp_dirs(root).empty());
  EXPECT_EQ(read_latest(root), std::optional<std::string>("step_10"));
}

TEST(Retention, RemovesOnlyOlderTmpLeftovers) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  fs::create_directories(fs::path(root) / "step_3.tmp");
  fs::create_directories(fs::path(root) / "step_9.tmp");  // a later save, maybe in progress
  write_file_atomic((fs::path(root) / kLatestFile).string(), "step_5\n");
  apply_retention(root, {.keep_last = 1}, 5);
  EXPECT_FALSE(fs::exists(fs::path(root) / "step_3.tmp"));
  EXPECT_TRUE(fs::exists(fs::path(root) / "step_9.tmp"));
}

TEST(CheckpointDir, StepNames) {
  EXPECT_EQ(step_dir_name(12), "step_12");
  EXPECT_EQ(parse_step_dir_name("step_12"), std::optional<int64_t>(12));
  EXPECT_FALSE(parse_step_dir_name("step_12.tmp"));
  EXPECT_FALSE(parse_step_dir_name("step_012"));
  EXPECT_FALSE(parse_step_dir_name("step_-1"));
  EXPECT_FALSE(parse_step_dir_name("step_"));
  EXPECT_FALSE(parse_step_dir_name("latest"));
}

}  // namespace
}  // namespace meshtrain::ckpt
