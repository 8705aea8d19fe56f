// The language-model task: GPT over byte tokens. Its data are the token shards of data.dir
// (train_*.bin, val_*.bin) cut into windows of model.block_size, its throughput is counted in
// tokens, and a run ends with text sampled from the model through the byte tokenizer.
#pragma once

#include <memory>

#include "meshtrain/data/token_dataset.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/runtime/resolved_config.h"
#include "meshtrain/runtime/task.h"

namespace meshtrain::runtime {

// Maps the [model] section onto the model's configuration.
nn::GPTConfig gpt_config(const ResolvedConfig& config);

class LanguageModelTask : public Task {
 public:
  // Reads the shards' headers and checks that their tokens fit model.vocab_size.
  explicit LanguageModelTask(const ResolvedConfig& config);

  std::unique_ptr<data::BatchSource> train_batches(int replicas, int replica,
                                                   int64_t batch_size) const override;
  std::vector<std::pair<Tensor, Tensor>> eval_batches() const override;
  ThroughputUnit unit() const override;
  std::string describe(int64_t parameters) const override;
  bool prints_sample() const override { return config_.train.sample_tokens > 0; }
  std::string sample(parallel::TrainEngine& engine) const override;
  std::string sample_heading() const override { return "sample:\n"; }

 private:
  TrainConfig config_;
  nn::GPTConfig model_;
  std::shared_ptr<const data::TokenDataset> train_;
  std::shared_ptr<const data::TokenDataset> val_;
};

}  // namespace meshtrain::runtime
