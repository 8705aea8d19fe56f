// A worker blocked in a collective when SIGTERM comes (its peer is cut off, here stopped) gives
// the collective up before its launcher's grace period ends, saying which operation and which
// ranks it was waiting for, instead of dying silently on the SIGKILL that follows.
#include <signal.h>

#include <gtest/gtest.h>

#include <regex>

#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class BlockedWorkerRun : public TrainRunTest {
 protected:
  static size_t lines(const fs::path& p) {
    const std::string s = file_bytes(p);
    return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
  }
};

TEST_F(BlockedWorkerRun, SigtermAbandonsACollectiveWhosePeerIsGone) {
  const fs::path out = dir_ / "out";
  const fs::path log = dir_ / "run.log";
  // dist.timeout_s = 200: the collective's own deadline cannot be what ends it within the test's
  // 60 s. meshrun tells its workers the 5 s grace period; they give up after half of it.
  ChildProcess job =
      spawn(meshrun(2) + train_args(out, 1000000, 0, "--set dist.timeout_s=200"), log.string());
  ASSERT_TRUE(job.started());
  ASSERT_TRUE(wait_until([&] { return lines(out / "metrics.jsonl") >= 3; }, 90s))
      << file_bytes(log);
  const std::vector<pid_t> workers = children_of(job.pid());
  ASSERT_EQ(workers.size(), 2u) << file_bytes(log);
  // Rank 1 answers nothing from now on; rank 0 is in a collective with it already or enters one
  // at the latest when its step ends, and stays there.
  ::kill(workers[1], SIGSTOP);
  ::kill(workers[0], SIGTERM);
  const auto t0 = std::chrono::steady_clock::now();
  const bool rank0_gone =
      ::meshtrain::testing::wait_until([&] { return ::kill(workers[0], 0) != 0; }, 60s, 20ms);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::kill(workers[1], SIGKILL);
  const std::optional<int> status = job.wait_for(60s);
  const std::string output = file_bytes(log);
  ASSERT_TRUE(rank0_gone) << "rank 0 still blocked 60 s after SIGTERM\n" << output;
  ASSERT_TRUE(status.has_value()) << output;
  EXPECT_TRUE(std::regex_search(
      output,
      std::regex(
          "meshtrain: error: group aborted: [a-z_]+ \\(seq [0-9]+, group '[^']+', rank 0/2\\) "
          "abandoned on SIGTERM after waiting [0-9]+ ms for ranks \\[1\\]")))
      << output;
  // Before the grace period (5 s) would have ended it, with slack for a loaded machine.
  EXPECT_LT(took, 30.0) << output;
}

}  // namespace
}  // namespace meshtrain::testing
