// Activation checkpointing of GPT blocks: the gradients are bitwise those of the model without
// checkpointing (the recomputation runs the same kernels on the same inputs with the same
// dropout masks, and the gradients are summed in the same order), for every block or some,
// with dropout and under bf16 autocast; every parameter's gradient-ready hook fires once with
// the final gradient; and the memory that a forward pass leaves held for backward shrinks,
// measured with a counting allocator.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <map>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/tensor/storage.h"
#include "tests/support/counting_allocator.h"

namespace meshtrain::nn {
namespace {

GPTConfig small(float dropout) {
  GPTConfig c;
  c.vocab_size = 41;
  c.block_size = 24;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 32;
  c.dropout = dropout;
  c.seed = 21;
  return c;
}

std::pair<Tensor, Tensor> batch(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator g(seed);
  std::vector<int32_t> x(static_cast<size_t>(B * T)), y(x.size());
  for (auto& t : x) t = static_cast<int32_t>(g.below(static_cast<uint64_t>(V)));
  for (auto& t : y) t = static_cast<int32_t>(g.below(static_cast<uint64_t>(V)));
  return {Tensor::from_vector(x, {B, T}), Tensor::from_vector(y, {B, T})};
}

struct Grads {
  float loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

// Two micro-batches accumulated, so the accumulation path is covered too.
Grads gradients(const GPTConfig& config, DType autocast = DType::f32) {
  GPT model(config);
  Grads out;
  for (uint64_t micro = 0; micro < 2; ++micro) {
    auto [x, y] = batch(3, config.block_size, config.vocab_size, 5 + micro);
    Tensor loss;
    {
      autograd::AutocastGuard cast(autocast);
      loss = model.loss(x, y, 1234 + micro);
    }
    autograd::backward(loss);
    out.loss += loss.item();
  }
  for (auto& [name, p] : model.named_parameters()) out.grads[name] = p.grad().to_vector();
  return out;
}

void expect_bitwise(const Grads& a, const Grads& b, const std::string& what) {
  EXPECT_EQ(a.loss, b.loss) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (const auto& [name, g] : a.grads) {
    const auto& h = b.grads.at(name);
    ASSERT_EQ(g.size(), h.size());
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_EQ(g[i], h[i]) << what << ": " << name << " element " << i;
  }
}

TEST(ActivationCheckpointing, ParsesSpecs) {
  using V = std::vector<bool>;
  EXPECT_EQ(parse_activation_checkpointing("none", 3), V({false, false, false}));
  EXPECT_EQ(parse_activation_checkpointing("", 3), V({false, false, false}));
  EXPECT_EQ(parse_activation_checkpointing("all", 3), V({true, true, true}));
  EXPECT_EQ(parse_activation_checkpointing("every:2", 5), V({true, false, true, false, true}));
  EXPECT_EQ(parse_activation_checkpointing("every:1", 2), V({true, true}));
  EXPECT_EQ(parse_activation_checkpointing("2,0", 4), V({true, false, true, false}));
  for (const char* bad : {"some", "every:0", "every:x", "0,4", "-1", "1,,2", "1,"}) {
    try {
      parse_activation_checkpointing(bad, 4);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("model.activation_checkpointing"), std::string::npos)
          << e.what();
    }
  }
  GPTConfig c = small(0.0f);
  c.checkpointed_blocks = std::vector<bool>(static_cast<size_t>(c.n_layer) + 1, true);
  EXPECT_THROW(GPT{c}, ValueError);
}

TEST(ActivationCheckpointing, GradientsAreBitwiseIdentical) {
  for (float dropout : {0.0f, 0.2f}) {
    GPTConfig c = small(dropout);
    const Grads ref = gradients(c);
    for (const char* spec : {"all", "1", "every:2", "0,3"}) {
      c.checkpointed_blocks = nn::parse_activation_checkpointing(spec, c.n_layer);
      expect_bitwise(gradients(c), ref, std::string(spec) + " dropout " + std::to_string(dropout));
    }
  }
}

TEST(ActivationCheckpointing, DropoutMasksAreThoseOfTheForward) {
  // Guard against a vacuous comparison: dropout really changes the gradients here, so equal
  // gradients above mean the recomputation drew the same masks.
  GPTConfig a = small(0.2f), b = small(0.2f);
  b.dropout = 0.0f;
  EXPECT_NE(gradients(a).grads.at("h.1.mlp.c_fc.weight"),
            gradients(b).grads.at("h.1.mlp.c_fc.weight"));
}

TEST(ActivationCheckpointing, RecomputesUnderTheForwardsAutocast) {
  // Backward runs outside the autocast scope; the recomputation must still round like the
  // forward did, or the gradients would differ.
  GPTConfig c = small(0.1f);
  const Grads ref = gradients(c, DType::bf16);
  c.checkpointed_blocks = nn::parse_activation_checkpointing("all", c.n_layer);
  expect_bitwise(gradients(c, DType::bf16), ref, "bf16");
  EXPECT_NE(gradients(c, DType::f32).loss, ref.loss);
}

TEST(ActivationCheckpointing, HooksFireOnceWithTheFinalGradient) {
  GPTConfig c = small(0.1f);
  c.checkpointed_blocks = nn::parse_activation_checkpointing("every:2", c.n_layer);
  GPT model(c);
  std::map<std::string, int> fired;
  std::map<std::string, std::vector<float>> seen;
  for (auto& [name, p] : model.named_parameters()) {
    Tensor t = p;
    autograd::register_grad_ready_hook(t, [&fired, &seen, name = name](const Tensor& param) {
      ++fired[name];
      seen[name] = param.grad().to_vector();
    });
  }
  auto [x, y] = batch(2, c.block_size, c.vocab_size, 9);
  autograd::backward(model.loss(x, y, 77));
  for (auto& [name, p] : model.named_parameters()) {
    EXPECT_EQ(fired[name], 1) << name;
    EXPECT_EQ(seen[name], p.grad().to_vector()) << name;
  }
}

struct Memory {
  int64_t held = 0;  // bytes alive after the forward beyond those alive before it
  int64_t peak = 0;  // the peak during forward and backward beyond the bytes alive before
};

Memory measure(const std::string& spec) {
  testing::CountingAllocator counting(allocator_for(DeviceType::cpu));
  set_allocator(DeviceType::cpu, &counting);
  Memory m;
  {
    GPTConfig c = small(0.1f);
    c.n_layer = 6;
    c.block_size = 64;
    c.checkpointed_blocks = nn::parse_activation_checkpointing(spec, c.n_layer);
    GPT model(c);
    auto [x, y] = batch(4, c.block_size, c.vocab_size, 3);
    const int64_t before = counting.live();
    counting.reset_peak();
    Tensor loss = model.loss(x, y, 5);
    m.held = counting.live() - before;
    autograd::backward(loss);
    m.peak = counting.peak() - before;
  }
  set_allocator(DeviceType::cpu, nullptr);
  return m;
}

TEST(ActivationCheckpointing, ForwardHoldsLessMemoryForBackward) {
  const Memory none = measure("none"), half = measure("every:2"), all = measure("all");
  // Per block without checkpointing: about 18 [B, T, C] activations plus the [B, NH, T, T]
  // attention weights; with it, the block's input only. The head (logits, softmax) stays.
  std::printf(
      "held after forward: none %lld, every:2 %lld, all %lld bytes; peak %lld, %lld, "
      "%lld bytes\n",
      static_cast<long long>(none.held), static_cast<long long>(half.held),
      static_cast<long long>(all.held), static_cast<long long>(none.peak),
      static_cast<long long>(half.peak), static_cast<long long>(all.peak));
  EXPECT_LT(half.held, none.held * 3 / 4);
  EXPECT_LT(all.held, half.held * 3 / 4);
  EXPECT_LT(all.held, none.held / 2);
  EXPECT_LT(all.peak, none.peak);
}

}  // namespace
}  // namespace meshtrain::nn
