// Finite-difference checks of every differentiable op (the checker is tests/support/gradcheck.h).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "meshtrain/autograd/checkpoint.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/function.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/nn/block.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/random.h"
#include "tests/support/gradcheck.h"

namespace meshtrain::autograd {
namespace {

using testing::gradcheck;
using testing::rnd;

TEST(Gradcheck, Elementwise) {
  gradcheck([](auto& in) { return add(in[0], in[1]); }, {rnd({2, 3}, 1), rnd({3}, 2)}, "add");
  gradcheck([](auto& in) { return sub(in[0], in[1]); }, {rnd({2, 3}, 1), rnd({2, 1}, 2)}, "sub");
  gradcheck([](auto& in) { return mul(in[0], in[1]); }, {rnd({2, 3}, 1), rnd({1, 3}, 2)}, "mul");
  gradcheck([](auto& in) { return div(in[0], in[1]); }, {rnd({2, 3}, 1), rnd({2, 3}, 2, 0.2f, 2.f)},
            "div");
  gradcheck([](auto& in) { return affine(in[0], -1.5f, 2.f); }, {rnd({4}, 3)}, "affine");
  gradcheck([](auto& in) { return exp(in[0]); }, {rnd({5}, 4)}, "exp");
  gradcheck([](auto& in) { return log(in[0]); }, {rnd({5}, 5, 0.2f, 2.f)}, "log");
  gradcheck([](auto& in) { return tanh(in[0]); }, {rnd({5}, 6)}, "tanh");
  gradcheck([](auto& in) { return sqrt(in[0]); }, {rnd({5}, 7, 0.2f, 2.f)}, "sqrt");
  gradcheck([](auto& in) { return pow(in[0], 3.f); }, {rnd({5}, 8)}, "pow");
}

TEST(Gradcheck, Matmul) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Tensor a = ta ? rnd({2, 4, 3}, 1) : rnd({2, 3, 4}, 1);
      Tensor b = tb ? rnd({2, 5, 4}, 2) : rnd({2, 4, 5}, 2);
      gradcheck([ta, tb](auto& in) { return matmul(in[0], in[1], ta, tb); }, {a, b}, "bmm");
      Tensor b2 = tb ? rnd({5, 4}, 3) : rnd({4, 5}, 3);
      if (!ta)
        gradcheck([tb](auto& in) { return matmul(in[0], in[1], false, tb); },
                  {rnd({2, 3, 4}, 4), b2}, "matmul shared");
    }
}

TEST(Gradcheck, ShapeOps) {
  gradcheck([](auto& in) { return reshape(in[0], {3, -1}); }, {rnd({2, 3, 2}, 1)}, "reshape");
  gradcheck([](auto& in) { return transpose(in[0], 0, 2); }, {rnd({2, 3, 2}, 1)}, "transpose");
  gradcheck([](auto& in) { return permute(in[0], {1, 2, 0}); }, {rnd({2, 3, 2}, 1)}, "permute");
  gradcheck([](auto& in) { return narrow(in[0], 1, 1, 2); }, {rnd({2, 4}, 1)}, "narrow");
  gradcheck(
      [](auto& in) {
        return cat({in[0], in[1]}, 1);
      },
      {rnd({2, 1}, 1), rnd({2, 3}, 2)}, "cat");
}

TEST(Gradcheck, Reductions) {
  gradcheck([](auto& in) { return sum(in[0], 1); }, {rnd({2, 3, 2}, 1)}, "sum");
  gradcheck([](auto& in) { return mean(in[0], -1, true); }, {rnd({2, 3}, 1)}, "mean");
  gradcheck([](auto& in) { return max(in[0], 0); }, {rnd({4, 3}, 1)}, "max");
  gradcheck([](auto& in) { return mean_all(in[0]); }, {rnd({4, 3}, 1)}, "mean_all");
}

TEST(Gradcheck, FusedLayers) {
  gradcheck([](auto& in) { return linear(in[0], in[1], in[2]); },
            {rnd({2, 3, 4}, 1), rnd({5, 4}, 2), rnd({5}, 3)}, "linear");
  gradcheck([](auto& in) { return linear_residual(in[3], in[0], in[1], in[2]); },
            {rnd({2, 3, 4}, 1), rnd({5, 4}, 2), rnd({5}, 3), rnd({2, 3, 5}, 4)}, "linear_residual");
  gradcheck([](auto& in) { return layer_norm(in[0], in[1], in[2]); },
            {rnd({3, 6}, 1), rnd({6}, 2, 0.5f, 1.f), rnd({6}, 3)}, "layer_norm");
  gradcheck([](auto& in) { return gelu(in[0]); }, {rnd({3, 5}, 1, 2.f)}, "gelu");
  gradcheck([](auto& in) { return softmax(in[0]); }, {rnd({3, 5}, 1)}, "softmax");
  gradcheck([](auto& in) { return causal_attention(in[0], 2); }, {rnd({2, 5, 12}, 1)}, "attention");
  Tensor targets = Tensor::from_vector(std::vector<int32_t>{1, -1, 4, 0}, {4});
  gradcheck([targets](auto& in) { return cross_entropy(in[0], targets, -1); }, {rnd({4, 5}, 1)},
            "cross_entropy");
  Tensor idx = Tensor::from_vector(std::vector<int32_t>{1, 3, 1, 0, 2, 1}, {2, 3});
  gradcheck([idx](auto& in) { return gpt_embedding(idx, in[0], in[1]); },
            {rnd({4, 3}, 1), rnd({5, 3}, 2)}, "gpt_embedding");
  gradcheck([idx](auto& in) { return embedding(idx, in[0]); }, {rnd({4, 3}, 1)}, "embedding");
  gradcheck([](auto& in) { return dropout(in[0], 0.3f, 42, 0, true); }, {rnd({4, 8}, 1)},
            "dropout");
}

TEST(Gradcheck, GptBlock) {
  Generator gen(5);
  nn::BlockOptions opt;
  opt.n_embd = 8;
  opt.n_head = 2;
  auto block = std::make_shared<nn::Block>(opt, gen);
  std::vector<Tensor> inputs = {rnd({2, 4, 8}, 11)};
  for (auto& [name, p] : block->named_parameters()) inputs.push_back(p);
  // Parameters enter as the same tensors the block uses, so perturbing them perturbs the block.
  gradcheck([block](auto& in) { return block->forward(in[0]); }, inputs, "block", 5e-3, 3e-3, 3e-2);
}

TEST(Gradcheck, CheckpointedGptBlock) {
  Generator gen(5);
  nn::BlockOptions opt;
  opt.n_embd = 8;
  opt.n_head = 2;
  auto block = std::make_shared<nn::Block>(opt, gen);
  std::vector<Tensor> inputs = {rnd({2, 4, 8}, 11)};
  for (auto& [name, p] : block->named_parameters()) inputs.push_back(p);
  gradcheck(
      [block](auto& in) {
        return checkpoint(
            [block](const std::vector<Tensor>& x) {
              return std::vector<Tensor>{block->forward(x[0])};
            },
            {in[0]}, block->parameters())[0];
      },
      inputs, "checkpointed block", 5e-3, 3e-3, 3e-2);
}

TEST(Autograd, AccumulatesAcrossBackwardCalls) {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2}, {2}).set_requires_grad(true);
  backward(sum_all(mul(x, x)));
  backward(sum_all(mul(x, x)));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{4, 8}));
}

// An addition hands its gradient to both operands as one tensor: a later gradient summed into one
// operand's must not change the other's.
TEST(Autograd, AGradientSharedByTwoOperandsIsNotSummedIntoInPlace) {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2}, {2}).set_requires_grad(true);
  Tensor y = Tensor::from_vector(std::vector<float>{3, 4}, {2}).set_requires_grad(true);
  const Tensor a = scale(x, 1.0f), b = scale(y, 1.0f);  // a and b have producers
  const Tensor c = scale(a, 3.0f);                      // a second consumer of a
  backward(sum_all(add(add(a, b), c)));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{4, 4}));
  EXPECT_EQ(y.grad().to_vector(), (std::vector<float>{1, 1}));
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = Tensor::ones({2}).set_requires_grad(true);
  NoGradGuard g;
  Tensor y = mul(x, x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_THROW(backward(sum_all(y)), Error);
}

TEST(Autograd, HooksFireOnceWhenGradientIsFinal) {
  // x feeds two paths; its hook must run after both contributions are summed.
  Tensor x = Tensor::from_vector(std::vector<float>{3}, {1}).set_requires_grad(true);
  Tensor w = Tensor::from_vector(std::vector<float>{2}, {1}).set_requires_grad(true);
  std::vector<std::string> order;
  float seen = 0;
  register_grad_ready_hook(x, [&](const Tensor& t) {
    order.push_back("x");
    seen = t.grad().item();
  });
  register_grad_ready_hook(w, [&](const Tensor&) { order.push_back("w"); });
  Tensor y = add(mul(x, w), mul(x, x));  // dy/dx = w + 2x = 8
  backward(sum_all(y));
  EXPECT_EQ(seen, 8.f);
  ASSERT_EQ(order.size(), 2u);
}

TEST(Autograd, HooksFireInReverseLayerOrder) {
  // Later layers finish their gradients first: the data-parallel reducer relies on it.
  Tensor w1 = Tensor::ones({2, 2}).set_requires_grad(true);
  Tensor w2 = Tensor::ones({2, 2}).set_requires_grad(true);
  std::vector<int> order;
  register_grad_ready_hook(w1, [&](const Tensor&) { order.push_back(1); });
  register_grad_ready_hook(w2, [&](const Tensor&) { order.push_back(2); });
  Tensor x = Tensor::ones({1, 2});
  backward(sum_all(matmul(matmul(x, w1), w2)));
  EXPECT_EQ(order, (std::vector<int>{2, 1}));
}

class Square : public Function {
 public:
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    x_ = in[0].detach();
    return {ops::mul(in[0], in[0])};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {ops::affine(ops::mul(g[0], x_), 2.f, 0.f)};
  }
  std::string name() const override { return "Square"; }

 private:
  Tensor x_;
};

class WrongSquare : public Square {
 public:
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {ops::affine(Square::backward(g)[0], 1.5f, 0.f)};
  }
};

void check_wrong_square() {
  gradcheck([](auto& in) { return Function::apply(std::make_shared<WrongSquare>(), {in[0]})[0]; },
            {rnd({4}, 3)}, "wrong");
}

TEST(Autograd, GradcheckCatchesAWrongBackward) {
  EXPECT_FATAL_FAILURE(check_wrong_square(), "wrong");
}

TEST(Autograd, CustomFunction) {
  gradcheck([](auto& in) { return Function::apply(std::make_shared<Square>(), {in[0]})[0]; },
            {rnd({4}, 3)}, "custom");
}

}  // namespace
}  // namespace meshtrain::autograd
