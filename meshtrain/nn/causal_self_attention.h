// GPT-2 attention: one projection to packed q, k, v (c_attn), fused causal attention over the
// heads, and the output projection (c_proj).
#pragma once

#include <memory>

#include "meshtrain/nn/linear.h"

namespace meshtrain::nn {

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t n_embd, int64_t n_head, bool bias, Generator& gen,
                      double proj_init_std);
  // x[B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) const;

 private:
  int64_t n_head_;
  std::shared_ptr<Linear> c_attn_;
  std::shared_ptr<Linear> c_proj_;
};

}  // namespace meshtrain::nn
