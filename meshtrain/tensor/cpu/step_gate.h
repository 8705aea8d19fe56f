// The update's decision of a training step, taken from values the device holds so that the host
// need not read them first: the step's loss, whether f16 unscaling found a non-finite gradient,
// the global gradient norm, whether the update is skipped and the clipping coefficient. The
// device computes it with this function's arithmetic (a device's step_gate entry), the optimizer
// reads `skip` and `coef` where it runs, and the host reads the whole record once, at the end of
// the step. Every value has the bits the engine's host path gives it (parallel/engine.cpp).
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

struct StepGate {
  double norm = 0.0;     // sqrt(split sums + whole sums), before clipping
  float loss = 0.0f;     // the mean of the micro-batches' losses
  float coef = 1.0f;     // what each gradient is taken times (clipping; 1 without)
  int32_t overflow = 0;  // a sum before unscaling was not finite (f16: back the scale off)
  int32_t skip = 0;      // the loss, a gradient or the norm is not finite: no update
};

// losses[accum]: each micro-batch's loss (the mean adds l / accum in f32, in order, as the step
// runner does on the host). pre[n_pre]: the gradients' sums of squares before unscaling (none
// without a loss scaler). sums[n]: the sums of squares the norm is taken from, the first n_split
// of tensor-parallel parts (the two groups are added apart, then together, as
// parallel::global_grad_norm adds them). max_norm <= 0: no clipping; else coef is
// optim::clip_coefficient(norm, max_norm) with `epsilon` its kClipEpsilon.
void step_gate(StepGate* out, const float* losses, int64_t accum, const double* pre, int64_t n_pre,
               const double* sums, int64_t n_split, int64_t n, double max_norm, double epsilon);

}  // namespace meshtrain::cpu
