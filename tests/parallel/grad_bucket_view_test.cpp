// gradient_as_bucket_view: parameter gradients that are views into the reducer's buckets must
// train bit for bit like separate gradient tensors (with accumulation, comm hooks, both kinds of
// zero_grad, the bucket rebuild and unused parameters), and must really alias the buckets.
// Ranks are threads in this process, each with its own shm process group.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <functional>
#include <thread>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain::parallel {
namespace {

constexpr int64_t kT = 16, kMicro = 2, kSteps = 5, kVocab = 31;

nn::GPTConfig tiny() {
  nn::GPTConfig c;
  c.vocab_size = kVocab;
  c.block_size = kT;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.seed = 11;
  return c;
}

std::pair<Tensor, Tensor> batch(int64_t step, int rank, int micro) {
  Generator g(500 + 97 * static_cast<uint64_t>(step) + 13 * static_cast<uint64_t>(rank) +
              static_cast<uint64_t>(micro));
  std::vector<int32_t> x(static_cast<size_t>(kMicro * kT)), y(x.size());
  for (auto& t : x) t = static_cast<int32_t>(g.below(kVocab));
  for (auto& t : y) t = static_cast<int32_t>(g.below(kVocab));
  return {Tensor::from_vector(x, {kMicro, kT}), Tensor::from_vector(y, {kMicro, kT})};
}

void run_ranks(int world, const std::function<void(int, comm::ProcessGroupPtr)>& fn) {
  meshtrain::testing::run_shm_ranks(world,
                                    [&](int r, const comm::ProcessGroupPtr& pg) { fn(r, pg); });
}

struct Mode {
  bool view = true;
  bool set_to_none = true;  // how zero_grad clears the gradients between steps
};

// Per step: every parameter's averaged gradient, then every parameter after the update.
using Trace = std::vector<std::vector<float>>;

// `divided`, when given, receives the reducer's divided_in_place count of every step.
Trace train(int rank, comm::ProcessGroupPtr pg, const std::string& hook, int accum, Mode mode,
            std::vector<size_t>* divided = nullptr) {
  omp_set_num_threads(1);
  nn::GPT model(tiny());
  auto params = model.named_parameters();
  optim::AdamW opt(params, {});
  ReducerOptions ro;
  ro.first_bucket_bytes = 2048;  // several buckets, and a rebuild after the first step
  ro.bucket_bytes = 8192;
  ro.comm_hook = parse_comm_hook_spec(hook);
  ro.gradient_as_bucket_view = mode.view;
  Reducer reducer(params, std::move(pg), ro);
  Trace trace;
  for (int64_t step = 0; step < kSteps; ++step) {
    opt.zero_grad(mode.set_to_none);
    for (int a = 0; a < accum; ++a) {
      reducer.set_require_sync(a == accum - 1);
      reducer.prepare_for_backward();
      auto [x, y] = batch(step, rank, a);
      autograd::backward(model.loss(x, y), Tensor::scalar(1.0f / static_cast<float>(accum)));
      reducer.finalize_backward();
    }
    if (divided) divided->push_back(reducer.stats().divided_in_place);
    for (auto& [n, p] : params) trace.push_back(p.grad().to_vector());
    optim::clip_grad_norm(params, 0.5);
    opt.step();
    for (auto& [n, p] : params) trace.push_back(p.to_vector());
  }
  return trace;
}

Trace train_world(int world, const std::string& hook, int accum, Mode mode) {
  std::vector<Trace> traces(static_cast<size_t>(world));
  run_ranks(world, [&](int r, comm::ProcessGroupPtr pg) {
    traces[static_cast<size_t>(r)] = train(r, std::move(pg), hook, accum, mode);
  });
  for (int r = 1; r < world; ++r) EXPECT_EQ(traces[static_cast<size_t>(r)], traces[0]);
  return traces[0];
}

class BucketViewHooks : public ::testing::TestWithParam<std::string> {};

TEST_P(BucketViewHooks, TrainBitwiseLikeSeparateGradients) {
  const std::string hook = GetParam();
  const Trace copy = train_world(2, hook, 2, {.view = false, .set_to_none = true});
  const Trace view = train_world(2, hook, 2, {.view = true, .set_to_none = true});
  // zero_grad in place keeps the views, so autograd sums straight into the buckets.
  const Trace in_place = train_world(2, hook, 2, {.view = true, .set_to_none = false});
  ASSERT_EQ(copy.size(), view.size());
  for (size_t i = 0; i < copy.size(); ++i) {
    ASSERT_EQ(view[i], copy[i]) << "entry " << i << " (hook " << hook << ", set_to_none)";
    ASSERT_EQ(in_place[i], copy[i]) << "entry " << i << " (hook " << hook << ", zero in place)";
  }
}

INSTANTIATE_TEST_SUITE_P(Hooks, BucketViewHooks,
                         ::testing::Values("allreduce", "bf16", "powersgd:1"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == ':') ch = '_';
                           return n;
                         });

// Gradients accumulated straight into the buckets (zero_grad in place) still need the division
// by the world size: the plain all-reduce does it in its collective (ReduceOp::avg), with no pass
// of its own; a compressing hook, which wants divided input, gets a pass.
TEST(BucketView, ThePlainAllReduceDividesInItsCollective) {
  for (const std::string hook : {"allreduce", "bf16"}) {
    std::vector<std::vector<size_t>> divided(2);
    run_ranks(2, [&](int r, comm::ProcessGroupPtr pg) {
      train(r, std::move(pg), hook, 2, {.view = true, .set_to_none = false},
            &divided[static_cast<size_t>(r)]);
    });
    size_t numel = 0;
    for (auto& [n, p] : nn::GPT(tiny()).named_parameters()) numel += static_cast<size_t>(p.numel());
    for (const auto& per_step : divided) {
      ASSERT_EQ(per_step.size(), static_cast<size_t>(kSteps));
      // Step 0 starts without gradients: its division rides on the copy into the bucket.
      EXPECT_EQ(per_step[0], 0u) << hook;
      for (size_t s = 1; s < per_step.size(); ++s)
        EXPECT_EQ(per_step[s], hook == "allreduce" ? 0u : numel) << hook << " step " << s;
    }
  }
}

TEST(BucketView, GradientsAliasTheirBucketsAcrossTheRebuild) {
  run_ranks(2, [](int rank, comm::ProcessGroupPtr pg) {
    omp_set_num_threads(1);
    nn::GPT model(tiny());
    auto params = model.named_parameters();
    ReducerOptions ro;
    ro.first_bucket_bytes = 2048;
    ro.bucket_bytes = 8192;
    Reducer reducer(params, std::move(pg), ro);
    auto expect_aliased = [&](const std::string& when) {
      for (size_t i = 0; i < params.size(); ++i) {
        const Tensor g = params[i].second.grad();
        ASSERT_TRUE(g.defined()) << params[i].first << " " << when;
        EXPECT_EQ(g.data_ptr(), reducer.bucket_view(i).data_ptr())
            << params[i].first << " " << when;
        EXPECT_EQ(g.shape(), params[i].second.shape());
      }
    };
    for (int64_t step = 0; step < 3; ++step) {
      // Cleared in place: the views survive, and backward accumulates into the buckets.
      for (auto& [n, p] : params)
        if (Tensor g = p.grad(); g.defined()) g.zero_();
      reducer.prepare_for_backward();
      auto [x, y] = batch(step, rank, 0);
      autograd::backward(model.loss(x, y));
      if (step > 0) expect_aliased("during step " + std::to_string(step));
      reducer.finalize_backward();
      expect_aliased("after step " + std::to_string(step));
    }
    EXPECT_TRUE(reducer.rebuilt());
  });
}

TEST(BucketView, CopyModeKeepsSeparateGradients) {
  run_ranks(1, [](int rank, comm::ProcessGroupPtr pg) {
    nn::GPT model(tiny());
    auto params = model.named_parameters();
    ReducerOptions ro;
    ro.gradient_as_bucket_view = false;
    Reducer reducer(params, std::move(pg), ro);
    reducer.prepare_for_backward();
    auto [x, y] = batch(0, rank, 0);
    autograd::backward(model.loss(x, y));
    reducer.finalize_backward();
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_NE(params[i].second.grad().data_ptr(), reducer.bucket_view(i).data_ptr());
  });
}

TEST(BucketView, UnusedParametersKeepWhatNoSyncPassesAccumulated) {
  // `a` gets a gradient only in the no_sync pass and `b` only in the synchronised one: with
  // find_unused_parameters, `a` still contributes its accumulated gradient, and a parameter that
  // never got one is reduced as zeros. Same in both modes.
  for (bool view : {false, true}) {
    run_ranks(2, [view](int rank, comm::ProcessGroupPtr pg) {
      const float r = static_cast<float>(rank + 1);
      Tensor a = Tensor::from_vector(std::vector<float>{r, 2 * r}, {2}).set_requires_grad(true);
      Tensor b = Tensor::from_vector(std::vector<float>{3 * r}, {1}).set_requires_grad(true);
      Tensor never = Tensor::ones({3}).set_requires_grad(true);
      nn::NamedTensors params{{"a", a}, {"b", b}, {"never", never}};
      ReducerOptions ro;
      ro.find_unused_parameters = true;
      ro.gradient_as_bucket_view = view;
      Reducer reducer(params, std::move(pg), ro);
      reducer.set_require_sync(false);
      reducer.prepare_for_backward();
      autograd::backward(autograd::sum_all(autograd::mul(a, a)));  // d/da = 2a
      reducer.finalize_backward();
      reducer.set_require_sync(true);
      reducer.prepare_for_backward();
      autograd::backward(autograd::sum_all(autograd::mul(b, b)));
      reducer.finalize_backward();
      // Averages over ranks 1 and 2: 2a -> {3, 6}, 2b -> {9}.
      EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{3, 6})) << "view " << view;
      EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{9})) << "view " << view;
      EXPECT_EQ(never.grad().to_vector(), (std::vector<float>(3, 0.0f))) << "view " << view;
      if (view) {
        for (size_t i = 0; i < params.size(); ++i)
          EXPECT_EQ(params[i].second.grad().data_ptr(), reducer.bucket_view(i).data_ptr());
      }
    });
  }
}

}  // namespace
}  // namespace meshtrain::parallel
