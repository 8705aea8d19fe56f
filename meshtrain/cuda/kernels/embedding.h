// GPT embedding lookups on the device; the semantics of tensor/cpu/embedding.h. An index outside
// [0, V) cannot throw in a kernel (the CPU's throws; the trainer checks a dataset's tokens against
// the vocabulary before it starts): its output row is NaN, nothing outside the tables is read or
// written, and its position adds nothing to the token table's gradient (the position table's
// gradient still sums its row).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

// out[B, T, C] = wte[idx[b, t], :] + wpe[t, :].
void gpt_embedding_forward(float* out, const int32_t* idx, const float* wte, const float* wpe,
                           int64_t B, int64_t T, int64_t C, int64_t V, cudaStream_t stream);

// dwte[v] += the sum of dout[b, t] over the positions (b, t) of token v, added up in position
// order from zero, and dwpe[t] += the sum over b of dout[b, t], in batch order; either gradient
// may be null. The same bits on every run: into a zero table, the CPU kernel's; into a table
// holding another gradient, that gradient plus this one, as a separate addition would give.
void gpt_embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* idx,
                            int64_t B, int64_t T, int64_t C, int64_t V, cudaStream_t stream);

// A vocabulary-parallel table's rows [begin, begin + valid) (tensor/cpu/embedding.h's
// vocab_lookup_*): out[n] = table[idx[n] - begin] or zeros for an id held elsewhere; the backward
// adds each held row's sum over its positions, in position order from zero, as above.
void vocab_lookup_forward(float* out, const int32_t* idx, const float* table, int64_t N, int64_t C,
                          int64_t begin, int64_t valid, cudaStream_t stream);
void vocab_lookup_backward(float* dtable, const float* dout, const int32_t* idx, int64_t N,
                           int64_t C, int64_t begin, int64_t valid, cudaStream_t stream);

}  // namespace meshtrain::cuda
