// DataLoader: sampler indices to dataset batches.
#include "meshtrain/data/data_loader.h"

#include "meshtrain/util/error.h"

namespace meshtrain::data {

namespace {

std::shared_ptr<const TokenDataset> non_null(std::shared_ptr<const TokenDataset> dataset) {
  MT_CHECK(dataset != nullptr, "DataLoader without a dataset");
  return dataset;
}

SamplerOptions with_size(SamplerOptions options, const TokenDataset& dataset) {
  options.num_windows = dataset.num_windows();
  options.shard_ends = dataset.shard_window_ends();
  return options;
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const TokenDataset> dataset, SamplerOptions options,
                       int64_t batch_size, int64_t shards_ahead)
    : dataset_(non_null(std::move(dataset))),
      sampler_(with_size(options, *dataset_)),
      batch_size_(batch_size),
      shards_ahead_(shards_ahead) {
  if (batch_size_ < 1) MT_THROW(ValueError, "batch size must be positive, got ", batch_size_);
}

std::pair<Tensor, Tensor> DataLoader::next() {
  if (dataset_->on_demand()) dataset_->expect(sampler_.upcoming_shards(shards_ahead_));
  return dataset_->get_batch(sampler_.next(batch_size_));
}

}  // namespace meshtrain::data
