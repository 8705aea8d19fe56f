#include "meshtrain/nn/mlp_classifier.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::nn {
namespace {

// Two interleaved spirals: not linearly separable, so the hidden layers must do the work.
std::pair<Tensor, Tensor> spirals(int64_t n, uint64_t seed) {
  Generator g(seed);
  std::vector<float> x(static_cast<size_t>(2 * n));
  std::vector<int32_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t cls = static_cast<int32_t>(i % 2);
    const double t = 0.5 + 3.0 * g.uniform();
    const double a = t * 1.6 + cls * std::numbers::pi;
    x[static_cast<size_t>(2 * i)] = static_cast<float>(t * std::cos(a) / 3.5 + 0.03 * g.normal());
    x[static_cast<size_t>(2 * i + 1)] =
        static_cast<float>(t * std::sin(a) / 3.5 + 0.03 * g.normal());
    y[static_cast<size_t>(i)] = cls;
  }
  return {Tensor::from_vector(x, {n, 2}), Tensor::from_vector(y, {n})};
}

TEST(MLPClassifier, NamesAndShapes) {
  MLPClassifier m({2, 16, 3}, 1);
  auto names = m.named_parameters();
  ASSERT_EQ(names.size(), 4u);
  EXPECT_EQ(names[0].first, "0.weight");
  EXPECT_EQ(names[3].first, "1.bias");
  EXPECT_EQ(m.forward(Tensor::zeros({5, 2})).shape(), (Shape{5, 3}));
  EXPECT_THROW(MLPClassifier({4}, 1), Error);
}

TEST(MLPClassifier, LearnsTwoSpirals) {
  auto [x, y] = spirals(400, 3);
  auto [tx, ty] = spirals(400, 4);
  MLPClassifier m({2, 64, 64, 2}, 7);
  optim::AdamWOptions o;
  o.lr = 1e-2f;
  o.weight_decay = 0.0f;
  optim::AdamW opt(m.named_parameters(), o);
  for (int step = 0; step < 400; ++step) {
    opt.zero_grad();
    autograd::backward(m.loss(x, y));
    opt.step();
  }
  auto pred = m.predict(tx);
  const int32_t* labels = ty.data<int32_t>();
  int correct = 0;
  for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == labels[i];
  EXPECT_GT(correct, 360) << "held-out accuracy " << correct / 4.0 << "%";
}

}  // namespace
}  // namespace meshtrain::nn
