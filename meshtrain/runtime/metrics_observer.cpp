#include "meshtrain/runtime/metrics_observer.h"

#include <filesystem>
#include <iomanip>
#include <sstream>

#include "meshtrain/obs/metrics.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

MetricsObserver::MetricsObserver(RunState& run, obs::RunObserverOptions options)
    : options_(std::move(options)) {
  if (run.rank != 0) return;
  const std::string& dir = run.config.config.train.out_dir;
  // A resumed run appends to the history of the run it continues.
  file_.open(std::filesystem::path(dir) / "metrics.jsonl",
             run.start_step > 0 ? std::ios::app : std::ios::trunc);
  if (!file_) MT_THROW(IoError, "cannot write ", dir, "/metrics.jsonl");
}

void MetricsObserver::on_start(RunState&) {
  observer_ = std::make_unique<obs::RunObserver>(obs::default_registry(), options_);
  layer_norms_ = std::make_unique<obs::LayerNormMetrics>(obs::default_registry());
  moe_ = std::make_unique<obs::MoEMetrics>(obs::default_registry());
  param_server_ = std::make_unique<obs::ParamServerMetrics>(obs::default_registry());
}

void MetricsObserver::after_step(RunState& run, StepContext& step) {
  const parallel::StepOutcome& out = step.outcome;
  observer_->on_step({.step = step.step,
                      .loss = out.loss,
                      .lr = step.options.lr,
                      .grad_norm = out.grad_norm,
                      .step_s = step.step_s,
                      .skipped = out.skipped},
                     step.phases, step.record);
  observer_->on_rank_step_times(out.rank_step_s, step.record);
  layer_norms_->on_step(out.layer_grad_norms, step.record);
  moe_->on_step(out.model_metrics, step.record);
  param_server_->on_step(out.sync_metrics, step.record);
  if (const auto recover_s = run.job_metrics.on_step(step.step, step.step_s)) {
    const obs::JobState js = run.job_metrics.state();
    const nlohmann::json event{{"event", "resume"},
                               {"step", run.start_step},
                               {"recover_s", *recover_s},
                               {"resumes", js.resumes_success}};
    write(event);
    std::ostringstream os;
    os << "recovered in " << std::fixed << std::setprecision(1) << *recover_s
       << " s (from the previous attempt's last step to this one; resume " << js.resumes_success
       << " of the job)";
    run.log(os.str(), event);
  }
  write(step.record, true);
}

void MetricsObserver::on_end(RunState& run) {
  const int64_t steps = run.config.config.train.steps;
  if (!run.result.preempted && run.result.last_step == steps) run.job_metrics.on_completed(steps);
}

void MetricsObserver::write(const nlohmann::json& row, bool flush) {
  if (!file_.is_open()) return;
  file_ << row.dump() << "\n";
  if (flush) file_ << std::flush;
}

}  // namespace meshtrain::runtime
