// GPT as a ModelStack: layer costs (parameters and FLOPs), balanced partitions by either, and
// stages that hold the whole model's
// parameters bit for bit and compute its loss and gradients when chained as a pipeline would.
#include "meshtrain/models/gpt_stack.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/util/error.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain::models {
namespace {

nn::GPTConfig tiny(bool tied = true, bool bias = true) {
  nn::GPTConfig c;
  c.vocab_size = 37;
  c.block_size = 8;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 16;
  c.seed = 11;
  c.tie_embeddings = tied;
  c.bias = bias;
  return c;
}

using testing::same_bits;

std::map<std::string, Tensor> by_name(const nn::NamedTensors& ts) {
  std::map<std::string, Tensor> out;
  for (const auto& [n, t] : ts) out[n] = t;
  return out;
}

Tensor tokens(int64_t B, int64_t T, int64_t V, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(B * T));
  for (int32_t& x : v) x = static_cast<int32_t>(rng() % static_cast<unsigned>(V));
  return Tensor::from_vector(v, {B, T});
}

TEST(GPTStack, LayersCostTheirParameters) {
  for (bool tied : {true, false})
    for (bool bias : {true, false}) {
      const nn::GPTConfig c = tiny(tied, bias);
      GPTStack stack(c);
      const auto& ls = stack.layers();
      ASSERT_EQ(ls.size(), 6u);
      EXPECT_EQ(ls.front().name, "embedding");
      EXPECT_EQ(ls[3].name, "h.2");
      EXPECT_EQ(ls.back().name, "head");
      int64_t total = 0;
      for (const LayerSpec& l : ls) total += l.params;
      // Every parameter once, plus the tied head's projection counted on the head as well.
      nn::GPT whole(c);
      EXPECT_EQ(total, whole.num_parameters() + (tied ? c.vocab_size * c.n_embd : 0))
          << "tied " << tied << " bias " << bias;
      // Each layer built alone holds exactly its cost (the tied head: its copy of wte).
      for (size_t i = 0; i < ls.size(); ++i)
        EXPECT_EQ(stack.build(i, i + 1)->num_parameters(), ls[i].params) << ls[i].name;
    }
}

// Forward plus backward FLOPs per token, counted by hand for tiny() (C = 16, T = 8, V = 37):
// a block's products 2 x 12C^2 = 6144 and attention 4TC = 512 per token forward, three times
// that with the backward, four times with a checkpointed block's second forward; the head's
// projection 2VC = 1184, three times, and the loss 5V = 185; the embedding 3C.
TEST(GPTStack, LayersCountTheirForwardAndBackwardFlops) {
  nn::GPTConfig c = tiny();
  c.checkpointed_blocks = nn::parse_activation_checkpointing("1", c.n_layer);
  GPTStack stack(c);
  const auto& ls = stack.layers();
  ASSERT_EQ(ls.size(), 6u);
  EXPECT_EQ(ls[0].flops, 48);
  EXPECT_EQ(ls[1].flops, 3 * 6656);
  EXPECT_EQ(ls[2].flops, 4 * 6656);  // h.1 is checkpointed
  EXPECT_EQ(ls[3].flops, 3 * 6656);
  EXPECT_EQ(ls[5].flops, 3 * 1184 + 185);
  // Bias and tying change the parameters, not the arithmetic.
  for (bool tied : {true, false})
    for (bool bias : {true, false}) {
      nn::GPTConfig d = tiny(tied, bias);
      d.checkpointed_blocks = nn::parse_activation_checkpointing("1", d.n_layer);
      const GPTStack other_stack(d);
      const auto& other = other_stack.layers();
      for (size_t i = 0; i < ls.size(); ++i) EXPECT_EQ(other[i].flops, ls[i].flops) << i;
    }
}

TEST(GPTStack, BalancedRangesAreOptimalAndContiguous) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t L = 1 + rng() % 9;
    std::vector<int64_t> costs(L);
    for (int64_t& c : costs) c = 1 + static_cast<int64_t>(rng() % 20);
    const int parts = 1 + static_cast<int>(rng() % L);
    const std::vector<LayerRange> got = balanced_ranges(costs, parts);
    ASSERT_EQ(got.size(), static_cast<size_t>(parts));
    size_t at = 0;
    int64_t worst = 0;
    for (const LayerRange& r : got) {
      ASSERT_EQ(r.begin, at);
      ASSERT_LT(r.begin, r.end);
      worst =
          std::max(worst, std::accumulate(costs.begin() + static_cast<int64_t>(r.begin),
                                          costs.begin() + static_cast<int64_t>(r.end), int64_t{0}));
      at = r.end;
    }
    ASSERT_EQ(at, L);
    // Brute force over every placement of the parts - 1 cuts among the L - 1 gaps.
    int64_t optimum = std::numeric_limits<int64_t>::max();
    for (uint32_t mask = 0; mask < (1u << (L - 1)); ++mask) {
      if (__builtin_popcount(mask) != parts - 1) continue;
      int64_t run = 0, w = 0;
      for (size_t i = 0; i < L; ++i) {
        run += costs[i];
        if (i == L - 1 || (mask >> i & 1u)) {
          w = std::max(w, run);
          run = 0;
        }
      }
      optimum = std::min(optimum, w);
    }
    EXPECT_EQ(worst, optimum) << "trial " << trial;
  }
}

TEST(GPTStack, PartitionBalancesAndNamesTheKeysWhenTooFine) {
  nn::GPTConfig c = tiny();
  c.vocab_size = 2000;  // embedding and head outweigh a block (3 kparams) many times
  GPTStack stack(c);
  const std::vector<LayerRange> two = stack.partition(2, 1, PartitionCost::params);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0], (LayerRange{0, 3}));  // embedding + 2 blocks | 2 blocks + head
  EXPECT_EQ(two[1], (LayerRange{3, 6}));
  // By FLOPs the embedding is a lookup and the head's projection (2VC per token, 10 blocks'
  // worth) is the heaviest layer: it gets the last stage alone.
  const std::vector<LayerRange> by_flops = stack.partition(2);
  EXPECT_EQ(by_flops[0], (LayerRange{0, 5}));
  EXPECT_EQ(by_flops[1], (LayerRange{5, 6}));
  // Interleaved: range k belongs to virtual stage k.
  EXPECT_EQ(stack.partition(2, 3).size(), 6u);
  try {
    stack.partition(4, 2);
    ADD_FAILURE() << "8 pieces of 6 layers accepted";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("parallel.pp (4) x parallel.virtual_stages (2) = 8 pipeline pieces"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("only 6 layers (embedding ... head)"), std::string::npos) << msg;
  }
}

// For each cost kind and every number of pieces: contiguous ranges that start with the
// embedding and end with the head, each piece's cost no more than the best cut's largest one
// (brute force over the cuts), and every parameter of the model in exactly one piece (the tied
// head's copy aside).
TEST(GPTStack, EveryCostKindCutsTheWholeModelEmbeddingFirstHeadLast) {
  for (PartitionCost kind : {PartitionCost::flops, PartitionCost::params}) {
    SCOPED_TRACE(partition_cost_name(kind));
    for (int64_t vocab : {37, 2000}) {
      nn::GPTConfig c = tiny();
      c.vocab_size = vocab;
      GPTStack stack(c);
      const auto& ls = stack.layers();
      std::vector<int64_t> costs;
      for (const LayerSpec& l : ls) costs.push_back(layer_cost(l, kind));
      for (int parts = 1; parts <= 6; ++parts) {
        const std::vector<LayerRange> got = stack.partition(parts, 1, kind);
        ASSERT_EQ(got.size(), static_cast<size_t>(parts));
        EXPECT_EQ(got.front().begin, 0u);
        EXPECT_EQ(got.back().end, ls.size());
        EXPECT_TRUE(stack.build(got.front().begin, got.front().end)->is_first());
        EXPECT_TRUE(stack.build(got.back().begin, got.back().end)->is_last());
        int64_t worst = 0;
        std::map<std::string, int> held;
        for (size_t k = 0; k < got.size(); ++k) {
          if (k > 0) {
            EXPECT_EQ(got[k].begin, got[k - 1].end);
          }
          int64_t sum = 0;
          for (size_t i = got[k].begin; i < got[k].end; ++i) sum += costs[i];
          worst = std::max(worst, sum);
          for (const auto& [name, t] : stack.build(got[k].begin, got[k].end)->named_parameters())
            ++held[name];
        }
        const std::vector<LayerRange> best = balanced_ranges(costs, parts);
        int64_t optimum = 0;
        for (const LayerRange& r : best) {
          int64_t sum = 0;
          for (size_t i = r.begin; i < r.end; ++i) sum += costs[i];
          optimum = std::max(optimum, sum);
        }
        EXPECT_EQ(worst, optimum) << parts << " parts";
        nn::GPT whole(c);
        for (const auto& [name, t] : whole.named_parameters())
          EXPECT_EQ(held[name], name == "wte.weight" && parts > 1 ? 2 : 1) << name;
        EXPECT_EQ(held.size(), whole.named_parameters().size());
      }
    }
  }
}

// Every way of cutting tiny()'s 6 layers into 1-6 stages.
std::vector<std::vector<LayerRange>> all_partitions(const GPTStack& stack) {
  std::vector<std::vector<LayerRange>> out;
  for (int parts = 1; parts <= 6; ++parts) out.push_back(stack.partition(parts));
  out.push_back({{0, 1}, {1, 5}, {5, 6}});  // embedding alone, head alone
  return out;
}

TEST(GPTStack, StagesHoldTheWholeModelsParametersBitwise) {
  for (bool tied : {true, false}) {
    const nn::GPTConfig c = tiny(tied);
    nn::GPT whole(c);
    const auto want = by_name(whole.named_parameters());
    GPTStack stack(c);
    for (const auto& ranges : all_partitions(stack)) {
      std::map<std::string, int> seen;
      for (const LayerRange& r : ranges) {
        auto stage = stack.build(r.begin, r.end);
        EXPECT_EQ(stage->is_first(), r.begin == 0);
        EXPECT_EQ(stage->is_last(), r.end == 6);
        const auto infos = stage->param_infos();
        const auto params = stage->named_parameters();
        ASSERT_EQ(infos.size(), params.size());
        for (size_t i = 0; i < params.size(); ++i) {
          const auto& [name, t] = params[i];
          ASSERT_TRUE(want.count(name)) << name << " is not a parameter of the whole model";
          EXPECT_TRUE(same_bits(t, want.at(name)))
              << name << " differs in stage [" << r.begin << ", " << r.end << ")";
          EXPECT_EQ(infos[i].tie_group, tied && name == "wte.weight" ? "wte" : "") << name;
          ++seen[name];
        }
      }
      // Every parameter somewhere; only the tied table twice, and only when the head and the
      // embedding are on different stages.
      EXPECT_EQ(seen.size(), want.size());
      for (const auto& [name, n] : seen) {
        const bool copied = tied && name == "wte.weight" && ranges.size() > 1;
        EXPECT_EQ(n, copied ? 2 : 1) << name;
      }
    }
  }
}

TEST(GPTStack, ChainedStagesGiveTheWholeModelsLossAndGradients) {
  nn::GPTConfig c = tiny();
  c.dropout = 0.1f;  // the stages must draw the whole model's masks
  c.checkpointed_blocks = nn::parse_activation_checkpointing("1,2", c.n_layer);
  const Tensor idx = tokens(2, 8, c.vocab_size, 1);
  const Tensor targets = tokens(2, 8, c.vocab_size, 2);
  const uint64_t seed = 77;
  nn::GPT whole(c);
  const Tensor whole_loss = whole.loss(idx, targets, seed);
  autograd::backward(whole_loss);
  const auto want_grads = [&] {
    std::map<std::string, Tensor> g;
    for (const auto& [n, t] : whole.named_parameters()) g[n] = t.grad();
    return g;
  }();
  GPTStack stack(c);
  for (const auto& ranges : all_partitions(stack)) {
    std::vector<std::unique_ptr<StageModule>> stages;
    for (const LayerRange& r : ranges) stages.push_back(stack.build(r.begin, r.end));
    // Forward as a pipeline does: each stage starts from a detached copy of what it received.
    std::vector<Tensor> inputs, outputs;
    Tensor x = idx;
    for (size_t s = 0; s < stages.size(); ++s) {
      Tensor in = s == 0 ? x : x.detach().set_requires_grad(true);
      inputs.push_back(in);
      x = stages[s]->forward(in, targets, seed);
      outputs.push_back(x);
    }
    ASSERT_TRUE(same_bits(x, whole_loss))
        << ranges.size() << " stages: loss " << x.item() << " vs " << whole_loss.item();
    // Backward from the last stage, handing each input's gradient to the stage before.
    for (size_t s = stages.size(); s-- > 0;) {
      if (s + 1 == stages.size())
        autograd::backward(outputs[s]);
      else
        autograd::backward(outputs[s], inputs[s + 1].grad());
    }
    std::map<std::string, Tensor> wte_copies;
    for (size_t s = 0; s < stages.size(); ++s)
      for (const auto& [name, t] : stages[s]->named_parameters()) {
        if (name == "wte.weight" && stages.size() > 1) {
          wte_copies[s == 0 ? "embedding" : "head"] = t.grad();
          continue;
        }
        EXPECT_TRUE(same_bits(t.grad(), want_grads.at(name)))
            << name << " gradient differs with " << ranges.size() << " stages";
      }
    if (stages.size() > 1) {
      // The tie group's sum: the whole model adds the head's and the embedding's contributions
      // into one gradient, the pipeline adds its two copies' gradients.
      ASSERT_EQ(wte_copies.size(), 2u);
      const std::vector<float> a = wte_copies["embedding"].to_vector();
      const std::vector<float> b = wte_copies["head"].to_vector();
      const std::vector<float> w = want_grads.at("wte.weight").to_vector();
      ASSERT_EQ(a.size(), w.size());
      for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(a[i] + b[i], w[i]) << "wte element " << i;
    }
  }
}

}  // namespace
}  // namespace meshtrain::models
