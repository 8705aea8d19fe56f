// Warm-up and decay curves; everything in double so the curve does not depend on float rounding
// of intermediate ratios.
#include "meshtrain/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "meshtrain/util/error.h"

namespace meshtrain::optim {

LrDecay parse_lr_decay(std::string_view name) {
  if (name == "constant") return LrDecay::constant;
  if (name == "cosine") return LrDecay::cosine;
  if (name == "linear") return LrDecay::linear;
  if (name == "one_cycle") return LrDecay::one_cycle;
  MT_THROW(ValueError, "unknown learning-rate decay '", name,
           "' (expected constant, cosine, linear or one_cycle)");
}

std::string_view lr_decay_name(LrDecay decay) {
  switch (decay) {
    case LrDecay::constant:
      return "constant";
    case LrDecay::cosine:
      return "cosine";
    case LrDecay::linear:
      return "linear";
    case LrDecay::one_cycle:
      return "one_cycle";
  }
  return "?";
}

void LrSchedule::validate() const {
  if (!std::isfinite(lr) || lr < 0) MT_THROW(ValueError, "lr schedule: lr must be >= 0, got ", lr);
  if (!std::isfinite(min_lr) || min_lr < 0) {
    MT_THROW(ValueError, "lr schedule: min_lr must be >= 0, got ", min_lr);
  }
  if (warmup_steps < 0) {
    MT_THROW(ValueError, "lr schedule: warmup_steps must be >= 0, got ", warmup_steps);
  }
  if (decay == LrDecay::one_cycle) {
    if (!(pct_start > 0.0 && pct_start < 1.0)) {
      MT_THROW(ValueError, "lr schedule: one_cycle pct_start must be in (0, 1), got ", pct_start);
    }
    if (!(div_factor >= 1.0) || !(final_div_factor >= 1.0) || !std::isfinite(div_factor) ||
        !std::isfinite(final_div_factor)) {
      MT_THROW(ValueError, "lr schedule: one_cycle div_factor and final_div_factor must be >= 1");
    }
    // PyTorch's phase ends are pct_start * total - 1 and total - 1; with fewer than two steps
    // the second phase has no length.
    if (total_steps < 2) {
      MT_THROW(ValueError, "lr schedule: one_cycle needs total_steps >= 2, got ", total_steps);
    }
    return;
  }
  if (decay != LrDecay::constant && total_steps < warmup_steps) {
    MT_THROW(ValueError, "lr schedule: total_steps (", total_steps, ") must be >= warmup_steps (",
             warmup_steps, ")");
  }
}

namespace {

// PyTorch's _annealing_cos: from `start` at pct 0 to `end` at pct 1.
double annealing_cos(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
}

}  // namespace

double LrSchedule::at(int64_t step) const {
  MT_CHECK(step >= 0, "lr schedule: negative step ", step);
  if (decay == LrDecay::one_cycle) {
    // OneCycleLR.get_lr with last_epoch = step: the phase ends are float step indices, and
    // steps past the end stay on the second phase's curve clamped to its floor (PyTorch raises
    // there instead; a run that stops at total_steps never asks).
    const double initial = lr / div_factor;
    const double floor = initial / final_div_factor;
    const double s = static_cast<double>(std::min(step, total_steps - 1));
    const double peak_step = pct_start * static_cast<double>(total_steps) - 1.0;
    if (s <= peak_step) return annealing_cos(initial, lr, peak_step > 0.0 ? s / peak_step : 1.0);
    const double end_step = static_cast<double>(total_steps) - 1.0;
    return annealing_cos(lr, floor, (s - peak_step) / (end_step - peak_step));
  }
  if (step < warmup_steps) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (decay == LrDecay::constant) return lr;
  if (step >= total_steps) return min_lr;
  const double ratio =
      static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  const double coeff =
      decay == LrDecay::cosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) : 1.0 - ratio;
  return min_lr + coeff * (lr - min_lr);
}

namespace {

void check_batches(int64_t global_batch, int64_t base_batch) {
  if (global_batch <= 0 || base_batch <= 0) {
    MT_THROW(ValueError, "lr scaling: batch sizes must be positive, got ", global_batch, " and ",
             base_batch);
  }
}

}  // namespace

double linear_scaled_lr(double base_lr, int64_t global_batch, int64_t base_batch) {
  check_batches(global_batch, base_batch);
  return base_lr * static_cast<double>(global_batch) / static_cast<double>(base_batch);
}

double sqrt_scaled_lr(double base_lr, int64_t global_batch, int64_t base_batch) {
  check_batches(global_batch, base_batch);
  return base_lr * std::sqrt(static_cast<double>(global_batch) / static_cast<double>(base_batch));
}

}  // namespace meshtrain::optim
