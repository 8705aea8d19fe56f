// Fused LayerNorm over the last dimension on the device; the semantics of
// tensor/cpu/layer_norm.h (statistics saved by the forward, dinp written), except that the
// parameter gradients are written, not accumulated.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "meshtrain/tensor/dtype.h"

namespace meshtrain::cuda {

// out[N, C] = (inp - mean) * rstd * weight + bias; mean[N], rstd[N] saved (each may be null), as
// may weight and bias (meaning 1 and 0). out is f32, or rounded once to bf16 or f16 (out_type:
// the input of a half product, written in 2 bytes instead of 4 plus a cast).
void layer_norm_forward(void* out, DType out_type, float* mean, float* rstd, const float* inp,
                        const float* weight, const float* bias, int64_t N, int64_t C, float eps,
                        cudaStream_t stream);

// Writes dinp[N, C] (may be null; with `accumulate`, adds to it) and dweight[C], dbias[C] (each
// may be null; written, not accumulated: no zero-fill before). dout is f32, bf16 or f16 (dout_type:
// a half output's gradient is half). dinp_half (may be null; `half`, bf16 or f16) receives what
// dinp receives, rounded once.
void layer_norm_backward(float* dinp, float* dweight, float* dbias, const void* dout,
                         DType dout_type, const float* inp, const float* weight, const float* mean,
                         const float* rstd, int64_t N, int64_t C, cudaStream_t stream,
                         bool accumulate = false, void* dinp_half = nullptr,
                         DType half = DType::bf16);

}  // namespace meshtrain::cuda
