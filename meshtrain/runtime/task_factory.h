// The task and the model of a run, chosen once from model.kind: the language model's token
// shards and GPT, or the classifier's labelled set and MLP.
#pragma once

#include <memory>

#include "meshtrain/parallel/model_source.h"
#include "meshtrain/runtime/resolved_config.h"
#include "meshtrain/runtime/task.h"

namespace meshtrain::runtime {

// Opens (or generates) the data; IoError naming a missing or truncated shard.
std::unique_ptr<Task> make_task(const ResolvedConfig& config);

// The model the engine trains, from [model] (and, for a classifier, the set's features and
// classes).
std::shared_ptr<const parallel::ModelSource> make_model_source(const ResolvedConfig& config);

}  // namespace meshtrain::runtime
