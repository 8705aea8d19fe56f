// Dropout of an activation that may be split along the sequence, with the masks the whole
// tensor would get: the whole [B, T, C] tensor's element i is kept by a hash of (seed, offset + i)
// (autograd::dropout), so this rank's time range [t0, t0 + Tl) of batch row b uses offsets
// offset + (b * T + t0) * C onwards. Without a split it is autograd::dropout itself; with one, a
// tensor-parallel run drops exactly the elements a single rank would.
#pragma once

#include <cstdint>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::parallel::tp {

// x[B, Tl, C] is time steps [t0, t0 + Tl) of a whole of T steps.
Tensor sequence_dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset, bool training,
                        int64_t t0, int64_t T);

}  // namespace meshtrain::parallel::tp
