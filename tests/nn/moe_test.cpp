// Mixture of experts on one rank: the routing (top-k, capacity, priority, drops), every
// backward of the routing ops against finite differences, the layer against the dense MLP it
// must equal with one expert, the auxiliary losses' gradient scale, and a GPT with expert blocks
// (names, ParamInfo, recomputed blocks, counters).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <map>
#include <string>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/moe_ops.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/nn/gpt_costs.h"
#include "meshtrain/nn/moe_mlp.h"
#include "meshtrain/nn/moe_routing.h"
#include "tests/support/gradcheck.h"

namespace meshtrain::nn {
namespace {

using testing::gradcheck;
using testing::rnd;

TEST(MoERouting, TopOneAndTopTwoWithTiesToTheLowerExpert) {
  // 3 tokens, 3 experts.
  const std::vector<float> s = {0.2f, 0.5f, 0.3f,  //
                                0.4f, 0.4f, 0.2f,  //
                                0.1f, 0.3f, 0.6f};
  MoERouting r1 = route_tokens(s.data(), 3, 3, 1, -1);
  EXPECT_EQ(r1.token, (std::vector<int32_t>{1, 0, 2}));
  EXPECT_EQ(r1.expert, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(r1.offsets, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(r1.dropped, 0);
  MoERouting r2 = route_tokens(s.data(), 3, 3, 2, -1);
  // Token 0 -> 1 then 2; token 1 -> 0 then 1; token 2 -> 2 then 1.
  EXPECT_EQ(r2.chosen, (std::vector<int64_t>{1, 3, 2}));
  EXPECT_EQ(r2.kept(), 6);
  // Within an expert, first choices come before second choices.
  EXPECT_EQ(r2.token, (std::vector<int32_t>{1, 0, 1, 2, 2, 0}));
  EXPECT_EQ(r2.choice, (std::vector<int32_t>{0, 0, 1, 1, 0, 1}));
}

TEST(MoERouting, CapacityKeepsFirstChoicesFirstAndCountsDrops) {
  // Every token prefers expert 0, then expert 1: one hot expert.
  const int64_t N = 5;
  std::vector<float> s;
  for (int64_t t = 0; t < N; ++t) s.insert(s.end(), {0.7f, 0.2f, 0.1f});
  MoERouting r = route_tokens(s.data(), N, 3, 2, 2);
  EXPECT_EQ(r.load(0), 2);
  EXPECT_EQ(r.load(1), 2);
  EXPECT_EQ(r.load(2), 0);
  EXPECT_EQ(r.dropped, 6);
  EXPECT_EQ(r.chosen, (std::vector<int64_t>{5, 5, 0}));
  // Expert 1 takes tokens 0 and 1 as second choices (no first choice competes).
  EXPECT_EQ(r.token, (std::vector<int32_t>{0, 1, 0, 1}));
  // No tokens at all.
  MoERouting empty = route_tokens(nullptr, 0, 3, 1, 4);
  EXPECT_EQ(empty.kept(), 0);
  EXPECT_EQ(empty.offsets, (std::vector<int64_t>{0, 0, 0, 0}));
}

// A fixed routing for the gradient checks (finite differences must not change it).
std::shared_ptr<const MoERouting> routing_of(const Tensor& probs, int64_t k, int64_t capacity) {
  auto v = probs.to_vector();
  return std::make_shared<const MoERouting>(
      route_tokens(v.data(), probs.size(0), probs.size(1), k, capacity));
}

// Every token prefers expert 0 (by different margins): after balancing, a top-1 or top-2
// choice gives every expert its even share to within one assignment, the tokens that prefer
// expert 0 most keep it, and an already even batch is left as it is.
TEST(MoERouting, BalancedBatchSplitsASkewedBatchEvenlyAndKeepsTheStrongestPreferences) {
  const int64_t N = 64, E = 4;
  std::vector<float> skewed(static_cast<size_t>(N * E));
  Generator g(3);
  for (int64_t n = 0; n < N; ++n) {
    const float strong = 0.4f + 0.5f * static_cast<float>(n) / static_cast<float>(N);
    skewed[static_cast<size_t>(n * E)] = strong;
    for (int64_t e = 1; e < E; ++e)
      skewed[static_cast<size_t>(n * E + e)] = (1.0f - strong) / 3.0f * (0.8f + 0.4f * g.uniform());
  }
  EXPECT_EQ(route_tokens(skewed.data(), N, E, 1, -1).chosen, (std::vector<int64_t>{64, 0, 0, 0}));
  for (int64_t k : {1, 2}) {
    SCOPED_TRACE("top " + std::to_string(k));
    std::vector<float> s = skewed;
    balance_batch(s.data(), N, E, k);
    const MoERouting r = route_tokens(s.data(), N, E, k, -1);
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_GE(r.chosen[static_cast<size_t>(e)], 16 * k - 1) << "expert " << e;
      EXPECT_LE(r.chosen[static_cast<size_t>(e)], 16 * k + 1) << "expert " << e;
    }
    // The tokens that prefer expert 0 most are the ones that keep it.
    for (int64_t t = N - 8; t < N; ++t) {
      bool to_zero = false;
      for (int64_t i = r.offsets[0]; i < r.offsets[1]; ++i)
        to_zero = to_zero || r.token[static_cast<size_t>(i)] == t;
      EXPECT_TRUE(to_zero) << "token " << t;
    }
    // An even batch needs no offsets.
    std::vector<float> again = s;
    balance_batch(again.data(), N, E, k);
    EXPECT_EQ(again, s);
  }
}

TEST(MoEOps, DispatchGatesAndCombineMatchFiniteDifferences) {
  const int64_t N = 7, C = 5, E = 3;
  for (int64_t k : {1, 2})
    for (int64_t capacity : {-1, 3}) {
      Tensor logits = rnd({N, E}, 11 + static_cast<uint64_t>(k), 2.0f);
      Tensor probs0 = autograd::softmax(logits);
      auto r = routing_of(probs0, k, capacity);
      Tensor w = rnd({C, C}, 5);
      auto f = [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> rows = autograd::moe_dispatch(in[0], r);
        std::vector<Tensor> outs;
        // Each expert a different map, so that the combine's gradient tells them apart.
        for (size_t e = 0; e < rows.size(); ++e)
          outs.push_back(autograd::scale(autograd::tanh(autograd::matmul(rows[e], in[2])),
                                         1.0f + static_cast<float>(e)));
        return autograd::moe_combine(outs, autograd::moe_gates(autograd::softmax(in[1]), r), r);
      };
      gradcheck(f, {rnd({N, C}, 3), logits, w},
                "k=" + std::to_string(k) + " capacity=" + std::to_string(capacity));
    }
}

TEST(MoEOps, AuxiliaryLossesMatchFiniteDifferencesAndReferenceValues) {
  const int64_t N = 6, E = 4;
  Tensor logits = rnd({N, E}, 21, 1.5f);
  auto r = routing_of(autograd::softmax(logits), 2, -1);
  gradcheck(
      [&](const std::vector<Tensor>& in) {
        return autograd::load_balancing_loss(autograd::softmax(in[0]), r);
      },
      {logits}, "balance");
  // A tensor of its own: gradients accumulate on the first one.
  gradcheck([&](const std::vector<Tensor>& in) { return autograd::router_z_loss(in[0]); },
            {rnd({N, E}, 21, 1.5f)}, "z");
  // Even routing scores 1; the z-loss of zero logits is log(E)^2.
  Tensor uniform = Tensor::full({4, 4}, 0.25);
  const std::vector<float> eye = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  auto even = routing_of(Tensor::from_vector(eye, {4, 4}), 1, -1);
  EXPECT_NEAR(autograd::load_balancing_loss(uniform, even).item(), 1.0, 1e-6);
  EXPECT_NEAR(autograd::router_z_loss(Tensor::zeros({3, 4})).item(), std::log(4.0) * std::log(4.0),
              1e-5);
}

TEST(MoEOps, AttachedLossTakesTheGivenGradient) {
  Tensor x = rnd({2, 3}, 1);
  x.set_requires_grad(true);
  Tensor p = rnd({4}, 2);
  p.set_requires_grad(true);
  Tensor out = autograd::attach_loss(autograd::scale(x, 2.0f),
                                     autograd::scale(autograd::sum_all(p), 3.0f), 0.25f);
  autograd::backward(autograd::sum_all(out));
  for (float g : p.grad().to_vector()) EXPECT_FLOAT_EQ(g, 0.75f);
  for (float g : x.grad().to_vector()) EXPECT_FLOAT_EQ(g, 2.0f);
}

MoEConfig moe_config(int64_t experts, int64_t k, bool drop) {
  MoEConfig m;
  m.every = 1;
  m.num_experts = experts;
  m.top_k = k;
  m.drop_tokens = drop;
  m.min_capacity = 1;
  m.capacity_factor = 1.0;
  return m;
}

// With the experts one by one (each the GPT's MLP), one dropless expert is the dense MLP bit for
// bit; grouped, within the last bits (their products are built for any row count).
TEST(MoEMLP, OneExpertDroplessIsTheDenseMlpBitwise) {
  Generator gen(7);
  auto ctx = std::make_shared<MoEContext>(std::vector<std::string>{"h.0"}, 1);
  MoEConfig cfg = moe_config(1, 1, false);
  cfg.grouped_experts = false;
  MoEMLP moe(8, true, cfg, ctx, 0, gen, 0.02);
  Generator gen_grouped(7);
  MoEMLP grouped(8, true, moe_config(1, 1, false), ctx, 0, gen_grouped, 0.02);
  MLP dense(8, true, *plain_gpt_layers(), gen, 0.02);
  std::map<std::string, Tensor> weights;
  for (auto& [name, t] : moe.named_parameters())
    if (name.rfind("experts.0.", 0) == 0) weights[name.substr(10)] = t;
  dense.load_state_dict(weights);
  Tensor x = rnd({2, 5, 8}, 4);
  const auto a = moe.forward(x, 1).to_vector(), b = dense.forward(x).to_vector();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << i;
  const auto c = grouped.forward(x, 1).to_vector();
  for (size_t i = 0; i < c.size(); ++i) ASSERT_NEAR(c[i], b[i], 1e-5f * (1 + std::abs(b[i]))) << i;
}

TEST(MoEMLP, InputGradientMatchesFiniteDifferences) {
  for (int64_t k : {1, 2}) {
    Generator gen(3);
    auto ctx = std::make_shared<MoEContext>(std::vector<std::string>{"h.0"}, 4);
    MoEConfig cfg = moe_config(4, k, false);
    cfg.aux_loss_weight = 0;
    cfg.z_loss_weight = 0;
    MoEMLP moe(6, true, cfg, ctx, 0, gen, 0.02);
    // Confident routing, so that a finite-difference step does not change it.
    for (auto& [name, t] : moe.named_parameters())
      if (name == "router.weight") t.copy_(rnd(t.shape(), 9, 3.0f));
    uint64_t seed = 0;
    gradcheck([&](const std::vector<Tensor>& in) { return moe.forward(in[0], ++seed); },
              {rnd({5, 6}, 8)}, "k=" + std::to_string(k));
  }
}

// Sets the router so that every (positive) input prefers expert 0; the other experts' scores are
// zero, or (others > 0) random weights of that size, so that they rank in orders of their own
// (an exact tie between experts cannot be split by balancing offsets).
void prefer_expert_zero(MoEMLP& moe, int64_t channels, float others = 0.0f) {
  for (auto& [name, t] : moe.named_parameters())
    if (name == "router.weight") {
      std::vector<float> w = others > 0 ? rnd(t.shape(), 11, others).to_vector()
                                        : std::vector<float>(static_cast<size_t>(t.numel()), 0.0f);
      for (int64_t c = 0; c < channels; ++c) w[static_cast<size_t>(c)] = 1.0f;
      t.copy_(Tensor::from_vector(w, t.shape()));
    }
}

// One hot expert takes every token: the others run on empty batches, so every parameter still
// gets a gradient (zero for the idle experts) and data parallelism never waits for one.
TEST(MoEMLP, IdleExpertsStillGetAGradient) {
  Generator gen(5);
  auto ctx = std::make_shared<MoEContext>(std::vector<std::string>{"h.0"}, 4);
  MoEConfig cfg = moe_config(4, 1, true);
  cfg.capacity_factor = 4.0;
  MoEMLP moe(6, true, cfg, ctx, 0, gen, 0.02);
  prefer_expert_zero(moe, 6);
  Tensor x = rnd({3, 4, 6}, 2, 0.5f, 1.0f);  // positive: every token prefers expert 0
  autograd::backward(autograd::sum_all(moe.forward(x, 1)));
  const nlohmann::json m = ctx->summarize(ctx->take_counters());
  EXPECT_EQ(m["layers"]["h.0"]["routed"], nlohmann::json({12.0, 0.0, 0.0, 0.0}));
  EXPECT_DOUBLE_EQ(m["max_mean_load"].get<double>(), 4.0);
  for (auto& [name, t] : moe.named_parameters()) {
    ASSERT_TRUE(t.grad().defined()) << name;
    if (name.rfind("experts.0.", 0) == 0 || name.rfind("experts.", 0) != 0) continue;
    for (float g : t.grad().to_vector()) ASSERT_EQ(g, 0.0f) << name;
  }
}

Tensor buffer_of(const Module& m, const std::string& name) {
  for (auto& [n, t] : m.named_buffers())
    if (n == name) return t;
  return {};
}

// Auxiliary-loss-free balancing: after a step an expert routed more than the mean loses
// `rate` of bias, one routed less gains it, one at the mean keeps it; a bias large enough moves
// the choice, and the counters are read from the sums the engine passes (not this rank's own).
TEST(MoEMLP, BalancingBiasMovesBySignTowardTheMeanAndSteersTheChoice) {
  Generator gen(5);
  auto ctx = std::make_shared<MoEContext>(std::vector<std::string>{"h.0"}, 4);
  MoEConfig cfg = moe_config(4, 1, false);
  cfg.bias_update_rate = 0.25;
  MoEMLP moe(6, true, cfg, ctx, 0, gen, 0.02);
  prefer_expert_zero(moe, 6);
  Tensor bias = buffer_of(moe, "expert_bias");
  ASSERT_TRUE(bias.defined());
  EXPECT_EQ(bias.to_vector(), std::vector<float>(4, 0.0f));
  Tensor x = rnd({3, 4, 6}, 2, 0.5f, 1.0f);
  moe.forward(x, 1);
  std::vector<float> counters = ctx->take_counters();
  EXPECT_EQ(ctx->summarize(counters)["layers"]["h.0"]["routed"],
            nlohmann::json({12.0, 0.0, 0.0, 0.0}));
  ctx->adapt(counters);
  EXPECT_EQ(bias.to_vector(), (std::vector<float>{-0.25f, 0.25f, 0.25f, 0.25f}));
  // Routed exactly at the mean: unchanged.
  std::vector<float> even = counters;
  for (size_t e = 0; e < 4; ++e) even[5 + 4 + e] = 3.0f;
  ctx->adapt(even);
  EXPECT_EQ(bias.to_vector(), (std::vector<float>{-0.25f, 0.25f, 0.25f, 0.25f}));
  // A bias past the probabilities' gap sends every token to expert 1.
  bias.copy_(Tensor::from_vector(std::vector<float>{0.0f, 2.0f, 0.0f, 0.0f}, {4}));
  moe.forward(x, 2);
  const nlohmann::json m = ctx->summarize(ctx->take_counters());
  EXPECT_EQ(m["layers"]["h.0"]["routed"], nlohmann::json({0.0, 12.0, 0.0, 0.0}));
  EXPECT_EQ(m["layers"]["h.0"]["expert_bias"], nlohmann::json({0.0, 2.0, 0.0, 0.0}));
}

// Each of two result sets (outputs and gradients, in one order) within `tol` of the other,
// relative to the element's size.
void expect_close(const std::vector<std::vector<float>>& got,
                  const std::vector<std::vector<float>>& want, float tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t t = 0; t < got.size(); ++t) {
    ASSERT_EQ(got[t].size(), want[t].size()) << what << " tensor " << t;
    for (size_t i = 0; i < got[t].size(); ++i)
      ASSERT_NEAR(got[t][i], want[t][i], tol * (1.0f + std::abs(want[t][i])))
          << what << " tensor " << t << " element " << i;
  }
}

// The grouped experts are each expert's MLP: outputs, the rows' gradients and every weight
// gradient, for experts with different row counts (one with none), with and without biases. Its
// products are built for any row count (cpu::gemm_onednn::RowsVary), whose kernels may round the
// last bits differently from each shape's own; the same bits on one thread and on two (where the
// experts run side by side, each on one thread).
TEST(MoEOps, GroupedExpertMlpsAreEachExpertsMlp) {
  const int saved_threads = omp_get_max_threads();
  for (bool bias : {true, false}) {
    Generator gen(21);
    std::vector<std::shared_ptr<MLP>> mlps;
    std::vector<autograd::ExpertMlp> weights;
    for (int e = 0; e < 4; ++e) {
      mlps.push_back(std::make_shared<MLP>(8, bias, *plain_gpt_layers(), gen, 0.02, 12));
      weights.push_back(expert_mlp_weights(*mlps.back()));
    }
    const std::vector<int64_t> counts = {5, 0, 17, 3};
    auto rows_for = [&] {
      std::vector<Tensor> rows;
      for (size_t e = 0; e < counts.size(); ++e) {
        Tensor r = rnd({counts[e], 8}, 30 + e);
        r.set_requires_grad(true);
        rows.push_back(r);
      }
      return rows;
    };
    // Everything the backward produced, in a fixed order.
    auto run = [&](bool grouped) {
      for (auto& m : mlps) m->zero_grad();
      std::vector<Tensor> rows = rows_for();
      std::vector<Tensor> outs;
      if (grouped) {
        outs = autograd::grouped_expert_mlps(rows, weights);
      } else {
        for (size_t e = 0; e < rows.size(); ++e) outs.push_back(mlps[e]->forward(rows[e]));
      }
      Tensor total;
      std::vector<std::vector<float>> got;
      for (size_t e = 0; e < outs.size(); ++e) {
        got.push_back(outs[e].to_vector());
        // Different weights per element, so that every gradient differs.
        Tensor part = autograd::sum_all(autograd::mul(outs[e], rnd(outs[e].shape(), 50 + e)));
        total = total.defined() ? autograd::add(total, part) : part;
      }
      autograd::backward(total);
      for (const Tensor& r : rows) got.push_back(r.grad().to_vector());
      for (auto& m : mlps)
        for (auto& [name, p] : m->named_parameters()) got.push_back(p.grad().to_vector());
      return got;
    };
    omp_set_num_threads(1);
    const auto want = run(false);
    const auto one = run(true);
    expect_close(one, want, 1e-5f, bias ? "one thread, biases" : "one thread");
    omp_set_num_threads(2);
    EXPECT_EQ(run(true), one) << "two threads, bias " << bias;
    omp_set_num_threads(saved_threads);
  }
}

// Batch balancing in training sends a hot expert's batch out evenly; evaluation routes by the
// probabilities alone.
TEST(MoEMLP, BatchBalancingSteersTrainingRoutingOnly) {
  Generator gen(5);
  auto ctx = std::make_shared<MoEContext>(std::vector<std::string>{"h.0"}, 4);
  MoEConfig cfg = moe_config(4, 1, false);
  cfg.balance_batch = true;
  MoEMLP moe(6, true, cfg, ctx, 0, gen, 0.02);
  prefer_expert_zero(moe, 6, 0.3f);
  Tensor x = rnd({4, 8, 6}, 2, 0.5f, 1.0f);
  moe.forward(x, 1);
  const nlohmann::json m = ctx->summarize(ctx->take_counters());
  EXPECT_LE(m["max_mean_load"].get<double>(), 1.25) << m.dump();
  // The same layer without balancing sends the whole batch to expert 0.
  MoEConfig plain_cfg = moe_config(4, 1, false);
  Generator gen2(5);
  auto ctx2 = std::make_shared<MoEContext>(std::vector<std::string>{"h.0"}, 4);
  MoEMLP plain(6, true, plain_cfg, ctx2, 0, gen2, 0.02);
  prefer_expert_zero(plain, 6, 0.3f);
  plain.forward(x, 1);
  EXPECT_DOUBLE_EQ(ctx2->summarize(ctx2->take_counters())["max_mean_load"].get<double>(), 4.0);
  // In evaluation both route by the probabilities: the same outputs, bit for bit.
  moe.train(false);
  plain.train(false);
  autograd::NoGradGuard no_grad;
  EXPECT_EQ(moe.forward(x, 3).to_vector(), plain.forward(x, 3).to_vector());
}

// The bias decides which experts a token goes to, never how much of each it takes: with both of
// two experts chosen (top-2), any bias gives the same output bit for bit. Biased gates would not.
TEST(MoEMLP, BalancingBiasNeverReachesTheGates) {
  Generator gen(6);
  auto ctx = std::make_shared<MoEContext>(std::vector<std::string>{"h.0"}, 2);
  MoEConfig cfg = moe_config(2, 2, false);
  cfg.bias_update_rate = 0.5;
  MoEMLP moe(6, true, cfg, ctx, 0, gen, 0.02);
  Tensor x = rnd({2, 5, 6}, 3);
  const std::vector<float> plain = moe.forward(x, 1).to_vector();
  buffer_of(moe, "expert_bias").copy_(Tensor::from_vector(std::vector<float>{3.0f, -3.0f}, {2}));
  EXPECT_EQ(moe.forward(x, 1).to_vector(), plain);
}

GPTConfig moe_gpt(int64_t k, bool drop) {
  GPTConfig c;
  c.vocab_size = 37;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.moe = moe_config(4, k, drop);
  c.moe.every = 2;
  c.moe.capacity_factor = 1.25;
  c.moe.aux_loss_weight = 0.5;
  c.moe.z_loss_weight = 0.1;
  return c;
}

int64_t numel_of(const NamedTensors& ts) {
  int64_t n = 0;
  for (const auto& [name, t] : ts) n += t.numel();
  return n;
}

std::pair<Tensor, Tensor> batch(uint64_t seed) {
  Generator g(seed);
  std::vector<int32_t> a(2 * 16), b(2 * 16);
  for (auto& t : a) t = static_cast<int32_t>(g.below(37));
  for (auto& t : b) t = static_cast<int32_t>(g.below(37));
  return {Tensor::from_vector(a, {2, 16}), Tensor::from_vector(b, {2, 16})};
}

std::map<std::string, std::vector<float>> grads_after(GPT& model, float loss_grad, uint64_t seed) {
  model.zero_grad();
  model.moe_context()->set_loss_grad(loss_grad);
  auto [x, y] = batch(seed);
  autograd::backward(model.loss(x, y, 5), Tensor::scalar(loss_grad));
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, p] : model.named_parameters())
    if (p.grad().defined()) out[name] = p.grad().to_vector();
  return out;
}

TEST(MoEGPT, ExpertBlocksNamesAndParamInfo) {
  GPT model(moe_gpt(1, true));
  std::map<std::string, ParamInfo> infos;
  for (const ParamInfo& i : model.param_infos()) infos[i.name] = i;
  EXPECT_FALSE(infos.count("h.0.mlp.router.weight"));  // block 0 is dense
  EXPECT_TRUE(infos.count("h.0.mlp.c_fc.weight"));
  ASSERT_TRUE(infos.count("h.1.mlp.router.weight"));
  EXPECT_FALSE(infos["h.1.mlp.router.weight"].expert);
  for (int e = 0; e < 4; ++e) {
    const std::string p = "h.1.mlp.experts." + std::to_string(e) + ".";
    ASSERT_TRUE(infos.count(p + "c_fc.weight")) << p;
    EXPECT_TRUE(infos[p + "c_fc.weight"].expert);
    EXPECT_TRUE(infos[p + "c_proj.bias"].expert);
  }
  // Each expert is drawn by its own name: no two experts start equal.
  std::map<std::string, Tensor> named;
  for (auto& [n, t] : model.named_parameters()) named[n] = t;
  EXPECT_NE(named["h.1.mlp.experts.0.c_fc.weight"].to_vector(),
            named["h.1.mlp.experts.1.c_fc.weight"].to_vector());
}

// The auxiliary losses enter backward at the scale the loss does: a backward from 2 must give
// exactly twice the gradients of a backward from 1 (a power of two scales every product
// exactly), which fails if the router's losses kept a gradient of their own.
TEST(MoEGPT, AuxiliaryLossGradientsFollowTheLossScale) {
  for (int64_t k : {1, 2}) {
    GPT model(moe_gpt(k, true));
    auto one = grads_after(model, 1.0f, 3), two = grads_after(model, 2.0f, 3);
    ASSERT_TRUE(one.count("h.1.mlp.router.weight"));
    for (auto& [name, g] : one) {
      ASSERT_TRUE(two.count(name)) << name;
      for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(two[name][i], 2.0f * g[i]) << name << i;
    }
    // And they are there: without them the router's gradient differs.
    GPTConfig plain_cfg = moe_gpt(k, true);
    plain_cfg.moe.aux_loss_weight = 0;
    plain_cfg.moe.z_loss_weight = 0;
    GPT plain(plain_cfg);
    auto none = grads_after(plain, 1.0f, 3);
    EXPECT_NE(none["h.1.mlp.router.weight"], one["h.1.mlp.router.weight"]);
    EXPECT_EQ(none["h.1.mlp.experts.0.c_fc.weight"], one["h.1.mlp.experts.0.c_fc.weight"]);
  }
}

TEST(MoEGPT, RecomputedBlocksGiveTheSameGradientsAndCountOnce) {
  GPT plain(moe_gpt(2, true));
  GPTConfig cc = moe_gpt(2, true);
  cc.checkpointed_blocks = {true, true};
  GPT checkpointed(cc);
  auto a = grads_after(plain, 1.0f, 4);
  auto counts_a = plain.moe_context()->take_counters();
  auto b = grads_after(checkpointed, 1.0f, 4);
  auto counts_b = checkpointed.moe_context()->take_counters();
  EXPECT_EQ(a, b);
  EXPECT_EQ(counts_a, counts_b);
  // One forward of 32 tokens, two choices each.
  const nlohmann::json m = plain.moe_context()->summarize(counts_a);
  const auto& layer = m["layers"]["h.1"];
  double kept = 0;
  for (double v : layer["load"]) kept += v;
  EXPECT_EQ(kept + m["dropped"].get<double>(), 64.0);
  double routed = 0;
  for (double v : layer["routed"]) routed += v;
  EXPECT_EQ(routed, 64.0);
  EXPECT_GE(layer["max_mean_load"].get<double>(), 1.0);
  EXPECT_GT(m["balance_loss"].get<double>(), 0.0);
  // Taken: the next step starts from zero.
  for (float v : plain.moe_context()->take_counters()) EXPECT_EQ(v, 0.0f);
}

TEST(MoEGPT, EvaluationNeitherCountsNorAttaches) {
  GPT model(moe_gpt(1, true));
  model.eval();
  autograd::NoGradGuard no_grad;
  auto [x, y] = batch(9);
  EXPECT_TRUE(std::isfinite(model.loss(x, y).item()));
  for (float v : model.moe_context()->take_counters()) EXPECT_EQ(v, 0.0f);
}

TEST(MoEGPT, BadSettingsNameTheKey) {
  GPTConfig c = moe_gpt(1, true);
  c.moe.top_k = 3;
  try {
    GPT model(c);
    ADD_FAILURE() << "top_k = 3 accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("model.moe.top_k"), std::string::npos) << e.what();
  }
  c = moe_gpt(1, true);
  c.moe.every = 3;
  EXPECT_THROW(GPT{c}, ValueError);
}

}  // namespace
}  // namespace meshtrain::nn

namespace meshtrain::nn {
namespace {

TEST(MoEGPT, CostsCountEveryExpertsParametersAndTheActiveFlops) {
  GPTConfig c = moe_gpt(2, true);
  GPT model(c);
  EXPECT_EQ(model.num_parameters(), gpt_params(c));
  EXPECT_EQ(gpt_block_params(c, 1, 1), numel_of(model.block_parameters(1)));
  EXPECT_EQ(gpt_block_params(c, 1, 0), numel_of(model.block_parameters(0)));
  // Top-2 of 4 experts: one more MLP's matmuls per token than the dense block, and the router.
  const double C = 16;
  EXPECT_DOUBLE_EQ(gpt_block_flops_per_token(c, 16, 1) - gpt_block_flops_per_token(c, 16, 0),
                   6.0 * (8.0 * C * C + 4.0 * C));
  // Experts of half the width, two per token: the dense block's matmuls again, plus the router.
  c.moe.expert_hidden = 32;
  GPT narrow(c);
  EXPECT_EQ(gpt_block_params(c, 1, 1), numel_of(narrow.block_parameters(1)));
  EXPECT_EQ(narrow.num_parameters(), gpt_params(c));
  EXPECT_DOUBLE_EQ(gpt_block_flops_per_token(c, 16, 1) - gpt_block_flops_per_token(c, 16, 0),
                   6.0 * 4.0 * C);
}

}  // namespace
}  // namespace meshtrain::nn
