#include "meshtrain/parallel/tensor_parallel/whole_parameters.h"

#include <vector>

#include "meshtrain/optim/grad_clip.h"

namespace meshtrain::parallel::tp {

nn::NamedTensors whole_parameters(const TpGPT& model) {
  const TpContext& tp = model.tp();
  const nn::NamedTensors params = model.named_parameters();
  const std::vector<nn::ParamInfo> infos = model.param_infos();
  nn::NamedTensors out;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor local = params[i].second.to(Device::cpu()).clone();
    const nn::TensorShard& shard = infos[i].init.shard;
    if (!shard.defined() || tp.size() == 1) {
      out.emplace_back(params[i].first, shard.defined() ? [&] {
        Tensor whole = Tensor::zeros(shard.full);
        shard.put(local, whole);
        return whole;
      }()
                                                        : local);
      continue;
    }
    Tensor parts = Tensor::empty({tp.size() * local.numel()});
    comm::AllGatherOptions opts;
    opts.async_op = false;
    tp.group
        ->all_gather(local.data_ptr(), parts.data_ptr(), static_cast<size_t>(local.numel()),
                     DType::f32, opts)
        ->wait();
    Tensor whole = Tensor::zeros(shard.full);
    for (int r = 0; r < tp.size(); ++r) {
      nn::TensorShard of_r = shard;
      of_r.index = r;
      of_r.put(parts.slice(r * local.numel(), (r + 1) * local.numel()).view(local.shape()), whole);
    }
    out.emplace_back(params[i].first, whole);
  }
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
