// The job-level indicators on a fake clock: what one attempt leaves in the state file is what the
// next attempt exports (counters carried over, never reset), the time to recover is measured from
// the previous attempt's last step, the throughput baseline is a windowed median, and only rank 0
// exports the job-level series. The end-to-end proof (a real run killed and resumed) is
// JobMetricsRun in tests/runtime.
#include "meshtrain/obs/job_metrics.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/obs/exposition_parser.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::obs {
namespace {

using meshtrain::testing::TempDir;

struct FakeClock {
  double now = 1'000'000;
  std::function<double()> fn() {
    return [this] { return now; };
  }
};

JobMetricsOptions options(int rank, const std::filesystem::path& state, FakeClock* clock,
                          double tokens_per_step = 100, size_t window = 100, bool fresh = false) {
  JobMetricsOptions o;
  o.rank = rank;
  o.state_file = state;
  o.fresh = fresh;
  o.tokens_per_step = tokens_per_step;
  o.baseline_window = window;
  if (clock != nullptr) o.clock = clock->fn();
  return o;
}

double sample(const Registry& r, const std::string& name, const Labels& labels = {}) {
  const auto e = testing::parse_exposition(r.render());
  for (const auto& s : e.samples) {
    if (s.name != name) continue;
    bool all = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      all = all && it != s.labels.end() && it->second == v;
    }
    if (all) return s.value;
  }
  ADD_FAILURE() << "no sample " << name << " in\n" << r.render();
  return -12345;
}

TEST(JobMetrics, CountsCarryOverAttemptsAndRecoveryIsMeasuredFromTheLastStep) {
  TempDir dir;
  FakeClock clock;
  const auto state = dir.path() / "job_state.json";
  {
    Registry r;
    JobMetrics m(r, options(0, state, &clock));
    m.on_resume(0, false);  // a new job
    for (int64_t step = 1; step <= 5; ++step) {
      clock.now += 2;
      m.on_step(step, 2.0);
    }
    m.on_checkpoint(4, 0.5, 1000, true);
    m.on_checkpoint(5, 0.5, 1000, false);
    m.on_rollback();
    EXPECT_EQ(sample(r, "meshtrain_resumes_total", {{"outcome", "success"}}), 0);
    EXPECT_EQ(sample(r, "meshtrain_rollbacks_total"), 1);
    EXPECT_EQ(sample(r, "meshtrain_last_checkpoint_step"), 4);
    EXPECT_EQ(sample(r, "meshtrain_last_checkpoint_timestamp_seconds"), clock.now);
    EXPECT_EQ(sample(r, "meshtrain_checkpoints_total", {{"outcome", "failure"}}), 1);
    EXPECT_EQ(sample(r, "meshtrain_job_completed"), 0);
    EXPECT_EQ(sample(r, "meshtrain_recovery_duration_seconds"), -1);
  }
  const double crashed_at = clock.now;  // the last step of the first attempt
  clock.now += 30;                      // down for 30 s
  {
    Registry r;
    JobMetrics m(r, options(0, state, &clock));
    // Carried over before anything happens in this attempt.
    EXPECT_EQ(sample(r, "meshtrain_rollbacks_total"), 1);
    EXPECT_EQ(sample(r, "meshtrain_last_checkpoint_step"), 4);
    m.on_resume(4, false);
    EXPECT_EQ(sample(r, "meshtrain_resumes_total", {{"outcome", "success"}}), 1);
    clock.now += 3;  // the first step after the resume ends 33 s after the last one before
    const auto recovered = m.on_step(5, 3.0);
    ASSERT_TRUE(recovered.has_value());
    EXPECT_DOUBLE_EQ(*recovered, clock.now - crashed_at);
    EXPECT_DOUBLE_EQ(sample(r, "meshtrain_recovery_duration_seconds"), 33);
    EXPECT_FALSE(m.on_step(6, 3.0).has_value()) << "only the first step after a resume";
    m.on_completed(6);
    EXPECT_EQ(sample(r, "meshtrain_job_completed"), 1);
  }
  const JobState s = JobState::load(state);
  EXPECT_EQ(s.resumes_success, 1);
  EXPECT_EQ(s.rollbacks, 1);
  EXPECT_TRUE(s.completed);
  EXPECT_DOUBLE_EQ(s.last_recovery_s, 33);
  {
    // A third attempt that finds only broken checkpoints: a failed resume, counted.
    Registry r;
    JobMetrics m(r, options(0, state, &clock));
    m.on_resume(0, true);
    EXPECT_EQ(sample(r, "meshtrain_resumes_total", {{"outcome", "failure"}}), 1);
    EXPECT_EQ(sample(r, "meshtrain_resumes_total", {{"outcome", "success"}}), 1);
    EXPECT_EQ(sample(r, "meshtrain_job_completed"), 0) << "completion is per attempt";
  }
  {
    // A run that does not resume is a new job.
    Registry r;
    JobMetrics m(r, options(0, state, &clock, 100, 100, true));
    EXPECT_EQ(sample(r, "meshtrain_resumes_total", {{"outcome", "success"}}), 0);
    EXPECT_EQ(sample(r, "meshtrain_rollbacks_total"), 0);
  }
}

TEST(JobMetrics, TheBaselineIsTheMedianOfTheWindowAndADropShowsAgainstIt) {
  FakeClock clock;
  Registry r;
  JobMetrics m(r, options(1, {}, &clock, 1000, 5));
  // 1000 tokens per step: 1 s -> 1000 tok/s.
  for (double s : {1.0, 1.0, 0.5, 1.0, 2.0}) m.on_step(1, s);  // 1000 1000 2000 1000 500
  EXPECT_DOUBLE_EQ(m.tokens_per_second_baseline(), 1000);
  // Two slow steps do not move the median of five; a third does.
  m.on_step(2, 4.0);
  m.on_step(3, 4.0);  // window: 2000 1000 500 250 250
  EXPECT_DOUBLE_EQ(m.tokens_per_second_baseline(), 500);
  m.on_step(4, 4.0);  // 1000 500 250 250 250
  EXPECT_DOUBLE_EQ(m.tokens_per_second_baseline(), 250);
  EXPECT_DOUBLE_EQ(sample(r, "meshtrain_tokens_per_second_baseline"), 250);
  EXPECT_DOUBLE_EQ(sample(r, "meshtrain_last_step_timestamp_seconds"), clock.now);
  // Rank 1 does not export the job-level series (rank 0 does, once for the job).
  EXPECT_EQ(r.render().find("meshtrain_resumes_total"), std::string::npos);
  EXPECT_EQ(r.render().find("meshtrain_job_completed"), std::string::npos);
}

TEST(JobMetrics, AStateFileThatDoesNotParseStartsTheCountersAgain) {
  TempDir dir;
  const auto state = dir.path() / "job_state.json";
  meshtrain::testing::write_bytes(state.string(), "{ not json");
  Registry r;
  JobMetrics m(r, options(0, state, nullptr));
  EXPECT_EQ(sample(r, "meshtrain_rollbacks_total"), 0);
  m.on_rollback();  // and the file is replaced by a good one
  EXPECT_EQ(JobState::load(state).rollbacks, 1);
}

}  // namespace
}  // namespace meshtrain::obs
