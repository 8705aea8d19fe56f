// Global gradient-norm clipping against a norm computed by hand.
#include "meshtrain/optim/grad_clip.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/sgd.h"

#include "meshtrain/util/error.h"

namespace meshtrain::optim {
namespace {

struct Fixture {
  Tensor a = Tensor::from_vector(std::vector<float>{1, 1}, {2});
  Tensor b = Tensor::from_vector(std::vector<float>{1}, {1});
  Tensor c = Tensor::from_vector(std::vector<float>{1, 1, 1}, {3});  // never gets a gradient
  NamedParams named() const { return {{"a", a}, {"b", b}, {"c", c}}; }
  Fixture() {
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    c.set_requires_grad(true);
    a.set_grad(Tensor::from_vector(std::vector<float>{3, 4}, {2}));
    b.set_grad(Tensor::from_vector(std::vector<float>{-12}, {1}));
  }
};

TEST(GradClip, NormOfAllGradientsTogether) {
  Fixture f;
  EXPECT_DOUBLE_EQ(grad_norm_squared(f.named()), 9.0 + 16.0 + 144.0);  // norm 13
}

TEST(GradClip, ScalesWhenAboveMaxNorm) {
  Fixture f;
  const double norm = clip_grad_norm(f.named(), 6.5);
  EXPECT_DOUBLE_EQ(norm, 13.0);
  const float scale = static_cast<float>(6.5 / (13.0 + 1e-6));
  EXPECT_FLOAT_EQ(f.a.grad().to_vector()[0], 3.0f * scale);
  EXPECT_FLOAT_EQ(f.a.grad().to_vector()[1], 4.0f * scale);
  EXPECT_FLOAT_EQ(f.b.grad().to_vector()[0], -12.0f * scale);
  EXPECT_NEAR(std::sqrt(grad_norm_squared(f.named())), 6.5, 1e-5);
  EXPECT_FALSE(f.c.grad().defined());
}

TEST(GradClip, LeavesSmallGradientsAlone) {
  Fixture f;
  EXPECT_DOUBLE_EQ(clip_grad_norm(f.named(), 20.0), 13.0);
  EXPECT_EQ(f.a.grad().to_vector(), (std::vector<float>{3, 4}));
  EXPECT_EQ(f.b.grad().to_vector(), (std::vector<float>{-12}));
}

TEST(GradClip, UsesTheGivenGlobalNorm) {
  // A data-parallel caller passes the all-reduced norm: 26 here, twice the local 13.
  Fixture f;
  EXPECT_DOUBLE_EQ(clip_grad_norm_with_total(f.named(), 26.0, 13.0), 26.0);
  EXPECT_NEAR(f.a.grad().to_vector()[0], 1.5f, 1e-6f);
  EXPECT_NEAR(f.b.grad().to_vector()[0], -6.0f, 1e-6f);
}

TEST(GradClip, NonFiniteNormIsReturnedAndGradientsKept) {
  Fixture f;
  f.b.grad().data<float>()[0] = std::numeric_limits<float>::infinity();
  const double norm = clip_grad_norm(f.named(), 1.0);
  EXPECT_FALSE(std::isfinite(norm));
  EXPECT_EQ(f.a.grad().to_vector(), (std::vector<float>{3, 4}));
  f.b.grad().data<float>()[0] = std::nanf("");
  EXPECT_TRUE(std::isnan(clip_grad_norm(f.named(), 1.0)));
}

TEST(GradClip, CoefficientIsTheFactorClippingScalesBy) {
  EXPECT_EQ(clip_coefficient(13.0, 6.5), static_cast<float>(6.5 / (13.0 + 1e-6)));
  EXPECT_EQ(clip_coefficient(13.0, 20.0), 1.0f);
  EXPECT_EQ(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0), 1.0f);
  EXPECT_EQ(clip_coefficient(std::nan(""), 1.0), 1.0f);
  EXPECT_THROW(clip_coefficient(13.0, 0.0), ValueError);
}

// A step given the clipping coefficient has the bits of clipping the gradients and then
// stepping, and leaves the gradients as they were: AdamW reads the factor with each gradient,
// SGD (which does not) has its gradients scaled first by the step.
TEST(GradClip, AStepWithTheCoefficientIsClippingThenStepping) {
  for (const OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::sgd}) {
    SCOPED_TRACE(kind == OptimizerKind::adamw ? "adamw" : "sgd");
    auto make = [&](const NamedParams& p) -> std::unique_ptr<Optimizer> {
      if (kind == OptimizerKind::adamw) {
        AdamWOptions o;
        o.lr = 0.1f;
        return std::make_unique<AdamW>(p, o);
      }
      SgdOptions o;
      o.lr = 0.1f;
      o.momentum = 0.9f;
      return std::make_unique<Sgd>(p, o);
    };
    Fixture clipped, folded;
    auto first = make(clipped.named()), second = make(folded.named());
    for (int step = 0; step < 3; ++step) {
      const double norm = std::sqrt(grad_norm_squared(folded.named()));
      const std::vector<float> a_grad = folded.a.grad().to_vector();
      clip_grad_norm(clipped.named(), 1.0);
      first->step();
      second->step(clip_coefficient(norm, 1.0));
      EXPECT_EQ(clipped.a.to_vector(), folded.a.to_vector()) << step;
      EXPECT_EQ(clipped.b.to_vector(), folded.b.to_vector()) << step;
      if (kind == OptimizerKind::adamw) {
        EXPECT_EQ(folded.a.grad().to_vector(), a_grad) << step;
      }
      // The next step's gradients, the same on both sides.
      for (Fixture* f : {&clipped, &folded}) {
        f->a.set_grad(Tensor::from_vector(std::vector<float>{3.0f + step, -4.0f}, {2}));
        f->b.set_grad(Tensor::from_vector(std::vector<float>{-12.0f / (step + 1)}, {1}));
      }
    }
  }
}

TEST(GradClip, RejectsBadMaxNorm) {
  Fixture f;
  EXPECT_THROW(clip_grad_norm(f.named(), 0.0), ValueError);
  EXPECT_THROW(clip_grad_norm(f.named(), -1.0), ValueError);
}

}  // namespace
}  // namespace meshtrain::optim
