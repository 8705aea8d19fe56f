#include "meshtrain/parallel/engine.h"

#include <chrono>
#include <cmath>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/comm/reduce_op.h"
#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/parallel/step_record.h"
#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"
#include "meshtrain/parallel/tensor_parallel/whole_parameters.h"
#include "meshtrain/parallel/zero/fsdp_units.h"
#include "meshtrain/parallel/zero/zero_shards.h"
#include "meshtrain/util/hash.h"

namespace meshtrain::parallel {

TrainEngine::TrainEngine(std::shared_ptr<nn::GPT> model, comm::ProcessGroupPtr group,
                         comm::ProcessGroupPtr grad_group, Device device, EngineOptions options)
    : model_(std::move(model)), group_(std::move(group)), options_(std::move(options)) {
  init(device, std::move(grad_group));
}

TrainEngine::TrainEngine(std::shared_ptr<tp::TpGPT> model, comm::ProcessGroupPtr group,
                         comm::ProcessGroupPtr tp_group, EngineOptions options)
    : tp_model_(std::move(model)),
      tp_group_(std::move(tp_group)),
      group_(std::move(group)),
      options_(std::move(options)) {
  MT_CHECK(options_.zero_stage == 0 && options_.precision == DType::f32 && !options_.loss_scaler,
           "tensor parallelism runs with ZeRO stage 0 in f32 for now");
  init(Device::cpu(), nullptr);
}

nn::Module& TrainEngine::module() const {
  if (tp_model_) return *tp_model_;
  return *model_;
}

Tensor TrainEngine::loss(const Batch& b, uint64_t dropout_seed) const {
  if (tp_model_) return tp_model_->loss(b.inputs, b.targets, dropout_seed);
  return model_->loss(b.inputs, b.targets, dropout_seed);
}

nn::GPT& TrainEngine::model() {
  MT_CHECK(model_ != nullptr,
           "under pipeline or tensor parallelism no rank holds the whole model until "
           "consolidate()");
  return *model_;
}

const nn::GPT& TrainEngine::model() const {
  MT_CHECK(model_ != nullptr,
           "under pipeline or tensor parallelism no rank holds the whole model until "
           "consolidate()");
  return *model_;
}

int64_t TrainEngine::num_parameters() const {
  if (pipe_) return pipe_->num_parameters();
  int64_t n = 0;
  for (const nn::ParamInfo& info : module().param_infos()) n += shape_numel(info.shape);
  return n;
}

std::vector<nn::ParamInfo> TrainEngine::local_param_infos() const {
  if (pipe_) return pipe_->param_infos();
  return module().param_infos();
}

void TrainEngine::init(Device device, comm::ProcessGroupPtr grad_group) {
  MT_CHECK(options_.zero_stage >= 0 && options_.zero_stage <= 3, "ZeRO stage ", options_.zero_stage,
           " does not exist (0, 1, 2 and 3 do)");
  if (group_) {
    rank_ = group_->rank();
    world_ = group_->size();
    // Every replica starts from rank 0's parameters and buffers.
    for (auto& [name, t] : module().state_dict())
      group_->broadcast(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype())->wait();
  }
  // Built on the host (the same initialisation everywhere), then moved as a whole.
  module().to(device);
  params_ = module().named_parameters();
  {
    std::vector<std::string> names;
    for (const auto& [name, p] : params_) names.push_back(name);
    layers_ = LayerGroups(names);
  }
  const bool zero = options_.zero_stage > 0 && group_ != nullptr;
  const bool fsdp = options_.zero_stage == 3 && group_ != nullptr;
  if (fsdp) MT_CHECK(device.is_cpu(), "ZeRO runs on the CPU; the model is on ", device.str());
  if (group_ && !fsdp) {
    ReducerOptions ro = options_.reducer;
    if (zero) {
      MT_CHECK(device.is_cpu(), "ZeRO runs on the CPU; the model is on ", device.str());
      ro = ZeroShards::reducer_options(ro, options_.zero_stage, world_);
    }
    reducer_ = std::make_unique<Reducer>(params_, grad_group ? grad_group : group_, ro);
  }
  auto factory = [this](std::vector<optim::ParamGroup> g) { return make_optimizer(std::move(g)); };
  if (fsdp) {
    fsdp_ = std::make_unique<FsdpUnits>(*model_, group_, options_.fsdp_unit_per_block, factory,
                                        options_.weight_decay);
  } else if (zero) {
    zero_ = std::make_unique<ZeroShards>(params_, *reducer_, group_, options_.zero_stage, factory,
                                         options_.weight_decay);
  } else {
    optimizer_ = make_optimizer(optim::decay_groups(params_, options_.weight_decay));
  }
  if (options_.loss_scaler) scaler_ = std::make_unique<optim::LossScaler>(*options_.loss_scaler);
}

TrainEngine::~TrainEngine() = default;

std::unique_ptr<optim::Optimizer> TrainEngine::make_optimizer(
    std::vector<optim::ParamGroup> groups) const {
  if (options_.optimizer == optim::OptimizerKind::adamw)
    return std::make_unique<optim::AdamW>(std::move(groups), options_.adamw);
  return std::make_unique<optim::Sgd>(std::move(groups), options_.sgd);
}

void TrainEngine::zero_grad() {
  if (optimizer_) {
    optimizer_->zero_grad();
    return;
  }
  for (auto& [name, p] : params_)
    if (p.grad().defined()) p.set_grad(Tensor());
}

StepOutcome TrainEngine::train_step(const std::vector<Batch>& micro_batches,
                                    const StepOptions& so) {
  MT_CHECK(!micro_batches.empty(), "a training step needs at least one micro-batch");
  if (pipe_) return pipeline_step(micro_batches, so);
  const auto t0 = std::chrono::steady_clock::now();
  obs::PhaseClock local_phases;
  obs::PhaseClock& phases = so.phases ? *so.phases : local_phases;
  StepOutcome out;
  if (zero_)
    zero_->optimizer().set_lr(so.lr);
  else if (fsdp_)
    fsdp_->optimizer().set_lr(so.lr);
  else
    optimizer_->set_lr(so.lr);
  zero_grad();
  const int64_t accum = static_cast<int64_t>(micro_batches.size());
  const uint64_t seed_base = (options_.seed * 1000003ull + static_cast<uint64_t>(so.step)) * 64;
  float loss_v = 0;
  for (int64_t a = 0; a < accum; ++a) {
    const Batch& mb = micro_batches[static_cast<size_t>(a)];
    phases.end(obs::Phase::kData);
    if (reducer_) {
      reducer_->set_require_sync(a == accum - 1);
      reducer_->prepare_for_backward();
    }
    if (fsdp_) {
      fsdp_->set_require_sync(a == accum - 1);
      fsdp_->prepare_for_backward();
      fsdp_->begin_forward();
    }
    Tensor loss;
    {
      autograd::AutocastGuard autocast(options_.precision);
      // Every tp rank of a replica takes the same masks (rank_ is the dp rank).
      loss = this->loss(mb, seed_base + static_cast<uint64_t>(a * world_ + rank_));
    }
    phases.end(obs::Phase::kForward);
    // f16: the loss is scaled up so that small gradients survive f16 (loss_scaler.h).
    const float root =
        scaler_ ? scaler_->scale() / static_cast<float>(accum) : 1.0f / static_cast<float>(accum);
    autograd::backward(loss, Tensor::scalar(root));
    phases.end(obs::Phase::kBackward);
    // The last micro-batch's buckets are waited for below, behind the step's all-gather.
    if (reducer_) reducer_->launch_remaining();
    if (fsdp_ && a < accum - 1) {
      fsdp_->finalize_backward();
      fsdp_->end_forward_and_backward();
    }
    phases.end(obs::Phase::kComm);
    loss_v += loss.item() / static_cast<float>(accum);
  }
  if (so.poison_loss) loss_v = std::nanf("");
  loss_v *= so.scale_loss;
  out.stop = so.stop_request;
  out.save = so.save_request;
  // The step's record (step_record.h) is queued right behind the gradient buckets, so the
  // exposed communication of a step is one wait, not two round trips.
  const StepRecord record(
      loss_v, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
      so.stop_request, so.save_request);
  std::vector<float> all(StepRecord::kFloats * static_cast<size_t>(world_));
  comm::WorkPtr gathered;
  if (group_)
    gathered =
        group_->all_gather(record.mine.data(), all.data(), StepRecord::kFloats, DType::f32, {});
  try {
    if (reducer_) reducer_->finalize_backward();  // exposed: what overlap did not hide
    if (fsdp_) {
      fsdp_->finalize_backward();
      fsdp_->end_forward_and_backward();
    }
  } catch (...) {
    // The all-gather writes into `all` on the group's thread: it must end before `all` does
    // (a failed group fails it promptly).
    if (gathered) {
      try {
        gathered->wait();
      } catch (const Error&) {
      }
    }
    throw;
  }
  if (gathered) {
    gathered->wait();
    loss_v = StepRecord::combine(all, world_, out);
  }
  if (tp_model_) {
    // Sequence parallelism left each replicated parameter's gradient in parts over tp; and a
    // stop asked of one rank stops its tp peers too, whose dp groups did not hear of it.
    tp_model_->reduce_sequence_parallel_grads();
    if (tp_group_ && tp_group_->size() > 1) {
      float flag = out.stop ? 1.0f : 0.0f;
      comm::AllReduceOptions ro;
      ro.op = comm::ReduceOp::max;
      ro.async_op = false;
      tp_group_->all_reduce(&flag, 1, DType::f32, ro)->wait();
      out.stop = flag > 0.0f;
    }
  }
  phases.end(obs::Phase::kComm);

  // Unscaled after the reduction: every rank holds the same gradients (or its shard of them), so
  // every rank takes the same skip decision.
  out.loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  double norm = 0;
  if ((zero_ && options_.zero_stage >= 2) || fsdp_) {
    ShardedOptimizer& opt = fsdp_ ? fsdp_->optimizer() : zero_->optimizer();
    const bool overflow = scaler_ && opt.unscale(*scaler_);
    // One all-gather carries every shard's sum of squares (double, as its bits), overflow flag
    // and, with layer_norms, its sums per layer; each rank adds them up in rank order, so all
    // get the same norms.
    const size_t n = 2 + (so.layer_norms ? layers_.size() : 0);
    std::vector<double> local(n, 0.0);
    local[0] = opt.local_grad_norm_squared();
    local[1] = overflow ? 1.0 : 0.0;
    if (so.layer_norms)
      for (const auto& [name, sq] : opt.local_grad_squares_by_param())
        local[2 + layers_.index_of(name)] += sq;
    std::vector<double> each(n * static_cast<size_t>(world_));
    group_->all_gather(local.data(), each.data(), n, DType::i64)->wait();
    double total = 0;
    std::vector<double> layer_sq(n - 2, 0.0);
    for (int r = 0; r < world_; ++r) {
      const double* e = each.data() + n * static_cast<size_t>(r);
      total += e[0];
      out.overflow = out.overflow || e[1] > 0;
      for (size_t l = 0; l + 2 < n; ++l) layer_sq[l] += e[2 + l];
    }
    norm = std::sqrt(total);
    if (so.layer_norms) out.layer_grad_norms = layers_.norms(layer_sq);
  } else {
    out.overflow = scaler_ && scaler_->unscale(params_);
    norm = std::sqrt(tp_model_ ? tp::grad_norm_squared(*tp_model_)
                               : optim::grad_norm_squared(params_));
    // With tensor parallelism a rank holds slices: layer norms are refused by the config.
    if (so.layer_norms && !tp_model_)
      out.layer_grad_norms = layers_.norms(layers_.grad_squares(params_));
  }
  return finish_step(std::move(out), loss_v, norm, so, phases);
}

// The end of every step, whichever path computed the loss and the norm: every rank holds the
// same loss and norm bits here, so every rank takes the same skip decision.
StepOutcome TrainEngine::finish_step(StepOutcome out, float loss_v, double norm,
                                     const StepOptions& so, obs::PhaseClock& phases) {
  out.grad_norm = norm;
  if (so.before_update) so.before_update();
  if (!std::isfinite(loss_v) || out.overflow || !std::isfinite(norm)) {
    out.skipped = true;
  } else if (so.skip_update && so.skip_update(loss_v, norm)) {
    out.skipped = true;
    out.spike = true;
  } else if (fsdp_) {
    // The shards are the parameters at rest: the next forward gathers the updated values.
    if (so.grad_clip > 0) fsdp_->optimizer().clip(norm, so.grad_clip);
    fsdp_->optimizer().step();
  } else if (zero_) {
    if (so.grad_clip > 0) zero_->optimizer().clip(norm, so.grad_clip);
    zero_->step();
  } else {
    // Pipeline stages: the tied copies are scaled alike and updated alike, so they stay the
    // same bits.
    if (so.grad_clip > 0) optim::clip_grad_norm_with_total(params_, norm, so.grad_clip);
    optimizer_->step();
  }
  if (scaler_) scaler_->update(out.overflow);
  out.loss = loss_v;
  phases.end(obs::Phase::kOptimizer);
  return out;
}

float TrainEngine::evaluate(const std::vector<Batch>& batches) {
  if (pipe_) return pipe_->evaluate(batches, options_.precision);
  autograd::NoGradGuard no_grad;
  autograd::AutocastGuard autocast(options_.precision);
  module().train(false);
  double total = 0;
  for (const Batch& b : batches) {
    if (fsdp_) fsdp_->begin_forward();
    total += loss(b, 0).item();
    if (fsdp_) fsdp_->end_forward_and_backward();
  }
  module().train(true);
  return static_cast<float>(total / static_cast<double>(std::max<size_t>(1, batches.size())));
}

void TrainEngine::check_in_sync(int64_t step) {
  if (pipe_) {
    pipe_->check_in_sync(step);
    return;
  }
  // ZeRO-3 ranks hold different shards by design: there are no replicas to compare.
  if (!group_ || fsdp_) return;
  // Per-tensor content hashes (device tensors through a host copy). Under ZeRO-1/2 the
  // parameters are whole again after every step's all-gather, so they are compared as DDP's.
  std::vector<uint64_t> mine;
  for (const auto& [name, p] : params_) {
    const Tensor host = p.to(Device::cpu());
    mine.push_back(xxh3_64(host.data_ptr(), host.nbytes()));
  }
  const size_t n = mine.size();
  std::vector<uint64_t> all(n * static_cast<size_t>(world_));
  group_->all_gather(mine.data(), all.data(), n, DType::i64)->wait();
  for (int r = 1; r < world_; ++r) {
    for (size_t i = 0; i < n; ++i) {
      if (all[static_cast<size_t>(r) * n + i] != all[i])
        MT_THROW(Error, "step ", step, ": parameters diverged between rank 0 and rank ", r,
                 ", first differing tensor '", params_[i].first,
                 "'; data-parallel replicas must stay identical");
    }
  }
}

nn::NamedTensors TrainEngine::gather_parameters() const {
  if (pipe_) return pipe_->gather_parameters();
  if (fsdp_) return fsdp_->gather_parameters();
  if (tp_model_) return tp::whole_parameters(*tp_model_);
  nn::NamedTensors out;
  for (const auto& [name, p] : params_) out.emplace_back(name, p.to(Device::cpu()).clone());
  return out;
}

std::string TrainEngine::describe() const {
  if (pipe_)
    return pipe_->describe() +
           (zero_ ? ", ZeRO-" + std::to_string(options_.zero_stage) + " over each stage's " +
                        std::to_string(group_->size()) + " replicas"
                  : "");
  if (tp_model_)
    return "tensor parallelism over " + std::to_string(tp_model_->tp().size()) + " ranks" +
           (tp_model_->tp().sequence_parallel ? " with sequence parallelism" : "") + " x " +
           std::to_string(world_) + " data-parallel replicas";
  if (!zero_ && !fsdp_) return "";
  return "ZeRO-" + std::to_string(options_.zero_stage) + " over " + std::to_string(world_) +
         " ranks";
}

size_t TrainEngine::in_flight_bytes() const {
  if (fsdp_) return fsdp_->buffer_bytes();
  return reducer_ ? reducer_->pool_bytes() : 0;
}

void TrainEngine::consolidate(int root) {
  if (pipe_) {
    consolidate_pipeline(root);
    return;
  }
  if (fsdp_) fsdp_->consolidate(root);
  if (tp_model_ && !model_) {
    // Every tp rank takes part in the gathers; the whole model is built where it is wanted
    // (root: the rank that is first of its dp and tp groups).
    const nn::NamedTensors whole = tp::whole_parameters(*tp_model_);
    const bool here = root == -1 || (rank_ == root && (!tp_group_ || tp_group_->rank() == 0));
    if (!here) return;
    model_ = std::make_shared<nn::GPT>(tp_model_->config());
    model_->load_state_dict(std::map<std::string, Tensor>(whole.begin(), whole.end()));
  }
}

}  // namespace meshtrain::parallel
