// See job_metrics.h.
#include "meshtrain/obs/job_metrics.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <vector>

#include "meshtrain/util/atomic_file.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::obs {

nlohmann::json JobState::to_json() const {
  return {{"resumes_success", resumes_success},
          {"resumes_failure", resumes_failure},
          {"rollbacks", rollbacks},
          {"last_step", last_step},
          {"last_step_unix_s", last_step_unix_s},
          {"last_checkpoint_step", last_checkpoint_step},
          {"last_checkpoint_unix_s", last_checkpoint_unix_s},
          {"last_recovery_s", last_recovery_s},
          {"completed", completed}};
}

JobState JobState::from_json(const nlohmann::json& j) {
  JobState s;
  s.resumes_success = j.value("resumes_success", s.resumes_success);
  s.resumes_failure = j.value("resumes_failure", s.resumes_failure);
  s.rollbacks = j.value("rollbacks", s.rollbacks);
  s.last_step = j.value("last_step", s.last_step);
  s.last_step_unix_s = j.value("last_step_unix_s", s.last_step_unix_s);
  s.last_checkpoint_step = j.value("last_checkpoint_step", s.last_checkpoint_step);
  s.last_checkpoint_unix_s = j.value("last_checkpoint_unix_s", s.last_checkpoint_unix_s);
  s.last_recovery_s = j.value("last_recovery_s", s.last_recovery_s);
  s.completed = j.value("completed", s.completed);
  return s;
}

JobState JobState::load(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return {};
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) {
    MT_LOG_WARN("metrics", path.string(),
                " is not a JSON object; the job's counters start again from 0");
    return {};
  }
  try {
    return from_json(j);
  } catch (const nlohmann::json::exception& e) {
    MT_LOG_WARN("metrics", path.string(), ": ", e.what(),
                "; the job's counters start again from 0");
    return {};
  }
}

bool JobState::save(const std::filesystem::path& path, std::string* error) const {
  try {
    write_file_atomic(path.string(), to_json().dump() + "\n");
    return true;
  } catch (const std::exception& e) {
    if (error != nullptr) *error = e.what();
    return false;
  }
}

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

constexpr const char* kResumesHelp =
    "Attempts of the job that looked for a checkpoint, by outcome (success: resumed from one; "
    "failure: none could be loaded).";

}  // namespace

JobMetrics::JobMetrics(Registry& r, JobMetricsOptions o)
    : options_(std::move(o)),
      job_level_(options_.rank == 0),
      last_step_time_(r.gauge("meshtrain_last_step_timestamp_seconds",
                              "Unix time at which this rank completed its last step.")),
      baseline_(r.gauge("meshtrain_tokens_per_second_baseline",
                        "Median global tokens per second over the last steps (the throughput "
                        "baseline a drop is measured against).")),
      ckpt_ok_(r.counter("meshtrain_checkpoints_total", "Checkpoints attempted, by outcome.",
                         {{"outcome", "success"}})),
      ckpt_failed_(r.counter("meshtrain_checkpoints_total", "Checkpoints attempted, by outcome.",
                             {{"outcome", "failure"}})),
      ckpt_duration_(r.histogram("meshtrain_checkpoint_duration_seconds",
                                 "Wall time of writing a checkpoint.", latency_buckets())),
      ckpt_bytes_(r.counter("meshtrain_checkpoint_bytes_total", "Checkpoint bytes written.")) {
  if (!options_.clock) options_.clock = unix_now;
  MT_CHECK(options_.baseline_window > 0, "job metrics: baseline_window must be positive");
  if (!job_level_) return;
  resumes_ok_ = &r.counter("meshtrain_resumes_total", kResumesHelp, {{"outcome", "success"}});
  resumes_failed_ = &r.counter("meshtrain_resumes_total", kResumesHelp, {{"outcome", "failure"}});
  recovery_ = &r.gauge("meshtrain_recovery_duration_seconds",
                       "Time to recover of the last resume: from the previous attempt's last "
                       "completed step to the first step after the resume (-1: never resumed).");
  rollbacks_ = &r.counter("meshtrain_rollbacks_total",
                          "Rollbacks of the job to a checkpoint after non-finite steps.");
  completed_ = &r.gauge("meshtrain_job_completed", "1 once the job has trained its last step.");
  last_ckpt_time_ = &r.gauge("meshtrain_last_checkpoint_timestamp_seconds",
                             "Unix time of the job's newest successful checkpoint (0: none).");
  last_ckpt_step_ =
      &r.gauge("meshtrain_last_checkpoint_step", "Step of the job's newest successful checkpoint.");
  if (!options_.state_file.empty() && !options_.fresh) state_ = JobState::load(options_.state_file);
  // A job is complete only once this attempt says so (a longer run of a finished job goes on).
  state_.completed = false;
  std::lock_guard<std::mutex> lock(mu_);
  publish_locked();
}

void JobMetrics::publish_locked() {
  if (!job_level_) return;
  // Counters only go up: raise each to the carried-over total.
  resumes_ok_->inc(static_cast<double>(state_.resumes_success) - resumes_ok_->value());
  resumes_failed_->inc(static_cast<double>(state_.resumes_failure) - resumes_failed_->value());
  rollbacks_->inc(static_cast<double>(state_.rollbacks) - rollbacks_->value());
  recovery_->set(state_.last_recovery_s);
  completed_->set(state_.completed ? 1.0 : 0.0);
  last_ckpt_time_->set(state_.last_checkpoint_unix_s);
  last_ckpt_step_->set(static_cast<double>(state_.last_checkpoint_step));
}

void JobMetrics::persist_locked(bool force) {
  if (!job_level_ || options_.state_file.empty()) return;
  const double now = options_.clock();
  if (!force && now - last_persist_s_ < options_.persist_interval_s) return;
  last_persist_s_ = now;
  std::string error;
  const bool ok = state_.save(options_.state_file, &error);
  // Once per run of failures (a full disk would otherwise repeat it every second).
  if (!ok && persist_ok_)
    MT_LOG_WARN("metrics", "cannot write ", options_.state_file.string(), ": ", error,
                "; the job's counters may not carry over to the next attempt");
  if (ok && !persist_ok_)
    MT_LOG_INFO("metrics", "writing ", options_.state_file.string(), " works again");
  persist_ok_ = ok;
}

void JobMetrics::on_resume(int64_t resumed_step, bool failed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (resumed_step > 0) {
    ++state_.resumes_success;
    // The previous attempt's last step, or (a file without one) its newest checkpoint.
    recovery_from_s_ =
        state_.last_step_unix_s > 0 ? state_.last_step_unix_s : state_.last_checkpoint_unix_s;
    recovery_pending_ = recovery_from_s_ > 0;
  } else if (failed) {
    ++state_.resumes_failure;
  }
  publish_locked();
  persist_locked(true);
}

std::optional<double> JobMetrics::on_step(int64_t step, double step_s) {
  const double now = options_.clock();
  last_step_time_.set(now);
  std::lock_guard<std::mutex> lock(mu_);
  if (step_s > 0 && options_.tokens_per_step > 0) {
    window_.push_back(options_.tokens_per_step / step_s);
    if (window_.size() > options_.baseline_window) window_.pop_front();
    std::vector<double> v(window_.begin(), window_.end());
    const auto mid = v.begin() + static_cast<long>(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    baseline_.set(*mid);
  }
  state_.last_step = step;
  state_.last_step_unix_s = now;
  std::optional<double> recovered;
  if (recovery_pending_) {
    recovery_pending_ = false;
    recovered = now - recovery_from_s_;
    state_.last_recovery_s = *recovered;
    publish_locked();
  }
  persist_locked(recovered.has_value());
  return recovered;
}

void JobMetrics::on_checkpoint(int64_t step, double seconds, uint64_t bytes, bool ok) {
  ckpt_duration_.observe(seconds);
  if (!ok) {
    ckpt_failed_.inc();
    return;
  }
  ckpt_ok_.inc();
  ckpt_bytes_.inc(static_cast<double>(bytes));
  std::lock_guard<std::mutex> lock(mu_);
  state_.last_checkpoint_step = step;
  state_.last_checkpoint_unix_s = options_.clock();
  publish_locked();
  persist_locked(true);
}

void JobMetrics::on_rollback() {
  std::lock_guard<std::mutex> lock(mu_);
  ++state_.rollbacks;
  publish_locked();
  persist_locked(true);
}

void JobMetrics::on_completed(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.completed = true;
  state_.last_step = std::max(state_.last_step, step);
  publish_locked();
  persist_locked(true);
}

JobState JobMetrics::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

double JobMetrics::tokens_per_second_baseline() const {
  return baseline_.value();
}

}  // namespace meshtrain::obs
