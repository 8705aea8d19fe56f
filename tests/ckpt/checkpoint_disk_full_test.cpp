// A full disk, for real: checkpoints are written into a small tmpfs, so the kernel itself
// answers ENOSPC midway through a file. The save must fail with one IoError naming the file and
// ENOSPC, `latest` and the older checkpoints must stay as they were, and the unfinished .tmp
// directory must be gone so that the space is free again. Mounting needs root (CAP_SYS_ADMIN);
// where it is refused the test fails saying so rather than passing without having run.
#include <sys/mount.h>
#include <sys/statvfs.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::ckpt {
namespace {

namespace fs = std::filesystem;
using meshtrain::testing::TempDir;
using testing::pattern;

constexpr uint64_t kDiskBytes = uint64_t{1} << 20;  // 1 MiB
constexpr int64_t kRows = 40000;                    // 160 KB a tensor, 640 KB a checkpoint

// A tmpfs of kDiskBytes mounted over a fresh directory for the test's lifetime.
class SmallDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    mount_point_ = dir_.file("disk");
    fs::create_directories(mount_point_);
    const std::string opts = "size=" + std::to_string(kDiskBytes) + ",mode=0700";
    if (::mount("tmpfs", mount_point_.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
      const int err = errno;
      FAIL() << "cannot mount a " << kDiskBytes << "-byte tmpfs at " << mount_point_ << ": "
             << std::strerror(err)
             << "; the disk-full tests need root (CAP_SYS_ADMIN) to make a small disk";
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount2(mount_point_.c_str(), MNT_DETACH);
  }

  uint64_t free_bytes() const {
    struct statvfs st {};
    EXPECT_EQ(::statvfs(mount_point_.c_str(), &st), 0);
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  }

  std::string root() const { return mount_point_ + "/ckpt"; }

  static RankShards shards(int64_t step) {
    RankShards s;
    s.add_replicated("model", "w", pattern({kRows}, static_cast<float>(step)));
    s.add_replicated("optim", "exp_avg.w", pattern({kRows}, 1.0f));
    s.add_replicated("optim", "exp_avg_sq.w", pattern({kRows}, 2.0f));
    s.add_replicated("optim", "step.w", pattern({kRows}, 3.0f));
    return s;
  }

  void expect_disk_full_error(const IoError& e, int64_t step) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ENOSPC"), std::string::npos) << msg;
    EXPECT_NE(msg.find(root() + "/" + step_dir_name(step) + ".tmp/"), std::string::npos)
        << "the message must name the file: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }

  // The previous checkpoint is still the one `latest` names, and it verifies.
  void expect_only_step_1() {
    EXPECT_EQ(read_latest(root()), std::optional<std::string>("step_1"));
    EXPECT_EQ(list_complete_steps(root()), std::vector<int64_t>{1});
    EXPECT_TRUE(list_tmp_dirs(root()).empty()) << "the failed save's .tmp directory is left";
    EXPECT_TRUE(verify_checkpoint((fs::path(root()) / "step_1").string()).empty());
    auto c = CheckpointLoader(root()).load_latest();
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->step(), 1);
    EXPECT_TRUE(testing::bitwise_equal(c->load_global_tensor("w"), pattern({kRows}, 1.0f)));
  }

  TempDir dir_;
  std::string mount_point_;
  bool mounted_ = false;
};

TEST_F(SmallDisk, SynchronousSaveFailsWithENOSPCAndFreesTheSpace) {
  WriterOptions wo;
  wo.root = root();
  wo.async = false;
  CheckpointWriter writer(wo);
  writer.save(1, shards(1));
  const uint64_t free_after_first = free_bytes();
  ASSERT_LT(free_after_first, shards(2).nbytes()) << "the second checkpoint would fit";
  try {
    writer.save(2, shards(2));
    FAIL() << "a save into a full disk succeeded";
  } catch (const IoError& e) {
    expect_disk_full_error(e, 2);
  }
  expect_only_step_1();
  EXPECT_EQ(free_bytes(), free_after_first) << "the failed save still holds space";
  EXPECT_EQ(writer.last_saved_step(), 1);
}

TEST_F(SmallDisk, AsynchronousSaveReportsENOSPCOnceAndTheWriterKeepsWorking) {
  WriterOptions wo;
  wo.root = root();
  wo.retention.keep_last = 1;
  CheckpointWriter writer(wo);
  writer.save(1, shards(1));
  writer.wait();
  writer.save(2, shards(2));
  try {
    writer.wait();
    FAIL() << "a save into a full disk succeeded";
  } catch (const IoError& e) {
    expect_disk_full_error(e, 2);
  }
  expect_only_step_1();
  writer.wait();  // reported once

  // Smaller state fits next to step 1 now that the failed attempt's files are gone; retention
  // then drops step 1.
  RankShards small;
  small.add_replicated("model", "w", pattern({1000}, 3.0f));
  writer.save(3, small);
  writer.wait();
  EXPECT_EQ(read_latest(root()), std::optional<std::string>("step_3"));
  EXPECT_EQ(list_complete_steps(root()), std::vector<int64_t>{3});
}

}  // namespace
}  // namespace meshtrain::ckpt
