// autograd::checkpoint and autograd::grad on small graphs: the gradients through a checkpointed
// segment equal those without it, bit for bit; generator states are replayed for the
// recomputation and left where the forward left them; a parameter used inside and outside a
// segment gets one hook call with its final gradient; grad() returns gradients without
// accumulating them or firing hooks.
#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/autograd/checkpoint.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/node.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::autograd {
namespace {

Tensor rnd(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, g);
}

// A segment with a product, a nonlinearity, dropout and a parameter read twice.
Tensor segment(const Tensor& x, const Tensor& w, uint64_t dropout_seed) {
  Tensor h = gelu(matmul(x, w));
  h = dropout(h, 0.3f, dropout_seed, 0, true);
  return add(matmul(h, w), x);
}

TEST(Grad, ReturnsGradientsWithoutAccumulatingOrFiringHooks) {
  Tensor x = rnd({3}, 1).set_requires_grad(true);
  Tensor w = rnd({3}, 2).set_requires_grad(true);
  int fired = 0;
  register_grad_ready_hook(w, [&](const Tensor&) { ++fired; });
  Tensor y = sum_all(mul(mul(x, w), w));
  std::vector<Tensor> g = grad({y}, {Tensor()}, {w});
  ASSERT_EQ(g.size(), 1u);
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());  // the walk never reached x's accumulator either
  EXPECT_EQ(fired, 0);
  const auto xv = x.to_vector(), wv = w.to_vector(), gv = g[0].to_vector();
  for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(gv[i], 2 * xv[i] * wv[i]);
}

TEST(Checkpoint, GradientsMatchTheUncheckpointedSegmentBitwise) {
  Tensor w = rnd({8, 8}, 3).set_requires_grad(true);
  Tensor x0 = rnd({4, 8}, 4).set_requires_grad(true);
  const Tensor v = rnd({8, 8}, 5);
  auto run = [&](bool ckpt) {
    w.set_grad(Tensor());
    x0.set_grad(Tensor());
    Tensor x = tanh(x0);
    Tensor y = ckpt ? checkpoint(
                          [&](const std::vector<Tensor>& in) {
                            return std::vector<Tensor>{segment(in[0], w, 17)};
                          },
                          {x}, {w})[0]
                    : segment(x, w, 17);
    // w is used only inside the segment, so its gradient is summed in the same order either
    // way; a parameter also used outside gets its parts in another order (see the hook test).
    backward(sum_all(matmul(y, v)));
    return std::make_pair(w.grad().to_vector(), x0.grad().to_vector());
  };
  const auto plain = run(false), ckpt = run(true);
  EXPECT_EQ(plain.first, ckpt.first);
  EXPECT_EQ(plain.second, ckpt.second);
}

TEST(Checkpoint, KeepsNoGraphInsideTheSegment) {
  Tensor w = rnd({4, 4}, 5).set_requires_grad(true);
  Tensor x = rnd({2, 4}, 6).set_requires_grad(true);
  Tensor y = checkpoint(
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(matmul(in[0], w))}; },
      {x}, {w})[0];
  ASSERT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn()->name(), "Checkpoint");
  // Its edges lead straight to the inputs' accumulators: nothing of gelu or matmul was kept.
  for (const Edge& e : y.grad_fn()->next_edges()) EXPECT_EQ(e.fn->name(), "AccumulateGrad");
}

TEST(Checkpoint, ReplaysGeneratorStatesAndLeavesThemWhereTheForwardDid) {
  Tensor w = rnd({6, 6}, 7).set_requires_grad(true);
  Tensor x = rnd({3, 6}, 8);
  // The segment draws its dropout seed from a stateful generator.
  auto fn_for = [&](Generator& gen) {
    return [&w, &gen](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{segment(in[0], w, gen.next_u64())};
    };
  };
  Generator g1(42);
  backward(sum_all(fn_for(g1)({x})[0]));
  const auto expect = w.grad().to_vector();
  const uint64_t after_forward = g1.counter();

  w.set_grad(Tensor());
  Generator g2(42);
  Tensor y = checkpoint(fn_for(g2), {x}, {w}, {.generators = {&g2}})[0];
  EXPECT_EQ(g2.counter(), after_forward);
  backward(sum_all(y));
  EXPECT_EQ(w.grad().to_vector(), expect);
  EXPECT_EQ(g2.counter(), after_forward) << "the recomputation's draws must not advance it";

  // Without naming the generator the recomputation draws another mask: the test can fail.
  w.set_grad(Tensor());
  Generator g3(42);
  backward(sum_all(checkpoint(fn_for(g3), {x}, {w})[0]));
  EXPECT_NE(w.grad().to_vector(), expect);
}

TEST(Checkpoint, HookOfAParameterUsedInsideAndOutsideFiresOnceWithTheTotal) {
  Tensor w = rnd({4, 4}, 9).set_requires_grad(true);
  Tensor x = rnd({2, 4}, 10);
  int fired = 0;
  std::vector<float> seen;
  register_grad_ready_hook(w, [&](const Tensor& p) {
    ++fired;
    seen = p.grad().to_vector();
  });
  Tensor y = checkpoint(
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], w)}; }, {x},
      {w})[0];
  backward(sum_all(matmul(y, w)));
  EXPECT_EQ(fired, 1);
  EXPECT_EQ(seen, w.grad().to_vector());
  clear_grad_ready_hooks(w);
  // The total equals the uncheckpointed one up to the order in which its two parts were added.
  const auto with_ckpt = w.grad().to_vector();
  w.set_grad(Tensor());
  backward(sum_all(matmul(matmul(x, w), w)));
  const auto plain = w.grad().to_vector();
  ASSERT_EQ(plain.size(), with_ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_NEAR(with_ckpt[i], plain[i], 1e-5f * (1.0f + std::abs(plain[i])));
}

TEST(Checkpoint, WithoutGradientsItIsAPlainCall) {
  Tensor w = rnd({4, 4}, 11).set_requires_grad(true);
  NoGradGuard no_grad;
  Tensor y = checkpoint(
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], w)}; },
      {rnd({2, 4}, 12)}, {w})[0];
  EXPECT_FALSE(y.requires_grad());
}

}  // namespace
}  // namespace meshtrain::autograd
