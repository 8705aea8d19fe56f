#include "meshtrain/runtime/language_model_task.h"

#include <algorithm>

#include "meshtrain/data/byte_tokenizer.h"
#include "meshtrain/data/data_loader.h"
#include "meshtrain/data/remote_dataset.h"
#include "meshtrain/data/remote_shards.h"
#include "meshtrain/data/vocab_check.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::runtime {

nn::GPTConfig gpt_config(const ResolvedConfig& r) {
  const TrainConfig& c = r.config;
  nn::GPTConfig g;
  g.vocab_size = c.model.vocab_size;
  g.block_size = c.model.block_size;
  g.n_layer = c.model.n_layer;
  g.n_head = c.model.n_head;
  g.n_embd = c.model.n_embd;
  g.dropout = static_cast<float>(c.model.dropout);
  g.bias = c.model.bias;
  g.tie_embeddings = c.model.tie_embeddings;
  g.seed = static_cast<uint64_t>(c.train.seed);
  g.checkpointed_blocks = r.checkpointed_blocks;
  g.moe = r.moe;
  return g;
}

LanguageModelTask::LanguageModelTask(const ResolvedConfig& config)
    : config_(config.config), model_(gpt_config(config)) {
  const TrainConfig& c = config_;
  if (ckpt::is_object_uri(c.data.dir) && c.data.shard_block > 0) {
    // Shard by shard, as the sampler's blocks come: the run starts once the headers are read.
    const std::shared_ptr<data::RemoteShards> source =
        data::open_remote_shards(c.data.dir, config.data_cache_limit.value_or(0));
    train_ =
        std::make_shared<data::TokenDataset>(source->shards("train"), source, c.model.block_size);
    val_ = std::make_shared<data::TokenDataset>(source->shards("val"), source, c.model.block_size);
  } else {
    const std::string dir = data::resolve_data_dir(c.data.dir);
    train_ = std::make_shared<data::TokenDataset>(
        data::TokenDataset::from_dir(dir, "train", c.model.block_size));
    val_ = std::make_shared<data::TokenDataset>(
        data::TokenDataset::from_dir(dir, "val", c.model.block_size));
  }
  data::check_vocab_fits({train_.get(), val_.get()}, c.model.vocab_size);
}

std::unique_ptr<data::BatchSource> LanguageModelTask::train_batches(int replicas, int replica,
                                                                    int64_t batch_size) const {
  data::SamplerOptions so = training_order(config_, replicas, replica);
  so.shard_block = config_.data.shard_block;
  return std::make_unique<data::DataLoaderSource>(
      data::DataLoader(train_, so, batch_size, config_.data.prefetch_shards));
}

std::vector<std::pair<Tensor, Tensor>> LanguageModelTask::eval_batches() const {
  const int64_t batch_size = config_.data.batch_size;
  data::SamplerOptions so;
  so.shuffle = false;
  data::DataLoader loader(val_, so, batch_size, config_.data.prefetch_shards);
  const int64_t batches = eval_batch_count(config_, val_->num_windows());
  std::vector<std::pair<Tensor, Tensor>> out;
  for (int64_t i = 0; i < batches; ++i) out.push_back(loader.next());
  return out;
}

ThroughputUnit LanguageModelTask::unit() const {
  const int64_t T = config_.model.block_size;
  return {.name = "tokens",
          .rate = "tok/s",
          .per_sample = T,
          .flops_per_unit = model_.flops_per_token(T)};
}

std::string LanguageModelTask::describe(int64_t parameters) const {
  const nn::MoEConfig& moe = model_.moe;
  const std::string experts =
      moe.enabled() ? ", " + std::to_string(moe.num_experts) + " experts (top-" +
                          std::to_string(moe.top_k) + ") in " +
                          (moe.every == 1 ? std::string("every block")
                                          : "one block of every " + std::to_string(moe.every)) +
                          (moe.drop_tokens ? "" : ", dropless")
                    : std::string();
  return "GPT " + std::to_string(parameters) + " parameters, " +
         std::to_string(config_.model.n_layer) + " layers, width " +
         std::to_string(config_.model.n_embd) + experts + "; " +
         std::to_string(train_->num_tokens()) + " training tokens";
}

std::string LanguageModelTask::sample(parallel::TrainEngine& engine) const {
  data::ByteTokenizer tok;
  Generator gen(static_cast<uint64_t>(config_.train.seed));
  const auto prompt = tok.encode("\n");
  const auto out = dynamic_cast<nn::GPT&>(engine.model())
                       .generate(prompt, config_.train.sample_tokens, 0.8f, 40, gen);
  std::vector<int32_t> printable;
  for (int32_t t : out)
    if (t < 256) printable.push_back(t);
  return tok.decode(printable);
}

}  // namespace meshtrain::runtime
