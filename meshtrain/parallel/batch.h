// Batch: a micro-batch of token windows and their next-token targets, the unit every training
// path consumes (the engine's accumulation steps and the pipeline's micro-batches alike).
#pragma once

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::parallel {

struct Batch {
  Tensor inputs;   // [B, T] token ids: read by the first pipeline stage
  Tensor targets;  // [B, T]: read by the last
};

}  // namespace meshtrain::parallel
