// The second model family through `meshtrain train`: the MLP classifier on the generated spiral
// set (model.kind = mlp, data.kind = spirals) trains under DDP, ZeRO-1/2/3 and a two-stage
// pipeline with the built meshtrain and meshrun programs, and every layout's final weights equal
// one process's bit for bit; a checkpointed run resumes where it stopped (the sampler position
// included); settings that belong to the language model are refused in one line.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/runtime/train_run_fixture.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::CommandResult;
using meshtrain::testing::kMeshtrainBin;
using meshtrain::testing::run_command;

class ClassifierRun : public meshtrain::testing::TrainRunTest {
 protected:
  // One sample per micro-batch: the one process accumulates the samples the ranks (or the
  // pipeline's micro-batches) take, in the same order, so every gradient is the same sum.
  static std::string args(const fs::path& out, int steps, const std::string& extra) {
    return "train --set model.kind=mlp --set data.kind=spirals --set data.samples=256"
           " --set model.mlp_hidden=16,16 --set train.out_dir=" +
           out.string() +
           " --set train.threads=1 --set train.log_interval=1 --set train.eval_interval=0"
           " --set optim.lr=0.01 --set optim.warmup_steps=2 --set optim.schedule=constant --set "
           "dist.timeout_s=30"
           " --set dist.check_interval=1 --set train.steps=" +
           std::to_string(steps) + " " + extra;
  }
  static std::string one_process(const fs::path& out, int steps, const std::string& extra = "") {
    return kMeshtrainBin + " " +
           args(out, steps, "--set data.batch_size=1 --set train.grad_accum_steps=2 " + extra);
  }
};

TEST_F(ClassifierRun, EveryLayoutEqualsOneProcessBitwise) {
  const fs::path one = dir_ / "one";
  CommandResult a = run_command(one_process(one, 12));
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_NE(a.output.find("MLP classifier 371 parameters, widths 2-16-16-3"), std::string::npos)
      << a.output;
  EXPECT_NE(a.output.find("validation accuracy"), std::string::npos) << a.output;
  // Every evaluation reports the top-1 accuracy beside the loss, in the log and the metrics.
  EXPECT_NE(a.output.find("val_accuracy"), std::string::npos) << a.output;
  const auto accuracy = by_step<double>(one, "val_accuracy");
  ASSERT_EQ(accuracy.size(), 2u);  // before the first step and after the last
  for (const auto& [step, acc] : accuracy) {
    EXPECT_GE(acc, 0.0) << step;
    EXPECT_LE(acc, 1.0) << step;
  }
  const auto l = losses(one);
  ASSERT_EQ(l.size(), 12u);

  struct Layout {
    std::string name, flags, banner;
  };
  const Layout layouts[] = {
      {"ddp", "--set data.batch_size=1", "x ranks 2)"},
      {"zero1", "--set data.batch_size=1 --set parallel.zero_stage=1", "ZeRO-1 over 2 ranks"},
      {"zero2", "--set data.batch_size=1 --set parallel.zero_stage=2", "ZeRO-2 over 2 ranks"},
      {"zero3", "--set data.batch_size=1 --set parallel.zero_stage=3", "ZeRO-3 over 2 ranks"},
      {"pp2",
       "--set data.batch_size=2 --set parallel.pp=2 --set parallel.micro_batches=2 "
       "--set parallel.schedule=gpipe",
       "pipeline gpipe over 2 stages"},
  };
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    const fs::path out = dir_ / layout.name;
    CommandResult r = run_command(meshrun(2) + args(out, 12, layout.flags));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(layout.banner), std::string::npos) << r.output;
    bool same_bits = false;
    const float worst = weights_difference(out, one, &same_bits);
    EXPECT_TRUE(same_bits) << "largest difference " << worst;
    const auto got = losses(out);
    ASSERT_EQ(got.size(), 12u);
  }
}

// A run stopped after a checkpoint and resumed ends with the weights of a run that never
// stopped: the optimizer state and the position in the spiral set come back.
TEST_F(ClassifierRun, ResumesFromACheckpointBitwise) {
  const fs::path straight = dir_ / "straight", resumed = dir_ / "resumed";
  CommandResult a = run_command(one_process(straight, 10));
  ASSERT_EQ(a.status, 0) << a.output;
  CommandResult b = run_command(one_process(resumed, 5, "--set ckpt.interval=5"));
  ASSERT_EQ(b.status, 0) << b.output;
  CommandResult c = run_command(one_process(resumed, 10, "--set ckpt.interval=5"));
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(c.output.find("(step 5 of 10)"), std::string::npos) << c.output;
  bool same_bits = false;
  const float worst = weights_difference(resumed, straight, &same_bits);
  EXPECT_TRUE(same_bits) << "largest difference " << worst;
}

TEST_F(ClassifierRun, LanguageModelSettingsAreOneLineAndStatusTwo) {
  const fs::path out = dir_ / "bad";
  const std::pair<std::string, std::string> cases[] = {
      {"--set data.kind=tokens",
       "model.kind = \"mlp\" trains on data.kind = \"spirals\", not \"tokens\""},
      {"--set parallel.tp=2", "model.kind = \"mlp\" and parallel.tp = 2 cannot be combined"},
      {"--set model.mlp_hidden=16,x", "model.mlp_hidden = \"16,x\" is not a list"},
      {"--set model.activation_checkpointing=all",
       "model.kind = \"mlp\" and model.activation_checkpointing = all"},
      {"--set data.shard_block=2", "data.kind = \"spirals\" has no shards"},
      {"--set data.cache_limit=1GiB", "data.cache_limit bounds the cache of a dataset read"},
      {"--set data.cache_limit=lots", "data.cache_limit = \"lots\" is not a size"},
  };
  for (const auto& [flags, message] : cases) {
    SCOPED_TRACE(flags);
    CommandResult r = run_command(kMeshtrainBin + " " + args(out, 2, flags));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  CommandResult gpt = run_command(kMeshtrainBin +
                                  " train --set data.kind=spirals --set "
                                  "train.out_dir=" +
                                  out.string());
  EXPECT_EQ(gpt.status, 2) << gpt.output;
  EXPECT_NE(gpt.output.find("model.kind = \"gpt\" trains on data.kind = \"tokens\""),
            std::string::npos)
      << gpt.output;
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
}

}  // namespace
