// Causal attention over packed qkv on the device; the layouts and semantics of
// tensor/cpu/attention.h (att [B, NH, T, T] saved by the forward, dqkv written once per element,
// scratch of B * NH * T * T floats for the backward).
//
// This is the simple, correct version that the fast one will be tested against: one block per
// query row, scores in shared memory, O(T^2) memory for att. A flash-style kernel (tiles of K and
// V in shared memory, online softmax, logsumexp saved instead of att) replaces it for speed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

// out[B, T, C] and att[B, NH, T, T] from qkv[B, T, 3C]; C must be divisible by NH.
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, cudaStream_t stream);

// Writes dqkv[B, T, 3C] from dout[B, T, C] and the forward's qkv and att.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH,
                        cudaStream_t stream);

}  // namespace meshtrain::cuda
