// ckpt.keep_best on the checkpoint side: the `best` pointer is kept apart from keep_last and
// keep_every retention, is moved only after the checkpoint it names is committed (a crash in
// between leaves the previous best, still on disk), and names a checkpoint to the tools.
#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/ckpt/retention.h"
#include "meshtrain/util/atomic_file.h"
#include "meshtrain/util/error.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::ckpt {
namespace {

namespace fs = std::filesystem;
using meshtrain::testing::TempDir;

TEST(BestRetention, TheBestStepIsKeptApartFromKeepLast) {
  const std::vector<int64_t> steps = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  // Without a best: the newest 2.
  EXPECT_EQ(steps_to_delete(steps, 10, {.keep_last = 2}),
            (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  // Best at 3: kept besides the newest 2 (9, 10), not in place of one of them.
  EXPECT_EQ(steps_to_delete(steps, 10, {.keep_last = 2}, 3),
            (std::vector<int64_t>{1, 2, 4, 5, 6, 7, 8}));
  // With milestones too: 4 and 8 stay for keep_every, 3 for best.
  EXPECT_EQ(steps_to_delete(steps, 10, {.keep_last = 2, .keep_every = 4}, 3),
            (std::vector<int64_t>{1, 2, 5, 6, 7}));
  // The best is also the newest: nothing changes.
  EXPECT_EQ(steps_to_delete(steps, 10, {.keep_last = 2}, 10),
            (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  // keep_last = 0 keeps everything anyway.
  EXPECT_TRUE(steps_to_delete(steps, 10, {.keep_last = 0}, 3).empty());
}

TEST(BestRetention, TheWriterPointsBestAfterLatestAndRetentionKeepsIt) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  WriterOptions wo;
  wo.root = root;
  wo.retention = {.keep_last = 2};
  {
    CheckpointWriter writer(wo);
    for (int64_t s = 1; s <= 8; ++s)
      writer.save(s, testing::shards_for_step(s), nlohmann::json::object(), s == 3);
    writer.wait();
  }
  EXPECT_EQ(list_complete_steps(root), (std::vector<int64_t>{3, 7, 8}));
  EXPECT_EQ(read_latest(root), std::optional<std::string>("step_8"));
  EXPECT_EQ(read_best(root), std::optional<std::string>("step_3"));
  EXPECT_EQ(read_pointer_step(root, kBestFile), std::optional<int64_t>(3));
  // A later best moves the pointer, and the old best becomes ordinary (deleted by keep_last).
  {
    CheckpointWriter writer(wo);
    writer.save(9, testing::shards_for_step(9), nlohmann::json::object(), true);
    writer.save(10, testing::shards_for_step(10));
    writer.wait();
  }
  EXPECT_EQ(list_complete_steps(root), (std::vector<int64_t>{9, 10}));
  EXPECT_EQ(read_best(root), std::optional<std::string>("step_9"));
}

TEST(BestRetention, ACrashBetweenTheCheckpointAndBestLeavesThePreviousBestOnDisk) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  WriterOptions wo;
  wo.root = root;
  wo.retention = {.keep_last = 1};
  int64_t saving = 0;
  // The "crash": the commit stops right before `best` is replaced, after `latest` was.
  wo.before_file_write = [&saving](const std::string& path) {
    if (saving == 4 && fs::path(path).filename() == kBestFile)
      throw std::runtime_error("killed before writing best");
  };
  CheckpointWriter writer(wo);
  for (int64_t s = 1; s <= 3; ++s) {
    saving = s;
    writer.save(s, testing::shards_for_step(s), nlohmann::json::object(), s == 2);
    writer.wait();
  }
  ASSERT_EQ(read_best(root), std::optional<std::string>("step_2"));
  saving = 4;
  writer.save(4, testing::shards_for_step(4), nlohmann::json::object(), true);
  EXPECT_THROW(writer.wait(), IoError);
  // Step 4 is complete and `latest` names it; `best` still names step 2, which is still there
  // and verifies, so whatever a restart reads is a consistent checkpoint.
  EXPECT_EQ(read_latest(root), std::optional<std::string>("step_4"));
  EXPECT_EQ(read_best(root), std::optional<std::string>("step_2"));
  EXPECT_TRUE(verify_checkpoint((fs::path(root) / "step_2").string()).empty());
  EXPECT_TRUE(verify_checkpoint((fs::path(root) / "step_4").string()).empty());
  // The next save's retention still keeps the best that `best` names.
  saving = 5;
  writer.save(5, testing::shards_for_step(5));
  writer.wait();
  EXPECT_EQ(list_complete_steps(root), (std::vector<int64_t>{2, 5}));
}

TEST(BestRetention, ThePointerFileNamesACheckpointToTheTools) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  WriterOptions wo;
  wo.root = root;
  {
    CheckpointWriter writer(wo);
    writer.save(1, testing::shards_for_step(1), nlohmann::json::object(), true);
    writer.save(2, testing::shards_for_step(2));
    writer.wait();
  }
  EXPECT_EQ(resolve_checkpoint_dir((fs::path(root) / kBestFile).string()),
            (fs::path(root) / "step_1").string());
  EXPECT_EQ(resolve_checkpoint_dir((fs::path(root) / kLatestFile).string()),
            (fs::path(root) / "step_2").string());
  EXPECT_EQ(resolve_checkpoint_dir(root), (fs::path(root) / "step_2").string());
  // A pointer at a step that is gone is an error naming it, not a silent fallback.
  write_file_atomic((fs::path(root) / kBestFile).string(), "step_7\n");
  try {
    resolve_checkpoint_dir((fs::path(root) / kBestFile).string());
    FAIL() << "a dangling best resolved";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("names step_7"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain::ckpt
