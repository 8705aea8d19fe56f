#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::nn {
namespace {

GPTConfig tiny() {
  GPTConfig c;
  c.vocab_size = 37;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

TEST(GPT, ParameterNamesFollowGpt2) {
  GPT model(tiny());
  std::vector<std::string> names;
  for (auto& [n, t] : model.named_parameters()) names.push_back(n);
  const std::vector<std::string> expect_prefix = {"wte.weight",
                                                  "wpe.weight",
                                                  "h.0.ln_1.weight",
                                                  "h.0.ln_1.bias",
                                                  "h.0.attn.c_attn.weight",
                                                  "h.0.attn.c_attn.bias",
                                                  "h.0.attn.c_proj.weight",
                                                  "h.0.attn.c_proj.bias",
                                                  "h.0.ln_2.weight",
                                                  "h.0.ln_2.bias",
                                                  "h.0.mlp.c_fc.weight",
                                                  "h.0.mlp.c_fc.bias",
                                                  "h.0.mlp.c_proj.weight",
                                                  "h.0.mlp.c_proj.bias"};
  ASSERT_GE(names.size(), expect_prefix.size());
  for (size_t i = 0; i < expect_prefix.size(); ++i) EXPECT_EQ(names[i], expect_prefix[i]);
  EXPECT_EQ(names.back(), "ln_f.bias");
  EXPECT_EQ(names.size(), 2u + 12u * 2u + 2u);
  // Tied head: no separate lm_head tensor; the count is the GPT-2 formula.
  const int64_t C = 16, V = 37, T = 16, L = 2;
  EXPECT_EQ(model.num_parameters(), V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C);
}

TEST(GPT, InitialLossIsLogVocab) {
  GPT model(tiny());
  Generator g(3);
  std::vector<int32_t> ids(2 * 16);
  for (auto& t : ids) t = static_cast<int32_t>(g.below(37));
  std::vector<int32_t> next(ids.size());
  for (auto& t : next) t = static_cast<int32_t>(g.below(37));
  // Independent targets: with tied embeddings, target == input would score above chance.
  Tensor x = Tensor::from_vector(ids, {2, 16}), y = Tensor::from_vector(next, {2, 16});
  const float loss = model.loss(x, y).item();
  EXPECT_NEAR(loss, std::log(37.0), 0.15);
}

std::vector<float> train_losses(uint64_t seed, int steps) {
  GPTConfig c = tiny();
  c.seed = seed;
  GPT model(c);
  auto params = model.named_parameters();
  optim::AdamWOptions o;
  o.lr = 1e-2f;
  optim::AdamW opt(params, o);
  Generator g(7);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    // A learnable pattern: token t+1 = (token t + 3) mod V.
    std::vector<int32_t> x(4 * 16), y(4 * 16);
    for (int b = 0; b < 4; ++b) {
      int32_t t = static_cast<int32_t>(g.below(37));
      for (int i = 0; i < 16; ++i) {
        x[b * 16 + i] = t;
        t = (t + 3) % 37;
        y[b * 16 + i] = t;
      }
    }
    opt.zero_grad();
    Tensor loss = model.loss(Tensor::from_vector(x, {4, 16}), Tensor::from_vector(y, {4, 16}));
    autograd::backward(loss);
    opt.step();
    losses.push_back(loss.item());
  }
  return losses;
}

TEST(GPT, SameSeedGivesBitwiseIdenticalLosses) {
  auto a = train_losses(11, 8), b = train_losses(11, 8), c = train_losses(12, 8);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;
  EXPECT_NE(a.back(), c.back());
}

TEST(GPT, LearnsASimplePattern) {
  auto l = train_losses(5, 60);
  EXPECT_GT(l.front(), 3.0f);
  EXPECT_LT(l.back(), 0.5f) << "loss did not fall on a deterministic sequence";
}

TEST(GPT, GenerateIsDeterministicAndInVocab) {
  GPT model(tiny());
  Generator g1(9), g2(9);
  auto a = model.generate({1, 2, 3}, 20, 1.0f, 0, g1);
  auto b = model.generate({1, 2, 3}, 20, 1.0f, 0, g2);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 20u);
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < 37);
}

TEST(GPT, TheWholeRangeIsTheWholeModel) {
  const GPT whole(tiny());
  const GPT range(tiny(), plain_gpt_layers(), 0, 4);
  Generator g(3);
  std::vector<int32_t> ids(2 * 8);
  for (auto& t : ids) t = static_cast<int32_t>(g.below(37));
  const Tensor idx = Tensor::from_vector(ids, {2, 8});
  EXPECT_EQ(whole.loss(idx, idx).to_vector(), range.loss(idx, idx).to_vector());
  EXPECT_TRUE(range.is_first() && range.is_last());
}

TEST(GPT, APartOfTheModelRefusesWholeModelCalls) {
  GPT stage(tiny(), plain_gpt_layers(), 1, 3);
  EXPECT_FALSE(stage.is_first());
  EXPECT_FALSE(stage.is_last());
  EXPECT_EQ(stage.num_blocks(), 2u);
  const Tensor idx = Tensor::from_vector(std::vector<int32_t>{1, 2}, {1, 2});
  EXPECT_THROW(stage.forward(idx), Error);
  EXPECT_THROW(stage.loss(idx, idx), Error);
  Generator g(1);
  EXPECT_THROW(stage.generate({1}, 2, 1.0f, 0, g), Error);
  EXPECT_THROW(GPT(tiny(), plain_gpt_layers(), 2, 2), Error);
  EXPECT_THROW(GPT(tiny(), plain_gpt_layers(), 0, 5), Error);
}

TEST(GPT, RejectsBadShapes) {
  GPTConfig c = tiny();
  c.n_embd = 15;
  EXPECT_THROW(GPT{c}, ValueError);
  GPT model(tiny());
  Tensor too_long = Tensor::zeros({1, 17}, DType::i32);
  EXPECT_THROW(model.loss(too_long, too_long), Error);
}

}  // namespace
}  // namespace meshtrain::nn
