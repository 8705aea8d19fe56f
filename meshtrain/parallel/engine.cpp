#include "meshtrain/parallel/engine.h"

#include <chrono>
#include <cmath>
#include <thread>

#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/optim/step_gate.h"
#include "meshtrain/parallel/expert/gather_experts.h"
#include "meshtrain/parallel/gathered_json.h"
#include "meshtrain/parallel/model_source.h"
#include "meshtrain/parallel/parts/grad_norm.h"
#include "meshtrain/parallel/parts/grad_sync.h"
#include "meshtrain/parallel/parts/param_sync.h"
#include "meshtrain/parallel/parts/step_runner.h"
#include "meshtrain/parallel/step_record.h"
#include "meshtrain/parallel/zero/fsdp_units.h"

namespace meshtrain::parallel {

struct TrainEngine::Norm {
  double norm = 0.0;       // the same on every rank
  double clip_norm = 0.0;  // what this rank's gradients are clipped by
  bool overflow = false;
  std::vector<std::pair<std::string, double>> layers;
};

TrainEngine::TrainEngine(EngineSpec spec, Parts parts)
    : spec_(std::move(spec)), parts_(std::move(parts)) {
  MT_CHECK(parts_.runner && parts_.grads && parts_.params && parts_.update,
           "an engine needs a runner, a gradient sync, a parameter sync and an update");
  dp_ = spec_.mesh.group("dp");
  if (spec_.options.loss_scaler)
    scaler_ = std::make_unique<optim::LossScaler>(*spec_.options.loss_scaler);
  // The norm adds up every rank's sums wherever ranks hold different gradient elements: shards,
  // tp parts, pipeline stages. Elsewhere every rank holds the same whole gradients.
  // Expert parallelism: each block's ranks hold different experts.
  const bool parts_differ = parts_.update->sharded() || spec_.mesh.size("pp") > 1 ||
                            spec_.mesh.size("tp") > 1 || spec_.experts.has_value();
  norm_group_ = parts_differ ? spec_.mesh.world() : nullptr;
  own_gradients_ = dp_ && dp_->size() > 1 && !parts_.grads->reduces_over_replicas();
  MT_CHECK(!own_gradients_ || !parts_differ,
           "replicas that step on their own gradients each hold the whole model: no shards, "
           "pipeline stages or tensor-parallel parts");
  {
    std::vector<std::string> names;
    for (const nn::ParamInfo& info : spec_.model->param_infos()) names.push_back(info.name);
    layers_ = LayerGroups(names);
  }
  const std::vector<nn::ParamInfo>& infos = parts_.runner->param_infos();
  const std::set<std::string> copies = parts_.runner->copy_names();
  const bool first_tp = spec_.mesh.coord("tp") == 0;
  const bool first_dp = spec_.mesh.coord("dp") == 0;
  // An expert's first copy is in the first block of the data-parallel group.
  const bool first_expert_copy = spec_.experts ? spec_.experts->replica == 0 : first_dp;
  for (const nn::ParamInfo& info : infos) {
    const bool split = info.init.shard.defined();
    const bool first = info.expert ? first_expert_copy : first_dp;
    const bool counted = !copies.count(info.name) && (split || first_tp) &&
                         (parts_.update->sharded() || !norm_group_ || first);
    share_.counted.push_back(counted);
    share_.split.push_back(split);
  }
  // An expert-parallel rank holds its share of the experts only.
  if (!spec_.experts) whole_ = parts_.runner->whole_model();
}

TrainEngine::~TrainEngine() = default;

StepOutcome TrainEngine::train_step(const std::vector<Batch>& micro_batches,
                                    const StepOptions& so) {
  MT_CHECK(!micro_batches.empty(), "a training step needs at least one micro-batch");
  const auto t0 = std::chrono::steady_clock::now();
  obs::PhaseClock local_phases;
  obs::PhaseClock& phases = so.phases ? *so.phases : local_phases;
  StepOutcome out;
  parts_.update->set_lr(so.lr);
  parts_.grads->zero_grad(parts_.runner->parameters());
  RunOptions ro;
  ro.seed_base = (spec_.options.seed * 1000003ull + static_cast<uint64_t>(so.step)) * 64;
  ro.precision = spec_.options.precision;
  // f16: the loss is scaled up so that small gradients survive f16 (loss_scaler.h).
  ro.loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  ro.phases = &phases;
  out.loss_scale = ro.loss_scale;
  // Decided on the device where nothing needs the loss or the norm on the host before the update:
  // the host then queues the norm, the decision and the update behind the backward and reads
  // their outcome once, at the end, instead of waiting for the losses and then for the norm.
  DeviceGatedUpdate* gated = gate_on_device(so) ? parts_.update->device_gated() : nullptr;
  Tensor device_losses;
  if (gated) ro.device_losses = &device_losses;
  float loss_v = parts_.runner->run(micro_batches, ro, *parts_.grads, *parts_.params);
  if (!device_losses.defined()) gated = nullptr;
  parts_.grads->reduce_held();
  if (so.poison_loss) loss_v = std::nanf("");
  loss_v *= so.scale_loss;
  out.stop = so.stop_request;
  out.save = so.save_request;
  // The step's record (step_record.h) goes to every rank of the job, queued right behind the
  // gradient buckets, so the exposed communication of a step is one wait, not two round trips.
  // Every rank of a replica carries its replica's loss, so the mean over all ranks is the mean
  // over replicas.
  const comm::ProcessGroupPtr& world = spec_.mesh.world();
  const int world_size = spec_.mesh.size();
  if (so.stall_compute > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(
        so.stall_compute *
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
  const StepRecord record(
      loss_v, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
      so.stop_request, so.save_request);
  std::vector<float> all(StepRecord::kFloats * static_cast<size_t>(world_size));
  comm::WorkPtr gathered;
  std::optional<float> carried;
  if (world && !parts_.grads->carries_records() && !gated)
    gathered =
        world->all_gather(record.mine.data(), all.data(), StepRecord::kFloats, DType::f32, {});
  try {
    if (parts_.grads->carries_records())
      carried = parts_.grads->finish_with_record(record, out);
    else
      parts_.grads->finish();
    parts_.params->release();
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
  if (carried) loss_v = *carried;
  if (gathered) {
    gathered->wait();
    loss_v = StepRecord::combine(all, world_size, out);
  }
  parts_.runner->after_sync();
  std::vector<float> counters = parts_.runner->take_model_counters();
  if (!counters.empty()) {
    if (dp_ && dp_->size() > 1)
      dp_->all_reduce(counters.data(), counters.size(), DType::f32, {})->wait();
    out.model_metrics = parts_.runner->model_metrics(counters);
    parts_.runner->adapt_model(counters);
  }
  phases.end(obs::Phase::kComm);
  if (gated) return finish_gated_step(std::move(out), *gated, device_losses, record, so, phases);

  // Unscaled after the reduction: every rank holds its reduced gradients (or its shard of them),
  // so every rank takes the same skip decision.
  Norm n = step_norm(so);
  out.overflow = n.overflow;
  out.layer_grad_norms = std::move(n.layers);
  return finish_step(std::move(out), loss_v, n.norm, n.clip_norm, so, phases);
}

TrainEngine::Norm TrainEngine::step_norm(const StepOptions& so) {
  const bool overflow = scaler_ && parts_.update->unscale(*scaler_);
  NormShare share = share_;
  if (so.layer_norms) share.layers = &layers_;
  const GlobalNorm g = global_grad_norm(parts_.update->grad_squares(share), overflow, norm_group_);
  Norm out;
  out.norm = g.norm;
  out.clip_norm = g.norm;
  out.overflow = g.overflow;
  if (own_gradients_) {
    const GlobalNorm agreed = replicas_mean_norm(g, dp_);
    out.norm = agreed.norm;
    out.overflow = agreed.overflow;
  }
  if (so.layer_norms) out.layers = layers_.norms(g.layers);
  return out;
}

// The end of every step: every rank holds the same loss and norm bits here, so every rank takes
// the same skip decision.
StepOutcome TrainEngine::finish_step(StepOutcome out, float loss_v, double norm, double clip_norm,
                                     const StepOptions& so, obs::PhaseClock& phases) {
  out.grad_norm = norm;
  if (so.before_update) so.before_update();
  if (!std::isfinite(loss_v) || out.overflow || !std::isfinite(norm)) {
    out.skipped = true;
  } else if (so.skip_update && so.skip_update(loss_v, norm)) {
    out.skipped = true;
    out.spike = true;
  } else {
    // Clipping scales the gradients where the optimizer reads them (one pass fewer); tied copies
    // are scaled alike and updated alike, so they stay the same bits.
    parts_.update->step(so.grad_clip > 0 ? optim::clip_coefficient(clip_norm, so.grad_clip) : 1.0f);
    parts_.params->after_update();
  }
  if (scaler_) scaler_->update(out.overflow);
  out.loss = loss_v;
  phases.end(obs::Phase::kOptimizer);
  return out;
}

bool TrainEngine::gate_on_device(const StepOptions& so) const {
  // What must be known on the host before the update keeps the decision there: a spike check,
  // per-layer norms, injected faults, other ranks' records or sums of squares.
  return !spec_.device.is_cpu() && !so.skip_update && !so.layer_norms && !so.poison_loss &&
         so.scale_loss == 1.0f && spec_.mesh.size() <= 1 && !norm_group_ && !own_gradients_ &&
         !parts_.grads->carries_records();
}

StepOutcome TrainEngine::finish_gated_step(StepOutcome out, DeviceGatedUpdate& gated,
                                           const Tensor& losses, const StepRecord& record,
                                           const StepOptions& so, obs::PhaseClock& phases) {
  const optim::DeviceSquares pre =
      scaler_ ? gated.unscale_on_device(*scaler_) : optim::DeviceSquares{};
  const Tensor gate =
      optim::gate_step(losses, pre, gated.grad_squares_on_device(share_), so.grad_clip);
  if (so.before_update) so.before_update();
  gated.step_gated(gate);
  // The step's one wait for the device.
  const cpu::StepGate g = optim::read_gate(gate);
  out.grad_norm = g.norm;
  out.overflow = g.overflow != 0;
  out.skipped = g.skip != 0;
  if (out.skipped)
    gated.revert_step();
  else
    parts_.params->after_update();
  if (scaler_) scaler_->update(out.overflow);
  out.loss = g.loss;
  // A group of one: its record as the all-gather would have given it back.
  if (spec_.mesh.world()) {
    StepRecord mine = record;
    mine.mine[0] = g.loss;
    out.loss = StepRecord::combine(std::vector<float>(mine.mine.begin(), mine.mine.end()), 1, out);
  }
  phases.end(obs::Phase::kOptimizer);
  return out;
}

float TrainEngine::evaluate(const std::vector<Batch>& batches, double* accuracy) {
  return parts_.runner->evaluate(batches, spec_.options.precision, *parts_.params, accuracy);
}

void TrainEngine::check_in_sync(int64_t step) {
  // ZeRO-3 ranks hold different shards by design: there are no replicas to compare. Gossip's
  // replicas differ between steps by design (each steps on its own gradients and only averages
  // with its neighbours), so a checksum comparison would fail every run.
  if (!parts_.params->whole_at_rest() || !parts_.params->replicas_equal()) return;
  // Under expert parallelism the copies of a rank's experts (and of everything else) are the
  // ranks at its place in every block.
  parts_.runner->check_in_sync(step, spec_.experts ? spec_.experts->replica_group : dp_);
}

StatePlace TrainEngine::state_place() const {
  StatePlace place;
  place.infos = parts_.runner->param_infos();
  place.copies = parts_.runner->copy_names();
  // Only the first data-parallel replica writes parameter parts; the others hold the same bits.
  // One holder of each replicated tensor writes it: the first tp rank of that replica.
  place.write_parts = spec_.mesh.coord("dp") == 0;
  place.write_replicated = place.write_parts && spec_.mesh.coord("tp") == 0;
  place.write_experts = spec_.experts ? spec_.experts->replica == 0 && spec_.mesh.coord("tp") == 0
                                      : place.write_replicated;
  place.dp_group = dp_;
  return place;
}

nlohmann::json TrainEngine::checkpoint_state(ckpt::RankShards& shards, int /*rank*/) const {
  const StatePlace place = state_place();
  // Buffers are whole on every rank that holds their layer, and the same on its replicas.
  if (place.write_replicated)
    for (const auto& [name, t] : parts_.runner->buffers()) shards.add_replicated("model", name, t);
  nlohmann::json scalars =
      parts_.runner->merge_scalars(parts_.update->add_to_checkpoint(shards, place));
  // The optimizer's scalars of the experts held elsewhere in the block ("step.<name>").
  if (spec_.experts) scalars = merge_json_objects(spec_.experts->block, std::move(scalars));
  return scalars;
}

void TrainEngine::restore(const ckpt::Checkpoint& checkpoint,
                          const nlohmann::json& optimizer_scalars) {
  // Everything is read before anything changes: a checkpoint without this model's buffers
  // leaves the engine as it was.
  std::vector<std::pair<Tensor, Tensor>> buffers;
  for (const auto& [name, t] : parts_.runner->buffers()) {
    if (checkpoint.manifest().find_tensor(name) == nullptr)
      MT_THROW(ValueError, "checkpoint ", checkpoint.dir(), " (step ", checkpoint.step(),
               ") has no buffer '", name, "' for this model");
    Tensor saved = checkpoint.load_global_tensor(name);
    if (saved.shape() != t.shape() || saved.dtype() != t.dtype())
      MT_THROW(ValueError, "checkpoint ", checkpoint.dir(), ": buffer '", name, "' is ",
               shape_str(saved.shape()), ", this model's is ", shape_str(t.shape()));
    buffers.emplace_back(t, std::move(saved));
  }
  parts_.update->restore(checkpoint, optimizer_scalars, state_place());
  for (auto& [live, saved] : buffers) live.copy_(saved);
}

nn::NamedTensors TrainEngine::gather_parameters() const {
  if (auto whole = parts_.params->whole_parameters()) return *whole;
  return parts_.runner->whole_parameters();
}

void TrainEngine::consolidate(int root) {
  // ZeRO-3 gathers its units into the model on `root`; elsewhere the whole model is built there
  // from the gathered parameters, unless every rank holds it already.
  if (parts_.params->gather_into_model(root)) return;
  if (whole_) return;
  nn::NamedTensors whole = parts_.runner->whole_parameters();
  if (spec_.experts) whole = gather_experts(whole, spec_.model->param_infos(), *spec_.experts);
  // Where it is wanted: the first rank of its dp and tp groups, or every rank.
  const bool here = root == -1 || (rank() == root && spec_.mesh.coord("tp") == 0);
  if (!here) return;
  whole_ = spec_.model->build({});
  std::map<std::string, Tensor> state(whole.begin(), whole.end());
  // Buffers (the experts' balancing biases) are the same on every rank that holds them.
  for (const auto& [name, t] : parts_.runner->buffers()) state.emplace(name, t);
  whole_->module().load_state_dict(state);
}

TrainModel& TrainEngine::train_model() {
  MT_CHECK(whole_ != nullptr,
           "under pipeline or tensor parallelism no rank holds the whole model until "
           "consolidate()");
  return *whole_;
}

nn::Module& TrainEngine::model() {
  return train_model().module();
}

const nn::Module& TrainEngine::model() const {
  MT_CHECK(whole_ != nullptr,
           "under pipeline or tensor parallelism no rank holds the whole model until "
           "consolidate()");
  return whole_->module();
}

const nn::NamedTensors& TrainEngine::local_parameters() const {
  return parts_.runner->parameters();
}

std::vector<nn::ParamInfo> TrainEngine::local_param_infos() const {
  return parts_.runner->param_infos();
}

int64_t TrainEngine::num_parameters() const {
  // An expert-parallel rank holds its share of the experts; the model has them all.
  if (spec_.experts) return spec_.model->num_parameters();
  return parts_.runner->num_parameters();
}

int TrainEngine::data_parallel_rank() const {
  return spec_.mesh.coord("dp");
}

int TrainEngine::data_parallel_size() const {
  return spec_.mesh.size("dp");
}

CommHook* TrainEngine::comm_hook() {
  Reducer* r = parts_.grads->reducer();
  return r ? &r->comm_hook() : nullptr;
}

const Reducer* TrainEngine::reducer() const {
  return parts_.grads->reducer();
}

const FsdpUnits* TrainEngine::fsdp() const {
  return dynamic_cast<const FsdpUnits*>(parts_.grads.get());
}

bool TrainEngine::lockstep() const {
  return parts_.grads->lockstep();
}

std::optional<int64_t> TrainEngine::join_running_job() {
  return parts_.params->join_running_job();
}

std::string TrainEngine::describe() const {
  const int zero = spec_.options.zero_stage;
  std::string s = parts_.runner->describe();
  std::string sync = parts_.grads->describe();
  if (sync.empty()) sync = parts_.params->describe();
  if (!sync.empty()) return s.empty() ? sync : s + ", " + sync;
  if (zero == 0 || !dp_) return s;
  if (s.empty())
    return "ZeRO-" + std::to_string(zero) + " over " + std::to_string(dp_->size()) + " ranks";
  return s + ", ZeRO-" + std::to_string(zero) + " over each stage's " +
         std::to_string(dp_->size()) + " replicas";
}

size_t TrainEngine::in_flight_bytes() const {
  return parts_.grads->in_flight_bytes() + parts_.params->exchange_bytes();
}

}  // namespace meshtrain::parallel
