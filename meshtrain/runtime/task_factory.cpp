#include "meshtrain/runtime/task_factory.h"

#include "meshtrain/models/gpt_source.h"
#include "meshtrain/models/mlp_source.h"
#include "meshtrain/runtime/classification_task.h"
#include "meshtrain/runtime/language_model_task.h"

namespace meshtrain::runtime {

std::unique_ptr<Task> make_task(const ResolvedConfig& config) {
  switch (config.choice.model) {
    case ModelKind::mlp:
      return std::make_unique<ClassificationTask>(config);
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
    case ModelKind::gpt:
      break;
  }
  return std::make_shared<models::GptSource>(gpt_config(config));
}

}  // namespace meshtrain::runtime
