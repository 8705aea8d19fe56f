// The GPT's parameter counts, written once in gpt_costs.h for the layer list, the MFU report and
// the planner, against the tensors the model actually holds.
#include "meshtrain/nn/gpt_costs.h"

#include <gtest/gtest.h>

#include "meshtrain/nn/gpt.h"

namespace meshtrain::nn {
namespace {

GPTConfig tiny(bool tied, bool bias) {
  GPTConfig c;
  c.vocab_size = 37;
  c.block_size = 8;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 16;
  c.tie_embeddings = tied;
  c.bias = bias;
  return c;
}

int64_t numel(const NamedTensors& ts, const std::string& prefix = "") {
  int64_t n = 0;
  for (const auto& [name, t] : ts)
    if (name.rfind(prefix, 0) == 0) n += t.numel();
  return n;
}

TEST(GptCosts, ParameterCountsAreTheModelsTensors) {
  for (bool tied : {true, false})
    for (bool bias : {true, false}) {
      const GPTConfig c = tiny(tied, bias);
      const GPT model(c);
      const NamedTensors params = model.named_parameters();
      EXPECT_EQ(gpt_params(c), numel(params)) << tied << bias;
      EXPECT_EQ(gpt_block_params(c), numel(model.block_parameters(1))) << tied << bias;
      EXPECT_EQ(gpt_norm_params(c), numel(params, "ln_f.")) << tied << bias;
      EXPECT_EQ(gpt_embedding_layer_params(c), numel(params, "wte.") + numel(params, "wpe."));
      // A last stage alone holds the head layer: ln_f and a [V, C] projection, tied or not.
      const GPT head(c, plain_gpt_layers(), 4, 5);
      EXPECT_EQ(gpt_head_layer_params(c), numel(head.named_parameters())) << tied << bias;
    }
}

TEST(GptCosts, ATensorParallelRanksBlockHoldsItsShareOfTheMatrices) {
  const GPTConfig c = tiny(true, true);
  const int64_t C = c.n_embd;
  // Split: 12 C^2 weights and the c_attn and c_fc biases (7C); replicated: two norms and the two
  // c_proj biases.
  EXPECT_EQ(gpt_block_params(c, 2), (12 * C * C + 7 * C) / 2 + 4 * C + 2 * C);
  EXPECT_EQ(gpt_block_params(c, 1), gpt_block_params(c));
}

TEST(GptCosts, FlopsPerTokenIsSixNPlusAttention) {
  const GPTConfig c = tiny(true, true);
  const double C = 16, L = 3, V = 37, T = 8;
  EXPECT_DOUBLE_EQ(c.flops_per_token(8), 6 * (L * 12 * C * C + V * C) + 6 * L * T * C);
  EXPECT_EQ(gpt_block_flops(c, true) * 3, gpt_block_flops(c, false) * 4);
}

}  // namespace
}  // namespace meshtrain::nn
