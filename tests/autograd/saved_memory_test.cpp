// What the graph holds between forward and backward, and what backward allocates beside it.
// An add keeps only its operands' shapes. A backward may write over a tensor it saved
// (autograd::may_overwrite_saved): the cross-entropy's gradient goes into its logits when the
// pass frees them afterwards and nothing else holds them. Host memory shows the saving; retained
// graphs and logits the caller still holds must come out as they would without it.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/tensor/storage.h"

namespace meshtrain::autograd {
namespace {

constexpr int64_t N = 128, C = 8, V = 2048;
constexpr size_t kLogitsBytes = static_cast<size_t>(N * V) * sizeof(float);

struct Head {
  Tensor h = Tensor::empty({N, C});
  Tensor w = Tensor::empty({V, C});
  Tensor targets;
  Head() {
    Generator gen(11);
    normal_(h, gen, 0.0, 1.0);
    normal_(w, gen, 0.0, 0.5);
    std::vector<int32_t> t(static_cast<size_t>(N));
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = i % 13 == 0 ? -1 : static_cast<int32_t>(i * 101 % V);
    targets = Tensor::from_vector(t, {N});
    h.set_requires_grad(true);
    w.set_requires_grad(true);
  }
  Tensor logits() const { return linear(h, w, Tensor()); }
  Tensor loss(const Tensor& logits) const { return cross_entropy(logits, targets, -1); }
  std::vector<std::vector<float>> grads() const {
    return {h.grad().to_vector(), w.grad().to_vector()};
  }
};

// A GPT's residual branches (the attention's and the MLP's outputs) go once they are added.
TEST(SavedMemory, AnAddKeepsNeitherOperand) {
  Tensor x = Tensor::zeros({64, 256});
  x.set_requires_grad(true);
  const size_t before = host_tensor_bytes();
  Tensor y = add(x, mul(x, x));  // the product's output is the add's operand
  const size_t kept = host_tensor_bytes() - before;
  EXPECT_EQ(kept, y.nbytes()) << "the sum alone; the product's output went";
  backward(y, Tensor::ones(y.shape()));
  EXPECT_EQ(x.grad().to_vector(), std::vector<float>(static_cast<size_t>(y.numel()), 1.0f));
}

// A leaf takes the incoming gradient's buffer only when nothing else can see it: a gradient the
// caller passes and still holds (reaching the leaf unchanged through an add) is copied, so a
// second backward adds into the leaf's gradient without writing into the caller's tensor.
TEST(SavedMemory, ALeafsGradientNeverAliasesTheCallersGradient) {
  Tensor x = Tensor::zeros({3});
  x.set_requires_grad(true);
  const Tensor c = Tensor::ones({3});
  const Tensor g = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  backward(add(x, c), g);
  EXPECT_NE(x.grad().data_ptr(), g.data_ptr());
  backward(add(x, c), g);
  EXPECT_EQ(g.to_vector(), (std::vector<float>{1, 2, 3})) << "the caller's gradient was written";
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, 4, 6}));
}

TEST(OverwriteSaved, FalseOutsideABackwardPass) {
  EXPECT_FALSE(may_overwrite_saved(Tensor::zeros({4})));
}

// The gradient goes into the logits: backward adds no logits-sized buffer, where it added one
// (the gradient beside the logits, freed only after the cross-entropy's backward).
TEST(OverwriteSaved, TheCrossEntropyGradientTakesTheLogitsBuffer) {
  std::vector<std::vector<float>> reference;
  {
    Head ref;
    Tensor logits = ref.logits();
    Tensor loss = ref.loss(logits);
    backward(loss);  // the caller's `logits` keeps the buffer: a second one is made
    reference = ref.grads();
  }
  Head head;
  Tensor loss = head.loss(head.logits());
  const size_t before = host_tensor_bytes();
  reset_host_tensor_peak_bytes();
  backward(loss);
  const size_t added = host_tensor_peak_bytes() - before;
  EXPECT_LT(added, kLogitsBytes / 2) << added << " bytes added to logits of " << kLogitsBytes;
  EXPECT_EQ(head.grads(), reference);
}

// An addition hands the same gradient to both operands; the half-precision product on one
// branch must not round the one the other branch (the residual) still adds up.
TEST(OverwriteSaved, ABranchUnderBf16LeavesTheResidualsGradientAsItWas) {
  Head head;
  Generator gen(3);
  Tensor w2 = Tensor::empty({C, C}), g = Tensor::empty({N, C});
  normal_(w2, gen, 0.0, 0.5);
  normal_(g, gen, 0.0, 1.0);
  AutocastGuard autocast(DType::bf16);
  backward(linear(head.h, w2, Tensor()), g.clone());
  const std::vector<float> branch = head.h.grad().to_vector(), direct = g.to_vector();
  head.h.autograd_meta().grad = Tensor();
  backward(add(head.h, linear(head.h, w2, Tensor())), g.clone());
  const std::vector<float> got = head.h.grad().to_vector();
  ASSERT_EQ(got.size(), direct.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], branch[i] + direct[i]) << i;
}

TEST(OverwriteSaved, LogitsTheCallerHoldsAreLeftAsTheyWere) {
  Head head;
  const Tensor logits = head.logits();
  const std::vector<float> values = logits.to_vector();
  backward(head.loss(logits));
  EXPECT_EQ(logits.to_vector(), values);
}

// A retained graph runs its nodes again: the first pass must not have consumed the logits.
TEST(OverwriteSaved, ARetainedGraphGivesTheSameGradientsTwice) {
  Head head;
  Tensor loss = head.loss(head.logits());
  backward(loss, Tensor(), BackwardOptions{.retain_graph = true});
  const auto first = head.grads();
  head.h.autograd_meta().grad = Tensor();
  head.w.autograd_meta().grad = Tensor();
  backward(loss);
  EXPECT_EQ(head.grads(), first);
}

}  // namespace
}  // namespace meshtrain::autograd
