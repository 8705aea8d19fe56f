// Differentiable layer operations built on the fused kernels of tensor/cpu: one forward kernel
// and one backward kernel each, instead of a chain of small ops. The model code (nn/) calls
// these; each checks shapes and dtypes and names what is wrong.
#pragma once

#include <cstdint>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::autograd {

// Under autocast an activation may be in its half type, handed over rounded by its producer to a
// consumer that would round it anyway (out_type below); as under PyTorch's autocast, the gradient
// of a half activation is half (autograd converts any other, engine.h).
//
// x[..., C_in] @ weight[C_out, C_in]^T + bias[C_out] (bias may be undefined). x is f32, or
// under autocast already in the autocast type (the rounding the product would make). Under
// autocast out_type may be that type: the output (with its bias) rounded once by the product, for
// a consumer that reads it rounded anyway (attention's q, k, v; GELU's input).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
              DType out_type = DType::f32);
// residual + linear(x, weight, bias), f32, residual of the output's shape: a product whose output
// joins a residual stream (a transformer block's output projections). The values of
// add(residual, linear(...)) on the CPU (the product, then the sum); on a device the sum is made
// where the product is written (cuBLASLt reads the residual as its C), saving the separate
// addition's pass over three arrays. The residual's gradient is the output's.
Tensor linear_residual(const Tensor& residual, const Tensor& x, const Tensor& weight,
                       const Tensor& bias);
// LayerNorm over the last dimension; weight/bias [C] may be undefined. Under autocast out_type may
// be the autocast type: the output rounded by the norm itself, for a product that would round it
// anyway.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f,
                  DType out_type = DType::f32);
// GELU, tanh approximation (GPT-2; PyTorch approximate='tanh'). Under autocast it reads x rounded
// to the autocast type (autocast.h; x may come in that type), and out_type may be that type: the
// output rounded by GELU itself, for a product that would round it anyway.
Tensor gelu(const Tensor& x, DType out_type = DType::f32);
// ReLU, max(x, 0) elementwise (CPU only).
Tensor relu(const Tensor& x);
// Softmax over the last dimension.
Tensor softmax(const Tensor& x);
// Causal scaled-dot-product attention over packed qkv[B, T, 3C] -> [B, T, C]. Under autocast it
// reads q, k, v rounded to the autocast type (autocast.h; qkv may come in that type), and
// out_type may be that type: the
// output rounded by the attention itself, for a product that would round it anyway (flash
// attention then keeps that copy, not an f32 one, for its backward).
Tensor causal_attention(const Tensor& qkv, int64_t n_head, DType out_type = DType::f32);
// Mean cross-entropy of logits[N, V] against i32 targets[N]; rows equal to ignore_index skipped.
// label_smoothing in [0, 1) mixes a uniform target into the one-hot one (PyTorch's semantics),
// on the CPU and on a device.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index = -1,
                     float label_smoothing = 0.0f);
// GPT input embedding: wte[idx] + wpe[0:T] for i32 idx[B, T].
Tensor gpt_embedding(const Tensor& idx, const Tensor& wte, const Tensor& wpe);
// Table lookup: table[idx] for i32 idx of any shape -> [..., C].
Tensor embedding(const Tensor& idx, const Tensor& table);
// x on `device` (x itself when it is there); the gradient goes back to x's device. For small
// tensors a device computes nothing worth launching for, as a mixture of experts' router: its
// [tokens, experts] probabilities decide on the host.
Tensor to_device(const Tensor& x, Device device);
// Inverted dropout with a counter-based mask: the same (seed, offset) gives the same mask on any
// thread count, and on a device the CPU's mask. Identity when p == 0 or not training.
Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset, bool training);

}  // namespace meshtrain::autograd
