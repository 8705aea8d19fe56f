#include "meshtrain/models/gpt_source.h"

#include <set>

#include "meshtrain/parallel/tensor_parallel/tp_gpt_stage.h"
#include "meshtrain/parallel/tensor_parallel/whole_parameters.h"

namespace meshtrain::models {

void GptModel::set_layer_hooks(parallel::LayerHooks hooks) {
  gpt_->set_block_hooks(nn::GPT::BlockHooks{std::move(hooks.before), std::move(hooks.after)});
}

nn::NamedTensors TpGptModel::whole_parameters() const {
  return parallel::tp::whole_parameters(*gpt_);
}

std::string TpGptModel::describe() const {
  return "tensor parallelism over " + std::to_string(gpt_->tp().size()) + " ranks" +
         (gpt_->tp().sequence_parallel ? " with sequence parallelism" : "");
}

GptSource::GptSource(const nn::GPTConfig& config) : config_(config), stack_(config) {}

std::shared_ptr<parallel::TrainModel> GptSource::build(const parallel::tp::TpContext& tp) const {
  if (tp.size() > 1)
    return std::make_shared<TpGptModel>(std::make_shared<parallel::tp::TpGPT>(config_, tp));
  return std::make_shared<GptModel>(std::make_shared<nn::GPT>(config_, tp.experts));
}

std::unique_ptr<StageModule> GptSource::build_stage(size_t begin, size_t end,
                                                    const parallel::tp::TpContext& tp) const {
  if (tp.size() > 1) return std::make_unique<parallel::tp::TpGPTStage>(config_, tp, begin, end);
  return stack_.build(begin, end);
}

std::vector<nn::ParamInfo> GptSource::param_infos() const {
  // Layer by layer, so that no rank holds the whole model for it (a pipeline stage must not).
  std::call_once(infos_once_, [this] {
    std::set<std::string> seen;
    for (size_t l = 0; l < stack_.layers().size(); ++l)
      for (nn::ParamInfo& info : stack_.build(l, l + 1)->param_infos())
        if (seen.insert(info.name).second) infos_.push_back(std::move(info));
  });
  return infos_;
}

size_t GptSource::layer_of(const std::string& name) const {
  if (name.rfind("wte.", 0) == 0 || name.rfind("wpe.", 0) == 0) return 0;
  if (name.rfind("h.", 0) == 0) return std::stoul(name.substr(2)) + 1;
  return static_cast<size_t>(config_.n_layer) + 1;  // ln_f, lm_head
}

int64_t GptSource::num_parameters() const {
  int64_t n = 0;
  for (const LayerSpec& l : stack_.layers()) n += l.params;
  // The head's count includes its projection even when that is the embedding.
  if (config_.tie_embeddings) n -= config_.vocab_size * config_.n_embd;
  return n;
}

}  // namespace meshtrain::models
