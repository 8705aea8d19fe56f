// Causal attention over packed qkv with the T x T products on cuBLASLt: the heads are split into a
// [B, NH, T, HS] layout, scores = q k^T * scale and y = att v are batched GEMMs over the B * NH
// heads, and a row kernel applies the causal softmax. Same interface, layouts and saved att as
// attention.h (the simple kernels, which stay as the reference it is tested against); it computes
// the full T x T products (the masked half too), trading those FLOPs for tensor-core GEMMs.
// Device scratch (4 to 7 arrays of B * T * C floats) comes from the caching allocator.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

void attention_forward_gemm(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                            int64_t C, int64_t NH, cudaStream_t stream);

// scratch holds B * NH * T * T floats, as for attention_backward.
void attention_backward_gemm(float* dqkv, float* scratch, const float* dout, const float* qkv,
                             const float* att, int64_t B, int64_t T, int64_t C, int64_t NH,
                             cudaStream_t stream);

}  // namespace meshtrain::cuda
