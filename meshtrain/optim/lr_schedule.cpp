// Warm-up and decay curves; everything in double so the curve does not depend on float rounding
// of intermediate ratios.
#include "meshtrain/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "meshtrain/util/error.h"

namespace meshtrain::optim {

LrDecay parse_lr_decay(std::string_view name) {
  if (name == "constant") return LrDecay::constant;
  if (name == "cosine") return LrDecay::cosine;
  if (name == "linear") return LrDecay::linear;
  MT_THROW(ValueError, "unknown learning-rate decay '", name,
           "' (expected constant, cosine or linear)");
}

std::string_view lr_decay_name(LrDecay decay) {
  switch (decay) {
    case LrDecay::constant:
      return "constant";
    case LrDecay::cosine:
      return "cosine";
    case LrDecay::linear:
      return "linear";
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
  if (decay != LrDecay::constant && total_steps < warmup_steps) {
    MT_THROW(ValueError, "lr schedule: total_steps (", total_steps, ") must be >= warmup_steps (",
             warmup_steps, ")");
  }
}

double LrSchedule::at(int64_t step) const {
  MT_CHECK(step >= 0, "lr schedule: negative step ", step);
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
