// GPT embedding lookups on the device; the semantics of tensor/cpu/embedding.h. An index outside
// [0, V) cannot throw in a kernel: its output row is NaN and its gradient is dropped.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

// out[B, T, C] = wte[idx[b, t], :] + wpe[t, :].
void gpt_embedding_forward(float* out, const int32_t* idx, const float* wte, const float* wpe,
                           int64_t B, int64_t T, int64_t C, int64_t V, cudaStream_t stream);

// Accumulates dwte[idx[b, t]] += dout[b, t] and dwpe[t] += sum over b of dout[b, t]; either
// gradient may be null. dwpe is summed in batch order (deterministic); dwte uses atomic adds, so
// a token repeated within the batch accumulates in an unspecified order (last-bit differences
// between runs). A sorted, atomic-free version is future work.
void gpt_embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* idx,
                            int64_t B, int64_t T, int64_t C, int64_t V, cudaStream_t stream);

}  // namespace meshtrain::cuda
