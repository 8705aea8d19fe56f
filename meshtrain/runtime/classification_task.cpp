#include "meshtrain/runtime/classification_task.h"

#include <algorithm>
#include <cstdio>

#include "meshtrain/data/spirals.h"
#include "meshtrain/nn/mlp_classifier.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

namespace {

// The validation set's seed: another draw of the same arms.
constexpr uint64_t kValSeedOffset = 0x5eed;

}  // namespace

std::vector<int64_t> mlp_sizes(const ResolvedConfig& r) {
  std::vector<int64_t> sizes{data::kSpiralFeatures};
  sizes.insert(sizes.end(), r.mlp_hidden.begin(), r.mlp_hidden.end());
  sizes.push_back(r.config.data.classes);
  return sizes;
}

ClassificationTask::ClassificationTask(const ResolvedConfig& config)
    : config_(config.config), sizes_(mlp_sizes(config)) {
  const TrainConfig& c = config_;
  MT_CHECK(config.choice.data == DataKind::spirals, "a classification task needs a labelled set");
  const auto seed = static_cast<uint64_t>(c.data.seed);
  train_ = std::make_shared<data::ClassificationSet>(
      data::make_spirals(c.data.samples, c.data.classes, seed));
  val_ = std::make_shared<data::ClassificationSet>(
      data::make_spirals(std::max<int64_t>(c.data.classes, c.data.samples / 8), c.data.classes,
                         seed + kValSeedOffset));
}

std::unique_ptr<data::BatchSource> ClassificationTask::train_batches(int replicas, int replica,
                                                                     int64_t batch_size) const {
  const data::SamplerOptions so = training_order(config_, replicas, replica);
  return std::make_unique<data::ClassificationBatches>(train_, so, batch_size);
}

std::vector<std::pair<Tensor, Tensor>> ClassificationTask::eval_batches() const {
  const int64_t batch_size = config_.data.batch_size;
  const int64_t batches = eval_batch_count(config_, val_->size());
  std::vector<std::pair<Tensor, Tensor>> out;
  for (int64_t i = 0; i < batches; ++i)
    out.push_back(val_->slice(i * batch_size, std::min(val_->size(), (i + 1) * batch_size)));
  return out;
}

ThroughputUnit ClassificationTask::unit() const {
  double flops = 0;  // forward and backward: 6 per weight
  for (size_t i = 0; i + 1 < sizes_.size(); ++i)
    flops += 6.0 * static_cast<double>(sizes_[i] * sizes_[i + 1]);
  return {.name = "samples", .rate = "samples/s", .per_sample = 1, .flops_per_unit = flops};
}

std::string ClassificationTask::describe(int64_t parameters) const {
  std::string widths = std::to_string(sizes_.front());
  for (size_t i = 1; i < sizes_.size(); ++i) {
    widths += '-';
    widths += std::to_string(sizes_[i]);
  }
  return "MLP classifier " + std::to_string(parameters) + " parameters, widths " + widths + "; " +
         std::to_string(train_->size()) + " training samples (" +
         std::to_string(config_.data.classes) + " spiral arms)";
}

std::string ClassificationTask::sample(parallel::TrainEngine& engine) const {
  const auto& model = dynamic_cast<const nn::MLPClassifier&>(engine.model());
  const auto [x, y] = val_->slice(0, val_->size());
  const std::vector<int32_t> predicted = model.predict(x);
  int64_t right = 0;
  for (size_t i = 0; i < predicted.size(); ++i) right += predicted[i] == val_->labels()[i];
  char line[160];
  std::snprintf(line, sizeof line, "validation accuracy %.1f%% (%lld samples, %lld classes)",
                100.0 * static_cast<double>(right) / static_cast<double>(val_->size()),
                static_cast<long long>(val_->size()), static_cast<long long>(config_.data.classes));
  return line;
}

}  // namespace meshtrain::runtime
