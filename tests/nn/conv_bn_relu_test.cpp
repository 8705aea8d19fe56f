// Fused convolution + batch norm (evaluation) + ReLU against the layers run one by one.
//
// Tolerance. Both paths are f32 dot products of K = C_in / groups * KH * KW terms in some order,
// plus a few roundings: the fused path rounds the folded weights and bias once each, the unfused
// one rounds (y - mean) * invstd * gamma + beta in four steps. A dot product's rounding error is
// at most about K * u * sum |terms| (u = 2^-24), and ReLU never widens a gap, so each output may
// differ by at most
//   2 * (K + 4) * u * (sum_k |w'_k| |x_k| + |bias * scale| + |mean * scale| + |beta|)
// with w' = w * scale, scale = gamma / sqrt(var + eps): the bound of each path, twice. It is
// computed per output from |x| and |w'|, so it is tight where the terms are small and cannot hide
// a wrong index or a missing term, which is off by a whole term.
#include "meshtrain/nn/conv_bn_relu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/vision.h"
#include "meshtrain/nn/resnet.h"
#include "meshtrain/nn/top1.h"
#include "meshtrain/tensor/cpu/conv2d.h"
#include "meshtrain/tensor/random.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain::nn {
namespace {

using testing::largest_difference;
using testing::same_bits;

// Running statistics and affine parameters far from their initial 0 / 1, with negative gammas,
// so that folding them is exercised rather than being the identity.
void randomise_batch_norm(const BatchNorm2d& bn, Generator& gen) {
  const int64_t C = bn.running_mean().numel();
  Tensor u = Tensor::empty({4, C});
  uniform_(u, gen, 0.0, 1.0);
  const float* r = u.data<float>();
  for (int64_t c = 0; c < C; ++c) {
    bn.running_mean().data<float>()[c] = r[c] - 0.5f;
    bn.running_var().data<float>()[c] = 0.1f + 2.0f * r[C + c];
    if (bn.weight().defined())
      bn.weight().data<float>()[c] = (c % 3 == 0 ? -1.0f : 1.0f) * (0.5f + r[2 * C + c]);
    if (bn.bias().defined()) bn.bias().data<float>()[c] = r[3 * C + c] - 0.5f;
  }
}

// The per-output bound of the header comment.
std::vector<double> tolerance(const Conv2d& conv, const BatchNorm2d& bn, const Tensor& x) {
  const Tensor& w = conv.weight();
  const int64_t C_out = w.size(0), per_out = w.numel() / C_out;
  Tensor abs_x = Tensor::empty(x.shape()), abs_w = Tensor::empty(w.shape());
  Tensor abs_b = Tensor::empty({C_out});
  for (int64_t i = 0; i < x.numel(); ++i) abs_x.data<float>()[i] = std::fabs(x.data<float>()[i]);
  for (int64_t c = 0; c < C_out; ++c) {
    const double gamma = bn.weight().defined() ? bn.weight().data<float>()[c] : 1.0;
    const double beta = bn.bias().defined() ? bn.bias().data<float>()[c] : 0.0;
    const double bias = conv.bias().defined() ? conv.bias().data<float>()[c] : 0.0;
    const double scale = gamma / std::sqrt(static_cast<double>(bn.running_var().data<float>()[c]) +
                                           bn.options().eps);
    for (int64_t i = 0; i < per_out; ++i)
      abs_w.data<float>()[c * per_out + i] =
          static_cast<float>(std::fabs(w.data<float>()[c * per_out + i] * scale));
    abs_b.data<float>()[c] =
        static_cast<float>(std::fabs(bias * scale) +
                           std::fabs(bn.running_mean().data<float>()[c] * scale) + std::fabs(beta));
  }
  const Conv2dOptions& o = conv.options();
  autograd::NoGradGuard no_grad;
  const Tensor magnitude =
      autograd::conv2d(abs_x, abs_w, abs_b, {o.stride, o.padding, o.dilation, o.groups});
  const double K = static_cast<double>(per_out), u = std::ldexp(1.0, -24);
  std::vector<double> tol;
  for (float m : magnitude.to_vector()) tol.push_back(2.0 * (K + 4.0) * u * m);
  return tol;
}

struct Case {
  int64_t N, C_in, H, C_out, kernel;
  Conv2dOptions o;
  bool relu;
  std::string name() const {
    return "N=" + std::to_string(N) + " C_in=" + std::to_string(C_in) + " H=" + std::to_string(H) +
           " C_out=" + std::to_string(C_out) + " K=" + std::to_string(kernel) +
           " stride=" + std::to_string(o.stride) + " pad=" + std::to_string(o.padding) +
           " dil=" + std::to_string(o.dilation) + " groups=" + std::to_string(o.groups) +
           (o.bias ? " bias" : " no bias") + (relu ? " relu" : " no relu");
  }
};

std::vector<Case> cases() {
  return {
      {2, 3, 9, 8, 3, {.stride = 1, .padding = 1, .bias = true}, true},
      {2, 3, 9, 8, 3, {.stride = 2, .padding = 0, .bias = false}, false},
      {2, 4, 10, 6, 3, {.stride = 2, .padding = 1, .groups = 2, .bias = true}, true},
      {3, 8, 7, 8, 3, {.stride = 1, .padding = 1, .groups = 8, .bias = false}, true},
      {2, 16, 8, 32, 1, {.stride = 2, .padding = 0, .bias = false}, false},
      {3, 3, 20, 16, 7, {.stride = 2, .padding = 3, .bias = false}, true},
      {1, 5, 11, 7, 3, {.stride = 1, .padding = 2, .dilation = 2, .bias = true}, false},
      {4, 16, 14, 16, 3, {.stride = 1, .padding = 1, .bias = false}, true},
  };
}

void expect_fused_matches_unfused(cpu::ConvImpl impl) {
  const cpu::ScopedConvImpl use(impl);
  uint64_t seed = 11;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    Generator gen(seed++);
    Conv2d conv(c.C_in, c.C_out, c.kernel, c.o, gen);
    BatchNorm2d bn(c.C_out);
    randomise_batch_norm(bn, gen);
    conv.eval();
    bn.eval();
    const Tensor x = randn({c.N, c.C_in, c.H, c.H}, gen);
    autograd::NoGradGuard no_grad;
    ASSERT_TRUE(conv_bn_fusable(conv, bn, x));
    const Tensor fused = conv_bn_relu(conv, bn, x, c.relu);
    Tensor unfused;
    {
      const ScopedConvBnFusion off(ConvBnFusion::off);
      ASSERT_FALSE(conv_bn_fusable(conv, bn, x));
      unfused = conv_bn_relu(conv, bn, x, c.relu);
    }
    ASSERT_EQ(fused.shape(), unfused.shape());
    const std::vector<double> tol = tolerance(conv, bn, x);
    const std::vector<float> f = fused.to_vector(), r = unfused.to_vector();
    int failures = 0, negatives = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      negatives += f[i] < 0.0f;
      const double err = std::fabs(static_cast<double>(f[i]) - r[i]);
      if (!(err <= tol[i]) && ++failures <= 5)
        ADD_FAILURE() << "[" << i << "] fused " << f[i] << " unfused " << r[i] << " err " << err
                      << " tolerance " << tol[i];
    }
    EXPECT_EQ(failures, 0);
    // The ReLU applied exactly where asked for.
    if (c.relu) {
      EXPECT_EQ(negatives, 0);
    } else {
      EXPECT_GT(negatives, 0);
    }
  }
}

TEST(ConvBnReluFusion, MatchesUnfusedOnOneDnn) {
  expect_fused_matches_unfused(cpu::ConvImpl::onednn);
}

TEST(ConvBnReluFusion, MatchesUnfusedOnTheReference) {
  expect_fused_matches_unfused(cpu::ConvImpl::reference);
}

TEST(ConvBnReluFusion, FusesOnlyInEvaluationWithoutGradients) {
  Generator gen(5);
  Conv2d conv(3, 4, 3, {.padding = 1, .bias = false}, gen);
  BatchNorm2d bn(4);
  const Tensor x = randn({2, 3, 5, 5}, gen);
  EXPECT_FALSE(conv_bn_fusable(conv, bn, x));  // training, grad mode on
  conv.eval();
  bn.eval();
  EXPECT_FALSE(conv_bn_fusable(conv, bn, x));  // evaluation, grad mode on
  autograd::NoGradGuard no_grad;
  EXPECT_TRUE(conv_bn_fusable(conv, bn, x));
  bn.train();
  EXPECT_FALSE(conv_bn_fusable(conv, bn, x));  // batch statistics are no fixed affine map
  bn.eval();
  const ScopedConvBnFusion off(ConvBnFusion::off);
  EXPECT_FALSE(conv_bn_fusable(conv, bn, x));
}

TEST(ConvBnReluFusion, InferenceConvolutionRefusesOperandsThatWantGradients) {
  Generator gen(6);
  const Tensor x = randn({1, 2, 4, 4}, gen);
  Tensor w = randn({3, 2, 3, 3}, gen);
  w.set_requires_grad(true);
  EXPECT_THROW(autograd::conv2d_inference(x, w, Tensor(), {.padding = 1}, true), Error);
  autograd::NoGradGuard no_grad;
  EXPECT_NO_THROW(autograd::conv2d_inference(x, w, Tensor(), {.padding = 1}, true));
}

std::unique_ptr<ResNet> randomised_resnet(const ResNetConfig& config) {
  auto model = std::make_unique<ResNet>(config);
  Generator gen(config.seed + 100);
  for (const auto& [name, bn] : model->batch_norms()) randomise_batch_norm(*bn, gen);
  return model;
}

void expect_same_grads(const ResNet& a, const ResNet& b) {
  const NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(same_bits(pa[i].second.grad(), pb[i].second.grad())) << pa[i].first;
}

TEST(ConvBnReluFusion, ResNetTrainingIsBitwiseUnchanged) {
  ResNetConfig config = resnet_config("tiny", 1, 10);
  config.seed = 21;
  const auto fused_model = randomised_resnet(config), unfused_model = randomised_resnet(config);
  ResNet& fused = *fused_model;
  ResNet& unfused = *unfused_model;
  Generator gen(22);
  const Tensor x = randn({4, 1, 28, 28}, gen);
  const Tensor labels = Tensor::from_vector(std::vector<int32_t>{1, 7, 3, 0}, {4});
  const Tensor loss_fused = fused.loss(x, labels);
  autograd::backward(loss_fused);
  Tensor loss_unfused;
  {
    const ScopedConvBnFusion off(ConvBnFusion::off);
    loss_unfused = unfused.loss(x, labels);
    autograd::backward(loss_unfused);
  }
  EXPECT_TRUE(same_bits(loss_fused, loss_unfused));
  expect_same_grads(fused, unfused);
  const auto na = fused.batch_norms(), nb = unfused.batch_norms();
  for (size_t i = 0; i < na.size(); ++i) {
    EXPECT_TRUE(same_bits(na[i].second->running_mean(), nb[i].second->running_mean()));
    EXPECT_TRUE(same_bits(na[i].second->running_var(), nb[i].second->running_var()));
  }
  // Evaluation with gradients on (a gradient through a frozen network) is not fused either.
  fused.eval();
  unfused.eval();
  const Tensor eval_fused = fused.forward(x);
  const ScopedConvBnFusion off(ConvBnFusion::off);
  EXPECT_TRUE(same_bits(eval_fused, unfused.forward(x)));
}

// Through the small ResNet's 15 conv-BN pairs the per-layer round-off compounds; the measured
// difference is 1.8e-7 of the largest logit (the relative_difference property), so 1e-4 of it
// leaves room for other CPUs and thread counts while a layer computed wrongly (a missing term, a
// mean not subtracted) moves logits by far more.
TEST(ConvBnReluFusion, ResNetEvalLogitsMatchUnfusedWithTheSameTop1) {
  ResNetConfig config = ResNetConfig::small(10);
  config.seed = 31;
  const auto model_ptr = randomised_resnet(config);
  ResNet& model = *model_ptr;
  model.eval();
  Generator gen(32);
  const Tensor x = randn({16, 1, 28, 28}, gen);
  autograd::NoGradGuard no_grad;
  const Tensor fused = model.forward(x);
  Tensor unfused;
  {
    const ScopedConvBnFusion off(ConvBnFusion::off);
    unfused = model.forward(x);
  }
  float scale = 0;
  for (float v : unfused.to_vector()) scale = std::max(scale, std::fabs(v));
  ASSERT_GT(scale, 0.0f);
  const float diff = largest_difference(fused, unfused);
  EXPECT_LE(diff, 1e-4f * scale) << "largest logit " << scale;
  std::ostringstream relative;
  relative << diff / scale;
  RecordProperty("relative_difference", relative.str());
  EXPECT_EQ(top1(fused), top1(unfused));
}

}  // namespace
}  // namespace meshtrain::nn
