// The LM head and its loss as one op (autograd/linear_cross_entropy.h). Without autocast it is
// linear() then cross_entropy(), bit for bit. Under autocast it is the same graph with the logits
// rounded to the half type before the loss (as PyTorch's autocast hands its LM head's bf16
// output to an f32 cross-entropy): written here as the rounding added to the f32 logits with a
// gradient that passes straight through, which is exact (the difference of two floats within a
// factor of two of each other is exact, and so is adding it back).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/linear_cross_entropy.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/tensor/storage.h"
#include "meshtrain/util/error.h"

namespace meshtrain::autograd {
namespace {

constexpr int64_t B = 4, T = 32, C = 8, V = 1024;

struct Head {
  Tensor h = Tensor::empty({B, T, C});
  Tensor w = Tensor::empty({V, C});
  Tensor targets;
  Head() {
    Generator gen(21);
    normal_(h, gen, 0.0, 1.0);
    normal_(w, gen, 0.0, 1.5);
    std::vector<int32_t> t(static_cast<size_t>(B * T));
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = i % 11 == 0 ? -1 : static_cast<int32_t>(i * 97 % V);
    targets = Tensor::from_vector(t, {B, T});
    h.set_requires_grad(true);
    w.set_requires_grad(true);
  }
  std::vector<std::vector<float>> run(const std::function<Tensor()>& loss_fn, float seed = 1.0f) {
    h.autograd_meta().grad = Tensor();
    w.autograd_meta().grad = Tensor();
    Tensor loss = loss_fn();
    backward(loss, Tensor::scalar(seed));
    return {loss.to_vector(), h.grad().to_vector(), w.grad().to_vector()};
  }
  Tensor fused() const { return linear_cross_entropy(h, w, targets, -1); }
  // linear then cross_entropy; under autocast the logits rounded with a straight-through
  // gradient.
  Tensor composed() const {
    Tensor logits = reshape(linear(h, w, Tensor()), {B * T, V});
    if (autocast_enabled()) {
      const Tensor exact = logits.detach();
      logits = add(logits, sub(round_to(exact, autocast_dtype()), exact));
    }
    return cross_entropy(logits, targets.view({B * T}), -1);
  }
};

TEST(LinearCrossEntropy, WithoutAutocastItIsLinearThenCrossEntropy) {
  Head head;
  const auto want = head.run([&] { return head.composed(); });
  EXPECT_EQ(head.run([&] { return head.fused(); }), want);
}

TEST(LinearCrossEntropy, UnderAutocastTheLossReadsTheLogitsRoundedToTheHalfType) {
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    Head head;
    AutocastGuard autocast(half);
    const auto want = head.run([&] { return head.composed(); });
    const auto got = head.run([&] { return head.fused(); });
    EXPECT_EQ(got, want);
    // And the rounding is really there: the f32 logits give another loss.
    Tensor unrounded = cross_entropy(reshape(linear(head.h, head.w, Tensor()), {B * T, V}),
                                     head.targets.view({B * T}), -1);
    EXPECT_NE(unrounded.item(), got[0][0]);
  }
}

// A loss scale reaches an f16 gradient before it is rounded, as it does through PyTorch's
// autocast (the composed ops' bits). Under bf16 the scale is applied after rounding (exact for a
// power of two).
TEST(LinearCrossEntropy, UnderF16ALossScaleReachesTheGradientBeforeItIsRounded) {
  for (DType half : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(half));
    Head head;
    AutocastGuard autocast(half);
    const auto want = head.run([&] { return head.composed(); }, 65536.0f);
    const auto got = head.run([&] { return head.fused(); }, 65536.0f);
    EXPECT_EQ(got[0], want[0]);
    if (half == DType::f16) {
      EXPECT_EQ(got[1], want[1]);
      EXPECT_EQ(got[2], want[2]);
    }
  }
}

// What that is for: over 4096 rows of 8192 classes, (softmax - onehot) / count is about 3e-8 for
// most entries, at the end of f16's range (6e-8), and rounding it before the loss scale kept
// little of the weight's gradient. With the scale first, f16's weight gradient is within its
// precision of the f32 one.
TEST(LinearCrossEntropy, UnderF16TheWeightGradientOfAWideBatchFollowsF32) {
  const int64_t N = 4096, Cw = 8, Vw = 8192;
  constexpr float kScale = 65536.0f;
  Generator gen(5);
  Tensor h = Tensor::empty({N, Cw}), w = Tensor::empty({Vw, Cw});
  normal_(h, gen, 0.0, 1.0);
  normal_(w, gen, 0.0, 0.3);
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i * 7919 % Vw);
  const Tensor targets = Tensor::from_vector(t, {N});
  auto weight_grad = [&](bool f16) {
    std::optional<AutocastGuard> autocast;
    if (f16) autocast.emplace(DType::f16);
    Tensor wl = w.clone();
    wl.set_requires_grad(true);
    backward(linear_cross_entropy(h, wl, targets, -1), Tensor::scalar(kScale));
    return wl.grad().to_vector();
  };
  const auto f32 = weight_grad(false), f16 = weight_grad(true);
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < f32.size(); ++i) {
    err += (f16[i] - f32[i]) * static_cast<double>(f16[i] - f32[i]);
    norm += f32[i] * static_cast<double>(f32[i]);
  }
  EXPECT_LT(std::sqrt(err / norm), 2e-3);  // 2.4e-4; 4.3e-2 when rounded before the scale
}

// The head keeps its logits in the half type: 2 bytes each from forward to backward, where the
// separate ops keep 4 (and the CPU's emulation of the half product a rounded copy beside them).
TEST(LinearCrossEntropy, UnderBf16TheGraphKeepsHalfLogits) {
  Head head;
  AutocastGuard autocast(DType::bf16);
  const size_t logits_f32 = static_cast<size_t>(B * T * V) * sizeof(float);
  const size_t before = host_tensor_bytes();
  Tensor loss = head.fused();
  const size_t kept = host_tensor_bytes() - before;
  EXPECT_LE(kept, logits_f32 / 2 + 2 * static_cast<size_t>((B * T + V) * C) * 2 + 4096)
      << "the graph keeps " << kept << " bytes";
  EXPECT_GE(kept, logits_f32 / 2);
  backward(loss);
}

// The final norm may hand the head its output in the half type: the loss and the weight's gradient
// of the same values given in f32, and a half gradient for the half hidden state (the f32 one
// rounded).
TEST(LinearCrossEntropy, AHalfHiddenStateGetsAHalfGradient) {
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    Head head;
    AutocastGuard autocast(half);
    Tensor rounded = round_to(head.h.detach(), half);
    Tensor packed = rounded.to(half);
    rounded.set_requires_grad(true);
    packed.set_requires_grad(true);
    const Tensor w = head.w.detach();
    Tensor wa = w.clone(), wb = w.clone();
    wa.set_requires_grad(true);
    wb.set_requires_grad(true);
    const Tensor want = linear_cross_entropy(rounded, wa, head.targets, -1);
    const Tensor got = linear_cross_entropy(packed, wb, head.targets, -1);
    backward(want);
    backward(got);
    EXPECT_EQ(got.item(), want.item());
    EXPECT_EQ(wb.grad().to_vector(), wa.grad().to_vector());
    ASSERT_EQ(packed.grad().dtype(), half);
    EXPECT_EQ(packed.grad().to(DType::f32).to_vector(),
              rounded.grad().to(half).to(DType::f32).to_vector());
  }
}

// A retained graph runs the head's backward again, on the same logits.
TEST(LinearCrossEntropy, ARetainedGraphGivesTheSameGradientsTwice) {
  Head head;
  AutocastGuard autocast(DType::bf16);
  Tensor loss = head.fused();
  backward(loss, Tensor(), BackwardOptions{.retain_graph = true});
  const std::vector<float> first = head.w.grad().to_vector();
  head.w.autograd_meta().grad = Tensor();
  backward(loss);
  EXPECT_EQ(head.w.grad().to_vector(), first);
}

TEST(LinearCrossEntropy, MismatchedOperandsAreNamed) {
  Head head;
  try {
    linear_cross_entropy(head.h, head.w, Tensor::zeros({B, T + 1}, DType::i32));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("132 targets for 128 rows"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(linear_cross_entropy(head.h, Tensor::zeros({V, C + 1}), head.targets), Error);
  EXPECT_THROW(linear_cross_entropy(head.h, head.w, Tensor::zeros({B, T})), Error);
}

}  // namespace
}  // namespace meshtrain::autograd
