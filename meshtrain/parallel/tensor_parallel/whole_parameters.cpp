#include "meshtrain/parallel/tensor_parallel/whole_parameters.h"

#include <vector>

#include "meshtrain/optim/grad_clip.h"

namespace meshtrain::parallel::tp {

Tensor whole_tensor(const TpContext& tp, const Tensor& param, const nn::ParamInfo& info) {
  const Tensor local = param.to(Device::cpu()).clone();
  const nn::TensorShard& shard = info.init.shard;
  if (!shard.defined()) return local;
  Tensor whole = Tensor::zeros(shard.full);
  if (tp.size() == 1) {
    shard.put(local, whole);
    return whole;
  }
  Tensor parts = Tensor::empty({tp.size() * local.numel()});
  comm::AllGatherOptions opts;
  opts.async_op = false;
  tp.group
      ->all_gather(local.data_ptr(), parts.data_ptr(), static_cast<size_t>(local.numel()),
                   DType::f32, opts)
      ->wait();
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

double grad_norm_squared(const TpGPT& model) {
  const nn::NamedTensors params = model.named_parameters();
  const std::vector<nn::ParamInfo> infos = model.param_infos();
  nn::NamedTensors sharded, replicated;
  for (size_t i = 0; i < params.size(); ++i)
    (infos[i].init.shard.defined() ? sharded : replicated).push_back(params[i]);
  const double mine = optim::grad_norm_squared(sharded);
  double shards = mine;
  if (model.tp().size() > 1) {
    // Doubles travel as their bits and are added in rank order, so every rank gets the same sum.
    std::vector<double> each(static_cast<size_t>(model.tp().size()));
    comm::AllGatherOptions opts;
    opts.async_op = false;
    model.tp().group->all_gather(&mine, each.data(), 1, DType::i64, opts)->wait();
    shards = 0;
    for (double v : each) shards += v;
  }
  return shards + optim::grad_norm_squared(replicated);
}

}  // namespace meshtrain::parallel::tp
