// GPT-2 attention: one projection to packed q, k, v (c_attn), fused causal attention over the
// heads, and the output projection (c_proj). Built through a layer factory: plain, it is the
// whole layer; tensor-parallel, c_attn is column-parallel in q/k/v blocks and c_proj
// row-parallel, so a rank computes its share of the heads.
#pragma once

#include <memory>

#include "meshtrain/nn/gpt_layers.h"

namespace meshtrain::nn {

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t n_embd, int64_t n_head, bool bias, const GPTLayers& layers,
                      Generator& gen, double proj_init_std);
  // x[B, T, C] -> [B, T, C] (or this rank's time steps of both under sequence parallelism).
  Tensor forward(const Tensor& x) const;
  // residual + forward(x), the sum made by the output projection (Layer::forward_residual).
  Tensor forward_residual(const Tensor& residual, const Tensor& x) const;
  // Whether forward takes x in autocast's type too (its first op is c_attn's product).
  bool takes_half_input() const { return c_attn_->takes_half_input(); }

 private:
  // The attention's output, the input of c_proj (rounded where c_proj takes a half input).
  Tensor heads(const Tensor& x) const;

  int64_t local_heads_;
  std::shared_ptr<Layer> c_attn_;
  std::shared_ptr<Layer> c_proj_;
};

}  // namespace meshtrain::nn
