// The vision ops through autograd: finite-difference checks of every backward (conv2d on both
// implementations), batch-norm statistics and running averages against hand-computed values, and
// the errors for bad shapes. Tolerances are those of tests/support/gradcheck.h.
#include "meshtrain/autograd/vision.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/tensor/cpu/conv2d.h"
#include "tests/cuda/fake_device.h"
#include "tests/support/gradcheck.h"

namespace meshtrain::autograd {
namespace {

using testing::gradcheck;
using testing::rnd;

// Runs fn and expects an exception of type E whose message contains `needle`.
template <typename E = Error, typename F>
void expect_error(F&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

Tensor f32(std::vector<float> v, const Shape& s) {
  return Tensor::from_vector(v, s);
}

// Values spread at least 0.05 apart, so that a 5e-3 finite-difference step never changes which
// element of a pooling window is the maximum, nor the sign of a ReLU input.
Tensor distinct(const Shape& s, uint64_t seed) {
  const int64_t n = shape_numel(s);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] =
        static_cast<float>((i * 37 + static_cast<int64_t>(seed)) % n) * 0.05f -
        0.025f * static_cast<float>(n);
  return Tensor::from_vector(v, s);
}

TEST(VisionGradcheck, Conv2dOnBothImplementations) {
  struct Case {
    Conv2dOptions o;
    Shape x, w;
    bool bias;
  };
  const Case cases[] = {
      {{1, 1, 1, 1}, {2, 3, 5, 4}, {4, 3, 3, 3}, true},
      {{2, 1, 1, 1}, {1, 2, 6, 5}, {3, 2, 3, 3}, false},
      {{1, 0, 2, 1}, {1, 2, 6, 6}, {2, 2, 3, 3}, true},
      {{1, 1, 1, 2}, {2, 4, 4, 4}, {2, 2, 3, 3}, true},
      {{2, 0, 1, 1}, {1, 3, 4, 4}, {2, 3, 1, 1}, false},
      {{1, 1, 1, 3}, {1, 3, 4, 4}, {6, 1, 3, 3}, true},  // depthwise, two filters per channel
  };
  for (cpu::ConvImpl impl : {cpu::ConvImpl::onednn, cpu::ConvImpl::reference}) {
    cpu::ScopedConvImpl scoped(impl);
    int k = 0;
    for (const Case& c : cases) {
      const std::string what = std::string(impl == cpu::ConvImpl::onednn ? "onednn" : "reference") +
                               " conv2d case " + std::to_string(k++);
      std::vector<Tensor> in = {rnd(c.x, 1), rnd(c.w, 2, 0.5f)};
      if (c.bias) in.push_back(rnd({c.w[0]}, 3));
      const Conv2dOptions o = c.o;
      gradcheck([o](auto& t) { return conv2d(t[0], t[1], t.size() > 2 ? t[2] : Tensor(), o); }, in,
                what);
    }
  }
}

TEST(VisionGradcheck, BatchNormTrainingAndEvaluation) {
  gradcheck([](auto& t) { return batch_norm(t[0], t[1], t[2], Tensor(), Tensor(), true); },
            {rnd({3, 2, 2, 3}, 1, 2.f, 1.f), rnd({2}, 2, 0.5f, 1.f), rnd({2}, 3)},
            "batch_norm train");
  gradcheck([](auto& t) { return batch_norm(t[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
            {rnd({4, 3, 2, 1}, 4)}, "batch_norm train, no affine");
  const Tensor rm = f32({0.5f, -1.0f}, {2});
  const Tensor rv = f32({2.0f, 0.5f}, {2});
  gradcheck([rm, rv](auto& t) { return batch_norm(t[0], t[1], t[2], rm, rv, false); },
            {rnd({2, 2, 3, 2}, 5), rnd({2}, 6, 0.5f, 1.f), rnd({2}, 7)}, "batch_norm eval");
}

TEST(VisionGradcheck, PoolingReluFlatten) {
  gradcheck([](auto& t) { return max_pool2d(t[0], 3, 2, 1); }, {distinct({2, 2, 5, 5}, 3)},
            "max_pool2d 3/2/1");
  gradcheck([](auto& t) { return max_pool2d(t[0], 2); }, {distinct({1, 3, 4, 6}, 5)},
            "max_pool2d 2");
  gradcheck([](auto& t) { return avg_pool2d(t[0], 3, 2, 1); }, {rnd({2, 2, 5, 5}, 1)},
            "avg_pool2d");
  gradcheck([](auto& t) { return avg_pool2d(t[0], 3, 2, 1, false); }, {rnd({1, 2, 5, 4}, 2)},
            "avg_pool2d, padding not counted");
  gradcheck([](auto& t) { return global_avg_pool(t[0]); }, {rnd({2, 3, 3, 2}, 3)},
            "global_avg_pool");
  gradcheck([](auto& t) { return relu(t[0]); }, {distinct({3, 7}, 4)}, "relu");
  gradcheck([](auto& t) { return flatten(t[0]); }, {rnd({2, 3, 2, 2}, 5)}, "flatten");
  EXPECT_EQ(flatten(Tensor::zeros({2, 3, 1, 1})).shape(), (Shape{2, 3}));
  EXPECT_EQ(flatten(Tensor::zeros({2, 3, 4}), 0).shape(), (Shape{24}));
}

TEST(VisionOps, ConvolutionImplementationsAgreeThroughAutograd) {
  // The same small network on each implementation: outputs and gradients within float rounding.
  auto run = [](cpu::ConvImpl impl) {
    cpu::ScopedConvImpl scoped(impl);
    Tensor x = rnd({2, 3, 8, 8}, 1).set_requires_grad(true);
    Tensor w1 = rnd({8, 3, 3, 3}, 2, 0.3f).set_requires_grad(true);
    Tensor w2 = rnd({8, 4, 3, 3}, 3, 0.3f).set_requires_grad(true);
    Tensor h = relu(conv2d(x, w1, Tensor(), {2, 1, 1, 1}));
    Tensor y = global_avg_pool(conv2d(h, w2, Tensor(), {1, 1, 1, 2}));
    backward(sum_all(mul(y, rnd({2, 8}, 4))));
    return std::vector<std::vector<float>>{y.to_vector(), x.grad().to_vector(),
                                           w1.grad().to_vector(), w2.grad().to_vector()};
  };
  const auto a = run(cpu::ConvImpl::onednn), b = run(cpu::ConvImpl::reference);
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].size(), b[k].size());
    float scale = 0.0f;
    for (float v : b[k]) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < a[k].size(); ++i)
      ASSERT_NEAR(a[k][i], b[k][i], 1e-5f * scale + 1e-7f) << "tensor " << k << " element " << i;
  }
}

TEST(VisionOps, BatchNormTrainingStatisticsByHand) {
  // One channel holding {1, 2, 3, 4} (N=2, H=1, W=2): mean 2.5, biased variance 1.25, unbiased
  // 5/3; a second channel holding {0, 0, 0, 8}: mean 2, biased variance 12, unbiased 16.
  const Tensor x = f32({1, 2, 0, 0, 3, 4, 0, 8}, {2, 2, 1, 2});
  const Tensor w = f32({2.0f, 1.0f}, {2});
  const Tensor b = f32({0.5f, 0.0f}, {2});
  Tensor rm = f32({1.0f, 0.0f}, {2});
  Tensor rv = f32({1.0f, 2.0f}, {2});
  const Tensor y = batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5);
  const std::vector<float> got = y.to_vector();
  const double s0 = 1.0 / std::sqrt(1.25 + 1e-5), s1 = 1.0 / std::sqrt(12.0 + 1e-5);
  const double want[] = {
      (1 - 2.5) * s0 * 2 + 0.5, (2 - 2.5) * s0 * 2 + 0.5, (0 - 2.0) * s1, (0 - 2.0) * s1,
      (3 - 2.5) * s0 * 2 + 0.5, (4 - 2.5) * s0 * 2 + 0.5, (0 - 2.0) * s1, (8 - 2.0) * s1};
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(got[i], want[i], 2e-6) << i;
  // running = 0.9 * running + 0.1 * batch (mean, unbiased variance).
  EXPECT_FLOAT_EQ(rm.to_vector()[0], 0.9f * 1.0f + 0.1f * 2.5f);
  EXPECT_FLOAT_EQ(rm.to_vector()[1], 0.1f * 2.0f);
  EXPECT_FLOAT_EQ(rv.to_vector()[0], 0.9f + 0.1f * (5.0f / 3.0f));
  EXPECT_FLOAT_EQ(rv.to_vector()[1], 0.9f * 2.0f + 0.1f * 16.0f);
}

TEST(VisionOps, BatchNormEvaluationUsesRunningStatisticsOnly) {
  const Tensor x = f32({1, 2, 3, 4}, {1, 1, 2, 2});
  Tensor rm = f32({2.0f}, {1});
  Tensor rv = f32({4.0f}, {1});
  const Tensor y = batch_norm(x, Tensor(), Tensor(), rm, rv, false, 0.1, 1e-5);
  const double s = 1.0 / std::sqrt(4.0 + 1e-5);
  const std::vector<float> got = y.to_vector();
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[static_cast<size_t>(i)], (i + 1 - 2.0) * s, 1e-6);
  EXPECT_EQ(rm.to_vector()[0], 2.0f);  // untouched
  EXPECT_EQ(rv.to_vector()[0], 4.0f);
}

TEST(VisionOps, BatchNormReduceHooksSeeLocalSumsAndTheirTotalsAreUsed) {
  // A fake "other rank" holding the same batch: doubling every sum and the count must leave the
  // output unchanged and the input gradient unchanged (the mean of two equal halves is the same).
  const Tensor x0 = rnd({3, 2, 2, 2}, 1);
  const Tensor w = rnd({2}, 2, 0.5f, 1.f), b = rnd({2}, 3);
  const Tensor dy = rnd({3, 2, 2, 2}, 4);
  auto run = [&](const BatchNormReduce& reduce) {
    Tensor x = x0.clone().set_requires_grad(true);
    Tensor wt = w.clone().set_requires_grad(true);
    Tensor y = batch_norm(x, wt, b, Tensor(), Tensor(), true, 0.1, 1e-5, reduce);
    backward(sum_all(mul(y, dy)));
    return std::vector<std::vector<float>>{y.to_vector(), x.grad().to_vector(),
                                           wt.grad().to_vector()};
  };
  int64_t seen_count = -1;
  std::vector<double> seen_grad_sums;
  BatchNormReduce twice;
  twice.statistics = [&](std::vector<double>& sums, int64_t& count) {
    seen_count = count;
    for (double& s : sums) s *= 2;
    count *= 2;
  };
  twice.gradients = [&](std::vector<double>& sums) {
    seen_grad_sums = sums;
    for (double& s : sums) s *= 2;
  };
  const auto alone = run({}), doubled = run(twice);
  EXPECT_EQ(seen_count, 3 * 2 * 2);
  ASSERT_EQ(seen_grad_sums.size(), 4u);
  for (size_t k = 0; k < alone.size(); ++k)
    for (size_t i = 0; i < alone[k].size(); ++i)
      EXPECT_NEAR(alone[k][i], doubled[k][i], 1e-6f) << k << " " << i;
  // The weight gradient is the local sum of dy * xhat, the value handed to the hook.
  EXPECT_NEAR(doubled[2][0], seen_grad_sums[2], 1e-6);
  EXPECT_NEAR(doubled[2][1], seen_grad_sums[3], 1e-6);
}

TEST(VisionOps, BatchNormNeedsMoreThanOneValuePerChannel) {
  expect_error<ValueError>(
      [] {
        batch_norm(Tensor::ones({1, 3, 1, 1}), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      "Expected more than 1 value per channel when training");
  // Evaluation has no such limit.
  Tensor rm = Tensor::zeros({3}), rv = Tensor::ones({3});
  EXPECT_EQ(batch_norm(Tensor::ones({1, 3, 1, 1}), Tensor(), Tensor(), rm, rv, false).numel(), 3);
  // Other ranks' values count: one here and one elsewhere is enough.
  BatchNormReduce other;
  other.statistics = [](std::vector<double>& sums, int64_t& count) {
    for (size_t c = 0; c < sums.size() / 2; ++c) {
      sums[c] += 3.0;
      sums[sums.size() / 2 + c] += 9.0;
    }
    count += 1;
  };
  const Tensor y = batch_norm(Tensor::ones({1, 3, 1, 1}), Tensor(), Tensor(), Tensor(), Tensor(),
                              true, 0.1, 1e-5, other);
  // mean 2, variance 1: the local 1 normalises to -1.
  for (float v : y.to_vector()) EXPECT_NEAR(v, -1.0f / std::sqrt(1.0f + 1e-5f), 1e-6);
}

TEST(VisionOps, EmptyBatchTakesPartInTheReduction) {
  // A rank with no samples still reports its zero sums and count, and gets the totals back.
  bool stats_called = false, grads_called = false;
  BatchNormReduce from_others;
  from_others.statistics = [&](std::vector<double>& sums, int64_t& count) {
    stats_called = true;
    EXPECT_EQ(count, 0);
    for (double s : sums) EXPECT_EQ(s, 0.0);
    sums = {4.0, 8.0, 20.0, 80.0};  // the other ranks' totals: means 2 and 4
    count = 2;
  };
  from_others.gradients = [&](std::vector<double>& sums) {
    grads_called = true;
    for (double s : sums) EXPECT_EQ(s, 0.0);
  };
  Tensor x = Tensor::zeros({0, 2, 3, 3}).set_requires_grad(true);
  Tensor w = Tensor::ones({2}).set_requires_grad(true);
  Tensor rm = Tensor::zeros({2}), rv = Tensor::ones({2});
  Tensor y = batch_norm(x, w, Tensor(), rm, rv, true, 0.5, 1e-5, from_others);
  EXPECT_EQ(y.shape(), (Shape{0, 2, 3, 3}));
  EXPECT_TRUE(stats_called);
  EXPECT_FLOAT_EQ(rm.to_vector()[0], 0.5f * 2.0f);  // total mean 4 / 2
  backward(sum_all(y));
  EXPECT_TRUE(grads_called);
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{0.0f, 0.0f}));
}

TEST(VisionOps, BadShapesNameTheProblem) {
  const Tensor x = Tensor::zeros({2, 4, 8, 8});
  expect_error([&] { conv2d(x, Tensor::zeros({6, 3, 3, 3}), Tensor()); }, "channels");
  expect_error(
      [&] {
        conv2d(x, Tensor::zeros({6, 2, 3, 3}), Tensor(), {1, 0, 1, 3});
      },
      "groups 3 must divide");
  expect_error([&] { conv2d(x, Tensor::zeros({6, 4, 9, 9}), Tensor()); }, "smaller than");
  expect_error([&] { conv2d(x, Tensor::zeros({6, 4, 3, 3}), Tensor::zeros({5})); }, "bias");
  expect_error(
      [&] {
        conv2d(Tensor::zeros({4, 8, 8}), Tensor::zeros({6, 4, 3, 3}), Tensor());
      },
      "[N, C, H, W]");
  expect_error(
      [&] {
        conv2d(x, Tensor::zeros({6, 4, 3, 3}), Tensor(), {0, 0, 1, 1});
      },
      "must be positive");
  expect_error([&] { batch_norm(x, Tensor::ones({3}), Tensor(), Tensor(), Tensor(), true); },
               "weight must be [4]");
  expect_error([&] { batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false); },
               "evaluation needs running_mean");
  expect_error([&] { max_pool2d(x, 3, 2, 2); }, "at most half");
  expect_error([&] { avg_pool2d(Tensor::zeros({1, 1, 2, 2}), 3); }, "smaller than");
  expect_error([&] { global_avg_pool(Tensor::zeros({2, 4})); }, "[N, C, H, W]");
  expect_error([&] { relu(Tensor::zeros({2}, DType::i32)); }, "must be f32");
}

// The vision ops run where their operands are (tests/cuda/vision_dispatch_test.cpp holds the device
// path to the CPU's bits); operands on two devices are refused naming both, instead of a device
// array being read as host memory.
class VisionOnDevice : public test::FakeDeviceTest {};

TEST_F(VisionOnDevice, OperandsOnTwoDevicesAreRefusedNamingBoth) {
  const Device dev = Device::cuda(0);
  const Tensor x = Tensor::ones({2, 4, 6, 6}).to(dev);
  const Tensor w = Tensor::ones({4, 4, 3, 3});
  const char* both = "operands on cuda:0 and cpu; move the model and its inputs to one device";
  expect_error([&] { conv2d(x, w, Tensor()); }, both);
  expect_error(
      [&] {
        conv2d(Tensor::ones({2, 4, 6, 6}), w.to(dev), Tensor());
      },
      "operands on cpu and cuda:0");
  expect_error([&] { batch_norm(x, Tensor::ones({4}), Tensor(), Tensor(), Tensor(), true); }, both);
  expect_error(
      [&] { batch_norm(x, Tensor(), Tensor(), Tensor::zeros({4}), Tensor::ones({4}), false); },
      both);
  expect_error([&] { conv2d_inference(x, w, Tensor(), {}, true); }, both);
  EXPECT_TRUE(kernels_.calls.empty()) << "nothing ran before the refusal";
}

}  // namespace
}  // namespace meshtrain::autograd
