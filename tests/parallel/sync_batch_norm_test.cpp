// SyncBatchNorm over real process groups (ranks on threads, shared memory): the ranks' slices of a
// global batch through BatchNorm2d layers synchronised over the group give what one layer gives
// on the whole batch (outputs, running statistics, input gradients; the weight gradients summed
// over the ranks), for 2 and 4 ranks, uneven slices and a rank with no samples at all; a rank at
// another layer is named by every rank, and a rank that never arrives is a CommError naming the
// layer once the group's timeout passes, instead of a hang.
//
// How close: the inputs are multiples of 1/64 below 2 in magnitude, so the per-channel sums of x
// and x^2 are exact in double in any order and the forward is bitwise equal; the backward's sums
// of dy * xhat are not exact, so the input gradient may differ in the last float bit (1e-6 of its
// scale), and the weight gradients, summed over ranks in another order, to float rounding.
#include "meshtrain/parallel/sync_batch_norm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <numeric>
#include <thread>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/nn/batch_norm.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain::parallel {
namespace {

constexpr int64_t kC = 3, kH = 4, kW = 5;

// Multiples of 1/64 in (-2, 2): sums of them and of their squares are exact in double.
Tensor images(int64_t n, uint64_t seed) {
  Generator g(seed);
  std::vector<float> v(static_cast<size_t>(n * kC * kH * kW));
  for (float& x : v) x = static_cast<float>(static_cast<int64_t>(g.below(255)) - 127) / 64.0f;
  return Tensor::from_vector(v, {n, kC, kH, kW});
}

// Rows [begin, begin + n) of x.
Tensor rows(const Tensor& x, int64_t begin, int64_t n) {
  const int64_t per = kC * kH * kW;
  const std::vector<float> all = x.to_vector();
  return Tensor::from_vector(
      std::vector<float>(all.begin() + begin * per, all.begin() + (begin + n) * per),
      {n, kC, kH, kW});
}

struct Result {
  Tensor out, dx, dweight, dbias, running_mean, running_var;
};

// Two BatchNorm2d layers in a row (so the backward exchanges twice), loss = sum(out * g).
Result run_layers(const Tensor& x_in, const Tensor& g,
                  const std::shared_ptr<nn::BatchNormSync>& sync) {
  nn::BatchNorm2d first(kC), second(kC);
  if (sync) {
    first.set_sync(sync, "first");
    second.set_sync(sync, "second");
  }
  Tensor x = x_in.clone();
  x.set_requires_grad(true);
  Tensor out = second.forward(first.forward(x));
  autograd::backward(autograd::sum_all(autograd::mul(out, g)));
  return {out.detach(),
          x.grad(),
          first.weight().grad(),
          first.bias().grad(),
          first.running_mean().clone(),
          first.running_var().clone()};
}

void expect_close(const Tensor& want, const Tensor& got, float tol, const char* what) {
  ASSERT_EQ(want.shape(), got.shape()) << what;
  const std::vector<float> a = want.to_vector(), b = got.to_vector();
  float scale = 0;
  for (float v : a) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_LE(std::fabs(a[i] - b[i]), tol * std::max(scale, 1.0f)) << what << " element " << i;
}

// Each rank takes `counts[r]` rows of one global batch.
void expect_equals_whole_batch(const std::vector<int64_t>& counts) {
  const int world = static_cast<int>(counts.size());
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const Tensor x = images(total, 7), g = images(total, 8);
  const Result whole = run_layers(x, g, nullptr);
  std::vector<Result> parts(static_cast<size_t>(world));
  testing::run_shm_ranks(world, [&](int rank, const comm::ProcessGroupPtr& group) {
    const int64_t begin = std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
    const int64_t n = counts[static_cast<size_t>(rank)];
    auto sync = std::make_shared<SyncBatchNorm>(group);
    parts[static_cast<size_t>(rank)] = run_layers(rows(x, begin, n), rows(g, begin, n), sync);
    EXPECT_EQ(sync->exchanges(), 4u);  // two layers, forward and backward
  });
  int64_t begin = 0;
  std::vector<float> dweight(kC, 0.0f), dbias(kC, 0.0f);
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Result& p = parts[static_cast<size_t>(r)];
    const int64_t n = counts[static_cast<size_t>(r)];
    if (n > 0) {
      EXPECT_TRUE(testing::same_bits(rows(whole.out, begin, n), p.out)) << "outputs";
      expect_close(rows(whole.dx, begin, n), p.dx, 1e-6f, "input gradient");
    }
    EXPECT_TRUE(testing::same_bits(whole.running_mean, p.running_mean)) << "running mean";
    EXPECT_TRUE(testing::same_bits(whole.running_var, p.running_var)) << "running variance";
    for (int64_t c = 0; c < kC; ++c) {
      dweight[static_cast<size_t>(c)] += p.dweight.to_vector()[static_cast<size_t>(c)];
      dbias[static_cast<size_t>(c)] += p.dbias.to_vector()[static_cast<size_t>(c)];
    }
    begin += n;
  }
  expect_close(whole.dweight, Tensor::from_vector(dweight, {kC}), 1e-5f, "weight gradient");
  expect_close(whole.dbias, Tensor::from_vector(dbias, {kC}), 1e-5f, "bias gradient");
}

TEST(SyncBatchNorm, TwoRanksEqualOneLayerOnTheGlobalBatch) {
  expect_equals_whole_batch({4, 4});
}

TEST(SyncBatchNorm, FourRanksEqualOneLayerOnTheGlobalBatch) {
  expect_equals_whole_batch({2, 2, 2, 2});
}

TEST(SyncBatchNorm, UnevenSlicesAndARankWithoutSamples) {
  expect_equals_whole_batch({3, 5});
  expect_equals_whole_batch({4, 0, 3});
}

// A rank at another layer: every rank fails with both ranks and both layers named.
TEST(SyncBatchNorm, ARankAtAnotherLayerIsNamedByEveryRank) {
  std::vector<std::string> errors(2);
  testing::run_shm_ranks(2, [&](int rank, const comm::ProcessGroupPtr& group) {
    SyncBatchNorm sync(group);
    std::vector<double> sums(2 * kC, 1.0);
    int64_t count = 10;
    try {
      sync.reduce_statistics(rank == 0 ? "layer1.0.bn1" : "layer1.0.bn2", sums, count);
    } catch (const ValueError& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("layer1.0.bn1"), std::string::npos) << e;
    EXPECT_NE(e.find("layer1.0.bn2"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 1"), std::string::npos) << e;
  }
}

// A rank that skips the layer altogether: the one waiting fails once the group's timeout passes,
// naming the layer, and does not hang.
TEST(SyncBatchNorm, ARankThatNeverArrivesFailsNamingTheLayer) {
  comm::register_builtin_backends();
  auto store = std::make_shared<comm::HashStore>();
  std::string error;
  std::vector<std::thread> ranks;
  std::atomic<bool> first_done{false};
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      comm::ProcessGroupOptions po;
      po.name = "syncbn-timeout";
      po.timeout = std::chrono::seconds(2);
      auto group = comm::make_process_group("shm", store, r, 2, po);
      if (r == 1) {
        // Rank 1 takes no part; it waits (on a signal, not a clock) until rank 0 has failed.
        first_done.wait(false);
        return;
      }
      SyncBatchNorm sync(group);
      std::vector<double> sums(2 * kC, 1.0);
      int64_t count = 10;
      try {
        sync.reduce_statistics("layer2.1.bn1", sums, count);
      } catch (const CommError& e) {
        error = e.what();
      }
      first_done = true;
      first_done.notify_all();
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_NE(error.find("SyncBatchNorm at layer 'layer2.1.bn1' (forward)"), std::string::npos)
      << error;
}

TEST(SyncBatchNorm, OneRankExchangesNothing) {
  SyncBatchNorm sync(nullptr);
  std::vector<double> sums{1, 2, 3, 4};
  int64_t count = 5;
  sync.reduce_statistics("bn", sums, count);
  EXPECT_EQ(sums, (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(count, 5);
}

}  // namespace
}  // namespace meshtrain::parallel
