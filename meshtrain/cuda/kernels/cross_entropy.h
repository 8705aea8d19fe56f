// Fused softmax cross-entropy on the device; the semantics of tensor/cpu/cross_entropy.h, with
// two differences forced by the device: a kernel cannot throw, so a target outside [0, V) that is
// not ignore_index gives that row a NaN loss (and NaN gradients) instead of an error; and the mean
// loss is written to device memory, so that reading it (a host sync) is the caller's choice.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "meshtrain/tensor/dtype.h"

namespace meshtrain::cuda {

// losses[N] (0 for ignored rows) and lse[N] from logits[N, V] and targets[N]; mean_loss (a
// device scalar, may be null) = mean of the non-ignored losses, summed in double in a fixed order
// (NaN when every row is ignored). The logits are f32, bf16 or f16 (`type`): half logits (those
// autocast's LM head keeps) are widened as they are read, the arithmetic stays f32. Where
// dlogits is not null each row's block also writes cross_entropy_backward's gradient with
// dloss = 1 into it (scale, one device float, receives 1 / count), reading the row a second time
// straight after the first (from L2); dlogits has the logits' type and may be the logits.
// label_smoothing in [0, 1) (else an MT_CHECK fails) smooths the target as the CPU's does: each
// loss is (1 - eps) * (lse - x[t]) + eps * (lse - mean of the row).
void cross_entropy_forward(float* losses, float* lse, float* mean_loss, const void* logits,
                           DType type, const int32_t* targets, int64_t N, int64_t V,
                           int32_t ignore_index, cudaStream_t stream, void* dlogits = nullptr,
                           float* scale = nullptr, float label_smoothing = 0.0f);

// Writes dlogits[N, V] = (softmax(row) - target) * dloss / count, the target onehot, or with
// label_smoothing (1 - eps) on the label plus eps / V everywhere; ignored rows get zeros.
// dloss is the incoming gradient of the mean loss and count the number of non-ignored rows, both
// taken on the device (no host synchronisation: `scale`, one device float, receives
// dloss / count); no non-ignored row gives zero gradients. dlogits has the logits' type and may
// be the logits (each element's gradient needs only its own logit, read before it is written).
void cross_entropy_backward(void* dlogits, const void* logits, DType type, const float* lse,
                            const int32_t* targets, const float* dloss, float* scale, int64_t N,
                            int64_t V, int32_t ignore_index, cudaStream_t stream,
                            float label_smoothing = 0.0f);

}  // namespace meshtrain::cuda
