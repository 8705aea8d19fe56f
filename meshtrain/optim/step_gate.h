// A step whose update is decided on the device (tensor/cpu/step_gate.h): the gradients' sums of
// squares stay where they were summed, one small kernel takes the engine's decision (skip or
// not, the clipping coefficient) from them and the step's losses, the optimizer reads that
// decision where it runs, and the host reads the outcome once at the end of the step. On a GPU
// the host then never waits between the backward and the update.
#pragma once

#include <cstdint>

#include "meshtrain/tensor/cpu/step_gate.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::optim {

// Sums of squares of gradients left on a device: `count` doubles in `sums` (ops::
// sum_squares_each_on_device), the first `split` of them of tensor-parallel parts.
struct DeviceSquares {
  Tensor sums;
  int64_t split = 0;
  int64_t count = 0;
};

// The gate of a step: `losses` ([accum] f32, the micro-batches' losses), `pre` (the sums before
// f16 unscaling; count 0 without a loss scaler) and `squares` (the norm's), all on one device;
// max_norm 0 (or less): no clipping, else finite (ValueError). Returns a buffer holding one
// cpu::StepGate on that device, queued, not waited for.
Tensor gate_step(const Tensor& losses, const DeviceSquares& pre, const DeviceSquares& squares,
                 double max_norm);

// The gate's values on the host (a wait for the device: the step's one read).
cpu::StepGate read_gate(const Tensor& gate);

}  // namespace meshtrain::optim
