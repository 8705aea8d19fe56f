// GELU (tanh approximation, GPT-2's) on the device; the semantics of tensor/cpu/gelu.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "meshtrain/tensor/dtype.h"

namespace meshtrain::cuda {

// out[n] = gelu(inp[n]); each array f32, bf16 or f16 (computed in f32, rounded once on the way
// out).
void gelu_forward(void* out, DType out_type, const void* inp, DType inp_type, int64_t n,
                  cudaStream_t stream);
// Autocast's GELU of an f32 input in one pass: inp_half[n] = inp rounded to `half` (bf16 or f16),
// kept for the backward, and out[n] = gelu(inp_half[n]), in f32 or rounded to `half` (out_type).
void gelu_forward_half(void* out, DType out_type, void* inp_half, const float* inp, DType half,
                       int64_t n, cudaStream_t stream);
// The same, but out[n] = gelu(inp[n]) of the f32 input itself (GELU in a product's epilogue, of
// the sum before it is rounded), inp_half the rounded copy all the same.
void gelu_forward_keep(void* out, DType out_type, void* inp_half, const float* inp, DType half,
                       int64_t n, cudaStream_t stream);
// dinp[n] = gelu'(inp[n]) * dout[n] (written, not accumulated); each array f32, bf16 or f16.
void gelu_backward(void* dinp, DType dinp_type, const void* inp, DType inp_type, const void* dout,
                   DType dout_type, int64_t n, cudaStream_t stream);

}  // namespace meshtrain::cuda
