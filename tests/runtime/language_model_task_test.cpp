// The language-model task: what the training loop takes from it (batches per replica, the same
// evaluation batches every time, tokens as the throughput unit, the run's first line) and the
// progress line's durations.
#include "meshtrain/runtime/language_model_task.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "meshtrain/data/token_shard.h"
#include "meshtrain/runtime/progress_line.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::runtime {
namespace {

using meshtrain::testing::TempDir;

// Shards of `n` tokens each (ids 0..255 repeating).
ResolvedConfig config_with_data(const TempDir& dir, int64_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::iota(tokens.begin(), tokens.end(), 0);
  for (int32_t& t : tokens) t %= 256;
  data::write_token_shard((dir.path() / "train_000000.bin").string(), tokens);
  data::write_token_shard((dir.path() / "val_000000.bin").string(), tokens);
  TrainConfig c;
  c.data.dir = dir.path().string();
  c.model.block_size = 16;
  c.model.n_layer = 2;
  c.model.n_embd = 32;
  c.model.n_head = 2;
  c.data.batch_size = 4;
  c.data.val_batches = 3;
  return resolve_config(c);
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector() == b.to_vector();
}

TEST(LanguageModelTask, CountsTokensAndNamesTheModelAndData) {
  TempDir dir;
  const ResolvedConfig r = config_with_data(dir, 4096);
  const LanguageModelTask task(r);
  const ThroughputUnit unit = task.unit();
  EXPECT_EQ(unit.name, "tokens");
  EXPECT_EQ(unit.rate, "tok/s");
  EXPECT_EQ(unit.per_sample, 16);
  EXPECT_EQ(unit.flops_per_unit, gpt_config(r).flops_per_token(16));
  EXPECT_EQ(task.describe(1234), "GPT 1234 parameters, 2 layers, width 32; 4096 training tokens");
  EXPECT_TRUE(task.prints_sample());  // train.sample_tokens = 200 by default
}

TEST(LanguageModelTask, EvaluatesOnTheSameBatchesEveryTime) {
  TempDir dir;
  const LanguageModelTask task(config_with_data(dir, 4096));
  const auto a = task.eval_batches(), b = task.eval_batches();
  ASSERT_EQ(a.size(), 3u);  // data.val_batches
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first.shape(), (Shape{4, 16}));
    EXPECT_TRUE(same(a[i].first, b[i].first) && same(a[i].second, b[i].second)) << i;
  }
}

TEST(LanguageModelTask, ReplicasReadDifferentBatchesInARestorableOrder) {
  TempDir dir;
  const LanguageModelTask task(config_with_data(dir, 4096));
  auto first = task.train_batches(2, 0, 4), second = task.train_batches(2, 1, 4);
  const auto x = first->next(), y = second->next();
  EXPECT_FALSE(same(x.first, y.first));
  // From a saved position the source gives the same batches again.
  const data::SamplerState at = first->state();
  const auto next = first->next();
  auto again = task.train_batches(2, 0, 4);
  again->set_state(at);
  EXPECT_TRUE(same(again->next().first, next.first));
}

TEST(ProgressLine, FormatsTheEta) {
  EXPECT_EQ(format_duration(42.4), "42s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(-1), "?");
}

}  // namespace
}  // namespace meshtrain::runtime
