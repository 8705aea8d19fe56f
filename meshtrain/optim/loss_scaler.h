// Dynamic loss scaling for f16 training (torch.cuda.amp.GradScaler semantics). f16 gradients
// underflow: values below ~6e-8 become zero and below ~6e-5 lose bits. Multiplying the loss by
// a large scale before backward lifts the gradients into f16's range; they are divided by it
// again (unscale) before clipping and the optimizer. When the scale is too large some gradient
// overflows to inf or NaN: that step is skipped and the scale backed off; after growth_interval
// finite steps in a row it grows again, so it settles just below the overflow threshold.
//
// The scale stays a power of two when the initial scale and the factors are (the defaults), so
// scaling and unscaling are exact in f32 (short of f32 subnormals).
//
// Data parallelism: unscale after the all-reduce. Every rank then holds the same bits (the
// collectives are deterministic), so every rank finds the same non-finite gradients and takes
// the same skip decision without a collective of its own; a rank whose local gradient
// overflowed poisons the sum everywhere.
#pragma once

#include <cstdint>

#include "meshtrain/optim/optimizer.h"
#include "meshtrain/optim/step_gate.h"

namespace meshtrain::optim {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;

  // ValueError naming the field: init_scale finite and > 0, growth_factor > 1, backoff_factor in
  // (0, 1), growth_interval >= 1.
  void validate() const;
};

// What a checkpoint keeps: the scale and the count of finite steps since the last change.
struct LossScalerState {
  double scale = 65536.0;
  int64_t growth_tracker = 0;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  // The factor the loss is multiplied by (backward's root gradient).
  float scale() const { return static_cast<float>(scale_); }
  // Divides every gradient by the scale in place and returns true when any element is inf or
  // NaN (the step must then be skipped). Parameters without a gradient are ignored.
  bool unscale(const NamedParams& params) const;
  // unscale for gradients on `device` with nothing decided on the host: the gradients' sums of
  // squares before the division stay on the device (one not finite is an overflow: the step
  // gate, optim/step_gate.h, finds it), and nothing waits. The same division as unscale's.
  DeviceSquares unscale_on_device(const NamedParams& params, Device device) const;
  // After each step: found_inf backs the scale off and restarts the growth count; otherwise the
  // count advances and the scale grows when it reaches growth_interval.
  void update(bool found_inf);

  LossScalerState state() const { return {scale_, growth_tracker_}; }
  // ValueError when the scale is not finite and positive or the tracker is negative.
  void load_state(const LossScalerState& state);
  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
};

}  // namespace meshtrain::optim
