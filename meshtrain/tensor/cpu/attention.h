// Causal scaled-dot-product attention, fused: QK^T, mask, softmax and the product with V in one
// kernel per (batch, head), working directly on the packed qkv activations of GPT-2's c_attn.
//
// Layouts:
//   qkv [B, T, 3C]: for each token, q in columns [0, C), k in [C, 2C), v in [2C, 3C); head h
//                   owns columns [h*HS, (h+1)*HS) of each part. sgemm reads the heads in place
//                   through its leading dimension, so no permute to [B, NH, T, HS] is needed.
//   out [B, T, C]:  heads concatenated along channels, ready for the output projection.
//   att [B, NH, T, T]: the softmax probabilities, saved for the backward; entries above the
//                   diagonal are written as 0. Keeping them (instead of a logsumexp and
//                   recomputing QK^T in the backward, flash-style) is faster on CPU at T <= 256
//                   where att is a few MB: the recompute would cost one more T x T x HS product
//                   and T*T/2 exps per head.
// The scale is 1/sqrt(HS). There is no dropout on the probabilities (p = 0); a model that wants
// it applies dropout.h to att between a split forward, which this fused kernel does not offer.
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// out[B, T, C] and att[B, NH, T, T] from qkv[B, T, 3C]. C must be divisible by NH.
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH);

// Accumulates dqkv[B, T, 3C] given dout[B, T, C] and the forward's qkv and att. scratch must hold
// B * NH * T * T floats; its contents on entry do not matter and are clobbered.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH);

}  // namespace meshtrain::cpu
