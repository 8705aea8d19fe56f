// Mixed-precision training of a small GPT: bf16 autocast, and f16 autocast with dynamic loss
// scaling, follow the f32 run's loss closely on a task with irreducible noise (so the loss
// plateaus well above zero and a relative comparison means something); an overflow injected
// into one step's gradients makes exactly that step skip (parameters and optimizer untouched)
// and halves the scale, and the scale then grows again after its interval.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::nn {
namespace {

constexpr int64_t kV = 37, kT = 16, kB = 8;

GPTConfig model_config() {
  GPTConfig c;
  c.vocab_size = kV;
  c.block_size = kT;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.seed = 3;
  return c;
}

// Token t+1 = (t + 3) mod V with probability 0.75, otherwise uniform: the best achievable loss
// is about 0.25 * ln(V) + 0.83 (the entropy of the mixture), around 1.7.
std::pair<Tensor, Tensor> noisy_batch(Generator& g) {
  std::vector<int32_t> x(static_cast<size_t>(kB * kT)), y(x.size());
  for (int64_t b = 0; b < kB; ++b) {
    int32_t t = static_cast<int32_t>(g.below(kV));
    for (int64_t i = 0; i < kT; ++i) {
      x[static_cast<size_t>(b * kT + i)] = t;
      t = g.uniform() < 0.75f ? (t + 3) % kV : static_cast<int32_t>(g.below(kV));
      y[static_cast<size_t>(b * kT + i)] = t;
    }
  }
  return {Tensor::from_vector(x, {kB, kT}), Tensor::from_vector(y, {kB, kT})};
}

struct TrainRun {
  std::vector<float> losses;
  std::vector<float> scales;  // the loss scale each step used (1 without scaling)
  std::vector<bool> skipped;
  std::vector<std::vector<float>> params;  // a probe tensor after each step
  std::vector<int64_t> optimizer_steps;    // after each step
  float eval_loss = 0;                     // f32 loss on held-out batches after training
};

struct RunOptions {
  DType precision = DType::f32;
  int steps = 150;
  int inject_overflow_at = -1;
  optim::LossScalerOptions scaler;
};

TrainRun train(const RunOptions& o) {
  GPT model(model_config());
  auto params = model.named_parameters();
  optim::AdamWOptions ao;
  ao.lr = 1e-2f;
  optim::AdamW opt(params, ao);
  std::unique_ptr<optim::LossScaler> scaler;
  if (o.precision == DType::f16) scaler = std::make_unique<optim::LossScaler>(o.scaler);
  Generator data(11);
  TrainRun r;
  for (int step = 0; step < o.steps; ++step) {
    auto [x, y] = noisy_batch(data);
    opt.zero_grad();
    Tensor loss;
    {
      autograd::AutocastGuard cast(o.precision);
      loss = model.loss(x, y);
    }
    const float scale = scaler ? scaler->scale() : 1.0f;
    autograd::backward(loss, Tensor::scalar(scale));
    if (step == o.inject_overflow_at) {
      Tensor g = params[5].second.grad();
      g.data<float>()[3] = std::numeric_limits<float>::infinity();
    }
    const bool overflow = scaler && scaler->unscale(params);
    if (!overflow) {
      optim::clip_grad_norm(params, 1.0);
      opt.step();
    }
    if (scaler) scaler->update(overflow);
    r.losses.push_back(loss.item());
    r.scales.push_back(scale);
    r.skipped.push_back(overflow);
    r.params.push_back(params[5].second.to_vector());
    r.optimizer_steps.push_back(opt.step_count());
  }
  autograd::NoGradGuard no_grad;
  Generator held_out(999);
  double total = 0;
  for (int i = 0; i < 8; ++i) {
    auto [x, y] = noisy_batch(held_out);
    total += model.loss(x, y).item();
  }
  r.eval_loss = static_cast<float>(total / 8);
  return r;
}

TEST(MixedPrecision, Bf16AndF16TrainLikeF32) {
  RunOptions o;
  const TrainRun f32 = train(o);
  o.precision = DType::bf16;
  const TrainRun bf16 = train(o);
  o.precision = DType::f16;
  const TrainRun f16 = train(o);
  int f16_skips = 0;
  for (bool s : f16.skipped) f16_skips += s;
  std::printf(
      "held-out loss after 150 steps: f32 %.4f, bf16 %.4f, f16 %.4f (%d f16 steps "
      "skipped, final scale %.0f); first loss %.4f\n",
      f32.eval_loss, bf16.eval_loss, f16.eval_loss, f16_skips, f16.scales.back(),
      f32.losses.front());
  EXPECT_LT(f32.eval_loss, 0.7f * f32.losses.front()) << "the model did not learn";
  // Stated tolerance: within 2% of the f32 loss. bf16 keeps 8 significant bits, f16 11.
  EXPECT_NEAR(bf16.eval_loss, f32.eval_loss, 0.02f * f32.eval_loss);
  EXPECT_NEAR(f16.eval_loss, f32.eval_loss, 0.02f * f32.eval_loss);
  // The half-precision runs really differ from f32 (autocast was in force).
  EXPECT_NE(bf16.losses[1], f32.losses[1]);
  EXPECT_NE(f16.losses[1], f32.losses[1]);
}

TEST(MixedPrecision, InjectedOverflowSkipsExactlyThatStepAndBacksOff) {
  RunOptions o;
  o.precision = DType::f16;
  o.steps = 12;
  o.inject_overflow_at = 5;
  o.scaler.init_scale = 1024;
  o.scaler.growth_interval = 4;
  const TrainRun r = train(o);
  for (int step = 0; step < o.steps; ++step) {
    EXPECT_EQ(r.skipped[static_cast<size_t>(step)], step == 5) << "step " << step;
    // The optimizer ran on every step but the skipped one.
    EXPECT_EQ(r.optimizer_steps[static_cast<size_t>(step)], step < 5 ? step + 1 : step)
        << "step " << step;
  }
  EXPECT_EQ(r.params[5], r.params[4]) << "the skipped step changed the parameters";
  EXPECT_NE(r.params[6], r.params[5]);
  // Growth after 4 finite steps (0-3), back-off at the overflow (5), growth again after 6-9.
  const std::vector<float> expect = {1024, 1024, 1024, 1024, 2048, 2048,
                                     1024, 1024, 1024, 1024, 2048, 2048};
  EXPECT_EQ(r.scales, expect);
}

}  // namespace
}  // namespace meshtrain::nn
