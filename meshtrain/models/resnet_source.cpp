#include "meshtrain/models/resnet_source.h"

#include "meshtrain/parallel/sync_batch_norm.h"
#include "meshtrain/util/error.h"

namespace meshtrain::models {

void ResNetModel::set_replicas(const comm::ProcessGroupPtr& replicas) {
  if (!sync_batch_norm_) return;
  const auto sync = std::make_shared<parallel::SyncBatchNorm>(replicas);
  for (const auto& [name, bn] : net_->batch_norms()) bn->set_sync(sync, name);
}

std::unique_ptr<StageModule> ResNetStack::build(size_t /*begin*/, size_t /*end*/) const {
  MT_THROW(ValueError, "a pipeline of the ResNet is not available yet; use parallel.pp = 1");
}

namespace {

int64_t count(const std::vector<nn::ParamInfo>& infos) {
  int64_t n = 0;
  for (const nn::ParamInfo& info : infos) n += shape_numel(info.shape);
  return n;
}

}  // namespace

ResNetSource::ResNetSource(nn::ResNetConfig config, bool sync_batch_norm)
    : config_(std::move(config)),
      sync_batch_norm_(sync_batch_norm),
      infos_(nn::ResNet(config_).param_infos()),
      params_(count(infos_)),
      stack_(params_) {}

std::shared_ptr<parallel::TrainModel> ResNetSource::build(const parallel::tp::TpContext& tp) const {
  if (tp.size() > 1)
    MT_THROW(ValueError, "the ResNet is not split over tensor-parallel ranks; use parallel.tp = 1");
  return std::make_shared<ResNetModel>(std::make_shared<nn::ResNet>(config_), sync_batch_norm_);
}

std::unique_ptr<StageModule> ResNetSource::build_stage(
    size_t begin, size_t end, const parallel::tp::TpContext& /*tp*/) const {
  return stack_.build(begin, end);
}

}  // namespace meshtrain::models
