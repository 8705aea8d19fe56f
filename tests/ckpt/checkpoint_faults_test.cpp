// Crash safety and failure handling: unfinished .tmp directories are ignored, a corrupted,
// truncated or missing latest checkpoint makes the loader fall back and say which file was
// bad, the asynchronous writer returns before the I/O (shown with a blocking test hook, not
// timing), and write failures surface as IoError naming the file without moving `latest`.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/util/atomic_file.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/support/temp_dir.h"
#include "tests/support/wait.h"

namespace meshtrain::ckpt {
namespace {

namespace fs = std::filesystem;
using meshtrain::testing::TempDir;
using testing::bitwise_equal;
using testing::pattern;
using testing::shards_for_step;

// Saves the given steps synchronously-complete into root (one rank).
void save_steps(const std::string& root, std::initializer_list<int64_t> steps) {
  WriterOptions wo;
  wo.root = root;
  CheckpointWriter writer(wo);
  for (int64_t s : steps) writer.save(s, shards_for_step(s), {{"step", s}});
  writer.wait();
}

std::string step_file(const std::string& root, int64_t step, const std::string& name) {
  return (fs::path(root) / step_dir_name(step) / name).string();
}

TEST(Crash, LeftoverTmpDirectoryIsIgnoredAndCanBeCleanedUp) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  save_steps(root, {1});
  // A crash in the middle of writing step 2: files, even a manifest, but still named .tmp.
  fs::create_directories(fs::path(root) / "step_2.tmp");
  fs::copy(fs::path(root) / "step_1", fs::path(root) / "step_2.tmp", fs::copy_options::recursive);
  EXPECT_EQ(list_complete_steps(root), (std::vector<int64_t>{1}));

  CheckpointLoader keep(root);
  auto c = keep.load_latest();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->step(), 1);
  EXPECT_TRUE(keep.rejections().empty());
  EXPECT_TRUE(fs::exists(fs::path(root) / "step_2.tmp"));

  CheckpointLoader clean(root, {.remove_tmp_dirs = true});
  ASSERT_TRUE(clean.load_latest());
  EXPECT_FALSE(fs::exists(fs::path(root) / "step_2.tmp"));
}

TEST(Crash, CorruptedShardInLatestFallsBackAndNamesTheFile) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  save_steps(root, {1, 2});
  ASSERT_EQ(read_latest(root), std::optional<std::string>("step_2"));
  testing::flip_byte(step_file(root, 2, "model_rank00000.safetensors"), 3);

  const auto problems = verify_checkpoint((fs::path(root) / "step_2").string());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("model_rank00000.safetensors"), std::string::npos) << problems[0];
  EXPECT_NE(problems[0].find("xxh3"), std::string::npos) << problems[0];
  EXPECT_THROW(Checkpoint::open((fs::path(root) / "step_2").string()), IoError);

  CheckpointLoader loader(root);
  ::testing::internal::CaptureStderr();
  auto c = loader.load_latest();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->step(), 1);
  EXPECT_TRUE(bitwise_equal(c->load_global_tensor("w"), pattern({8, 4}, 1.0f)));
  ASSERT_EQ(loader.rejections().size(), 1u);
  EXPECT_NE(loader.rejections()[0].find("step_2"), std::string::npos);
  EXPECT_NE(loader.rejections()[0].find("model_rank00000.safetensors"), std::string::npos);
  EXPECT_NE(log.find("model_rank00000.safetensors"), std::string::npos) << log;
}

TEST(Crash, TruncatedFileIsDetected) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  save_steps(root, {1, 2});
  testing::truncate_by(step_file(root, 2, "optim_rank00000.safetensors"), 5);
  const auto problems = verify_checkpoint((fs::path(root) / "step_2").string());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("optim_rank00000.safetensors"), std::string::npos);
  EXPECT_NE(problems[0].find("truncated"), std::string::npos) << problems[0];
  CheckpointLoader loader(root);
  auto c = loader.load_latest();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->step(), 1);
}

TEST(Crash, CorruptedManifestIsDetected) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  save_steps(root, {1, 2});
  // Change a digit inside the manifest: still valid JSON, caught by its own checksum.
  const std::string path = step_file(root, 2, kManifestFile);
  std::string text = meshtrain::testing::read_bytes(path);
  const auto pos = text.find("\"epoch\": 0");
  ASSERT_NE(pos, std::string::npos);
  text[pos + 9] = '1';
  meshtrain::testing::write_bytes(path, text);
  const auto problems = verify_checkpoint((fs::path(root) / "step_2").string());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("checksum"), std::string::npos) << problems[0];
  CheckpointLoader loader(root);
  EXPECT_EQ(loader.load_latest()->step(), 1);
}

TEST(Crash, LatestPointingToMissingDirectoryFallsBack) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  save_steps(root, {1, 2});
  fs::remove_all(fs::path(root) / "step_2");
  CheckpointLoader loader(root);
  auto c = loader.load_latest();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->step(), 1);
  ASSERT_FALSE(loader.rejections().empty());
  EXPECT_NE(loader.rejections()[0].find("step_2"), std::string::npos);

  write_file_atomic((fs::path(root) / kLatestFile).string(), "garbage\n");
  EXPECT_EQ(CheckpointLoader(root).load_latest()->step(), 1);
}

TEST(Crash, NoGoodCheckpointGivesNothing) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  EXPECT_FALSE(CheckpointLoader(root).load_latest().has_value());
  save_steps(root, {1});
  testing::flip_byte(step_file(root, 1, "optim_rank00000.safetensors"));
  CheckpointLoader loader(root);
  EXPECT_FALSE(loader.load_latest().has_value());
  EXPECT_EQ(loader.rejections().size(), 1u);
}

TEST(Crash, ResavingAStepReplacesIt) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  save_steps(root, {1, 2});
  WriterOptions wo;
  wo.root = root;
  CheckpointWriter writer(wo);
  writer.save(2, shards_for_step(5));
  writer.wait();
  auto c = CheckpointLoader(root).load_latest();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->step(), 2);
  EXPECT_TRUE(bitwise_equal(c->load_global_tensor("w"), pattern({8, 4}, 5.0f)));
}

// Blocks the writer thread at its first file until released.
class Gate {
 public:
  std::function<void(const std::string&)> hook() {
    return [this](const std::string&) {
      std::unique_lock<std::mutex> lock(mu_);
      entered_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    };
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void wait_entered() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false, entered_ = false;
};

TEST(AsyncSave, ReturnsAfterTheSnapshotWhileTheWriterIsBlocked) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  Gate gate;
  WriterOptions wo;
  wo.root = root;
  wo.before_file_write = gate.hook();
  CheckpointWriter writer(wo);

  RankShards shards = shards_for_step(1);
  Tensor live = shards.groups()[0].second[0].data;
  SaveStats st = writer.save(1, shards);
  // save() has returned although the writer cannot have written a byte yet.
  EXPECT_TRUE(st.async);
  EXPECT_EQ(st.snapshot_bytes, shards.nbytes());
  gate.wait_entered();
  EXPECT_TRUE(writer.in_flight());
  EXPECT_FALSE(fs::exists(fs::path(root) / "step_1"));
  // Training goes on and changes the live tensor; the checkpoint holds the snapshot.
  live.fill_(42.0);

  // A second save waits for the first: at most one in flight.
  std::atomic<bool> second_done{false};
  std::atomic<bool> gate_opened{false};
  std::atomic<bool> done_before_the_gate_opened{false};
  std::atomic<pid_t> second_tid{0};
  SaveStats st2;
  std::thread t([&] {
    second_tid = meshtrain::testing::current_tid();
    st2 = writer.save(2, shards_for_step(2));
    done_before_the_gate_opened = !gate_opened.load();
    second_done = true;
  });
  // The second save has blocked (its thread sleeps in the kernel) or, wrongly, returned.
  EXPECT_TRUE(meshtrain::testing::wait_until(
      [&] {
        return second_done.load() ||
               (second_tid.load() != 0 && meshtrain::testing::thread_is_asleep(second_tid));
      },
      std::chrono::seconds(30)));
  EXPECT_FALSE(second_done.load());  // cannot be done: the first save is held by the gate
  gate_opened = true;
  gate.open();
  t.join();
  EXPECT_TRUE(second_done.load());
  EXPECT_FALSE(done_before_the_gate_opened.load()) << "the second save did not wait for the first";
  EXPECT_GT(st2.wait_s, 0.0);
  writer.wait();
  EXPECT_FALSE(writer.in_flight());
  EXPECT_EQ(writer.last_saved_step(), 2);

  Checkpoint c1 = Checkpoint::open((fs::path(root) / "step_1").string());
  EXPECT_TRUE(bitwise_equal(c1.load_global_tensor("w"), pattern({8, 4}, 1.0f)));
  EXPECT_EQ(read_latest(root), std::optional<std::string>("step_2"));
}

TEST(AsyncSave, OverBudgetSnapshotIsWrittenSynchronously) {
  TempDir dir;
  WriterOptions wo;
  wo.root = dir.file("ckpt");
  wo.max_snapshot_bytes = 16;
  CheckpointWriter writer(wo);
  SaveStats st = writer.save(3, shards_for_step(3));
  EXPECT_FALSE(st.async);
  EXPECT_FALSE(writer.in_flight());
  EXPECT_TRUE(fs::exists(fs::path(wo.root) / "step_3" / kManifestFile));
}

TEST(AsyncSave, WriteFailureSurfacesOnWaitNamingTheFileAndKeepsLatest) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  save_steps(root, {1});
  WriterOptions wo;
  wo.root = root;
  wo.before_file_write = [](const std::string& path) {
    if (path.find("optim_rank00000") != std::string::npos)
      MT_THROW(IoError, "cannot write ", path, ": No space left on device");
  };
  CheckpointWriter writer(wo);
  writer.save(2, shards_for_step(2));  // returns; the failure happens on the writer thread
  try {
    writer.wait();
    FAIL() << "the failed save was not reported";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("optim_rank00000.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step 2"), std::string::npos) << msg;
  }
  EXPECT_EQ(read_latest(root), std::optional<std::string>("step_1"));
  EXPECT_FALSE(fs::exists(fs::path(root) / "step_2"));
  writer.wait();  // reported once

  // The same failure reported by the next save() instead, which then does not start.
  writer.save(3, shards_for_step(3));
  while (writer.in_flight()) std::this_thread::yield();
  EXPECT_THROW(writer.save(4, shards_for_step(4)), IoError);
  EXPECT_FALSE(writer.in_flight());
  EXPECT_EQ(CheckpointLoader(root).load_latest()->step(), 1);
}

TEST(AsyncSave, FailedRankPreventsTheCommitOnEveryRank) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  testing::ThreadBarrier barrier(3);
  std::vector<std::string> errors(3);
  testing::run_ranks(3, [&](int64_t rank) {
    WriterOptions wo;
    wo.root = root;
    wo.rank = rank;
    wo.layout.world_size = 3;
    wo.barrier = barrier.callback();
    if (rank == 1)
      wo.before_file_write = [](const std::string& path) {
        MT_THROW(IoError, "cannot write ", path, ": disk full");
      };
    CheckpointWriter writer(wo);
    writer.save(5, shards_for_step(5));
    try {
      writer.wait();
    } catch (const IoError& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  EXPECT_NE(errors[1].find("model_rank00001.safetensors"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank00001.json"), std::string::npos) << errors[0];
  EXPECT_TRUE(errors[2].empty());
  EXPECT_FALSE(read_latest(root).has_value());
  EXPECT_TRUE(list_complete_steps(root).empty());
}

// A rank whose process died after it was told to save the step, and whose replacement marked its
// part absent (an asynchronous parameter-server worker): rank 0 leaves the step uncommitted with
// a warning instead of failing, the newest checkpoint stays the one before, and the next step
// that every rank writes is committed as usual (the marker gone).
TEST(AsyncSave, APartMarkedAbsentLeavesTheStepUncommittedWithoutAFailure) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  testing::ThreadBarrier barrier(2);
  std::vector<std::string> errors(2);
  testing::run_ranks(2, [&](int64_t rank) {
    WriterOptions wo;
    wo.root = root;
    wo.rank = rank;
    wo.layout.world_size = 2;
    wo.barrier = barrier.callback();
    CheckpointWriter writer(wo);
    try {
      writer.save(4, shards_for_step(4));
      writer.wait();
      if (rank == 0) {
        writer.save(8, shards_for_step(8));
      } else {
        // The process of rank 1 died; its replacement marks the part and arrives in its place.
        mark_rank_absent(root, 8, 1, "rank 1 died after step 8 was cut");
        barrier.callback()(8);
      }
      writer.wait();
      writer.save(12, shards_for_step(12));
      writer.wait();
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(list_complete_steps(root), (std::vector<int64_t>{4, 12}));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(root) / "step_8.tmp"));
  EXPECT_FALSE(
      std::filesystem::exists(std::filesystem::path(root) / "step_12" / "rank00001.json.absent"));
  // A step committed already is left alone.
  mark_rank_absent(root, 12, 1, "late");
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(root) / "step_12.tmp"));
}

}  // namespace
}  // namespace meshtrain::ckpt

namespace meshtrain::ckpt {
namespace {

// Every save reports its end once (the job's checkpoint metrics count them), asynchronous or
// written on the caller's thread, with its outcome: a failed write is a failure, and a save
// that is over is reported before wait() returns.
TEST(AsyncSave, EverySaveReportsItsEndWithItsOutcome) {
  for (const bool async : {true, false}) {
    TempDir dir;
    struct Done {
      int64_t step;
      uint64_t bytes;
      bool ok;
    };
    std::mutex mu;
    std::vector<Done> done;
    WriterOptions wo;
    wo.root = dir.file("ckpt");
    wo.async = async;
    wo.before_file_write = [](const std::string& path) {
      if (path.find("step_2.tmp/optim_rank00000") != std::string::npos)
        MT_THROW(IoError, "cannot write ", path, ": No space left on device");
    };
    wo.on_done = [&](int64_t step, double seconds, uint64_t bytes, bool ok) {
      EXPECT_GE(seconds, 0.0);
      std::lock_guard<std::mutex> lock(mu);
      done.push_back({step, bytes, ok});
    };
    CheckpointWriter writer(wo);
    writer.save(1, shards_for_step(1));
    writer.wait();
    if (async) {
      writer.save(2, shards_for_step(2));
      EXPECT_THROW(writer.wait(), IoError);
    } else {
      EXPECT_THROW(writer.save(2, shards_for_step(2)), IoError);
    }
    writer.save(3, shards_for_step(3));
    writer.wait();
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(done.size(), 3u) << "async " << async;
    EXPECT_EQ(done[0].step, 1);
    EXPECT_TRUE(done[0].ok);
    EXPECT_EQ(done[0].bytes, shards_for_step(1).nbytes());
    EXPECT_EQ(done[1].step, 2);
    EXPECT_FALSE(done[1].ok);
    EXPECT_EQ(done[2].step, 3);
    EXPECT_TRUE(done[2].ok);
  }
}

}  // namespace
}  // namespace meshtrain::ckpt
