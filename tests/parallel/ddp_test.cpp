// Data-parallel equivalence: N ranks with micro-batch b train exactly like one rank with batch
// N*b. Ranks are threads in this process, each with its own model and process group (shm).
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/prefix_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/process_group_shm.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain::parallel {
namespace {

constexpr int64_t kT = 16, kMicro = 2, kSteps = 20;

nn::GPTConfig tiny(const std::string& checkpointing = "none") {
  nn::GPTConfig c;
  c.vocab_size = 31;
  c.block_size = kT;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.seed = 4;
  c.checkpointed_blocks = nn::parse_activation_checkpointing(checkpointing, c.n_layer);
  return c;
}

// Batch `step` of the global stream: rows [0, rows) of tokens.
std::pair<Tensor, Tensor> global_batch(int64_t step, int64_t rows) {
  Generator g(1000 + static_cast<uint64_t>(step));
  std::vector<int32_t> x(static_cast<size_t>(rows * kT)), y(x.size());
  for (auto& t : x) t = static_cast<int32_t>(g.below(31));
  for (auto& t : y) t = static_cast<int32_t>(g.below(31));
  return {Tensor::from_vector(x, {rows, kT}), Tensor::from_vector(y, {rows, kT})};
}

// SGD keeps the update linear in the gradient, so the comparison measures the reduction itself;
// Adam's per-element normalisation would blow rounding noise in near-zero gradients up to lr.
EngineOptions sgd_engine(const ReducerOptions& ropt) {
  EngineOptions o;
  o.optimizer = optim::OptimizerKind::sgd;
  o.sgd.lr = 0.1f;
  o.sgd.momentum = 0.9f;
  o.weight_decay = 0.01f;
  o.reducer = ropt;
  return o;
}

using Snapshots = std::vector<std::vector<std::vector<float>>>;  // [step][param][values]

std::vector<std::vector<float>> snapshot(const nn::GPT& m) {
  std::vector<std::vector<float>> s;
  for (auto& [n, p] : m.named_parameters()) s.push_back(p.to_vector());
  return s;
}

// One rank's training through the engine; rank r takes rows [r*m*accum, (r+1)*m*accum) of each
// global batch, in micro-batches of m rows.
Snapshots train_rank(int rank, int world, int accum, comm::ProcessGroupPtr pg, ReducerOptions ropt,
                     ReducerStats* stats_out = nullptr, const std::string& checkpointing = "none",
                     int64_t micro = kMicro) {
  omp_set_num_threads(1);
  TrainEngine engine(std::make_shared<nn::GPT>(tiny(checkpointing)), pg, nullptr, Device::cpu(),
                     sgd_engine(ropt));
  Snapshots snaps;
  const int64_t rows_per_rank = micro * accum;
  for (int64_t step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(step, rows_per_rank * world);
    std::vector<Batch> micro_batches;
    for (int a = 0; a < accum; ++a) {
      const int64_t r0 = rank * rows_per_rank + a * micro;
      micro_batches.push_back({x.slice(r0, r0 + micro).clone(), y.slice(r0, r0 + micro).clone()});
    }
    StepOptions so;
    so.step = step + 1;
    so.lr = 0.1f;
    so.grad_clip = 1.0;
    engine.train_step(micro_batches, so);
    snaps.push_back(snapshot(engine.model()));
  }
  if (stats_out && engine.reducer()) *stats_out = engine.reducer()->stats();
  return snaps;
}

std::vector<Snapshots> run_world(int world, int accum, ReducerOptions ropt,
                                 std::vector<ReducerStats>* stats = nullptr,
                                 const std::string& checkpointing = "none") {
  std::vector<Snapshots> out(static_cast<size_t>(world));
  if (stats) stats->resize(static_cast<size_t>(world));
  meshtrain::testing::run_shm_ranks(world, [&](int r, const comm::ProcessGroupPtr& pg) {
    out[static_cast<size_t>(r)] =
        train_rank(r, world, accum, pg, ropt, stats ? &(*stats)[static_cast<size_t>(r)] : nullptr,
                   checkpointing);
  });
  return out;
}

void expect_close(const Snapshots& a, const Snapshots& b, double rel, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s)
    for (size_t p = 0; p < a[s].size(); ++p)
      for (size_t i = 0; i < a[s][p].size(); ++i) {
        const double x = a[s][p][i], y = b[s][p][i];
        ASSERT_LE(std::fabs(x - y), rel * std::max(1.0, std::fabs(y)))
            << what << ": step " << s << " param " << p << " element " << i;
      }
}

TEST(DataParallel, TwoAndFourRanksMatchOneRankWithTheGlobalBatch) {
  ReducerOptions ro;
  ro.first_bucket_bytes = 4096;  // several buckets even for this small model
  ro.bucket_bytes = 16384;
  for (int world : {2, 4}) {
    auto ranks = run_world(world, 1, ro);
    // Every rank holds identical parameters at every step (bitwise).
    for (int r = 1; r < world; ++r) {
      for (size_t s = 0; s < ranks[0].size(); ++s)
        ASSERT_EQ(ranks[static_cast<size_t>(r)][s], ranks[0][s]) << "rank " << r << " step " << s;
    }
    // Reference: one rank, one micro-batch of N*b rows.
    const Snapshots ref = train_rank(0, 1, 1, nullptr, ro, nullptr, "none", kMicro * world);
    expect_close(ranks[0], ref, 1e-6, "world " + std::to_string(world));
  }
}

// Buckets in memory the shm group shares between ranks are all-reduced in place (the group
// counts it) and train bit for bit like private buckets.
TEST(DataParallel, SharedBucketsReduceInPlaceAndMatchPrivateBuckets) {
  ::setenv("MESHTRAIN_SHM_SHARED_MIN_BYTES", "1", 1);  // this model's buckets are small
  ReducerOptions ro;
  ro.first_bucket_bytes = 4096;
  ro.bucket_bytes = 16384;
  for (int world : {2, 4}) {
    std::vector<Snapshots> shared(static_cast<size_t>(world)), priv(shared.size());
    std::vector<uint64_t> in_place(shared.size());
    for (bool use_shared : {true, false}) {
      ReducerOptions o = ro;
      o.shared_buckets = use_shared;
      meshtrain::testing::run_shm_ranks(world, [&](int r, const comm::ProcessGroupPtr& pg) {
        auto snaps = train_rank(r, world, 1, pg, o);
        (use_shared ? shared : priv)[static_cast<size_t>(r)] = std::move(snaps);
        if (use_shared) {
          in_place[static_cast<size_t>(r)] =
              dynamic_cast<comm::ShmProcessGroup&>(*pg).in_place_all_reduces();
        }
      });
    }
    for (int r = 0; r < world; ++r) {
      const auto i = static_cast<size_t>(r);
      // One bucket all-reduce per bucket and step at least.
      EXPECT_GE(in_place[i], static_cast<uint64_t>(kSteps)) << "world " << world << " rank " << r;
      for (size_t s = 0; s < shared[i].size(); ++s)
        ASSERT_EQ(shared[i][s], priv[i][s]) << "world " << world << " rank " << r << " step " << s;
    }
  }
  ::unsetenv("MESHTRAIN_SHM_SHARED_MIN_BYTES");
}

TEST(DataParallel, GradientAccumulationMatches) {
  // 2 ranks x 2 micro-batches == 1 rank x 4 micro-batches (communication only on the last).
  ReducerOptions ro;
  auto two = run_world(2, 2, ro);
  Snapshots one = train_rank(0, 1, 4, nullptr, ro);
  expect_close(two[0], one, 1e-6, "accumulation");
}

TEST(DataParallel, ActivationCheckpointingKeepsEveryRankBitwiseTheSame) {
  // The reducer's hooks fire from the checkpoint node's gradients; with 2 ranks (sums of two
  // terms do not depend on the bucket layout) the parameters are bitwise those without
  // checkpointing at every step, on every rank, with and without accumulation.
  ReducerOptions ro;
  ro.first_bucket_bytes = 4096;
  ro.bucket_bytes = 16384;
  for (int accum : {1, 2}) {
    auto plain = run_world(2, accum, ro);
    for (const char* spec : {"all", "1"}) {
      std::vector<ReducerStats> stats;
      auto ckpt = run_world(2, accum, ro, &stats, spec);
      EXPECT_GE(stats[0].launched_during_backward, 1) << spec;
      for (int r = 0; r < 2; ++r)
        for (size_t s = 0; s < plain[0].size(); ++s)
          ASSERT_EQ(ckpt[static_cast<size_t>(r)][s], plain[static_cast<size_t>(r)][s])
              << spec << " accum " << accum << " rank " << r << " step " << s;
    }
  }
}

TEST(DataParallel, BucketsOverlapBackwardAndRebuildOnce) {
  ReducerOptions ro;
  ro.first_bucket_bytes = 2048;
  ro.bucket_bytes = 8192;
  std::vector<ReducerStats> stats;
  run_world(2, 1, ro, &stats);
  EXPECT_GT(stats[0].buckets, 2);
  // At least one bucket's all-reduce was launched from a gradient-ready hook, i.e. before
  // backward returned.
  EXPECT_GE(stats[0].launched_during_backward, 1);
  EXPECT_GT(stats[0].wire_bytes, 0u);
}

TEST(DataParallel, UnusedParameterIsAnErrorUnlessFlagged) {
  comm::register_builtin_backends();
  auto store = std::make_shared<comm::HashStore>();
  auto pg = comm::make_process_group("shm", store, 0, 1, {});
  Tensor used = Tensor::ones({4}).set_requires_grad(true);
  Tensor unused = Tensor::ones({4}).set_requires_grad(true);
  nn::NamedTensors params{{"used", used}, {"unused", unused}};
  {
    Reducer r(params, pg, {});
    r.prepare_for_backward();
    autograd::backward(autograd::sum_all(autograd::mul(used, used)));
    try {
      r.finalize_backward();
      FAIL() << "expected an error naming the unused parameter";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("unused"), std::string::npos) << e.what();
    }
  }
  used.set_grad(Tensor());
  ReducerOptions ro;
  ro.find_unused_parameters = true;
  Reducer r(params, pg, ro);
  r.prepare_for_backward();
  autograd::backward(autograd::sum_all(autograd::mul(used, used)));
  r.finalize_backward();
  EXPECT_EQ(unused.grad().to_vector(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(used.grad().to_vector(), std::vector<float>(4, 2.0f));
}

TEST(DataParallel, HalfPrecisionHookIsCloseToF32) {
  ReducerOptions f32, bf16;
  bf16.comm_hook = parse_comm_hook_spec("bf16");
  auto a = run_world(2, 1, f32);
  std::vector<ReducerStats> stats;
  auto b = run_world(2, 1, bf16, &stats);
  // bf16 halves the bytes; with 3 significant digits per gradient the parameters stay close.
  std::vector<ReducerStats> stats32;
  run_world(2, 1, f32, &stats32);
  EXPECT_EQ(stats[0].wire_bytes * 2, stats32[0].wire_bytes);
  expect_close(b[0], a[0], 5e-2, "bf16 vs f32");
}

TEST(DataParallel, DefaultBucketsStillOverlapASmallModel) {
  // The test GPT's gradients fit many times in one 25 MiB bucket; the reducer caps the buckets
  // (at a quarter of the gradients, here above the small first bucket) so that there are several
  // and the early ones go out while backward still runs.
  ReducerOptions ro;
  ro.first_bucket_bytes = 1024;
  ASSERT_EQ(ro.bucket_bytes, size_t{25} << 20);
  std::vector<ReducerStats> stats;
  run_world(2, 1, ro, &stats);
  EXPECT_GE(stats[0].buckets, 4);
  EXPECT_GE(stats[0].launched_during_backward, 2);
}

}  // namespace
}  // namespace meshtrain::parallel
