#include "meshtrain/parallel/tensor_parallel/whole_parameters.h"

#include <vector>

namespace meshtrain::parallel::tp {

Tensor whole_tensor(const TpContext& tp, const Tensor& param, const nn::ParamInfo& info) {
  const nn::TensorShard& shard = info.init.shard;
  if (!shard.defined() || tp.size() == 1) {
    const Tensor local = param.to(Device::cpu()).clone();
    if (!shard.defined()) return local;
    Tensor whole = Tensor::zeros(shard.full);
    shard.put(local, whole);
    return whole;
  }
  Tensor whole = Tensor::zeros(shard.full);
  const Tensor local = param.clone();
  Tensor gathered = Tensor::empty({tp.size() * local.numel()}, DType::f32, local.device());
  comm::AllGatherOptions opts;
  opts.async_op = false;
  tp.group
      ->all_gather(local.data_ptr(), gathered.data_ptr(), static_cast<size_t>(local.numel()),
                   DType::f32, opts)
      ->wait();
  const Tensor parts = gathered.to(Device::cpu());
  for (int r = 0; r < tp.size(); ++r) {
    nn::TensorShard of_r = shard;
    of_r.index = r;
    of_r.put(parts.slice(r * local.numel(), (r + 1) * local.numel()).view(local.shape()), whole);
  }
  return whole;
}

nn::NamedTensors whole_parameters(const TpGPT& model) {
  const nn::NamedTensors params = model.named_parameters();
  const std::vector<nn::ParamInfo> infos = model.param_infos();
  nn::NamedTensors out;
  for (size_t i = 0; i < params.size(); ++i)
    out.emplace_back(params[i].first, whole_tensor(model.tp(), params[i].second, infos[i]));
  return out;
}

}  // namespace meshtrain::parallel::tp
