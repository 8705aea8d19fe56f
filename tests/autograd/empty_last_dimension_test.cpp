// Ops that fold a tensor's leading dimensions into rows of its last one: with an empty last
// dimension (no features, or a product over an empty sum) they give PyTorch's answers (empty
// outputs, or products over nothing: zeros plus the bias) instead of dividing by zero.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/gelu_mlp.h"
#include "meshtrain/autograd/linear_cross_entropy.h"
#include "meshtrain/autograd/ops.h"

namespace meshtrain {
namespace {

Tensor param(const Shape& shape, float v) {
  Tensor t = Tensor::zeros(shape);
  t.fill_(v);
  return t.set_requires_grad(true);
}

TEST(EmptyLastDimension, LayerNormGivesEmptyOutputsAndGradients) {
  Tensor x = param({2, 3, 0}, 1.0f), w = param({0}, 1.0f), b = param({0}, 0.0f);
  const Tensor y = autograd::layer_norm(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 0}));
  autograd::backward(autograd::sum_all(y));
  EXPECT_EQ(x.grad().shape(), (Shape{2, 3, 0}));
  EXPECT_EQ(w.grad().shape(), (Shape{0}));
}

// No input features: the product is a sum over nothing, so the output is the bias, and the
// bias's gradient the output's summed over the rows.
TEST(EmptyLastDimension, LinearWithoutInputFeaturesGivesTheBias) {
  Tensor x = param({2, 3, 0}, 1.0f), w = param({4, 0}, 1.0f), b = param({4}, 0.5f);
  const Tensor y = autograd::linear(x, w, b);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(y.to_vector(), std::vector<float>(24, 0.5f));
  autograd::backward(autograd::sum_all(y));
  EXPECT_EQ(b.grad().to_vector(), std::vector<float>(4, 6.0f));
  EXPECT_EQ(x.grad().shape(), (Shape{2, 3, 0}));
  EXPECT_EQ(w.grad().shape(), (Shape{4, 0}));
}

// A batched product with a shared right operand folds the batch into rows in its backward.
TEST(EmptyLastDimension, BatchedProductOverAnEmptySumHasZerosAndEmptyGradients) {
  Tensor a = param({2, 3, 0}, 1.0f), b = param({0, 4}, 1.0f);
  const Tensor y = autograd::matmul(a, b);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(y.to_vector(), std::vector<float>(24, 0.0f));
  autograd::backward(autograd::sum_all(y));
  EXPECT_EQ(a.grad().shape(), (Shape{2, 3, 0}));
  EXPECT_EQ(b.grad().shape(), (Shape{0, 4}));
}

TEST(EmptyLastDimension, TheMlpUnderAutocastGivesItsOutputBias) {
  Tensor x = param({2, 0}, 1.0f), w1 = param({3, 0}, 1.0f), b1 = param({3}, 0.0f),
         w2 = param({5, 3}, 1.0f), b2 = param({5}, 0.25f);
  autograd::AutocastGuard autocast(DType::bf16);
  const Tensor y = autograd::gelu_mlp(x, w1, b1, w2, b2);
  ASSERT_EQ(y.shape(), (Shape{2, 5}));
  EXPECT_EQ(y.to_vector(), std::vector<float>(10, 0.25f));
}

// Logits over no features are zeros: each row's loss is log(V).
TEST(EmptyLastDimension, TheLmHeadOverNoFeaturesGivesUniformLogits) {
  Tensor h = param({3, 0}, 1.0f), w = param({4, 0}, 1.0f);
  const Tensor targets = Tensor::from_vector(std::vector<int32_t>{0, 1, 3}, {3});
  const Tensor loss = autograd::linear_cross_entropy(h, w, targets);
  EXPECT_NEAR(loss.item(), std::log(4.0f), 1e-6);
  autograd::backward(loss);
  EXPECT_EQ(w.grad().shape(), (Shape{4, 0}));
}

}  // namespace
}  // namespace meshtrain
