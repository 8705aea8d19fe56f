// BatchNorm2d through a BatchNormSync: two "ranks" (threads, each with its own layer) holding the
// two halves of a batch, whose sync adds the other rank's sums, must behave as one layer on the
// whole batch.
//
// How close: the inputs are multiples of 1/64 below 2 in magnitude, so every per-channel sum of x
// and x^2 is exact in double, whatever the order of the additions; the halves' totals therefore
// equal the whole batch's sums bit for bit, and so do the outputs and the running statistics. The
// backward sums of dy * xhat involve xhat, an arbitrary float, so they are not exact in double: the
// split and the whole batch can round the last bit of a double differently, which can move the
// input gradient by a float ulp (1e-6 of its scale asserted; the test prints how many elements
// came out bitwise equal anyway). The weight and bias gradients are
// each rank's local sums (data parallelism averages them); their sum over the ranks matches the
// whole batch's gradient to float rounding (1e-5 of its scale).
#include "meshtrain/nn/batch_norm_sync.h"

#include <gtest/gtest.h>

#include <array>
#include <barrier>
#include <cmath>
#include <cstring>
#include <exception>
#include <iostream>
#include <thread>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/nn/batch_norm.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain::nn {
namespace {

// Sums two ranks' vectors in rank order, so both ranks get bitwise-identical totals.
class Exchange {
 public:
  void reduce(int rank, const std::string& layer, std::vector<double>& sums, int64_t* count) {
    parts_[rank] = sums;
    counts_[rank] = count != nullptr ? *count : 0;
    layers_[rank].push_back(layer);
    barrier_.arrive_and_wait();
    for (size_t i = 0; i < sums.size(); ++i) sums[i] = parts_[0][i] + parts_[1][i];
    if (count != nullptr) *count = counts_[0] + counts_[1];
    barrier_.arrive_and_wait();  // nobody deposits the next vector before both have read this one
  }
  const std::vector<std::string>& layers(int rank) const { return layers_[rank]; }

 private:
  std::barrier<> barrier_{2};
  std::vector<double> parts_[2];
  int64_t counts_[2] = {0, 0};
  std::vector<std::string> layers_[2];
};

class PairSync : public BatchNormSync {
 public:
  PairSync(Exchange& exchange, int rank) : exchange_(exchange), rank_(rank) {}
  void reduce_statistics(const std::string& layer, std::vector<double>& sums,
                         int64_t& count) override {
    exchange_.reduce(rank_, layer, sums, &count);
  }
  void reduce_gradients(const std::string& layer, std::vector<double>& sums) override {
    exchange_.reduce(rank_, layer, sums, nullptr);
  }

 private:
  Exchange& exchange_;
  int rank_;
};

// k / 64 with |k| < 128: exact sums of values and squares in double (see the top of the file).
Tensor dyadic(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape);
  uint32_t state = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    state = state * 1664525u + 1013904223u;
    t.data<float>()[i] = static_cast<float>(static_cast<int>((state >> 16) % 255) - 127) / 64.0f;
  }
  return t;
}

struct Result {
  Tensor y, dx, dweight, dbias, running_mean, running_var;
  int64_t batches = 0;
};

std::shared_ptr<BatchNorm2d> make_layer() {
  auto bn = std::make_shared<BatchNorm2d>(3, BatchNormOptions{.momentum = 0.3});
  Tensor w = bn->weight(), b = bn->bias();
  w.copy_(Tensor::from_vector(std::vector<float>{1.5f, -0.5f, 2.0f}, {3}));
  b.copy_(Tensor::from_vector(std::vector<float>{0.25f, 0.0f, -1.0f}, {3}));
  return bn;
}

Result step(BatchNorm2d& bn, const Tensor& x_in, const Tensor& dy) {
  Tensor x = x_in.clone().set_requires_grad(true);
  Result r;
  r.y = bn.forward(x);
  autograd::backward(autograd::sum_all(autograd::mul(r.y, dy)));
  r.dx = x.grad();
  r.dweight = bn.weight().grad();
  r.dbias = bn.bias().grad();
  r.running_mean = bn.running_mean();
  r.running_var = bn.running_var();
  r.batches = bn.num_batches_tracked();
  return r;
}

// Runs `halves` (rank 0's and rank 1's part of the batch) on two threads, each rank its own layer
// synchronised through one exchange.
std::array<Result, 2> split_step(const std::array<Tensor, 2>& x, const std::array<Tensor, 2>& dy,
                                 Exchange& exchange) {
  std::array<Result, 2> out;
  std::array<std::exception_ptr, 2> errors;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        auto bn = make_layer();
        bn->set_sync(std::make_shared<PairSync>(exchange, r), "layer1.0.bn1");
        out[static_cast<size_t>(r)] =
            step(*bn, x[static_cast<size_t>(r)], dy[static_cast<size_t>(r)]);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

float scale_of(const Tensor& t) {
  float s = 0.0f;
  for (float v : t.to_vector()) s = std::max(s, std::fabs(v));
  return s;
}

void expect_near_all(const Tensor& got, const Tensor& want, float rel, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_LE(testing::largest_difference(got, want), rel * scale_of(want)) << what;
}

TEST(BatchNormSync, TwoHalvesEqualOneLayerOnTheWholeBatch) {
  const Tensor x = dyadic({6, 3, 4, 5}, 1), dy = dyadic({6, 3, 4, 5}, 2);
  auto whole_layer = make_layer();
  const Result whole = step(*whole_layer, x, dy);

  Exchange exchange;
  const auto parts =
      split_step({x.slice(0, 2).clone(), x.slice(2, 6).clone()},  // unequal halves: 2 and 4 images
                 {dy.slice(0, 2).clone(), dy.slice(2, 6).clone()}, exchange);

  // Forward: bitwise.
  EXPECT_TRUE(testing::same_bits(parts[0].y, whole.y.slice(0, 2).clone()));
  EXPECT_TRUE(testing::same_bits(parts[1].y, whole.y.slice(2, 6).clone()));
  for (const Result& p : parts) {
    EXPECT_TRUE(testing::same_bits(p.running_mean, whole.running_mean));
    EXPECT_TRUE(testing::same_bits(p.running_var, whole.running_var));
    EXPECT_EQ(p.batches, 1);
  }
  // Backward: the input gradient from the totals, the parameter gradients local.
  int64_t same = 0;
  const std::vector<float> whole_dx = whole.dx.to_vector();
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> part = parts[static_cast<size_t>(r)].dx.to_vector();
    const size_t offset = r == 0 ? 0 : whole_dx.size() / 3;  // rank 1 holds images 2..5
    for (size_t i = 0; i < part.size(); ++i) same += part[i] == whole_dx[offset + i] ? 1 : 0;
  }
  std::cout << "input gradient: " << same << " of " << whole_dx.size()
            << " elements bitwise equal to the whole batch's" << std::endl;
  expect_near_all(parts[0].dx, whole.dx.slice(0, 2).clone(), 1e-6f, "dx rank 0");
  expect_near_all(parts[1].dx, whole.dx.slice(2, 6).clone(), 1e-6f, "dx rank 1");
  Tensor dw_sum = autograd::add(parts[0].dweight, parts[1].dweight);
  Tensor db_sum = autograd::add(parts[0].dbias, parts[1].dbias);
  expect_near_all(dw_sum, whole.dweight, 1e-5f, "dweight");
  expect_near_all(db_sum, whole.dbias, 1e-5f, "dbias");
  // Local, not totals: rank 0's bias gradient is the sum of its own dy only.
  EXPECT_GT(testing::largest_difference(parts[0].dbias, whole.dbias), 1e-3f);
  // One statistics and one gradient reduction per step, under the layer's name.
  EXPECT_EQ(exchange.layers(0), (std::vector<std::string>{"layer1.0.bn1", "layer1.0.bn1"}));
  EXPECT_EQ(exchange.layers(1), exchange.layers(0));
}

TEST(BatchNormSync, ARankWithoutSamplesTakesPart) {
  const Tensor x = dyadic({4, 3, 2, 3}, 3), dy = dyadic({4, 3, 2, 3}, 4);
  auto whole_layer = make_layer();
  const Result whole = step(*whole_layer, x, dy);
  Exchange exchange;
  const auto parts = split_step({x.clone(), Tensor::zeros({0, 3, 2, 3})},
                                {dy.clone(), Tensor::zeros({0, 3, 2, 3})}, exchange);
  EXPECT_TRUE(testing::same_bits(parts[0].y, whole.y));
  EXPECT_EQ(parts[1].y.shape(), (Shape{0, 3, 2, 3}));
  EXPECT_TRUE(testing::same_bits(parts[1].running_mean, whole.running_mean));
  EXPECT_TRUE(testing::same_bits(parts[1].running_var, whole.running_var));
  expect_near_all(parts[0].dx, whole.dx, 1e-6f, "dx");
  EXPECT_EQ(parts[1].dweight.to_vector(), std::vector<float>(3, 0.0f));
  EXPECT_EQ(exchange.layers(1).size(), 2u);
}

TEST(BatchNormSync, OneValuePerChannelOverAllRanksIsAValueErrorOnEveryRank) {
  Exchange exchange;
  EXPECT_THROW(split_step({dyadic({1, 3, 1, 1}, 5), Tensor::zeros({0, 3, 1, 1})},
                          {dyadic({1, 3, 1, 1}, 6), Tensor::zeros({0, 3, 1, 1})}, exchange),
               ValueError);
  // One value on each rank is two per channel: fine.
  Exchange again;
  const auto parts = split_step({dyadic({1, 3, 1, 1}, 5), dyadic({1, 3, 1, 1}, 7)},
                                {dyadic({1, 3, 1, 1}, 6), dyadic({1, 3, 1, 1}, 8)}, again);
  EXPECT_EQ(parts[0].batches, 1);
}

TEST(BatchNormSync, EvaluationNeverCallsTheSync) {
  auto bn = make_layer();
  struct Refuse : BatchNormSync {
    void reduce_statistics(const std::string&, std::vector<double>&, int64_t&) override {
      ADD_FAILURE() << "statistics reduced in evaluation";
    }
    void reduce_gradients(const std::string&, std::vector<double>&) override {
      ADD_FAILURE() << "gradients reduced in evaluation";
    }
  };
  bn->set_sync(std::make_shared<Refuse>(), "bn");
  bn->eval();
  Tensor x = dyadic({2, 3, 2, 2}, 9).set_requires_grad(true);
  autograd::backward(autograd::sum_all(bn->forward(x)));
  EXPECT_TRUE(x.grad().defined());
}

}  // namespace
}  // namespace meshtrain::nn
