// The update's decision of a step on the device (tensor/cpu/step_gate.h), so that the host reads
// it once at the end of the step instead of waiting for the norm before the update.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "meshtrain/tensor/cpu/step_gate.h"

namespace meshtrain::cuda {

// cpu::step_gate's arithmetic, bit for bit, in one thread; every pointer is device memory.
void step_gate(cpu::StepGate* out, const float* losses, int64_t accum, const double* pre,
               int64_t n_pre, const double* sums, int64_t n_split, int64_t n, double max_norm,
               double epsilon, cudaStream_t stream);

}  // namespace meshtrain::cuda
