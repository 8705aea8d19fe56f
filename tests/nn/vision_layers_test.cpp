// Conv2d and BatchNorm2d modules: parameter and buffer names, shapes and dtypes as PyTorch has
// them, the keyed Kaiming-uniform initialisation, and train/eval behaviour of batch norm.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/nn/batch_norm.h"
#include "meshtrain/nn/conv2d.h"
#include "meshtrain/tensor/random.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain::nn {
namespace {

std::vector<std::string> names(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [n, t] : named) out.push_back(n);
  return out;
}

TEST(Conv2dModule, ShapesNamesAndOptions) {
  Generator gen(1);
  Conv2d conv(4, 8, 3, {.stride = 2, .padding = 1, .groups = 2, .bias = false}, gen);
  EXPECT_EQ(names(conv.named_parameters()), (std::vector<std::string>{"weight"}));
  EXPECT_EQ(conv.weight().shape(), (Shape{8, 2, 3, 3}));
  EXPECT_FALSE(conv.bias().defined());
  const Tensor y = conv.forward(Tensor::zeros({2, 4, 9, 9}));
  EXPECT_EQ(y.shape(), (Shape{2, 8, 5, 5}));
  Conv2d with_bias(3, 5, 1, {}, gen);
  EXPECT_EQ(names(with_bias.named_parameters()), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(with_bias.bias().shape(), (Shape{5}));
  EXPECT_THROW(Conv2d(4, 6, 3, {.groups = 4}, gen), Error);
}

TEST(Conv2dModule, KaimingUniformInitIsKeyedBySeedAndName) {
  // PyTorch's default: U(-b, b) with b = 1 / sqrt(fan_in), fan_in = in / groups * k * k = 16 * 9.
  Generator gen(7);
  Conv2d conv(16, 32, 3, {}, gen);
  const double bound = 1.0 / std::sqrt(16.0 * 9.0);
  for (const Tensor* t : {&conv.weight(), &conv.bias()}) {
    float lo = 1, hi = -1;
    for (float v : t->to_vector()) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    EXPECT_GE(lo, -bound);
    EXPECT_LE(hi, bound);
    // 4608 weights (and 32 biases) spread over the whole interval.
    EXPECT_LT(lo, -0.8 * bound);
    EXPECT_GT(hi, 0.8 * bound);
  }
  const std::vector<ParamInfo> infos = conv.param_infos();
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[0].init.kind, ParamInit::Kind::uniform);
  EXPECT_DOUBLE_EQ(infos[0].init.bound, bound);
  EXPECT_DOUBLE_EQ(infos[1].init.bound, bound);
  EXPECT_TRUE(infos[0].weight_decay);
  EXPECT_FALSE(infos[1].weight_decay);
  // Redrawn from (seed, name): two layers built from different generators end up equal, another
  // seed gives other values.
  Generator other(8);
  Conv2d twin(16, 32, 3, {}, other);
  EXPECT_FALSE(testing::same_bits(conv.weight(), twin.weight()));
  conv.init_parameters(42);
  twin.init_parameters(42);
  EXPECT_TRUE(testing::same_bits(conv.weight(), twin.weight()));
  EXPECT_TRUE(testing::same_bits(conv.bias(), twin.bias()));
  twin.init_parameters(43);
  EXPECT_FALSE(testing::same_bits(conv.weight(), twin.weight()));
}

TEST(BatchNorm2dModule, StateDictHasPyTorchNames) {
  BatchNorm2d bn(6);
  EXPECT_EQ(names(bn.state_dict()),
            (std::vector<std::string>{"weight", "bias", "running_mean", "running_var",
                                      "num_batches_tracked"}));
  EXPECT_EQ(bn.weight().to_vector(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(bn.bias().to_vector(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(bn.running_mean().to_vector(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(bn.running_var().to_vector(), std::vector<float>(6, 1.0f));
  const auto buffers = bn.named_buffers();
  EXPECT_EQ(buffers[2].second.dtype(), DType::i64);
  EXPECT_EQ(buffers[2].second.dim(), 0);
  EXPECT_EQ(bn.param_infos()[0].weight_decay, false);
  BatchNorm2d plain(6, {.affine = false});
  EXPECT_EQ(names(plain.state_dict()),
            (std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"}));
}

TEST(BatchNorm2dModule, TrainUpdatesRunningStatisticsEvalUsesThem) {
  BatchNorm2d bn(2, {.eps = 1e-5, .momentum = 0.25});
  Generator gen(3);
  Tensor x = randn({4, 2, 3, 3}, gen);
  bn.forward(x);
  bn.forward(x);
  EXPECT_EQ(bn.num_batches_tracked(), 2);
  // Two updates towards the same batch: running = 0.75^2 * initial + (1 - 0.75^2) * batch.
  const std::vector<float> xv = x.to_vector();
  for (int64_t c = 0; c < 2; ++c) {
    double s = 0, sq = 0;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t i = 0; i < 9; ++i) s += xv[static_cast<size_t>((n * 2 + c) * 9 + i)];
    const double mean = s / 36;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t i = 0; i < 9; ++i) {
        const double d = xv[static_cast<size_t>((n * 2 + c) * 9 + i)] - mean;
        sq += d * d;
      }
    const double unbiased = sq / 35, keep = 0.75 * 0.75;
    EXPECT_NEAR(bn.running_mean().to_vector()[static_cast<size_t>(c)], (1 - keep) * mean, 1e-6);
    EXPECT_NEAR(bn.running_var().to_vector()[static_cast<size_t>(c)],
                keep * 1.0 + (1 - keep) * unbiased, 1e-6);
  }
  bn.eval();
  const std::vector<float> rm = bn.running_mean().to_vector(), rv = bn.running_var().to_vector();
  const Tensor y = bn.forward(x);
  EXPECT_EQ(bn.num_batches_tracked(), 2);  // evaluation counts nothing
  EXPECT_EQ(bn.running_mean().to_vector(), rm);
  const std::vector<float> yv = y.to_vector();
  for (size_t i = 0; i < yv.size(); ++i) {
    const size_t c = (i / 9) % 2;
    EXPECT_NEAR(yv[i], (xv[i] - rm[c]) / std::sqrt(rv[c] + 1e-5), 1e-5) << i;
  }
}

TEST(BatchNorm2dModule, EvalReachesNestedLayersAndWeightsRoundTrip) {
  struct Net : Module {
    std::shared_ptr<BatchNorm2d> bn = register_module("bn", std::make_shared<BatchNorm2d>(3));
  } net;
  net.eval();
  EXPECT_FALSE(net.bn->is_training());
  net.train();
  Generator gen(4);
  net.bn->forward(randn({2, 3, 2, 2}, gen));
  BatchNorm2d copy(3);
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : net.state_dict()) state[name.substr(3)] = t;  // drop "bn."
  copy.load_state_dict(state);
  EXPECT_EQ(copy.num_batches_tracked(), 1);
  EXPECT_TRUE(testing::same_bits(copy.running_var(), net.bn->running_var()));
}

TEST(BatchNorm2dModule, OneValuePerChannelIsAValueErrorInTrainingOnly) {
  BatchNorm2d bn(3);
  try {
    bn.forward(Tensor::ones({1, 3, 1, 1}));
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("Expected more than 1 value per channel when training"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(bn.num_batches_tracked(), 0);
  bn.eval();
  EXPECT_EQ(bn.forward(Tensor::ones({1, 3, 1, 1})).numel(), 3);
  EXPECT_THROW(bn.forward(Tensor::ones({2, 4, 1, 1})), Error);  // 4 channels into a 3-channel layer
}

}  // namespace
}  // namespace meshtrain::nn
