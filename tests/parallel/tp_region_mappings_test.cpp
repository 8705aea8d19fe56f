// The tensor-parallel region mappings on 2 thread ranks: forward values, and every backward
// against finite differences of the global loss the mapping's convention implies (the sum of the
// ranks' losses; for reduce_from, whose output feeds replicated computation, one rank's loss).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/parallel/tensor_parallel/region_mappings.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain::parallel::tp {
namespace {

using Mapping = std::function<Tensor(const Tensor&, const comm::ProcessGroupPtr&)>;

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, gen);
}

float all_reduce_scalar(float v, const comm::ProcessGroupPtr& group) {
  comm::AllReduceOptions opts;
  opts.async_op = false;
  group->all_reduce(&v, 1, DType::f32, opts)->wait();
  return v;
}

struct GradCheck {
  Mapping fn;
  Shape input_shape;
  bool replicated_input;   // every rank holds the same input (perturbed together)
  bool replicated_output;  // downstream is the same on every rank (the loss counted once)
};

// Compares each rank's analytic input gradient with central differences of the global loss
// L = sum_r l_r (or l when the output is replicated), l_r = sum(w_r * y_r^2).
void check_gradients(const GradCheck& c) {
  constexpr int kWorld = 2;
  testing::run_shm_ranks(kWorld, [&](int rank, const comm::ProcessGroupPtr& group) {
    const Tensor x0 = random_tensor(c.input_shape, c.replicated_input ? 7 : 100 + rank);
    auto local_loss = [&](const Tensor& x) {
      Tensor y = c.fn(x, group);
      const Tensor w = random_tensor(y.shape(), c.replicated_output ? 55 : 200 + rank);
      return autograd::sum_all(autograd::mul(w, autograd::mul(y, y)));
    };
    auto global_loss = [&](const Tensor& x) {
      const float l = local_loss(x).item();
      return all_reduce_scalar(l, group) / (c.replicated_output ? kWorld : 1);
    };
    Tensor x = x0.clone();
    x.set_requires_grad(true);
    autograd::backward(local_loss(x));
    ASSERT_TRUE(x.grad().defined());
    const std::vector<float> analytic = x.grad().to_vector();

    constexpr float kEps = 1e-2f;
    const int64_t n = x0.numel();
    // Replicated input: one perturbation of all ranks' copies; else one rank's at a time.
    const int owners = c.replicated_input ? 1 : kWorld;
    for (int owner = 0; owner < owners; ++owner) {
      for (int64_t i = 0; i < n; ++i) {
        auto shifted = [&](float d) {
          Tensor xs = x0.clone();
          if (c.replicated_input || rank == owner) xs.data<float>()[i] += d;
          return global_loss(xs);
        };
        const float numeric = (shifted(kEps) - shifted(-kEps)) / (2 * kEps);
        if (c.replicated_input || rank == owner) {
          EXPECT_NEAR(analytic[static_cast<size_t>(i)], numeric, 2e-3f + 2e-3f * std::fabs(numeric))
              << "rank " << rank << " element " << i;
        }
      }
    }
  });
}

TEST(TpRegionMappings, CopyToTpRegionBackwardIsAllReduce) {
  check_gradients({copy_to_tp_region, {2, 4, 3}, true, false});
}

TEST(TpRegionMappings, ReduceFromTpRegionBackwardIsIdentity) {
  check_gradients({reduce_from_tp_region, {2, 4, 3}, false, true});
}

TEST(TpRegionMappings, GatherFromSequenceParallelBackwardIsReduceScatter) {
  check_gradients({gather_from_sequence_parallel, {2, 2, 3}, false, false});
}

TEST(TpRegionMappings, ReduceScatterToSequenceParallelBackwardIsAllGather) {
  check_gradients({reduce_scatter_to_sequence_parallel, {2, 4, 3}, false, false});
}

TEST(TpRegionMappings, ForwardValues) {
  constexpr int kWorld = 2;
  testing::run_shm_ranks(kWorld, [&](int rank, const comm::ProcessGroupPtr& group) {
    const Tensor a = random_tensor({2, 4, 3}, 100), b = random_tensor({2, 4, 3}, 101);
    const Tensor mine = rank == 0 ? a : b;
    const std::vector<float> sum = (autograd::add(a, b)).to_vector();

    EXPECT_EQ(copy_to_tp_region(mine, group).to_vector(), mine.to_vector());
    const std::vector<float> reduced = reduce_from_tp_region(mine, group).to_vector();
    for (size_t i = 0; i < sum.size(); ++i) EXPECT_FLOAT_EQ(reduced[i], sum[i]);

    // Rank r's part is time steps [2r, 2r + 2) of every batch row.
    const Tensor part = reduce_scatter_to_sequence_parallel(mine, group);
    ASSERT_EQ(part.shape(), (Shape{2, 2, 3}));
    EXPECT_EQ(part.to_vector(), sequence_chunk(autograd::add(a, b), rank, kWorld).to_vector());
    const Tensor whole = gather_from_sequence_parallel(sequence_chunk(a, rank, kWorld), group);
    EXPECT_EQ(whole.to_vector(), a.to_vector());
  });
}

TEST(TpRegionMappings, SequenceSplitNeedsADivisibleLength) {
  testing::run_shm_ranks(2, [&](int, const comm::ProcessGroupPtr& group) {
    try {
      reduce_scatter_to_sequence_parallel(Tensor::zeros({2, 3, 4}), group);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sequence length 3 is not divisible"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace meshtrain::parallel::tp
