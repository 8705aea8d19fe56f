// ckpt.dir = s3://... end to end, `meshtrain train` against a real S3-compatible server
// (s3rver): checkpoints upload while training goes on and a node with an empty disk resumes from
// the remote newest; a corrupt remote object is named and the previous checkpoint used; wrong
// credentials stop the run with one line that holds no secret; a server stopped in the middle of
// a run and started again neither stops training nor loses a checkpoint (the uploads catch up);
// `meshtrain ckpt verify|export` read s3:// URIs.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/manifest.h"
#include "meshtrain/ckpt/object_store.h"
#include "meshtrain/ckpt/remote_checkpoints.h"
#include "tests/runtime/s3_train_run_fixture.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;

class S3CheckpointRun : public S3TrainRunTest {
 protected:
  std::string train(const fs::path& out, int64_t steps, int64_t interval, const std::string& prefix,
                    const std::string& extra = "") const {
    return "env " + server_->env() + kMeshtrainBin + " " +
           train_args(out, steps, interval, "--set ckpt.dir=" + server_->uri(prefix) + " " + extra);
  }
  std::vector<int64_t> remote_steps(const std::string& prefix) const {
    ckpt::S3ObjectStore s(ckpt::S3Settings::from_environment(), server_->bucket());
    std::vector<int64_t> out;
    for (const auto& r :
         ckpt::remote_complete_steps(s, ckpt::parse_object_uri(server_->uri(prefix))))
      out.push_back(r.step);
    return out;
  }
};

TEST_F(S3CheckpointRun, UploadsAndANodeWithAnEmptyDiskResumes) {
  const fs::path out = dir_ / "a";
  CommandResult first = run_command(train(out, 8, 4, "run", "--set ckpt.keep_last=0"));
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("uploaded 2 checkpoint(s) to " + server_->uri("run")),
            std::string::npos)
      << first.output;
  EXPECT_EQ(remote_steps("run"), (std::vector<int64_t>{4, 8}));

  // Another node: nothing on its disk.
  const fs::path fresh = dir_ / "b";
  CommandResult second = run_command(train(fresh, 12, 4, "run", "--set ckpt.keep_last=0"));
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("fetched " + server_->uri("run") + "/step_8"), std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("(step 8 of 12)"), std::string::npos) << second.output;
  EXPECT_EQ(remote_steps("run"), (std::vector<int64_t>{4, 8, 12}));

  // The tools read the remote checkpoint too.
  const std::string tools = server_->env() + "MESHTRAIN_S3_CACHE=" + (dir_ / "cache").string() +
                            " " + kMeshtrainBin + " ckpt ";
  CommandResult verify = run_command(tools + "verify " + server_->uri("run"));
  EXPECT_EQ(verify.status, 0) << verify.output;
  EXPECT_NE(verify.output.find("step 12"), std::string::npos) << verify.output;
  CommandResult exported = run_command(tools + "export " + server_->uri("run/step_8") + " --out " +
                                       (dir_ / "m.safetensors").string());
  EXPECT_EQ(exported.status, 0) << exported.output;
  EXPECT_TRUE(fs::exists(dir_ / "m.safetensors"));
}

TEST_F(S3CheckpointRun, ACorruptRemoteObjectIsNamedAndThePreviousOneUsed) {
  CommandResult first = run_command(train(dir_ / "a", 8, 4, "run"));
  ASSERT_EQ(first.status, 0) << first.output;
  ckpt::S3ObjectStore s(ckpt::S3Settings::from_environment(), server_->bucket());
  const std::string key = "run/step_8/" + ckpt::shard_file_name("model", 0);
  std::string bytes = s.get_bytes(key).value();
  bytes[bytes.size() / 2] ^= 0x5a;
  s.put_bytes(key, bytes);

  CommandResult second = run_command(train(dir_ / "b", 10, 4, "run"));
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("checkpoint rejected: " + server_->uri("run") +
                               "/step_8: " + server_->uri(key) + " is corrupt"),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("(step 4 of 10)"), std::string::npos) << second.output;
}

TEST_F(S3CheckpointRun, WrongCredentialsStopWithOneLineAndNoSecret) {
  const std::string cmd = "AWS_ENDPOINT_URL=" + server_->endpoint() +
                          " AWS_ACCESS_KEY_ID=NOTAKEY AWS_SECRET_ACCESS_KEY=hush-hush-secret " +
                          kMeshtrainBin + " " +
                          train_args(dir_ / "a", 4, 2, "--set ckpt.dir=" + server_->uri("run"));
  CommandResult r = run_command(cmd);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("hush-hush"), std::string::npos) << r.output;
  size_t lines = 0;
  for (size_t p = r.output.find("access denied"); p != std::string::npos;
       p = r.output.find("access denied", p + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << r.output;
  EXPECT_NE(r.output.find("InvalidAccessKeyId"), std::string::npos) << r.output;
}

TEST_F(S3CheckpointRun, AServerStoppedMidRunDoesNotStopTrainingAndUploadsCatchUp) {
  const fs::path out = dir_ / "a";
  const std::string log = (dir_ / "run.log").string();
  // A step of about 50 ms (the slowdown idles inside it): 400 steps take 20 s.
  ChildProcess run = spawn("env MESHTRAIN_S3_RETRY_MAX_S=0.5 MESHTRAIN_TEST_SLOWDOWN=20 " +
                               train(out, 400, 20, "run", "--set ckpt.keep_last=2"),
                           log);
  ASSERT_TRUE(run.started());
  // The first checkpoint reached the server: stop it while training goes on.
  ASSERT_TRUE(::meshtrain::testing::wait_until([&] { return !remote_steps("run").empty(); },
                                               std::chrono::seconds(120),
                                               std::chrono::milliseconds(100)))
      << file_bytes(log);
  server_->stop();
  ASSERT_TRUE(::meshtrain::testing::wait_until(
      [&] { return file_bytes(log).find("failed: ") != std::string::npos; },
      std::chrono::seconds(120), std::chrono::milliseconds(20)))
      << file_bytes(log);
  const size_t failed_at = file_bytes(log).find("failed: ");
  ASSERT_TRUE(server_->start());
  const std::optional<int> status = run.wait_for(std::chrono::seconds(240));
  const std::string output = file_bytes(log);
  ASSERT_TRUE(status.has_value()) << output;
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << output;
  // Training went on after the failure, and the newest checkpoint reached the server.
  EXPECT_NE(output.find("step 400/400", failed_at), std::string::npos) << output;
  const std::vector<int64_t> remote = remote_steps("run");
  ASSERT_FALSE(remote.empty()) << output;
  EXPECT_EQ(remote.back(), 400) << output;
  EXPECT_LE(remote.size(), 2u) << output;  // keep_last applies to the remote copy
}

}  // namespace
}  // namespace meshtrain::testing
