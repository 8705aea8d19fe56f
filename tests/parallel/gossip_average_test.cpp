// Gossip averaging on 4 thread-ranks with real shm process groups: one round of the ring and
// rounds of the exponential graph leave each rank exactly the formula's bits and keep the mean
// over ranks; and through the engine, each replica steps on its own gradients clipped by its own
// norm before the ring average, with one agreed norm and loss on every rank.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "meshtrain/models/mlp_source.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/gossip/gossip_average.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain::parallel {
namespace {

constexpr int kRanks = 4;
const std::vector<std::pair<std::string, int64_t>> kTensors{{"w", 37}, {"b", 5}};

// Rank r's element k of tensor t: irregular values whose sums round.
float value(int r, size_t t, int64_t k) {
  return std::sin(1.3f * static_cast<float>(r + 1) + 0.7f * static_cast<float>(k) +
                  static_cast<float>(t)) *
         static_cast<float>(r + 2) / 7.0f;
}

using Values = std::vector<std::vector<float>>;  // [tensor][element]

Values start(int r) {
  Values v;
  for (size_t t = 0; t < kTensors.size(); ++t) {
    v.emplace_back();
    for (int64_t k = 0; k < kTensors[t].second; ++k) v.back().push_back(value(r, t, k));
  }
  return v;
}

// Every rank's values after `rounds` rounds of `graph`, through GossipAverage.
std::vector<Values> gossip(GossipGraph graph, int ranks, int rounds, size_t* exchange_bytes) {
  std::vector<Values> out(static_cast<size_t>(ranks));
  std::mutex mu;
  testing::run_shm_ranks(ranks, [&](int rank, const comm::ProcessGroupPtr& group) {
    nn::NamedTensors params;
    const Values v = start(rank);
    for (size_t t = 0; t < kTensors.size(); ++t)
      params.emplace_back(kTensors[t].first, Tensor::from_vector(v[t], {kTensors[t].second}));
    GossipAverage avg(params, group, graph);
    for (int i = 0; i < rounds; ++i) avg.after_update();
    EXPECT_EQ(avg.rounds(), rounds);
    std::lock_guard<std::mutex> lock(mu);
    if (rank == 0 && exchange_bytes) *exchange_bytes = avg.exchange_bytes();
    for (const auto& [name, p] : params) out[static_cast<size_t>(rank)].push_back(p.to_vector());
  });
  return out;
}

void expect_bits(const std::vector<Values>& want, const std::vector<Values>& got) {
  for (size_t r = 0; r < want.size(); ++r)
    for (size_t t = 0; t < want[r].size(); ++t)
      for (size_t k = 0; k < want[r][t].size(); ++k)
        ASSERT_EQ(std::memcmp(&want[r][t][k], &got[r][t][k], sizeof(float)), 0)
            << "rank " << r << " tensor " << t << " element " << k << ": " << want[r][t][k]
            << " vs " << got[r][t][k];
}

void expect_mean_kept(const std::vector<Values>& before, const std::vector<Values>& after) {
  for (size_t t = 0; t < before[0].size(); ++t)
    for (size_t k = 0; k < before[0][t].size(); ++k) {
      double a = 0, b = 0;
      for (size_t r = 0; r < before.size(); ++r) {
        a += before[r][t][k];
        b += after[r][t][k];
      }
      // Each rank's result is rounded once or twice to f32.
      EXPECT_NEAR(b / static_cast<double>(before.size()), a / static_cast<double>(before.size()),
                  4e-7 * (1.0 + std::fabs(a)))
          << "tensor " << t << " element " << k;
    }
}

TEST(GossipAverage, OneRingRoundIsTheFormulaBitwiseAndKeepsTheMean) {
  std::vector<Values> before, want(kRanks);
  for (int r = 0; r < kRanks; ++r) before.push_back(start(r));
  for (int r = 0; r < kRanks; ++r) {
    const Values &p = before[(r + kRanks - 1) % kRanks], &x = before[r],
                 &n = before[(r + 1) % kRanks];
    for (size_t t = 0; t < x.size(); ++t) {
      want[r].emplace_back();
      for (size_t k = 0; k < x[t].size(); ++k)
        want[r].back().push_back((p[t][k] + x[t][k] + n[t][k]) / 3.0f);
    }
  }
  size_t bytes = 0;
  const std::vector<Values> got = gossip(GossipGraph::ring, kRanks, 1, &bytes);
  expect_bits(want, got);
  expect_mean_kept(before, got);
  // This replica's flat buffer and one per neighbour.
  EXPECT_EQ(bytes, 3u * (37 + 5) * sizeof(float));
  // The replicas moved: not all of them hold the same values yet.
  EXPECT_NE(got[0], got[1]);
}

TEST(GossipAverage, ExponentialRoundsAreTheFormulaBitwiseAndKeepTheMean) {
  std::vector<Values> before, want;
  for (int r = 0; r < kRanks; ++r) before.push_back(start(r));
  want = before;
  const int rounds = 3;  // hops 1, 2, 1
  for (int t = 0; t < rounds; ++t) {
    const int hop = t % 2 == 0 ? 1 : 2;
    std::vector<Values> next = want;
    for (int r = 0; r < kRanks; ++r)
      for (size_t i = 0; i < next[r].size(); ++i)
        for (size_t k = 0; k < next[r][i].size(); ++k)
          next[r][i][k] = (want[r][i][k] + want[(r - hop + kRanks) % kRanks][i][k]) / 2.0f;
    want = next;
  }
  const std::vector<Values> got = gossip(GossipGraph::exponential, kRanks, rounds, nullptr);
  expect_bits(want, got);
  expect_mean_kept(before, got);
}

TEST(GossipAverage, TwoRanksBothHoldTheirMean) {
  for (GossipGraph g : {GossipGraph::ring, GossipGraph::exponential}) {
    const std::vector<Values> got = gossip(g, 2, 1, nullptr);
    expect_bits({got[1]}, {got[0]});
    const Values a = start(0), b = start(1);
    EXPECT_EQ(got[0][0][3], (a[0][3] + b[0][3]) / 2.0f);
  }
}

// The engine: a small MLP classifier on a synthetic set (as mlp_engine_test.cpp).
const std::vector<int64_t> kSizes{8, 16, 12, 3};
constexpr int64_t kRows = 6;

Batch batch(int step, int part) {
  Generator g(300 + static_cast<uint64_t>(step) * 7 + static_cast<uint64_t>(part));
  std::vector<float> x(static_cast<size_t>(kRows * kSizes.front()));
  std::vector<int32_t> y(static_cast<size_t>(kRows));
  for (auto& v : x) v = static_cast<float>(g.normal());
  for (int64_t r = 0; r < kRows; ++r) y[static_cast<size_t>(r)] = static_cast<int32_t>(r % 3);
  return {Tensor::from_vector(x, {kRows, kSizes.front()}), Tensor::from_vector(y, {kRows})};
}

std::unique_ptr<TrainEngine> mlp_engine(DeviceMesh mesh, bool gossip) {
  EngineSpec spec;
  spec.model = std::make_shared<models::MlpSource>(kSizes, 11);
  spec.mesh = std::move(mesh);
  spec.options.adamw.lr = 1e-2f;
  if (gossip) spec.options.gossip = GossipGraph::ring;
  return make_engine(std::move(spec));
}

StepOptions step_options() {
  StepOptions so;
  so.step = 1;
  so.lr = 1e-2f;
  so.grad_clip = 0.05;  // below every replica's norm: each is clipped by its own
  return so;
}

using Params = std::vector<std::pair<std::string, std::vector<float>>>;

Params values_of(const nn::NamedTensors& params) {
  Params out;
  for (const auto& [name, t] : params) out.emplace_back(name, t.to_vector());
  return out;
}

TEST(GossipEngine, EachReplicaStepsOnItsOwnClippedGradientsThenAveragesWithItsRing) {
  omp_set_num_threads(1);
  // Replica r alone, on its own batch.
  std::vector<Params> alone;
  std::vector<double> norms;
  std::vector<float> losses;
  for (int r = 0; r < kRanks; ++r) {
    auto engine = mlp_engine(data_parallel_mesh(nullptr), false);
    const StepOutcome o = engine->train_step({batch(1, r)}, step_options());
    ASSERT_FALSE(o.skipped);
    EXPECT_GT(o.grad_norm, step_options().grad_clip);
    norms.push_back(o.grad_norm);
    losses.push_back(o.loss);
    alone.push_back(values_of(engine->gather_parameters()));
  }
  std::vector<Params> got(kRanks);
  std::vector<StepOutcome> outcomes(kRanks);
  std::vector<std::string> described(kRanks);
  std::mutex mu;
  testing::run_shm_ranks(kRanks, [&](int rank, const comm::ProcessGroupPtr& group) {
    omp_set_num_threads(1);
    auto engine = mlp_engine(data_parallel_mesh(group), true);
    const StepOutcome o = engine->train_step({batch(1, rank)}, step_options());
    // The replicas differ by design: the periodic comparison does not fail the run.
    engine->check_in_sync(1);
    const Params mine = values_of(engine->gather_parameters());
    std::lock_guard<std::mutex> lock(mu);
    got[static_cast<size_t>(rank)] = mine;
    outcomes[static_cast<size_t>(rank)] = o;
    described[static_cast<size_t>(rank)] = engine->describe();
  });
  EXPECT_EQ(described[0], "gossip averaging over a ring of 4 replicas");
  const double mean_norm = (((norms[0] + norms[1]) + norms[2]) + norms[3]) / kRanks;
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const StepOutcome& o = outcomes[static_cast<size_t>(r)];
    EXPECT_FALSE(o.skipped);
    // One norm on every rank: the mean of the replicas' own norms.
    EXPECT_EQ(o.grad_norm, mean_norm);
    EXPECT_NEAR(o.loss, (losses[0] + losses[1] + losses[2] + losses[3]) / 4, 1e-6);
    const Params &p = alone[(r + kRanks - 1) % kRanks], &x = alone[r], &n = alone[(r + 1) % kRanks];
    const Params& mine = got[static_cast<size_t>(r)];
    ASSERT_EQ(mine.size(), x.size());
    for (size_t t = 0; t < x.size(); ++t) {
      ASSERT_EQ(mine[t].first, x[t].first);
      for (size_t k = 0; k < x[t].second.size(); ++k) {
        const float want = (p[t].second[k] + x[t].second[k] + n[t].second[k]) / 3.0f;
        ASSERT_EQ(std::memcmp(&want, &mine[t].second[k], sizeof(float)), 0)
            << x[t].first << "[" << k << "]: " << want << " vs " << mine[t].second[k];
      }
    }
  }
  // The neighbours' averages differ: nothing made the replicas equal.
  EXPECT_NE(got[0], got[2]);
}

}  // namespace
}  // namespace meshtrain::parallel
