// GPT as a ModelStack: layer costs, balanced partitions, and stages that hold the whole model's
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

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

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
      for (const LayerSpec& l : ls) total += l.cost;
      // Every parameter once, plus the tied head's projection counted on the head as well.
      nn::GPT whole(c);
      EXPECT_EQ(total, whole.num_parameters() + (tied ? c.vocab_size * c.n_embd : 0))
          << "tied " << tied << " bias " << bias;
      // Each layer built alone holds exactly its cost (the tied head: its copy of wte).
      for (size_t i = 0; i < ls.size(); ++i)
        EXPECT_EQ(stack.build(i, i + 1)->num_parameters(), ls[i].cost) << ls[i].name;
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
  const std::vector<LayerRange> two = stack.partition(2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0], (LayerRange{0, 3}));  // embedding + 2 blocks | 2 blocks + head
  EXPECT_EQ(two[1], (LayerRange{3, 6}));
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
  c.activation_checkpointing = "1,2";
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
