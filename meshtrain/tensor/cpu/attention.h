// Causal scaled-dot-product attention, fused: QK^T, mask, softmax and the product with V in one
// kernel per (batch, head), working directly on the packed qkv activations of GPT-2's c_attn.
//
// Layouts:
//   qkv [B, T, 3C]: for each token, q in columns [0, C), k in [C, 2C), v in [2C, 3C); head h
//                   owns columns [h*HS, (h+1)*HS) of each part. sgemm reads the heads in place
//                   through its leading dimension, so no permute to [B, NH, T, HS] is needed.
//   out [B, T, C]:  heads concatenated along channels, ready for the output projection.
//   att [B, NH, T, T]: the softmax probabilities, saved for the backward; entries above the
//                   diagonal are written as 0. Keeping them beats a flash-style logsumexp +
//                   recompute on CPU at T <= 256, where att is a few MB per layer: measured on one
//                   thread, the recompute (QK^T and softmax again) costs 1.2 ms per layer at
//                   B=8,T=128,C=128,NH=4 against a 2.1 ms backward, and 4.3 ms at B=4,T=256,C=384,
//                   NH=6 against 9.5 ms.
// The scale is 1/sqrt(HS). Dropout on the probabilities is not offered (p = 0); it would go
// between the softmax and the PV product of each row block, with the mask regenerated from its
// seed in the backward (see dropout.h).
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// out[B, T, C] and att[B, NH, T, T] from qkv[B, T, 3C]. C must be divisible by NH.
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH);

// Writes dqkv[B, T, 3C] (every element exactly once: no zero-filled buffer needed) given dout[B, T,
// C] and the forward's qkv and att. scratch must hold B * NH * T * T floats; its contents on entry
// do not matter and are clobbered.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH);

}  // namespace meshtrain::cpu
