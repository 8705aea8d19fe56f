// The classification task: a classifier over a labelled set (data.kind = spirals: the generated
// spiral arms of data/spirals.h). Its batches are features and labels picked by the same sampler
// as token windows, its throughput is counted in samples, and a run ends with the whole model's
// accuracy on the validation set.
#pragma once

#include <memory>
#include <string>

#include "meshtrain/data/classification_set.h"
#include "meshtrain/runtime/resolved_config.h"
#include "meshtrain/runtime/task.h"

namespace meshtrain::runtime {

// The classifier's layer widths: the set's features, model.mlp_hidden, the set's classes.
std::vector<int64_t> mlp_sizes(const ResolvedConfig& config);

class ClassificationTask : public Task {
 public:
  // Generates the training set (data.samples, from data.seed) and a validation set of 1/8 as
  // many samples from another seed.
  explicit ClassificationTask(const ResolvedConfig& config);

  std::unique_ptr<data::BatchSource> train_batches(int replicas, int replica,
                                                   int64_t batch_size) const override;
  std::vector<std::pair<Tensor, Tensor>> eval_batches() const override;
  ThroughputUnit unit() const override;
  std::string describe(int64_t parameters) const override;
  bool prints_sample() const override { return true; }
  // "validation accuracy 97.3% (512 samples, 3 classes)".
  std::string sample(parallel::TrainEngine& engine) const override;

 private:
  TrainConfig config_;
  std::vector<int64_t> sizes_;
  std::shared_ptr<const data::ClassificationSet> train_;
  std::shared_ptr<const data::ClassificationSet> val_;
};

}  // namespace meshtrain::runtime
