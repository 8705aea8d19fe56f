// Reducer::reduce_held_gradients: gradients accumulated over backward passes the reducer did not
// take part in (its hooks idle, as in a pipeline stage) and reduced at once afterwards are the
// bits a synchronised backward pass gives, for the all-reduce (DDP, ZeRO-1) and for the
// reduce-scatter into shards with pooled buckets (ZeRO-2). Two thread ranks over shm.
#include <gtest/gtest.h>

#include <cstring>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain::parallel {
namespace {

constexpr int64_t kT = 8, kB = 2, kVocab = 29;
constexpr int kWorld = 2, kMicro = 3;

nn::GPTConfig tiny() {
  nn::GPTConfig c;
  c.vocab_size = kVocab;
  c.block_size = kT;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.seed = 3;
  return c;
}

std::pair<Tensor, Tensor> batch(int rank, int micro) {
  Generator g(71 + 13 * static_cast<uint64_t>(rank) + static_cast<uint64_t>(micro));
  std::vector<int32_t> x(static_cast<size_t>(kB * kT)), y(x.size());
  for (auto& t : x) t = static_cast<int32_t>(g.below(kVocab));
  for (auto& t : y) t = static_cast<int32_t>(g.below(kVocab));
  return {Tensor::from_vector(x, {kB, kT}), Tensor::from_vector(y, {kB, kT})};
}

// Per rank: the whole averaged gradients (all-reduce) or this rank's shards (reduce-scatter),
// flattened in order.
std::vector<std::vector<float>> reduce(bool held, bool scatter) {
  std::vector<std::vector<float>> out(kWorld);
  testing::run_shm_ranks(kWorld, [&](int rank, const comm::ProcessGroupPtr& pg) {
    nn::GPT model(tiny());
    ReducerOptions o;
    o.first_bucket_bytes = 1024;
    o.bucket_bytes = 4096;
    o.pad_to = kWorld;
    o.reduce_scatter = scatter;
    o.gradient_as_bucket_view = !scatter;
    o.bucket_pool = scatter ? 2 : 0;
    Reducer reducer(model.named_parameters(), pg, o);
    if (held) reducer.set_require_sync(false);
    for (int m = 0; m < kMicro; ++m) {
      if (!held) {
        reducer.set_require_sync(m == kMicro - 1);
        reducer.prepare_for_backward();
      }
      const auto [x, y] = batch(rank, m);
      autograd::backward(model.loss(x, y, 0), Tensor::scalar(1.0f / kMicro));
    }
    if (held) {
      reducer.reduce_held_gradients();
      EXPECT_FALSE(reducer.require_sync());  // left as it was
    } else {
      reducer.finalize_backward();
    }
    std::vector<float>& v = out[static_cast<size_t>(rank)];
    if (scatter) {
      for (size_t b = 0; b < reducer.bucket_layout().size(); ++b) {
        const std::vector<float> s = reducer.shard(b).to_vector();
        v.insert(v.end(), s.begin(), s.end());
      }
    } else {
      for (const auto& [name, p] : model.named_parameters()) {
        const std::vector<float> g = p.grad().to_vector();
        v.insert(v.end(), g.begin(), g.end());
      }
    }
  });
  return out;
}

TEST(ReduceHeldGradients, AllReduceGivesASynchronisedBackwardsBits) {
  const auto want = reduce(false, false), got = reduce(true, false);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_FALSE(want[r].empty());
    ASSERT_EQ(got[r].size(), want[r].size());
    EXPECT_EQ(std::memcmp(got[r].data(), want[r].data(), want[r].size() * sizeof(float)), 0)
        << "rank " << r;
    EXPECT_EQ(got[r], got[0]);  // every rank holds the average
  }
}

TEST(ReduceHeldGradients, ReduceScatterGivesASynchronisedBackwardsShards) {
  const auto want = reduce(false, true), got = reduce(true, true);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_FALSE(want[r].empty());
    ASSERT_EQ(got[r].size(), want[r].size());
    EXPECT_EQ(std::memcmp(got[r].data(), want[r].data(), want[r].size() * sizeof(float)), 0)
        << "rank " << r;
  }
  EXPECT_NE(got[0], got[1]);  // each rank holds its own shards
}

}  // namespace
}  // namespace meshtrain::parallel
