// ckpt.interval_minutes through the engine: rank 0's decision to checkpoint at a step rides on
// the step's own all-gather, so every rank learns it at the same step, whatever the other ranks
// asked. Thread ranks over shm, DDP and ZeRO-2; rank 0 decides with a fake clock, never a
// sleep, and the other ranks ask at steps of their own, which must be ignored.
#include <gtest/gtest.h>
#include <omp.h>

#include <map>
#include <mutex>
#include <vector>

#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/runtime/timed_checkpoints.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/engines.h"

namespace meshtrain::parallel {
namespace {

constexpr int64_t kT = 8, kB = 2;

Batch random_batch(int rank, int64_t step) {
  Generator gen(77 + static_cast<uint64_t>(step) * 31 + static_cast<uint64_t>(rank));
  Tensor x = Tensor::empty({kB, kT}, DType::i32);
  Tensor y = Tensor::empty({kB, kT}, DType::i32);
  for (int64_t i = 0; i < kB * kT; ++i) {
    x.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % 29);
    y.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % 29);
  }
  return {x, y};
}

// Per rank: the steps at which StepOutcome::save was set.
std::map<int, std::vector<int64_t>> saves_per_rank(int world, int zero_stage, int64_t steps,
                                                   std::vector<int64_t>* rank0_due) {
  std::map<int, std::vector<int64_t>> saves;
  std::mutex mu;
  testing::run_shm_ranks(world, [&](int rank, const comm::ProcessGroupPtr& pg) {
    omp_set_num_threads(1);
    nn::GPTConfig g;
    g.vocab_size = 29;
    g.block_size = kT;
    g.n_layer = 1;
    g.n_head = 2;
    g.n_embd = 8;
    EngineOptions o;
    o.zero_stage = zero_stage;
    auto engine_owner = testing::gpt_engine(g, pg, o);
    TrainEngine& engine = *engine_owner;
    // Rank 0's clock advances 25 s per reading; a save is due every 1 minute, i.e. at the
    // third reading after the last save.
    double fake_s = 0;
    runtime::TimedCheckpoints timed(rank == 0 ? 1.0 : 0.0, [&fake_s] {
      const double t = fake_s;
      fake_s += 25;
      return t;
    });
    std::vector<int64_t> mine;
    for (int64_t step = 1; step <= steps; ++step) {
      StepOptions so;
      so.step = step;
      so.lr = 1e-3f;
      // The other ranks ask at every odd step: only rank 0's request counts.
      so.save_request = rank == 0 ? timed.due() : step % 2 == 1;
      if (rank == 0 && so.save_request) {
        std::lock_guard<std::mutex> lock(mu);
        rank0_due->push_back(step);
      }
      const StepOutcome out = engine.train_step({random_batch(rank, step)}, so);
      if (out.save) {
        mine.push_back(step);
        timed.saved();
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    saves[rank] = mine;
  });
  return saves;
}

TEST(SaveRequest, EveryRankSavesAtTheStepRank0Chose) {
  for (int stage : {0, 2}) {
    std::vector<int64_t> due;
    const auto saves = saves_per_rank(3, stage, 9, &due);
    // Readings 0 (start), 25, 50, 75 (step 3: due), 100, 125, 150 (step 6), ...
    EXPECT_EQ(due, (std::vector<int64_t>{3, 6, 9})) << "ZeRO-" << stage;
    ASSERT_EQ(saves.size(), 3u);
    for (const auto& [rank, steps] : saves)
      EXPECT_EQ(steps, due) << "rank " << rank << ", ZeRO-" << stage;
  }
}

TEST(SaveRequest, OneProcessTakesItsOwnRequest) {
  nn::GPTConfig g;
  g.vocab_size = 29;
  g.block_size = kT;
  g.n_layer = 1;
  g.n_head = 2;
  g.n_embd = 8;
  auto engine_owner = testing::gpt_engine(g, comm::ProcessGroupPtr{});
  TrainEngine& engine = *engine_owner;
  StepOptions so;
  so.step = 1;
  so.lr = 1e-3f;
  so.save_request = true;
  EXPECT_TRUE(engine.train_step({random_batch(0, 1)}, so).save);
  so.step = 2;
  so.save_request = false;
  EXPECT_FALSE(engine.train_step({random_batch(0, 2)}, so).save);
}

TEST(TimedCheckpoints, DueOnceTheIntervalPassedSinceTheLastSave) {
  double now = 0;
  runtime::TimedCheckpoints timed(0.5, [&now] { return now; });
  now = 29;
  EXPECT_FALSE(timed.due());
  now = 30;
  EXPECT_TRUE(timed.due());
  EXPECT_TRUE(timed.due());  // still due until something is saved
  timed.saved();             // at the time of the last reading, 30
  now = 59;
  EXPECT_FALSE(timed.due());
  now = 60;
  EXPECT_TRUE(timed.due());
  // A save for another reason (the step interval) starts the interval again too.
  now = 70;
  (void)timed.due();  // each step reads the clock once; this one saves on its step interval
  timed.saved();
  now = 99;
  EXPECT_FALSE(timed.due());
  now = 100;
  EXPECT_TRUE(timed.due());
}

TEST(TimedCheckpoints, ZeroMinutesIsOffAndNeverReadsTheClock) {
  int readings = 0;
  runtime::TimedCheckpoints timed(0.0, [&readings] {
    ++readings;
    return 1e9;
  });
  EXPECT_FALSE(timed.enabled());
  EXPECT_FALSE(timed.due());
  EXPECT_EQ(readings, 0);
}

}  // namespace
}  // namespace meshtrain::parallel
