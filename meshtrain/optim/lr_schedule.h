// Learning-rate schedules as pure functions of the step, so a resumed run needs only the step
// count to continue on the same curve (no scheduler state in checkpoints). The shape is
// nanoGPT's: a linear warm-up, then a decay from `lr` to `min_lr` that ends at `total_steps`
// and stays at `min_lr` after it; or PyTorch's one-cycle curve (OneCycleLR, cosine annealing,
// two phases), which sets its own start and floor from `lr`. Also the batch-size scaling rules
// used when the world size (and so the global batch) changes.
#pragma once

#include <cstdint>
#include <string_view>

namespace meshtrain::optim {

enum class LrDecay : uint8_t { constant, cosine, linear, one_cycle };

// "constant", "cosine", "linear" or "one_cycle"; throws ValueError otherwise.
LrDecay parse_lr_decay(std::string_view name);
std::string_view lr_decay_name(LrDecay decay);

struct LrSchedule {
  double lr = 1e-3;          // peak, reached at the end of warm-up
  double min_lr = 0.0;       // floor of the decay (ignored by constant)
  int64_t warmup_steps = 0;  // step s < warmup_steps: lr * (s + 1) / warmup_steps
  int64_t total_steps = 0;   // the decay runs over [warmup_steps, total_steps]
  LrDecay decay = LrDecay::constant;
  // one_cycle only (warmup_steps and min_lr do not apply to it): as torch.optim.lr_scheduler.
  // OneCycleLR(max_lr=lr, total_steps, pct_start, anneal_strategy="cos", div_factor,
  // final_div_factor, three_phase=False). The curve rises from lr / div_factor to lr over the
  // first pct_start of the steps, then falls to lr / div_factor / final_div_factor at the last.
  double pct_start = 0.3;
  double div_factor = 25.0;
  double final_div_factor = 1e4;

  // Throws ValueError on negative or non-finite values or total_steps < warmup_steps (for a
  // decaying schedule); for one_cycle, on pct_start outside (0, 1), a factor below 1 or
  // total_steps < 2.
  void validate() const;
  // The learning rate for 0-based step `step`.
  double at(int64_t step) const;
};

// Linear scaling rule (Goyal et al.): lr * global_batch / base_batch.
double linear_scaled_lr(double base_lr, int64_t global_batch, int64_t base_batch);
// Square-root scaling rule (common for Adam): lr * sqrt(global_batch / base_batch).
double sqrt_scaled_lr(double base_lr, int64_t global_batch, int64_t base_batch);

}  // namespace meshtrain::optim
