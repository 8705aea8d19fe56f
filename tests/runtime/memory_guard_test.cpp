// The memory guard: the planner's estimate of a rank's bytes held against a limit, and the
// one-line verdict that names the estimate, the limit and the settings that would fit.
#include "meshtrain/runtime/memory_guard.h"

#include <gtest/gtest.h>

#include "meshtrain/plan/memory_model.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

TrainConfig big_model(const std::string& max_memory) {
  TrainConfig c = load_config(
      "", {"model.n_layer=8", "model.n_embd=512", "model.n_head=8", "model.block_size=64",
           "data.batch_size=2", "train.max_memory=" + max_memory});
  return c;
}

TEST(MemoryGuard, TheEstimateIsThePlannersFormulaForTheRun) {
  const TrainConfig c = big_model("off");
  const plan::MemoryInput in = memory_input(resolve_config(c), 4);
  EXPECT_EQ(in.dp, 4);
  EXPECT_EQ(in.zero_stage, 0);
  const plan::MemoryBreakdown ddp = plan::estimate_memory(in);
  const double p = static_cast<double>(plan::model_params(in.model));
  // f32 AdamW under DDP: 4 bytes of parameters, 4 of gradients, 8 of state per parameter.
  EXPECT_EQ(ddp.parameters, static_cast<int64_t>(4 * p));
  EXPECT_EQ(ddp.gradients, static_cast<int64_t>(4 * p));
  EXPECT_EQ(ddp.optimizer_state, static_cast<int64_t>(8 * p));
  EXPECT_GT(ddp.activations, 0);
}

TEST(MemoryGuard, ARunThatDoesNotFitIsOneLineNamingEstimateLimitAndWhatFits) {
  // 8 x 512 GPT: about 25M parameters, 400 MB under DDP, 100 MB plus two blocks under ZeRO-3 on
  // 4 ranks.
  const TrainConfig c = big_model("200MiB");
  try {
    check_memory(resolve_config(c), 4, 4);
    FAIL() << "a 400 MB run passed a 200 MiB limit";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find("memory guard: this run needs about"), std::string::npos) << m;
    EXPECT_NE(m.find("train.max_memory = 200MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("parallel.zero_stage = 0 on 4 ranks"), std::string::npos) << m;
    EXPECT_NE(m.find("settings that fit: "), std::string::npos) << m;
    EXPECT_NE(m.find("parallel.zero_stage = 3 ("), std::string::npos) << m;
    EXPECT_EQ(m.find("parallel.zero_stage = 1 ("), std::string::npos) << m;  // 8P + 8P/4 > 200MiB
  }
  // The same run under ZeRO-3 fits; "off" never checks.
  TrainConfig z3 = c;
  z3.parallel.zero_stage = 3;
  EXPECT_NO_THROW(check_memory(resolve_config(z3), 4, 4));
  EXPECT_NO_THROW(check_memory(resolve_config(big_model("off")), 4, 4));
  // One process has no ZeRO to offer: the verdict says what else would do.
  try {
    check_memory(resolve_config(big_model("300MiB")), 1, 1);
    FAIL() << "a 400 MB single-process run passed a 300 MiB limit";
  } catch (const ValueError& e) {
    EXPECT_EQ(std::string(e.what()).find("zero_stage = 1 ("), std::string::npos) << e.what();
  }
}

std::string mib_limit(int64_t bytes) {
  return std::to_string(bytes / 1048576) + "MiB";
}

TEST(MemoryGuard, PipelineAndTensorParallelRunsAreEstimatedPerRankOfTheirLayout) {
  TrainConfig c = big_model("off");
  c.train.grad_accum_steps = 4;
  c.parallel.pp = 2;
  plan::MemoryInput in = memory_input(resolve_config(c), 4);
  EXPECT_EQ(in.pp, 2);
  EXPECT_EQ(in.tp, 1);
  EXPECT_EQ(in.dp, 2);
  EXPECT_EQ(in.micro_batches, 4);  // parallel.micro_batches = 0: one per accumulation step
  EXPECT_EQ(in.micro_batch, 2);
  EXPECT_EQ(in.schedule, plan::ScheduleKind::one_f_one_b);
  c.parallel.micro_batches = 8;  // the replica's 8 sequences in micro-batches of 1
  in = memory_input(resolve_config(c), 4);
  EXPECT_EQ(in.micro_batches, 8);
  EXPECT_EQ(in.micro_batch, 1);
  c.parallel.pp = 1;
  c.parallel.micro_batches = 0;
  c.parallel.tp = 2;
  c.parallel.sequence_parallel = true;
  in = memory_input(resolve_config(c), 4);
  EXPECT_EQ(in.tp, 2);
  EXPECT_EQ(in.dp, 2);
  EXPECT_TRUE(in.sequence_parallel);
}

TEST(MemoryGuard, ARunThatFitsOnlyBecauseOfPipelineOrTensorParallelismIsAccepted) {
  // 8 x 512 GPT on 2 ranks: every rank holding the whole model needs about 400 MB; half the
  // blocks (pp 2) or half of each block's matrices (tp 2) need much less.
  TrainConfig whole = big_model("off");
  const int64_t everything = plan::estimate_memory(memory_input(resolve_config(whole), 2)).total();
  for (const char* key : {"pp", "tp"}) {
    TrainConfig c = big_model("off");
    (std::string(key) == "pp" ? c.parallel.pp : c.parallel.tp) = 2;
    const int64_t per_rank = plan::estimate_memory(memory_input(resolve_config(c), 2)).total();
    ASSERT_LT(per_rank, everything * 7 / 10) << key;
    // A limit between the two: accepted with the layout, refused for the whole model.
    const std::string between = mib_limit((per_rank + everything) / 2);
    c.train.max_memory = between;
    EXPECT_NO_THROW(check_memory(resolve_config(c), 2, 2)) << key;
    whole.train.max_memory = between;
    EXPECT_THROW(check_memory(resolve_config(whole), 2, 2), ValueError) << key;
    // Below what a rank of the layout needs: refused with the guard's line naming the layout.
    c.train.max_memory = mib_limit(per_rank / 2);
    try {
      check_memory(resolve_config(c), 2, 2);
      ADD_FAILURE() << key << ": a run of twice the limit passed";
    } catch (const ValueError& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      EXPECT_NE(m.find("memory guard: this run needs about"), std::string::npos) << m;
      EXPECT_NE(m.find(std::string("dp1 ") + (std::string(key) == "pp" ? "tp1 pp2" : "tp2 pp1")),
                std::string::npos)
          << m;
      EXPECT_EQ(m.find("parallel.zero_stage = 1 ("), std::string::npos)
          << "ZeRO is not offered with pp / tp: " << m;
    }
  }
}

TEST(MemoryGuard, TheHostLimitIsReadAndSharedAmongTheLocalRanks) {
  const auto one = host_memory_limit(1);
  ASSERT_TRUE(one.has_value()) << "neither a cgroup limit nor /proc/meminfo could be read";
  EXPECT_GT(one->bytes, 0u);
  const auto four = host_memory_limit(4);
  ASSERT_TRUE(four.has_value());
  // Read twice (the host's free memory moves), so compare with slack.
  EXPECT_NEAR(static_cast<double>(four->bytes), static_cast<double>(one->bytes) / 4,
              0.1 * static_cast<double>(one->bytes));
  EXPECT_NE(four->source.find("/ 4 ranks on this host"), std::string::npos) << four->source;
}

}  // namespace
}  // namespace meshtrain::runtime
