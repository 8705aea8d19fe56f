#include "meshtrain/nn/gpt_costs.h"

#include "meshtrain/nn/gpt.h"

namespace meshtrain::nn {

int64_t gpt_norm_params(const GPTConfig& c) {
  return c.bias ? 2 * c.n_embd : c.n_embd;
}

namespace {

bool is_moe(const GPTConfig& c, int64_t block) {
  return block >= 0 && c.moe.is_moe_block(block);
}

// One GPT-2 MLP of H hidden features: c_fc [H, C] (+ H), c_proj [C, H] (+ C).
int64_t mlp_params(const GPTConfig& c, int64_t H) {
  return 2 * H * c.n_embd + (c.bias ? H + c.n_embd : 0);
}

int64_t expert_hidden(const GPTConfig& c) {
  return c.moe.expert_hidden > 0 ? c.moe.expert_hidden : 4 * c.n_embd;
}

}  // namespace

int64_t gpt_block_params(const GPTConfig& c, int64_t tp, int64_t block) {
  if (is_moe(c, block))
    return gpt_block_params(c, tp) - mlp_params(c, 4 * c.n_embd) +
           c.moe.num_experts * (mlp_params(c, expert_hidden(c)) + c.n_embd);  // experts, router
  const int64_t C = c.n_embd;
  // c_attn 3C^2 (+ 3C), attn c_proj C^2, c_fc 4C^2 (+ 4C), mlp c_proj 4C^2: split.
  const int64_t split = 12 * C * C + (c.bias ? 7 * C : 0);
  // ln_1, ln_2 and the two c_proj biases: replicated.
  const int64_t replicated = 2 * gpt_norm_params(c) + (c.bias ? 2 * C : 0);
  return (split + tp - 1) / tp + replicated;
}

int64_t gpt_expert_params(const GPTConfig& c) {
  return mlp_params(c, expert_hidden(c));
}

int64_t gpt_embedding_layer_params(const GPTConfig& c) {
  return c.vocab_size * c.n_embd + c.block_size * c.n_embd;
}

int64_t gpt_head_layer_params(const GPTConfig& c) {
  return gpt_norm_params(c) + c.vocab_size * c.n_embd;
}

int64_t gpt_params(const GPTConfig& c) {
  int64_t blocks = 0;
  for (int64_t i = 0; i < c.n_layer; ++i) blocks += gpt_block_params(c, 1, i);
  return blocks + gpt_embedding_layer_params(c) + gpt_head_layer_params(c) -
         (c.tie_embeddings ? c.vocab_size * c.n_embd : 0);
}

// FLOPs per token of the forward (a multiply-add counts 2): the embedding gathers and adds two
// rows (C); a block's matrix products 2 x 12C^2, and attention's scores and weighted sum
// 2 x 2TC against the T = block_size positions of a sequence; the head's projection 2VC and the
// loss, a softmax over V (about 5V with its gradient). The backward costs twice the forward
// (gradients of the inputs and of the weights). Norms, GELU and residual adds (tens of C) are
// left out.
int64_t gpt_embedding_layer_flops(const GPTConfig& c) {
  return 3 * c.n_embd;
}

int64_t gpt_block_flops(const GPTConfig& c, bool checkpointed, int64_t block) {
  const int64_t C = c.n_embd, T = c.block_size;
  int64_t forward = 24 * C * C + 4 * T * C;
  // A token passes top_k experts' MLPs (2 x 2CH each) instead of the dense one, and the router.
  if (is_moe(c, block))
    forward += c.moe.top_k * 4 * C * expert_hidden(c) - 16 * C * C + 2 * C * c.moe.num_experts;
  return (checkpointed ? 4 : 3) * forward;
}

int64_t gpt_head_layer_flops(const GPTConfig& c) {
  return 3 * 2 * c.vocab_size * c.n_embd + 5 * c.vocab_size;
}

// 6 FLOPs per matmul parameter per token, plus attention scores and values: 6 * T * C per block
// (forward and backward; causal masking halves the 12). Every term is a whole number far below
// 2^53, so the sums are exact in any order.
double gpt_block_flops_per_token(const GPTConfig& c, int64_t T, int64_t block) {
  const double C = static_cast<double>(c.n_embd);
  double matmul = 12.0 * C * C;
  // The active parameters: top_k experts' MLPs and the router.
  if (is_moe(c, block))
    matmul += static_cast<double>(c.moe.top_k) * 2.0 * C * static_cast<double>(expert_hidden(c)) -
              8.0 * C * C + C * static_cast<double>(c.moe.num_experts);
  return 6.0 * (matmul + static_cast<double>(T) * C);
}

double gpt_head_flops_per_token(const GPTConfig& c) {
  return 6.0 * static_cast<double>(c.vocab_size) * static_cast<double>(c.n_embd);
}

double gpt_flops_per_token(const GPTConfig& c, int64_t T) {
  double blocks = 0;
  for (int64_t i = 0; i < c.n_layer; ++i) blocks += gpt_block_flops_per_token(c, T, i);
  return blocks + gpt_head_flops_per_token(c);
}

}  // namespace meshtrain::nn
