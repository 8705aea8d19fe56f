// Inverted dropout on the device with the CPU's mask (tensor/dropout_mask.h), so a run with
// dropout on cuda drops the elements the CPU would and the fake device's bits are the GPU's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

// out[i] = inp[i] / (1 - p) where element offset + i is kept under seed, else 0 (written; out may
// be inp). p in [0, 1]; p = 1 drops everything. The backward is the same call on the gradient.
void dropout(float* out, const float* inp, int64_t n, float p, uint64_t seed, uint64_t offset,
             cudaStream_t stream);

}  // namespace meshtrain::cuda
