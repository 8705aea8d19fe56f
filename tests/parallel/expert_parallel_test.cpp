// Expert parallelism inside the model: a tiny MoE GPT whose experts are shared out over 2 and 4
// ranks (threads over shm), each rank with its own batch, against the plain model on every
// rank's batch. The loss and every non-expert gradient are each rank's own plain ones, and an
// expert's gradient on the rank holding it is the sum of the plain gradients of every rank whose
// tokens it took (the all-to-all brought them), with top-1 and top-2, dropless and dropping, and
// one hot expert taking every token (so the ranks holding the others receive no rows at all).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/expert/expert_groups.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain::parallel {
namespace {

constexpr int64_t kB = 2, kT = 8, kExperts = 4;

nn::GPTConfig tiny(int64_t top_k, bool drop) {
  nn::GPTConfig c;
  c.vocab_size = 31;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.seed = 9;
  c.moe.every = 1;
  c.moe.num_experts = kExperts;
  c.moe.top_k = top_k;
  c.moe.drop_tokens = drop;
  c.moe.capacity_factor = 1.0;
  c.moe.min_capacity = 1;
  c.moe.aux_loss_weight = 0.1;
  c.moe.z_loss_weight = 0.01;
  return c;
}

std::pair<Tensor, Tensor> batch(int rank) {
  Generator g(700 + static_cast<uint64_t>(rank));
  std::vector<int32_t> x(static_cast<size_t>(kB * kT)), y(x.size());
  for (auto& t : x) t = static_cast<int32_t>(g.below(31));
  for (auto& t : y) t = static_cast<int32_t>(g.below(31));
  return {Tensor::from_vector(x, {kB, kT}), Tensor::from_vector(y, {kB, kT})};
}

struct Result {
  float loss = 0;
  std::map<std::string, Tensor> grads;
  std::vector<float> counters;
};

// One forward and backward of `model` on `rank`'s batch; `hot`: every router zeroed, so that
// every token's choices tie and go to the lowest experts.
Result run(nn::GPT& model, int rank, bool hot) {
  model.train();
  if (hot)
    for (auto& [name, p] : model.named_parameters())
      if (name.find("router") != std::string::npos) {
        Tensor t = p;
        t.zero_();
      }
  const auto [x, y] = batch(rank);
  Tensor loss = model.loss(x, y);
  autograd::backward(loss);
  Result r;
  r.loss = loss.item();
  for (auto& [name, p] : model.named_parameters()) r.grads[name] = p.grad().clone();
  r.counters = model.moe_context()->take_counters();
  return r;
}

void expect_close(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const std::vector<float> va = a.to_vector(), vb = b.to_vector();
  double scale = 1e-3, worst = 0;
  for (float v : vb) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < va.size(); ++i) worst = std::max(worst, std::fabs(double(va[i]) - vb[i]));
  // Only the order of the sums differs: an expert's rows from every rank in one GEMM.
  EXPECT_LE(worst, 1e-5 * scale) << what << " (scale " << scale << ")";
}

void compare(int ep, int64_t top_k, bool drop, bool hot) {
  SCOPED_TRACE("ep " + std::to_string(ep) + " top-" + std::to_string(top_k) +
               (drop ? " dropping" : " dropless") + (hot ? " hot expert" : ""));
  const nn::GPTConfig config = tiny(top_k, drop);
  std::vector<Result> plain(static_cast<size_t>(ep)), split(plain.size());
  for (int r = 0; r < ep; ++r) {
    nn::GPT model(config);
    plain[static_cast<size_t>(r)] = run(model, r, hot);
  }
  testing::run_shm_ranks(ep, [&](int r, const comm::ProcessGroupPtr& group) {
    nn::GPT model(config, group_expert_exchange(group));
    split[static_cast<size_t>(r)] = run(model, r, hot);
  });
  const int64_t share = kExperts / ep;
  for (int r = 0; r < ep; ++r) {
    const Result& mine = split[static_cast<size_t>(r)];
    const Result& ref = plain[static_cast<size_t>(r)];
    EXPECT_NEAR(mine.loss, ref.loss, 1e-6 * std::fabs(ref.loss)) << "rank " << r;
    // The routing is each rank's own: the same counts as its plain model's (the auxiliary
    // losses among the counters only within rounding: the second block's input went through
    // the first block's experts in a GEMM of other rows).
    // One more under expert parallelism: the seconds spent in the exchanges, forward and
    // backward.
    ASSERT_EQ(mine.counters.size(), ref.counters.size() + 1);
    EXPECT_GT(mine.counters.back(), 0.0f);
    for (size_t i = 0; i < ref.counters.size(); ++i)
      EXPECT_NEAR(mine.counters[i], ref.counters[i], 1e-6 * std::max(1.0f, ref.counters[i]))
          << "rank " << r << " counter " << i;
    size_t experts_here = 0;
    for (const auto& [name, g] : mine.grads) {
      const size_t at = name.find(".experts.");
      if (at == std::string::npos) {
        expect_close(g, ref.grads.at(name), "rank " + std::to_string(r) + " " + name);
        continue;
      }
      const int64_t e = std::stoll(name.substr(at + 9));
      ASSERT_EQ(e / share, r) << name << " is not one of rank " << r << "'s experts";
      ++experts_here;
      Tensor sum = plain[0].grads.at(name).clone();
      for (int s = 1; s < ep; ++s) {
        const std::vector<float> add = plain[static_cast<size_t>(s)].grads.at(name).to_vector();
        float* d = sum.data<float>();
        for (size_t i = 0; i < add.size(); ++i) d[i] += add[i];
      }
      expect_close(g, sum, "rank " + std::to_string(r) + " " + name);
    }
    // 2 blocks x `share` experts x 4 tensors (c_fc and c_proj, weight and bias).
    EXPECT_EQ(experts_here, static_cast<size_t>(2 * share * 4)) << "rank " << r;
  }
}

TEST(ExpertParallel, TwoRanksGiveEachRanksPlainLossAndSummedExpertGradients) {
  for (int64_t top_k : {1, 2})
    for (bool drop : {false, true}) compare(2, top_k, drop, false);
}

TEST(ExpertParallel, FourRanksWithOneExpertEach) {
  compare(4, 2, true, false);
  compare(4, 1, false, false);
}

TEST(ExpertParallel, OneHotExpertLeavesTheOtherRanksWithoutRows) {
  // Every token ties and takes expert 0 (and 1 for top-2): the ranks holding the others get
  // blocks of zero rows both ways, and a capacity cut drops most of them.
  compare(2, 1, false, true);
  compare(4, 2, true, true);
}

TEST(ExpertParallel, GroupsSplitTheDataParallelRanksIntoBlocksAndCopies) {
  EXPECT_EQ(expert_split_sizes(4, 2), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(expert_split_sizes(2, 2), (std::vector<int>{2}));
  EXPECT_EQ(expert_split_sizes(8, 4), (std::vector<int>{4, 4, 2, 2, 2, 2}));
  EXPECT_TRUE(expert_split_sizes(4, 1).empty());
  struct Seen {
    int coord = -1, replica = -1, data_parallel = 0, block_size = 0, block_rank = -1,
        copy_rank = -1;
  };
  std::vector<Seen> seen(4);
  testing::run_shm_ranks(4, [&](int r, const comm::ProcessGroupPtr& group) {
    const ExpertGroups g = make_expert_groups(group, 2);
    Seen& s = seen[static_cast<size_t>(r)];
    s.coord = g.coord;
    s.replica = g.replica;
    s.data_parallel = g.data_parallel;
    s.block_size = g.block ? g.block->size() : 0;
    s.block_rank = g.block ? g.block->rank() : -1;
    s.copy_rank = g.replica_group ? g.replica_group->rank() : -1;
  });
  for (int r = 0; r < 4; ++r) {
    const Seen& g = seen[static_cast<size_t>(r)];
    EXPECT_EQ(g.coord, r % 2);
    EXPECT_EQ(g.replica, r / 2);
    EXPECT_EQ(g.data_parallel, 4);
    EXPECT_EQ(g.block_size, 2);
    EXPECT_EQ(g.block_rank, r % 2);
    EXPECT_EQ(g.copy_rank, r / 2);
  }
}

}  // namespace
}  // namespace meshtrain::parallel
