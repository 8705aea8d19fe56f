// The pieces of the GEMM-based attention (attention_gemm.h) that are not matrix products: moving
// heads between the packed [B, T, C] / [B, T, 3C] layouts and the per-head [B, NH, T, HS] layout
// the batched products need, and the causal softmax over the T x T score rows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

// q, k, v [B, NH, T, HS] from qkv [B, T, 3C].
void split_qkv(float* q, float* k, float* v, const float* qkv, int64_t B, int64_t T, int64_t C,
               int64_t NH, cudaStream_t stream);
// dqkv [B, T, 3C] (written) from dq, dk, dv [B, NH, T, HS].
void merge_qkv(float* dqkv, const float* dq, const float* dk, const float* dv, int64_t B, int64_t T,
               int64_t C, int64_t NH, cudaStream_t stream);
// y [B, NH, T, HS] from x [B, T, C], and back.
void split_heads(float* y, const float* x, int64_t B, int64_t T, int64_t C, int64_t NH,
                 cudaStream_t stream);
void merge_heads(float* x, const float* y, int64_t B, int64_t T, int64_t C, int64_t NH,
                 cudaStream_t stream);

// In place over att [rows, T], row r being query t = r % T: softmax over keys s <= t, zeros
// for s > t (the causal mask).
void causal_softmax_forward(float* att, int64_t rows, int64_t T, cudaStream_t stream);
// In place: g [rows, T] holds d(att) on entry and d(scores) = att * (g - sum(att * g)) on exit,
// zeros for s > t.
void causal_softmax_backward(float* g, const float* att, int64_t rows, int64_t T,
                             cudaStream_t stream);

}  // namespace meshtrain::cuda
