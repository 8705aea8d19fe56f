#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"

namespace meshtrain::parallel::tp {

TpGPT::TpGPT(const nn::GPTConfig& config, const TpContext& tp)
    : TpGPT(config, tp, 0, static_cast<size_t>(config.n_layer) + 2) {}

TpGPT::TpGPT(const nn::GPTConfig& config, const TpContext& tp, size_t begin, size_t end)
    : nn::GPT(config, gpt_layers(config, tp), begin, end), tp_(tp) {}

void reduce_sequence_parallel_grads(const TpContext& tp, const nn::NamedTensors& params,
                                    const std::vector<nn::ParamInfo>& infos) {
  if (!tp.sequence_parallel || tp.size() == 1) return;
  MT_CHECK(params.size() == infos.size(), "one ParamInfo per parameter");
  std::vector<Tensor> grads;
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (infos[i].placement("tp").kind != nn::Placement::Kind::replicate) continue;
    Tensor g = params[i].second.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    total += g.numel();
  }
  if (total == 0) return;
  // Where the gradients are: the group is that memory's (a device's through the device group).
  Tensor flat = Tensor::empty({total}, DType::f32, grads.front().device());
  int64_t at = 0;
  for (const Tensor& g : grads) {
    flat.slice(at, at + g.numel()).copy_(g.view({g.numel()}));
    at += g.numel();
  }
  comm::AllReduceOptions opts;
  opts.async_op = false;
  tp.group->all_reduce(flat.data_ptr(), static_cast<size_t>(total), DType::f32, opts)->wait();
  at = 0;
  for (Tensor g : grads) {
    g.copy_(flat.slice(at, at + g.numel()).view(g.shape()));
    at += g.numel();
  }
}

void TpGPT::reduce_sequence_parallel_grads() const {
  tp::reduce_sequence_parallel_grads(tp_, named_parameters(), param_infos());
}

}  // namespace meshtrain::parallel::tp
