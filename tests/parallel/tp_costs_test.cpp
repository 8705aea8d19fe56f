// What tensor and sequence parallelism cost per step, measured: the bytes every collective of a
// training step moves (counted by the collective observer) against Megatron's formula, and the
// activations the norm and dropout regions keep for backward (counted by the allocator) with
// and without the sequence split.
#include <gtest/gtest.h>
#include <omp.h>

#include <iostream>
#include <map>
#include <mutex>
#include <string>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/comm/collective_observer.h"
#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/counting_allocator.h"

namespace meshtrain::parallel::tp {
namespace {

constexpr int64_t kB = 2, kT = 8, kC = 16, kL = 2;

nn::GPTConfig tiny(float dropout) {
  nn::GPTConfig c;
  c.vocab_size = 31;
  c.block_size = 16;
  c.n_layer = kL;
  c.n_head = 4;
  c.n_embd = kC;
  c.dropout = dropout;
  c.seed = 9;
  return c;
}

std::pair<Tensor, Tensor> batch() {
  Generator g(3);
  std::vector<int32_t> x(static_cast<size_t>(kB * kT)), y(x.size());
  for (auto& t : x) t = static_cast<int32_t>(g.below(31));
  for (auto& t : y) t = static_cast<int32_t>(g.below(31));
  return {Tensor::from_vector(x, {kB, kT}), Tensor::from_vector(y, {kB, kT})};
}

struct OpCount {
  int64_t calls = 0;
  uint64_t bytes = 0;
};

// Collectives of one step (forward, backward, the sequence-parallel gradient sum) summed over
// the ranks of a tp group; ranks are symmetric, so a rank's share is 1 / tp of it.
std::map<std::string, OpCount> count_step(int tp, bool sp, int64_t* replicated_numel) {
  std::mutex mu;
  std::map<std::string, OpCount> ops;
  bool counting = false;
  comm::ScopedCollectiveObserver observer([&](const comm::CollectiveEvent& e) {
    std::lock_guard lock(mu);
    if (!counting) return;
    ops[e.op].calls += 1;
    ops[e.op].bytes += e.bytes;
  });
  testing::run_shm_ranks(tp, [&](int r, const comm::ProcessGroupPtr& group) {
    omp_set_num_threads(1);
    TpGPT model(tiny(0.0f), TpContext{group, sp});
    if (r == 0) {
      *replicated_numel = 0;
      const auto infos = model.param_infos();
      const auto params = model.named_parameters();
      for (size_t i = 0; i < infos.size(); ++i)
        if (!infos[i].init.shard.defined()) *replicated_numel += params[i].second.numel();
    }
    auto [x, y] = batch();
    comm::BarrierOptions bo;
    bo.async_op = false;
    group->barrier(bo)->wait();
    if (r == 0) {
      std::lock_guard lock(mu);
      counting = true;
    }
    group->barrier(bo)->wait();
    autograd::backward(model.loss(x, y));
    model.reduce_sequence_parallel_grads();
    group->barrier(bo)->wait();
    if (r == 0) {
      std::lock_guard lock(mu);
      counting = false;
    }
  });
  ops.erase("barrier");
  for (auto& [op, c] : ops) {
    EXPECT_EQ(c.calls % tp, 0) << op;
    c.calls /= tp;
    c.bytes /= static_cast<uint64_t>(tp);
  }
  return ops;
}

// Per layer and micro-batch: 2 all-reduces of B x T x C forward (attention's and the MLP's
// row-parallel exits) and 2 backward (their column-parallel entries); besides the layers, the
// embedding's exit (forward), the head's entry (backward) and the cross-entropy's three
// all-reduces of B x T floats (max, sum of exponentials, target logit).
TEST(TensorParallelCost, CommunicationPerStepIsTheMegatronFormula) {
  const uint64_t btc = kB * kT * kC * sizeof(float), bt = kB * kT * sizeof(float);
  for (int tp : {2, 4}) {
    int64_t replicated = 0;
    const auto ops = count_step(tp, false, &replicated);
    EXPECT_EQ(ops.size(), 1u) << "only all-reduces without sequence parallelism";
    EXPECT_EQ(ops.at("all_reduce").calls, 4 * kL + 2 + 3) << "tp " << tp;
    EXPECT_EQ(ops.at("all_reduce").bytes, (4 * kL + 2) * btc + 3 * bt) << "tp " << tp;
  }
}

// With sequence parallelism each of those all-reduces becomes a reduce-scatter plus an
// all-gather of 1 / tp of it per rank (the same bytes on the wire as a ring all-reduce:
// 2 (tp - 1) / tp of B x T x C), plus one all-reduce of the replicated parameters' gradients
// per step (each rank's covers its own time steps).
TEST(TensorParallelCost, SequenceParallelismMovesTheSameBytesAsGathersAndScatters) {
  const uint64_t bt = kB * kT * sizeof(float);
  for (int tp : {2, 4}) {
    int64_t replicated = 0;
    const auto ops = count_step(tp, true, &replicated);
    const uint64_t part = kB * kT * kC * sizeof(float) / static_cast<uint64_t>(tp);
    // Forward: 2 gathers per layer into its column-parallel layers and one into the head;
    // backward: the all-gather of each reduce-scatter's gradient (the 2 row-parallel exits per
    // layer and the embedding's, whose table needs the whole gradient).
    EXPECT_EQ(ops.at("all_gather").calls, 4 * kL + 2) << "tp " << tp;
    EXPECT_EQ(ops.at("all_gather").bytes, (4 * kL + 2) * part) << "tp " << tp;
    // Forward: the 2 row-parallel exits per layer and the embedding's; backward: the
    // reduce-scatter of each gather's gradient.
    EXPECT_EQ(ops.at("reduce_scatter").calls, 4 * kL + 2) << "tp " << tp;
    EXPECT_EQ(ops.at("reduce_scatter").bytes, (4 * kL + 2) * part) << "tp " << tp;
    EXPECT_EQ(ops.at("all_reduce").calls, 3 + 1) << "tp " << tp;
    EXPECT_EQ(ops.at("all_reduce").bytes, 3 * bt + static_cast<uint64_t>(replicated) * 4)
        << "tp " << tp;
    // Each of the 4L + 2 all-reduces of B x T x C without the split is one gather and one
    // scatter of a 1 / tp part here: on a ring, the same bytes on the wire.
    EXPECT_EQ(ops.at("all_gather").calls, ops.at("reduce_scatter").calls);
  }
}

// Activations a forward keeps for backward, per rank. Outside the matrices (the region sequence
// parallelism splits) a forward keeps, in floats: per layer the block input and the middle
// residual (kept by the layer norms), 2 B T C, and the two layer norms' statistics, 4 B T;
// besides, the final norm's input and statistics, B T C + 2 B T. Additions keep only their
// operands' shapes (the row-parallel outputs, the dropout outputs, the embedding's token and
// position rows go once added), and dropout keeps no mask (it comes back from the seed). With
// the sequence split a rank keeps T / tp time steps of each of them: the difference is exactly
// (1 - 1 / tp) of that region; what the matrices keep is unchanged.
TEST(TensorParallelCost, SequenceParallelismKeepsOneTpthOfTheNormAndDropoutActivations) {
  for (int tp : {2, 4}) {
    int64_t kept[2] = {0, 0};
    for (bool sp : {false, true}) {
      testing::CountingAllocator counting(allocator_for(DeviceType::cpu));
      set_allocator(DeviceType::cpu, &counting);
      int64_t before = 0, after = 0;
      std::vector<Tensor> losses(static_cast<size_t>(tp));
      try {
        testing::run_shm_ranks(tp, [&](int r, const comm::ProcessGroupPtr& group) {
          omp_set_num_threads(1);
          TpGPT model(tiny(0.1f), TpContext{group, sp});
          auto [x, y] = batch();
          comm::BarrierOptions bo;
          bo.async_op = false;
          group->barrier(bo)->wait();
          if (r == 0) before = counting.live();
          group->barrier(bo)->wait();
          losses[static_cast<size_t>(r)] = model.loss(x, y, 5);
          group->barrier(bo)->wait();
          if (r == 0) after = counting.live();
          group->barrier(bo)->wait();
          losses[static_cast<size_t>(r)] = Tensor();
        });
      } catch (...) {
        set_allocator(DeviceType::cpu, nullptr);
        throw;
      }
      set_allocator(DeviceType::cpu, nullptr);
      kept[sp ? 1 : 0] = (after - before) / tp;
    }
    const int64_t btc = kB * kT * kC, bt = kB * kT;
    const int64_t region = 4 * (kL * (2 * btc + 4 * bt) + btc + 2 * bt);  // bytes, no split
    std::cout << "tp " << tp << ": forward keeps " << kept[0] << " bytes per rank, " << kept[1]
              << " with sequence parallelism; norm/dropout/residual region " << region << " -> "
              << region / tp << "\n";
    EXPECT_EQ(kept[0] - kept[1], region - region / tp) << "tp " << tp;
  }
}

}  // namespace
}  // namespace meshtrain::parallel::tp
