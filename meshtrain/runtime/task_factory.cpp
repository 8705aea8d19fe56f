#include "meshtrain/runtime/task_factory.h"

#include "meshtrain/data/image_set.h"
#include "meshtrain/models/gpt_source.h"
#include "meshtrain/models/mlp_source.h"
#include "meshtrain/models/resnet_source.h"
#include "meshtrain/runtime/classification_task.h"
#include "meshtrain/runtime/image_classification_task.h"
#include "meshtrain/runtime/language_model_task.h"

namespace meshtrain::runtime {

std::unique_ptr<Task> make_task(const ResolvedConfig& config) {
  switch (config.choice.model) {
    case ModelKind::mlp:
      return std::make_unique<ClassificationTask>(config);
    case ModelKind::resnet:
      return std::make_unique<ImageClassificationTask>(config);
    case ModelKind::gpt:
      break;
  }
  return std::make_unique<LanguageModelTask>(config);
}

std::shared_ptr<const parallel::ModelSource> make_model_source(const ResolvedConfig& config) {
  switch (config.choice.model) {
    case ModelKind::mlp:
      return std::make_shared<models::MlpSource>(mlp_sizes(config),
                                                 static_cast<uint64_t>(config.config.train.seed));
    case ModelKind::resnet: {
      nn::ResNetConfig rc =
          nn::resnet_config(config.config.model.resnet, 1, data::kFashionMnistClasses);
      rc.seed = static_cast<uint64_t>(config.config.train.seed);
      rc.label_smoothing = static_cast<float>(config.config.train.label_smoothing);
      return std::make_shared<models::ResNetSource>(rc, config.config.model.sync_batch_norm);
    }
    case ModelKind::gpt:
      break;
  }
  return std::make_shared<models::GptSource>(gpt_config(config));
}

}  // namespace meshtrain::runtime
