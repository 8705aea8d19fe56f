// The image-classification task: a ResNet over Fashion-MNIST (data.kind = fashion_mnist, the IDX
// files of data.image_dir). Training batches are normalised, randomly cropped and flipped images
// in the sampler's order (data/image_batches.h); evaluation reads the test split in order,
// without augmentation. Throughput is counted in images, and a run ends with the whole model's
// top-1 accuracy on the whole test split.
#pragma once

#include <memory>
#include <string>

#include "meshtrain/data/image_set.h"
#include "meshtrain/runtime/resolved_config.h"
#include "meshtrain/runtime/task.h"

namespace meshtrain::runtime {

class ImageClassificationTask : public Task {
 public:
  // Reads both splits (IoError naming a missing or malformed file).
  explicit ImageClassificationTask(const ResolvedConfig& config);

  std::unique_ptr<data::BatchSource> train_batches(int replicas, int replica,
                                                   int64_t batch_size) const override;
  std::vector<std::pair<Tensor, Tensor>> eval_batches() const override;
  ThroughputUnit unit() const override;
  std::string describe(int64_t parameters) const override;
  bool prints_sample() const override { return true; }
  // "test accuracy 91.3% (10000 images)".
  std::string sample(parallel::TrainEngine& engine) const override;

  const data::ImageSet& train_set() const { return *train_; }
  const data::ImageSet& test_set() const { return *test_; }

 private:
  TrainConfig config_;
  std::shared_ptr<const data::ImageSet> train_;
  std::shared_ptr<const data::ImageSet> test_;
};

}  // namespace meshtrain::runtime
