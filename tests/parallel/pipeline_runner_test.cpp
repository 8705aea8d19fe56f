// The stage runner on thread ranks over the shm backend: a tiny GPT cut into 2-4 stages gives,
// under each schedule, the loss and gradients of one rank running the whole model over the same
// micro-batches with gradient accumulation, bitwise, the tied token embedding included: the
// single model adds the head's and the embedding's contributions micro-batch by micro-batch, and
// the pipeline forms that same sum from each micro-batch's contributions on both stages.
#include "meshtrain/parallel/pipeline/stage_runner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/models/gpt_stack.h"
#include "meshtrain/obs/trace.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain::parallel::pipeline {
namespace {

constexpr int64_t kB = 2, kT = 8;

nn::GPTConfig tiny_gpt() {
  nn::GPTConfig c;
  c.vocab_size = 37;
  c.block_size = kT;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 16;
  c.seed = 11;
  c.dropout = 0.1f;  // every stage must draw the single model's masks
  c.checkpointed_blocks = nn::parse_activation_checkpointing("2", c.n_layer);
  return c;
}

std::vector<MicroBatch> micro_batches(int M) {
  std::vector<MicroBatch> out;
  for (int m = 0; m < M; ++m) {
    Generator gen(500 + static_cast<uint64_t>(m));
    Tensor x = Tensor::empty({kB, kT}, DType::i32);
    Tensor y = Tensor::empty({kB, kT}, DType::i32);
    for (int64_t i = 0; i < kB * kT; ++i) {
      x.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % 37);
      y.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % 37);
    }
    out.push_back({x, y});
  }
  return out;
}

std::vector<uint64_t> seeds(int M) {
  std::vector<uint64_t> out;
  for (int m = 0; m < M; ++m) out.push_back(9000 + 31 * static_cast<uint64_t>(m));
  return out;
}

using testing::same_bits;

struct Case {
  ScheduleKind kind;
  int P, M, V;
};

std::string case_name(const Case& c) {
  return std::string(schedule_kind_name(c.kind)) + "_P" + std::to_string(c.P) + "_M" +
         std::to_string(c.M) + "_V" + std::to_string(c.V);
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

class PipelineRunner : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineRunner, MatchesOneRankAccumulatingTheSameMicroBatches) {
  const Case c = GetParam();
  const nn::GPTConfig config = tiny_gpt();
  const std::vector<MicroBatch> mbs = micro_batches(c.M);
  const std::vector<uint64_t> dropout = seeds(c.M);

  // One rank, the whole model: the engine's accumulation (each loss weighted 1/M).
  nn::GPT whole(config);
  float want_loss = 0.0f;
  for (int m = 0; m < c.M; ++m) {
    const Tensor loss =
        whole.loss(mbs[static_cast<size_t>(m)].inputs, mbs[static_cast<size_t>(m)].targets,
                   dropout[static_cast<size_t>(m)]);
    autograd::backward(loss, Tensor::scalar(1.0f / static_cast<float>(c.M)));
    want_loss += loss.item() / static_cast<float>(c.M);
  }
  double want_sq = 0.0;
  std::map<std::string, Tensor> want;
  for (const auto& [name, t] : whole.named_parameters()) {
    want[name] = t.grad();
    for (float g : t.grad().to_vector()) want_sq += double{g} * g;
  }

  std::mutex mu;
  std::vector<PipelineStepResult> results(static_cast<size_t>(c.P));
  std::multimap<std::string, Tensor> got;
  testing::run_shm_ranks(c.P, [&](int rank, const comm::ProcessGroupPtr& group) {
    const PipelineShape shape{c.P, c.M, c.V, c.kind};
    models::GPTStack stack(config);
    const std::vector<models::LayerRange> ranges = stack.partition(c.P, c.V);
    std::vector<std::shared_ptr<models::StageModule>> chunks;
    for (int v = 0; v < c.V; ++v) {
      const models::LayerRange& r = ranges[static_cast<size_t>(shape.virtual_stage(rank, v))];
      chunks.push_back(stack.build(r.begin, r.end));
    }
    StageRunner runner(shape, rank, chunks, group, kB, kT);
    const PipelineStepResult res = runner.run(mbs, dropout);
    std::lock_guard<std::mutex> lock(mu);
    results[static_cast<size_t>(rank)] = res;
    for (const auto& chunk : chunks)
      for (const auto& [name, t] : chunk->named_parameters()) got.emplace(name, t.grad());
  });

  for (int r = 0; r < c.P; ++r) {
    const PipelineStepResult& res = results[static_cast<size_t>(r)];
    EXPECT_EQ(std::memcmp(&res.loss, &want_loss, sizeof(float)), 0)
        << "rank " << r << " loss " << res.loss << " vs " << want_loss;
    EXPECT_EQ(std::memcmp(&res.grad_norm, &results[0].grad_norm, sizeof(double)), 0) << r;
    // The norm sums squares stage by stage rather than over the whole model in one pass.
    EXPECT_NEAR(res.grad_norm, std::sqrt(want_sq), 1e-6 * std::sqrt(want_sq)) << r;
  }
  ASSERT_EQ(got.size(), want.size() + (c.P > 1 ? 1 : 0));
  for (const auto& [name, w] : want) {
    auto [lo, hi] = got.equal_range(name);
    ASSERT_NE(lo, hi) << name << " is on no stage";
    for (auto it = lo; it != hi; ++it)  // both copies of the tied embedding
      EXPECT_TRUE(same_bits(it->second, w)) << name << " gradient differs";
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineRunner,
                         ::testing::Values(Case{ScheduleKind::gpipe, 2, 4, 1},
                                           Case{ScheduleKind::one_f_one_b, 2, 4, 1},
                                           Case{ScheduleKind::one_f_one_b, 4, 3, 1},
                                           Case{ScheduleKind::gpipe, 3, 5, 1},
                                           Case{ScheduleKind::interleaved, 2, 4, 2},
                                           Case{ScheduleKind::one_f_one_b, 1, 2, 1}),
                         [](const auto& info) { return case_name(info.param); });

TEST(PipelineRunnerTrace, EveryRankRecordsItsProgramAsSpans) {
  const int P = 2, M = 4;
  const nn::GPTConfig config = tiny_gpt();
  const std::vector<MicroBatch> mbs = micro_batches(M);
  obs::TraceRecorder& trace = obs::TraceRecorder::global();
  trace.start(0);
  std::vector<int> tids(P);
  std::vector<size_t> program_sizes(P);
  testing::run_shm_ranks(P, [&](int rank, const comm::ProcessGroupPtr& group) {
    const PipelineShape shape{P, M, 1, ScheduleKind::one_f_one_b};
    models::GPTStack stack(config);
    const models::LayerRange r = stack.partition(P)[static_cast<size_t>(rank)];
    StageRunner runner(shape, rank, {stack.build(r.begin, r.end)}, group, kB, kT);
    tids[static_cast<size_t>(rank)] = obs::TraceRecorder::thread_id();
    program_sizes[static_cast<size_t>(rank)] = runner.program().size();
    runner.run(mbs);
  });
  trace.stop();
  for (int rank = 0; rank < P; ++rank) {
    std::vector<obs::TraceEvent> mine;
    for (const obs::TraceEvent& e : trace.events())
      if (e.cat == "pipeline" && e.tid == tids[static_cast<size_t>(rank)]) mine.push_back(e);
    ASSERT_EQ(mine.size(), program_sizes[static_cast<size_t>(rank)]) << "rank " << rank;
    std::map<double, int64_t> forward_end;
    int forwards = 0, backwards = 0;
    int64_t busy = 0;
    for (const obs::TraceEvent& e : mine) {
      if (e.name == "p2p") continue;
      ASSERT_EQ(e.args.size(), 2u);
      const double m = e.args[0].second;
      busy += e.dur_us;
      if (e.name == "forward") {
        ++forwards;
        forward_end[m] = e.ts_us + e.dur_us;
      } else {
        ++backwards;
        ASSERT_TRUE(forward_end.count(m)) << "backward of micro-batch " << m << " before forward";
        EXPECT_GE(e.ts_us, forward_end[m]);
      }
    }
    EXPECT_EQ(forwards, M);
    EXPECT_EQ(backwards, M);
    const int64_t span = mine.back().ts_us + mine.back().dur_us - mine.front().ts_us;
    EXPECT_GT(span, 0);
    std::cout << "rank " << rank << ": idle " << 100.0 * (1.0 - double(busy) / double(span))
              << "% of the step on the trace clock (model: " << 100.0 * (P - 1) / (M + P - 1)
              << "%)\n";
  }
}

// Training: every stage steps AdamW on its own parameters after each pipeline step; one rank
// steps AdamW on the whole model after accumulating the same micro-batches.
struct TrainCase {
  Case shape;
  bool tied;
};

void PrintTo(const TrainCase& c, std::ostream* os) {
  *os << case_name(c.shape) << (c.tied ? "_tied" : "_untied");
}

class PipelineTraining : public ::testing::TestWithParam<TrainCase> {};

constexpr int kSteps = 20;

std::vector<MicroBatch> step_batches(int step, int M) {
  std::vector<MicroBatch> out = micro_batches(M + step);
  out.erase(out.begin(), out.begin() + step);  // a different window of data every step
  return out;
}

TEST_P(PipelineTraining, TwentyAdamWStepsMatchOneRank) {
  const auto [c, tied] = GetParam();
  nn::GPTConfig config = tiny_gpt();
  config.n_layer = 6;  // 8 layers: room for 4 stages x 2 chunks
  config.tie_embeddings = tied;
  optim::AdamWOptions adamw;
  adamw.lr = 3e-3f;
  adamw.weight_decay = 0.1f;

  nn::GPT whole(config);
  optim::AdamW whole_opt(whole.named_parameters(), adamw);
  std::vector<float> want_losses;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<MicroBatch> mbs = step_batches(step, c.M);
    const std::vector<uint64_t> dropout = seeds(c.M);
    whole_opt.zero_grad();
    float loss_v = 0.0f;
    for (int m = 0; m < c.M; ++m) {
      const Tensor loss =
          whole.loss(mbs[static_cast<size_t>(m)].inputs, mbs[static_cast<size_t>(m)].targets,
                     dropout[static_cast<size_t>(m)] + static_cast<uint64_t>(step));
      autograd::backward(loss, Tensor::scalar(1.0f / static_cast<float>(c.M)));
      loss_v += loss.item() / static_cast<float>(c.M);
    }
    want_losses.push_back(loss_v);
    whole_opt.step();
  }

  std::mutex mu;
  std::multimap<std::string, Tensor> got;
  std::vector<std::vector<float>> losses(static_cast<size_t>(c.P));
  testing::run_shm_ranks(c.P, [&](int rank, const comm::ProcessGroupPtr& group) {
    const PipelineShape shape{c.P, c.M, c.V, c.kind};
    models::GPTStack stack(config);
    const std::vector<models::LayerRange> ranges = stack.partition(c.P, c.V);
    std::vector<std::shared_ptr<models::StageModule>> chunks;
    nn::NamedTensors params;
    for (int v = 0; v < c.V; ++v) {
      const models::LayerRange& r = ranges[static_cast<size_t>(shape.virtual_stage(rank, v))];
      chunks.push_back(stack.build(r.begin, r.end));
      for (auto& np : chunks.back()->named_parameters()) params.push_back(np);
    }
    optim::AdamW opt(params, adamw);
    StageRunner runner(shape, rank, chunks, group, kB, kT);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<uint64_t> dropout = seeds(c.M);
      for (uint64_t& d : dropout) d += static_cast<uint64_t>(step);
      opt.zero_grad();
      const PipelineStepResult res = runner.run(step_batches(step, c.M), dropout);
      losses[static_cast<size_t>(rank)].push_back(res.loss);
      opt.step();
    }
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [name, t] : params) got.emplace(name, t);
  });

  // Tied too: the pipeline adds the embedding's two contributions in the single model's order.
  const bool exact = true;
  (void)tied;
  for (int r = 0; r < c.P; ++r)
    for (int step = 0; step < kSteps; ++step) {
      const float a = losses[static_cast<size_t>(r)][static_cast<size_t>(step)];
      const float b = want_losses[static_cast<size_t>(step)];
      if (exact)
        EXPECT_EQ(std::memcmp(&a, &b, sizeof(float)), 0) << "rank " << r << " step " << step;
      else
        EXPECT_NEAR(a, b, 1e-5f * std::fabs(b)) << "rank " << r << " step " << step;
    }
  float worst = 0.0f;
  for (const auto& [name, t] : whole.named_parameters()) {
    auto [lo, hi] = got.equal_range(name);
    ASSERT_NE(lo, hi) << name;
    for (auto it = lo; it != hi; ++it) {
      if (exact) {
        EXPECT_TRUE(same_bits(it->second, t)) << name << " differs after " << kSteps << " steps";
        continue;
      }
      const std::vector<float> g = it->second.to_vector(), w = t.to_vector();
      for (size_t i = 0; i < w.size(); ++i) worst = std::max(worst, std::fabs(g[i] - w[i]));
    }
    if (std::next(lo) != hi) {
      EXPECT_TRUE(same_bits(lo->second, std::next(lo)->second)) << name << " copies diverged";
    }
  }
  // Tied: the embedding's gradient is summed in another order (see the file comment), so the
  // parameters drift apart by rounding; AdamW keeps the drift near float epsilon times lr steps.
  EXPECT_LE(worst, 1e-5f);
  if (!exact)
    std::cout << "largest parameter difference after " << kSteps << " steps: " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineTraining,
                         ::testing::Values(TrainCase{{ScheduleKind::gpipe, 2, 4, 1}, false},
                                           TrainCase{{ScheduleKind::one_f_one_b, 2, 4, 1}, false},
                                           TrainCase{{ScheduleKind::interleaved, 2, 4, 2}, false},
                                           TrainCase{{ScheduleKind::gpipe, 4, 4, 1}, false},
                                           TrainCase{{ScheduleKind::one_f_one_b, 4, 4, 1}, false},
                                           TrainCase{{ScheduleKind::interleaved, 4, 4, 2}, false},
                                           TrainCase{{ScheduleKind::one_f_one_b, 2, 4, 1}, true},
                                           TrainCase{{ScheduleKind::interleaved, 4, 4, 2}, true}),
                         [](const auto& info) {
                           return case_name(info.param.shape) +
                                  (info.param.tied ? "_tied" : "_untied");
                         });

}  // namespace
}  // namespace meshtrain::parallel::pipeline
