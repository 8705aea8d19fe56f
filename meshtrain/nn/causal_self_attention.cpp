#include "meshtrain/nn/causal_self_attention.h"

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/functional.h"

namespace meshtrain::nn {

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head, bool bias,
                                         const GPTLayers& layers, Generator& gen,
                                         double proj_init_std)
    : local_heads_(n_head / layers.ranks()) {
  MT_CHECK(n_head > 0 && n_embd % n_head == 0, "model width ", n_embd,
           " must be divisible by the number of heads ", n_head);
  MT_CHECK(n_head % layers.ranks() == 0, "attention: ", n_head, " heads do not split over ",
           layers.ranks(), " tensor-parallel ranks");
  c_attn_ = register_module("c_attn", layers.column(n_embd, 3 * n_embd, bias, 0.02, 3, gen));
  c_proj_ = register_module("c_proj", layers.row(n_embd, n_embd, bias, proj_init_std, gen));
}

Tensor CausalSelfAttention::heads(const Tensor& x) const {
  // This rank's heads: q, k and v of heads [r * NH / tp, (r + 1) * NH / tp), packed as c_attn's.
  // Under autocast the attention reads them rounded: a projection that can round its output
  // hands them over in the half type.
  const Tensor qkv =
      c_attn_->forward_as(x, autograd::output_type_for(c_attn_->gives_half_output()));
  // Under autocast a projection that takes half inputs gets the output rounded by the attention.
  return autograd::causal_attention(qkv, local_heads_,
                                    autograd::output_type_for(c_proj_->takes_half_input()));
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  return c_proj_->forward(heads(x));
}

Tensor CausalSelfAttention::forward_residual(const Tensor& residual, const Tensor& x) const {
  return c_proj_->forward_residual(residual, heads(x));
}

}  // namespace meshtrain::nn
