// Batches for a training or evaluation loop: a TokenDataset, a Sampler and a batch size in one
// object whose position can be saved and restored with the checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "meshtrain/data/sampler.h"
#include "meshtrain/data/token_dataset.h"

namespace meshtrain::data {

class DataLoader {
 public:
  // options.num_windows and options.shard_ends are filled in from the dataset. A dataset whose
  // shards come on demand is told before every batch which shards the sampler reads next: the
  // block of the batch and `shards_ahead` more.
  DataLoader(std::shared_ptr<const TokenDataset> dataset, SamplerOptions options,
             int64_t batch_size, int64_t shards_ahead = 0);

  // (input, target), int32 [batch_size, context].
  std::pair<Tensor, Tensor> next();

  int64_t batch_size() const { return batch_size_; }
  const TokenDataset& dataset() const { return *dataset_; }
  Sampler& sampler() { return sampler_; }
  SamplerState state() const { return sampler_.state(); }
  void set_state(const SamplerState& s) { sampler_.set_state(s); }

 private:
  std::shared_ptr<const TokenDataset> dataset_;
  Sampler sampler_;
  int64_t batch_size_;
  int64_t shards_ahead_;
};

}  // namespace meshtrain::data
