#include "meshtrain/runtime/progress_line.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

namespace meshtrain::runtime {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  std::ostringstream os;
  if (s >= 3600)
    os << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s % 3600) / 60 << "m";
  else if (s >= 60)
    os << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  else
    os << s << "s";
  return os.str();
}

void ProgressLine::on_start(RunState&) {
  start_ = std::chrono::steady_clock::now();
}

void ProgressLine::after_step(RunState& run, StepContext& step) {
  const int64_t steps = run.config.config.train.steps;
  const nlohmann::json& m = step.record;
  const bool due = step.step % std::max<int64_t>(1, run.config.config.train.log_interval) == 0;
  if (!due && !step.last && !m.contains("val_loss")) return;
  const parallel::StepOutcome& out = step.outcome;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = elapsed / static_cast<double>(step.step - run.start_step) *
                     static_cast<double>(steps - step.step);
  std::ostringstream os;
  os << "step " << step.step << "/" << steps << " loss " << std::fixed << std::setprecision(4)
     << out.loss;
  if (m.contains("val_loss")) os << " val_loss " << m["val_loss"].get<float>();
  if (m.contains("val_accuracy")) os << " val_accuracy " << m["val_accuracy"].get<float>();
  os << " lr " << std::scientific << std::setprecision(2) << step.options.lr << std::fixed
     << " norm " << std::setprecision(2) << out.grad_norm << " " << run.task.unit().rate << " "
     << std::setprecision(0) << step.throughput << " eta " << format_duration(eta);
  const optim::LossScaler* scaler = run.engine.loss_scaler();
  if (scaler) os << " scale " << std::setprecision(0) << out.loss_scale;
  // The experts' balance this step: the busiest expert over the mean, and what was dropped.
  if (m.contains("moe"))
    os << " experts max/mean " << std::setprecision(2) << m["moe"]["max_mean_load"].get<double>()
       << " dropped " << std::setprecision(1) << 100.0 * m["moe"]["dropped_fraction"].get<double>()
       << "%";
  if (out.skipped && out.overflow && std::isfinite(out.loss))
    os << " (skipped: gradient overflow, loss scale -> " << std::setprecision(0) << scaler->scale()
       << ")";
  else if (out.spike)
    os << " (skipped: spike, " << step.spike << ")";
  else if (out.skipped)
    os << " (skipped: non-finite)";
  run.log(os.str(), m);
}

}  // namespace meshtrain::runtime
