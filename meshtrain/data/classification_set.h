// A labelled classification set held in memory: features [N, F] (f32) and one class label per
// row (i32), read in batches by sample index. The sampler (sampler.h) picks the indices, exactly
// as it picks token windows, so data-parallel sharding, seeded shuffling and the checkpointed
// position work for classifiers as they do for language models.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "meshtrain/data/prefetch_loader.h"
#include "meshtrain/data/sampler.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::data {

class ClassificationSet {
 public:
  // `features` holds samples x num_features values, row after row; every label is in
  // [0, num_classes). ValueError otherwise.
  ClassificationSet(std::vector<float> features, std::vector<int32_t> labels, int64_t num_features,
                    int64_t num_classes);

  int64_t size() const { return static_cast<int64_t>(labels_.size()); }
  int64_t num_features() const { return num_features_; }
  int64_t num_classes() const { return num_classes_; }
  const std::vector<int32_t>& labels() const { return labels_; }

  // Features [B, F] (f32) and labels [B] (i32) of the samples `indices`, in that order.
  std::pair<Tensor, Tensor> get_batch(const std::vector<int64_t>& indices) const;
  // Samples [begin, end) in order, for evaluation.
  std::pair<Tensor, Tensor> slice(int64_t begin, int64_t end) const;

 private:
  std::vector<float> features_;
  std::vector<int32_t> labels_;
  int64_t num_features_;
  int64_t num_classes_;
};

// Batches of a ClassificationSet in the order of a Sampler; the sampler's position is the one a
// checkpoint saves.
class ClassificationBatches : public BatchSource {
 public:
  // options.num_windows is filled in from the set.
  ClassificationBatches(std::shared_ptr<const ClassificationSet> set, SamplerOptions options,
                        int64_t batch_size);
  std::pair<Tensor, Tensor> next() override;
  SamplerState state() const override { return sampler_.state(); }
  void set_state(const SamplerState& state) override { sampler_.set_state(state); }

 private:
  std::shared_ptr<const ClassificationSet> set_;
  Sampler sampler_;
  int64_t batch_size_;
};

}  // namespace meshtrain::data
