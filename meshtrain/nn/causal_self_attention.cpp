#include "meshtrain/nn/causal_self_attention.h"

#include "meshtrain/autograd/functional.h"

namespace meshtrain::nn {

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head, bool bias, Generator& gen,
                                         double proj_init_std)
    : n_head_(n_head) {
  MT_CHECK(n_head > 0 && n_embd % n_head == 0, "model width ", n_embd,
           " must be divisible by the number of heads ", n_head);
  c_attn_ = register_module("c_attn", std::make_shared<Linear>(n_embd, 3 * n_embd, bias, gen));
  c_proj_ =
      register_module("c_proj", std::make_shared<Linear>(n_embd, n_embd, bias, gen, proj_init_std));
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  Tensor qkv = c_attn_->forward(x);
  Tensor y = autograd::causal_attention(qkv, n_head_);
  return c_proj_->forward(y);
}

}  // namespace meshtrain::nn
