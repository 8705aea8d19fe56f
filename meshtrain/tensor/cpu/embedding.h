// Embedding lookups: GPT's token + position embedding, and a plain table lookup. The backwards
// scatter into the tables without atomics and in a fixed order (see embedding.cpp), so repeated
// tokens accumulate deterministically.
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// out[B, T, C] = wte[idx[b, t], :] + wpe[t, :], for idx[B, T] in [0, V) and wte[V, C], wpe[>=T, C].
// An index outside [0, V) fails an MT_CHECK.
void gpt_embedding_forward(float* out, const int32_t* idx, const float* wte, const float* wpe,
                           int64_t B, int64_t T, int64_t C, int64_t V);

// Accumulates dwte[idx[b, t]] += dout[b, t] and dwpe[t] += sum over b of dout[b, t].
// Either gradient may be nullptr.
void gpt_embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* idx,
                            int64_t B, int64_t T, int64_t C, int64_t V);

// out[N, C] = table[idx[n], :] for idx[N] in [0, V) and table[V, C].
void embedding_forward(float* out, const int32_t* idx, const float* table, int64_t N, int64_t C,
                       int64_t V);

// Accumulates dtable[idx[n]] += dout[n].
void embedding_backward(float* dtable, const float* dout, const int32_t* idx, int64_t N, int64_t C,
                        int64_t V);

// A vocabulary-parallel table's lookup: this rank holds rows [begin, begin + valid) of the whole
// table as table[valid, C]. out[n, :] = table[idx[n] - begin, :] for the ids it holds, zeros for
// the others (another rank's; any id is allowed).
void vocab_lookup_forward(float* out, const int32_t* idx, const float* table, int64_t N, int64_t C,
                          int64_t begin, int64_t valid);

// Accumulates dtable[idx[n] - begin] += dout[n] for the ids held, in n order.
void vocab_lookup_backward(float* dtable, const float* dout, const int32_t* idx, int64_t N,
                           int64_t C, int64_t begin, int64_t valid);

}  // namespace meshtrain::cpu
