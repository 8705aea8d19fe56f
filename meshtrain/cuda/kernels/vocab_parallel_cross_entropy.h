// The parts of a vocabulary-parallel cross-entropy on the device: the semantics of
// tensor/cpu/vocab_parallel_cross_entropy.h, the rows combined over the tensor-parallel group by
// the caller between the calls. The sum of exponentials is in double, as on the CPU, but added in
// a tree (and with the device's expf), so it follows the CPU within a few ulps of f32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

void vocab_parallel_row_max(float* max, const float* logits, int64_t N, int64_t V, int64_t valid,
                            cudaStream_t stream);

void vocab_parallel_row_sums(float* sum, float* target_logit, const float* logits, const float* max,
                             const int32_t* targets, int64_t N, int64_t V, int64_t valid,
                             int64_t begin, int32_t ignore_index, cudaStream_t stream);

// scale = *dloss / *count, read on the device.
void vocab_parallel_backward(float* dlogits, const float* logits, const float* max,
                             const float* sum, const int32_t* targets, int64_t N, int64_t V,
                             int64_t valid, int64_t begin, int32_t ignore_index, const float* dloss,
                             const float* count, cudaStream_t stream);

// out[0] = the mean loss, out[1] = the count (device memory), in one thread with the CPU's
// order; the device's double log may differ from the host's in its last bit.
void vocab_parallel_loss_mean(float* out, const float* max, const float* sum,
                              const float* target_logit, const int32_t* targets, int64_t N,
                              int32_t ignore_index, cudaStream_t stream);

}  // namespace meshtrain::cuda
