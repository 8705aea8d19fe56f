// Optimizer behaviour that needs no reference implementation: updates computed by hand,
// parameter groups, gradients that are missing, zero_grad, the checkpoint form of the state and
// its validation, and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/sgd.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/util/error.h"

namespace meshtrain::optim {
namespace {

Tensor param(const std::vector<float>& v, const Shape& shape) {
  Tensor t = Tensor::from_vector(v, shape);
  t.set_requires_grad(true);
  return t;
}

void set_grad(Tensor& p, const std::vector<float>& g) {
  p.set_grad(Tensor::from_vector(g, p.shape()));
}

TEST(Sgd, PlainStepIsLrTimesGrad) {
  Tensor w = param({1.0f, -2.0f, 0.5f}, {3});
  Sgd opt({{"w", w}}, SgdOptions{.lr = 0.5f});
  set_grad(w, {2.0f, 1.0f, -4.0f});
  opt.step();
  EXPECT_EQ(w.to_vector(), (std::vector<float>{0.0f, -2.5f, 2.5f}));
  EXPECT_EQ(opt.step_count(), 1);
}

TEST(Sgd, MomentumBufferStartsAtFirstGradient) {
  // Step 1: buf = g1 = 1; p = 1 - 0.1 * 1 = 0.9.
  // Step 2: buf = 0.9 * 1 + 2 = 2.9; p = 0.9 - 0.1 * 2.9 = 0.61.
  Tensor w = param({1.0f}, {1});
  Sgd opt({{"w", w}}, SgdOptions{.lr = 0.1f, .momentum = 0.9f});
  set_grad(w, {1.0f});
  opt.step();
  EXPECT_FLOAT_EQ(w.to_vector()[0], 0.9f);
  EXPECT_FLOAT_EQ(opt.state_tensor("momentum_buffer", "w").to_vector()[0], 1.0f);
  set_grad(w, {2.0f});
  opt.step();
  EXPECT_FLOAT_EQ(opt.state_tensor("momentum_buffer", "w").to_vector()[0], 2.9f);
  EXPECT_NEAR(w.to_vector()[0], 0.61f, 1e-6f);
}

TEST(Sgd, NesterovAndWeightDecay) {
  // d = g + wd * p = 1 + 0.5 * 2 = 2; buf = 2; d = d + m * buf = 2 + 0.5 * 2 = 3; p = 2 - 0.1 * 3.
  Tensor w = param({2.0f}, {1});
  Sgd opt({{"w", w}},
          SgdOptions{.lr = 0.1f, .momentum = 0.5f, .weight_decay = 0.5f, .nesterov = true});
  set_grad(w, {1.0f});
  opt.step();
  EXPECT_NEAR(w.to_vector()[0], 1.7f, 1e-6f);
}

TEST(Sgd, RejectsBadOptions) {
  Tensor w = param({1.0f}, {1});
  EXPECT_THROW(Sgd({{"w", w}}, SgdOptions{.lr = 0.1f, .nesterov = true}), ValueError);
  EXPECT_THROW(Sgd({{"w", w}},
                   SgdOptions{.lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f, .nesterov = true}),
               ValueError);
  EXPECT_THROW(Sgd({{"w", w}}, SgdOptions{.lr = -1.0f}), ValueError);
  EXPECT_THROW(Sgd({{"w", w}}, SgdOptions{.momentum = -0.5f}), ValueError);
  EXPECT_THROW(Sgd({{"w", w}, {"w", w}}, SgdOptions{}), ValueError);
  Tensor ints = Tensor::from_vector(std::vector<int32_t>{1}, {1});
  EXPECT_THROW(Sgd({{"i", ints}}, SgdOptions{}), ValueError);
}

TEST(AdamW, FirstStepMovesByLrTimesSignOfGradient) {
  // After one step the bias-corrected moments are g and g^2, so the update is
  // lr * g / (|g| + eps) after the parameter was decayed by (1 - lr * wd).
  const float lr = 0.01f, wd = 0.1f, eps = 1e-8f;
  Tensor w = param({1.0f, -3.0f, 0.25f}, {3});
  AdamW opt({{"w", w}}, AdamWOptions{.lr = lr, .eps = eps, .weight_decay = wd});
  const std::vector<float> g = {0.5f, -2.0f, 1e-3f};
  const std::vector<float> p0 = w.to_vector();
  set_grad(w, g);
  opt.step();
  const std::vector<float> p1 = w.to_vector();
  for (size_t i = 0; i < g.size(); ++i) {
    const double expect = p0[i] * (1.0 - lr * wd) - lr * g[i] / (std::abs(g[i]) + eps);
    EXPECT_NEAR(p1[i], expect, 1e-6) << i;
  }
}

TEST(AdamW, SecondStepMatchesClosedForm) {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-6, wd = 0.0;
  Tensor w = param({0.3f}, {1});
  AdamW opt({{"w", w}}, AdamWOptions{.lr = static_cast<float>(lr),
                                     .beta1 = 0.9f,
                                     .beta2 = 0.95f,
                                     .eps = 1e-6f,
                                     .weight_decay = 0.0f});
  const double g1 = 0.7, g2 = -0.2;
  set_grad(w, {static_cast<float>(g1)});
  opt.step();
  set_grad(w, {static_cast<float>(g2)});
  opt.step();
  double p = 0.3, m = 0, v = 0;
  int t = 0;
  for (double g : {g1, g2}) {
    ++t;
    p *= 1 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double denom = std::sqrt(v) / std::sqrt(1 - std::pow(b2, t)) + eps;
    p -= lr / (1 - std::pow(b1, t)) * m / denom;
  }
  EXPECT_NEAR(w.to_vector()[0], p, 1e-6);
  EXPECT_NEAR(opt.state_tensor("exp_avg", "w").to_vector()[0], m, 1e-7);
  EXPECT_NEAR(opt.state_tensor("exp_avg_sq", "w").to_vector()[0], v, 1e-7);
}

TEST(AdamW, RejectsBadBetas) {
  Tensor w = param({1.0f}, {1});
  EXPECT_THROW(AdamW({{"w", w}}, AdamWOptions{.beta1 = 1.0f}), ValueError);
  EXPECT_THROW(AdamW({{"w", w}}, AdamWOptions{.beta2 = -0.1f}), ValueError);
  EXPECT_THROW(AdamW({{"w", w}}, AdamWOptions{.eps = -1.0f}), ValueError);
}

TEST(Optimizer, ParameterWithoutGradientIsUntouched) {
  Tensor a = param({1.0f, 2.0f}, {2});
  Tensor b = param({3.0f}, {1});
  AdamW opt({{"a", a}, {"b", b}}, AdamWOptions{});
  set_grad(a, {1.0f, 1.0f});
  opt.step();
  EXPECT_EQ(b.to_vector(), std::vector<float>{3.0f});
  EXPECT_FALSE(opt.state_tensor("exp_avg", "b").defined());
  const OptimizerState st = opt.state_dict();
  EXPECT_EQ(st.scalars.at("step.a"), 1.0);
  EXPECT_EQ(st.scalars.count("step.b"), 0u);
  EXPECT_EQ(st.tensors.size(), 2u);
}

// Only a step taken from a device gate can be taken back (its counts), and only once: a host step
// decided before it ran, and a second take-back would count the step twice.
TEST(Optimizer, OnlyAGatedStepCanBeTakenBack) {
  Tensor a = param({1.0f, 2.0f}, {2});
  AdamW opt({{"a", a}}, AdamWOptions{});
  set_grad(a, {1.0f, 1.0f});
  EXPECT_THROW(opt.revert_step(), Error) << "no step yet";
  opt.step();
  EXPECT_THROW(opt.revert_step(), Error) << "a host step";
  EXPECT_EQ(opt.state_dict().scalars.at("step.a"), 1.0);
}

TEST(Optimizer, DecayGroupsSplitByRank) {
  NamedParams params = {{"wte.weight", param({1, 2, 3, 4}, {2, 2})},
                        {"h.0.ln_1.weight", param({1, 1}, {2})},
                        {"h.0.attn.c_attn.bias", param({0, 0}, {2})},
                        {"h.0.attn.c_attn.weight", param({1, 2, 3, 4, 5, 6}, {3, 2})}};
  const auto groups = decay_groups(params, 0.1f);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_FLOAT_EQ(groups[0].weight_decay, 0.1f);
  EXPECT_FLOAT_EQ(groups[1].weight_decay, 0.0f);
  ASSERT_EQ(groups[0].params.size(), 2u);
  EXPECT_EQ(groups[0].params[0].first, "wte.weight");
  EXPECT_EQ(groups[0].params[1].first, "h.0.attn.c_attn.weight");
  ASSERT_EQ(groups[1].params.size(), 2u);
  EXPECT_EQ(groups[1].params[0].first, "h.0.ln_1.weight");
  EXPECT_TRUE(groups[0].params[0].second.is_same(params[0].second));
}

TEST(Optimizer, GroupWeightDecayAppliesPerGroup) {
  // With a zero gradient SGD only applies weight decay: p -= lr * wd * p.
  Tensor w = param({1.0f, 1.0f}, {2, 1});
  Tensor b = param({1.0f}, {1});
  Sgd opt(decay_groups({{"w", w}, {"b", b}}, 0.5f), SgdOptions{.lr = 0.1f});
  set_grad(w, {0.0f, 0.0f});
  set_grad(b, {0.0f});
  opt.step();
  EXPECT_FLOAT_EQ(w.to_vector()[0], 0.95f);
  EXPECT_FLOAT_EQ(b.to_vector()[0], 1.0f);
}

TEST(Optimizer, ZeroGrad) {
  Tensor w = param({1.0f, 2.0f}, {2});
  Sgd opt({{"w", w}}, SgdOptions{});
  set_grad(w, {3.0f, 4.0f});
  opt.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{0.0f, 0.0f}));
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
}

TEST(Optimizer, LrIsSettable) {
  Tensor w = param({1.0f}, {1});
  Sgd opt({{"w", w}}, SgdOptions{.lr = 0.1f});
  opt.set_lr(0.25f);
  EXPECT_FLOAT_EQ(opt.lr(), 0.25f);
  set_grad(w, {1.0f});
  opt.step();
  EXPECT_FLOAT_EQ(w.to_vector()[0], 0.75f);
  EXPECT_THROW(opt.set_lr(std::nanf("")), ValueError);
}

TEST(Optimizer, GradientShapeMismatchThrows) {
  Tensor w = param({1.0f, 2.0f}, {2});
  Sgd opt({{"w", w}}, SgdOptions{});
  w.set_grad(Tensor::from_vector(std::vector<float>{1.0f, 2.0f}, {2, 1}));
  EXPECT_THROW(opt.step(), ValueError);
}

// Runs `steps` AdamW steps with deterministic gradients starting at step `first`.
void train(AdamW& opt, std::vector<Tensor>& ps, int first, int steps) {
  for (int s = first; s < first + steps; ++s) {
    for (size_t i = 0; i < ps.size(); ++i) {
      std::vector<float> g(static_cast<size_t>(ps[i].numel()));
      for (size_t k = 0; k < g.size(); ++k) {
        g[k] = std::sin(static_cast<float>(s * 7 + static_cast<int>(i * 3 + k)));
      }
      set_grad(ps[i], g);
    }
    opt.step();
  }
}

TEST(Optimizer, StateDictRoundTripResumesBitwise) {
  auto make_params = [] {
    return std::vector<Tensor>{param({0.1f, -0.2f, 0.3f, 0.4f}, {2, 2}), param({0.5f}, {1})};
  };
  auto named = [](std::vector<Tensor>& ps) {
    return NamedParams{{"h.0.w", ps[0]}, {"h.0.b", ps[1]}};
  };
  const AdamWOptions o{.lr = 0.01f, .beta2 = 0.95f, .weight_decay = 0.1f};

  std::vector<Tensor> straight = make_params();
  AdamW a(decay_groups(named(straight), 0.1f), o);
  train(a, straight, 0, 6);

  std::vector<Tensor> resumed = make_params();
  AdamW b(decay_groups(named(resumed), 0.1f), o);
  train(b, resumed, 0, 3);
  const OptimizerState st = b.state_dict();
  std::vector<Tensor> saved_params = {resumed[0].clone(), resumed[1].clone()};

  std::vector<Tensor> fresh = {saved_params[0], saved_params[1]};
  for (Tensor& t : fresh) t.set_requires_grad(true);
  AdamW c(decay_groups(named(fresh), 0.1f), o);
  c.load_state_dict(st);
  EXPECT_EQ(c.step_count(), 3);
  EXPECT_TRUE(
      ops::equal(c.state_tensor("exp_avg_sq", "h.0.w"), b.state_tensor("exp_avg_sq", "h.0.w")));
  train(c, fresh, 3, 3);
  for (size_t i = 0; i < fresh.size(); ++i) {
    EXPECT_TRUE(ops::equal(fresh[i], straight[i])) << i;
  }
  EXPECT_EQ(c.state_dict().scalars.at("step.h.0.b"), 6.0);
}

TEST(Optimizer, StateDictNamesFollowSlotDotParam) {
  Tensor w = param({1.0f}, {1});
  Sgd opt({{"h.0.mlp.c_fc.weight", w}}, SgdOptions{.momentum = 0.9f});
  set_grad(w, {1.0f});
  opt.step();
  const OptimizerState st = opt.state_dict();
  ASSERT_EQ(st.tensors.size(), 1u);
  EXPECT_EQ(st.tensors[0].first, "momentum_buffer.h.0.mlp.c_fc.weight");
  EXPECT_EQ(st.scalars.at("step"), 1.0);
}

TEST(Optimizer, LoadStateDictRejectsBadStateAndKeepsOld) {
  Tensor w = param({1.0f, 2.0f}, {2});
  AdamW opt({{"w", w}}, AdamWOptions{});
  set_grad(w, {1.0f, 1.0f});
  opt.step();
  const OptimizerState good = opt.state_dict();

  OptimizerState wrong_shape = good;
  wrong_shape.tensors[0].second = Tensor::zeros({3});
  EXPECT_THROW(opt.load_state_dict(wrong_shape), ValueError);

  OptimizerState unknown = good;
  unknown.tensors.emplace_back("exp_avg.nope", Tensor::zeros({2}));
  EXPECT_THROW(opt.load_state_dict(unknown), ValueError);

  OptimizerState missing_slot = good;
  missing_slot.tensors.pop_back();
  EXPECT_THROW(opt.load_state_dict(missing_slot), ValueError);

  OptimizerState bad_step = good;
  bad_step.scalars["step.w"] = 1.5;
  EXPECT_THROW(opt.load_state_dict(bad_step), ValueError);

  OptimizerState no_step = good;
  no_step.scalars.erase("step.w");
  EXPECT_THROW(opt.load_state_dict(no_step), ValueError);

  // Nothing above changed the optimizer.
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_TRUE(ops::equal(opt.state_tensor("exp_avg", "w"), good.tensors[0].second));
  opt.load_state_dict(good);
  EXPECT_EQ(opt.step_count(), 1);
}

}  // namespace
}  // namespace meshtrain::optim
