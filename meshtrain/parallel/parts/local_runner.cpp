#include "meshtrain/parallel/parts/local_runner.h"

#include <optional>
#include <set>
#include <string>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/grad_mode.h"

namespace meshtrain::parallel {

LocalRunner::LocalRunner(std::shared_ptr<TrainModel> model, comm::ProcessGroupPtr replicas,
                         Device device, bool broadcast_buffers,
                         std::optional<comm::ProcessGroupPtr> expert_copies)
    : model_(std::move(model)) {
  std::set<std::string> experts;
  if (expert_copies)
    for (const nn::ParamInfo& info : model_->module().param_infos())
      if (info.expert) experts.insert(info.name);
  if (replicas) {
    replica_ = replicas->rank();
    replicas_ = replicas->size();
    // Every replica starts from rank 0's parameters and buffers; each expert from its first copy.
    // Replicas that never meet (asynchronous parameter-server workers) start from the same keyed
    // initial values and take the servers' parameters with their first reply.
    for (auto& [name, t] : model_->module().state_dict()) {
      if (replicas->detached()) break;
      const comm::ProcessGroupPtr& from = experts.count(name) ? *expert_copies : replicas;
      if (from) from->broadcast(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype())->wait();
    }
  }
  model_->set_replicas(replicas);
  // Built on the host (the same initialisation everywhere), then moved as a whole.
  model_->module().to(device);
  params_ = model_->module().named_parameters();
  buffers_ = model_->module().named_buffers();
  // Host buffers only: the group is the host one (device buffers would need the device group).
  if (broadcast_buffers && replicas && replicas->size() > 1 && !buffers_.empty() && device.is_cpu())
    broadcast_group_ = replicas;
  infos_ = model_->module().param_infos();
}

float LocalRunner::run(const std::vector<Batch>& micro_batches, const RunOptions& o,
                       GradSync& grads, ParamSync& params) {
  obs::PhaseClock local_phases;
  obs::PhaseClock& phases = o.phases ? *o.phases : local_phases;
  const int64_t accum = static_cast<int64_t>(micro_batches.size());
  if (broadcast_group_)
    for (auto& [name, t] : buffers_)
      broadcast_group_->broadcast(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype())->wait();
  // Each micro-batch's loss stays where it was computed until the last one is done: the host
  // reads them all at once (one wait for a device), not one a micro-batch.
  Tensor losses;
  // The parameters stay as they are until the update (unless each forward gathers its own, as
  // ZeRO-3's): the micro-batches share one half copy of each weight. (With one micro-batch the
  // copies would only live longer: each goes once its node's backward has run.)
  std::optional<autograd::WeightCastCache> weight_copies;
  if (accum > 1 && o.precision != DType::f32 && params.whole_at_rest()) weight_copies.emplace();
  for (int64_t a = 0; a < accum; ++a) {
    const bool last = a == accum - 1;
    phases.end(obs::Phase::kData);
    grads.before_backward(last);
    params.gather();
    Tensor loss;
    const float loss_grad = o.loss_scale / static_cast<float>(accum);
    model_->set_loss_grad(loss_grad);
    {
      autograd::AutocastGuard autocast(o.precision);
      // Every tp rank of a replica takes the same masks.
      loss = model_->loss(micro_batches[static_cast<size_t>(a)],
                          o.seed_base + static_cast<uint64_t>(a * replicas_ + replica_));
    }
    phases.end(obs::Phase::kForward);
    autograd::backward(loss, Tensor::scalar(loss_grad));
    phases.end(obs::Phase::kBackward);
    grads.after_backward(last);
    if (!last) params.release();
    phases.end(obs::Phase::kComm);
    if (!losses.defined()) losses = Tensor::empty({accum}, DType::f32, loss.device());
    losses.slice(a, a + 1).copy_(loss.detach().view({1}));
  }
  if (o.device_losses && !losses.device().is_cpu()) {
    *o.device_losses = losses;
    return 0;
  }
  // cpu::step_gate's arithmetic, which takes the mean where the losses are left on the device.
  float loss_v = 0;
  for (const float l : losses.to_vector()) loss_v += l / static_cast<float>(accum);
  return loss_v;
}

float LocalRunner::evaluate(const std::vector<Batch>& batches, DType precision, ParamSync& params,
                            double* accuracy) {
  autograd::NoGradGuard no_grad;
  autograd::AutocastGuard autocast(precision);
  model_->module().train(false);
  double total = 0;
  int64_t right = 0, samples = 0;
  for (const Batch& b : batches) {
    params.gather();
    int64_t correct = -1;
    total += model_->evaluate(b, correct).item();
    params.release();
    right = correct < 0 || right < 0 ? -1 : right + correct;
    samples += b.targets.size(0);
  }
  model_->module().train(true);
  if (accuracy)
    *accuracy = right < 0 || samples == 0
                    ? -1.0
                    : static_cast<double>(right) / static_cast<double>(samples);
  return static_cast<float>(total / static_cast<double>(std::max<size_t>(1, batches.size())));
}

int64_t LocalRunner::num_parameters() const {
  int64_t n = 0;
  for (const nn::ParamInfo& info : infos_) n += shape_numel(info.shape);
  return n;
}

std::shared_ptr<TrainModel> LocalRunner::whole_model() const {
  // A tensor-parallel part is not the whole model.
  for (const nn::ParamInfo& info : infos_)
    if (info.init.shard.defined()) return nullptr;
  return model_;
}

std::string LocalRunner::describe() const {
  const std::string split = model_->describe();
  if (split.empty()) return "";
  return split + " x " + std::to_string(replicas_) + " data-parallel replicas";
}

}  // namespace meshtrain::parallel
