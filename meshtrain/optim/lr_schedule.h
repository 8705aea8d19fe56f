// Learning-rate schedules as pure functions of the step, so a resumed run needs only the step
// count to continue on the same curve (no scheduler state in checkpoints). The shape is
// nanoGPT's: a linear warm-up, then a decay from `lr` to `min_lr` that ends at `total_steps`
// and stays at `min_lr` after it. Also the batch-size scaling rules used when the world size
// (and so the global batch) changes.
#pragma once

#include <cstdint>
#include <string_view>

namespace meshtrain::optim {

enum class LrDecay : uint8_t { constant, cosine, linear };

// "constant", "cosine" or "linear"; throws ValueError otherwise.
LrDecay parse_lr_decay(std::string_view name);
std::string_view lr_decay_name(LrDecay decay);

struct LrSchedule {
  double lr = 1e-3;          // peak, reached at the end of warm-up
  double min_lr = 0.0;       // floor of the decay (ignored by constant)
  int64_t warmup_steps = 0;  // step s < warmup_steps: lr * (s + 1) / warmup_steps
  int64_t total_steps = 0;   // the decay runs over [warmup_steps, total_steps]
  LrDecay decay = LrDecay::constant;

  // Throws ValueError on negative or non-finite values or total_steps < warmup_steps (for a
  // decaying schedule).
  void validate() const;
  // The learning rate for 0-based step `step`.
  double at(int64_t step) const;
};

// Linear scaling rule (Goyal et al.): lr * global_batch / base_batch.
double linear_scaled_lr(double base_lr, int64_t global_batch, int64_t base_batch);
// Square-root scaling rule (common for Adam): lr * sqrt(global_batch / base_batch).
double sqrt_scaled_lr(double base_lr, int64_t global_batch, int64_t base_batch);

}  // namespace meshtrain::optim
