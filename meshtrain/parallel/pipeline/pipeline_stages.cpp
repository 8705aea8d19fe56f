#include "meshtrain/parallel/pipeline/pipeline_stages.h"

#include <cstring>
#include <map>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"
#include "meshtrain/parallel/tensor_parallel/whole_parameters.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/hash.h"

namespace meshtrain::parallel::pipeline {

namespace {

// Evaluation's activations travel on tags of their own, above the schedules' (below 2^30) and
// under the tied sum's (2^31 and up).
constexpr uint32_t kEvalTag = 0x40000000u;

}  // namespace

PipelineStages::PipelineStages(const ModelSource& source, const PipelineOptions& options,
                               comm::ProcessGroupPtr pp_group, comm::ProcessGroupPtr dp_group,
                               tp::TpContext tp, Device device)
    : source_(source),
      options_(options),
      pp_group_(std::move(pp_group)),
      dp_group_(std::move(dp_group)),
      tp_(std::move(tp)),
      device_(device) {
  const int P = options_.stages, V = options_.virtual_stages;
  MT_CHECK(P >= 1 && V >= 1, "a pipeline needs at least one stage and one chunk per stage");
  MT_CHECK(P == 1 || (pp_group_ && pp_group_->size() == P),
           "the pipeline's group must hold one rank per stage (", P, ")");
  stage_ = pp_group_ ? pp_group_->rank() : 0;
  // ValueError naming the keys when the layers are too few.
  ranges_ = source_.stack().partition(P, V, options_.partition);
  const PipelineShape shape{P, 1, V, options_.kind};
  for (int c = 0; c < V; ++c) {
    const models::LayerRange& r = ranges_[static_cast<size_t>(shape.virtual_stage(stage_, c))];
    chunks_.push_back(source_.build_stage(r.begin, r.end, tp_));
    chunks_.back()->to(device_);
    for (auto& np : chunks_.back()->named_parameters()) params_.push_back(np);
    for (auto& info : chunks_.back()->param_infos()) infos_.push_back(std::move(info));
  }
  for (const nn::ParamInfo& info : source_.param_infos())
    if (!info.tie_group.empty() && tied_name_.empty()) tied_name_ = info.name;
  if (P > 1 && stage_ == P - 1)
    for (const nn::ParamInfo& info : chunks_.back()->param_infos())
      holds_tied_copy_ = holds_tied_copy_ || !info.tie_group.empty();
}

nn::NamedTensors PipelineStages::owned_parameters() const {
  if (!holds_tied_copy_) return params_;
  nn::NamedTensors out;
  // The tied copy is the last chunk's wte.weight (the embedding itself is on stage 0).
  const Tensor copy = chunks_.back()->named_parameters().front().second;
  for (const auto& np : params_)
    if (np.second.data_ptr() != copy.data_ptr()) out.push_back(np);
  return out;
}

std::set<std::string> PipelineStages::copy_names() const {
  std::set<const void*> owned;
  for (const auto& [name, p] : owned_parameters()) owned.insert(p.data_ptr());
  std::set<std::string> out;
  for (const auto& [name, p] : params_)
    if (!owned.count(p.data_ptr())) out.insert(name);
  return out;
}

std::vector<Batch> PipelineStages::micro_batches(const std::vector<Batch>& batches) const {
  const int n = static_cast<int>(batches.size());
  const int M = options_.micro_batches > 0 ? options_.micro_batches : n;
  if (M == n) return batches;
  const int64_t per_batch = batches.front().inputs.shape()[0];
  const int64_t total = per_batch * n;
  MT_CHECK(total % M == 0, "parallel.micro_batches = ", M, " does not divide the step's ", total,
           " sequences per replica; make it a divisor of data.batch_size x "
           "train.grad_accum_steps");
  std::vector<Tensor> xs, ys;
  for (const Batch& b : batches) {
    xs.push_back(b.inputs);
    ys.push_back(b.targets);
  }
  const Tensor x = ops::cat(xs, 0), y = ops::cat(ys, 0);
  const int64_t b = total / M;
  std::vector<Batch> out;
  for (int m = 0; m < M; ++m)
    out.push_back({x.slice(m * b, (m + 1) * b), y.slice(m * b, (m + 1) * b)});
  return out;
}

float PipelineStages::step(const std::vector<Batch>& batches, uint64_t seed_base, DType precision,
                           float loss_scale) {
  MT_CHECK(!batches.empty(), "a pipeline step needs at least one batch");
  const std::vector<Batch> mbs = micro_batches(batches);
  const int M = static_cast<int>(mbs.size());
  const int64_t B = mbs.front().inputs.shape()[0], T = mbs.front().inputs.shape()[1];
  if (!runner_ || runner_B_ != B || runner_T_ != T || runner_M_ != M) {
    const PipelineShape shape{options_.stages, M, options_.virtual_stages, options_.kind};
    runner_ = std::make_unique<StageRunner>(shape, stage_, chunks_, pp_group_, B, T);
    if (tp_.size() > 1) runner_->set_tp_group(tp_.group);
    runner_->set_device(device_);
    runner_B_ = B;
    runner_T_ = T;
    runner_M_ = M;
  }
  const int dp = dp_group_ ? dp_group_->size() : 1, dp_rank = dp_group_ ? dp_group_->rank() : 0;
  std::vector<uint64_t> seeds;
  for (int m = 0; m < M; ++m) seeds.push_back(seed_base + static_cast<uint64_t>(m * dp + dp_rank));
  runner_->set_precision(precision, loss_scale);
  runner_->run_program(mbs, seeds);
  // Sequence parallelism left each replicated parameter's gradient in parts over tp.
  tp::tp_gpt_parts::reduce_sequence_parallel_grads(tp_, params_, infos_);
  runner_->sum_tied_gradients();
  return runner_->share_loss();
}

float PipelineStages::evaluate(const std::vector<Batch>& batches, DType precision) {
  autograd::NoGradGuard no_grad;
  autograd::AutocastGuard autocast(precision);
  train(false);
  const int P = options_.stages, S = P * options_.virtual_stages;
  double total = 0;
  for (const Batch& b : batches) {
    const int64_t B = b.inputs.shape()[0], T = b.inputs.shape()[1];
    // The virtual stages one after another: this rank computes its chunks as the activation
    // reaches them (no overlap: evaluation is a few batches).
    Tensor carried;  // an activation kept on this rank (when the next virtual stage is here)
    for (int k = 0; k < S; ++k) {
      if (k % P != stage_) continue;
      const models::StageModule& chunk = *chunks_[static_cast<size_t>(k / P)];
      Tensor in;
      if (k == 0) {
        in = b.inputs;
      } else if ((k - 1) % P == stage_) {
        in = carried;
      } else {
        in = Tensor::empty(chunk.input_shape(B, T));
        pp_group_
            ->recv(in.data_ptr(), static_cast<size_t>(in.numel()), in.dtype(), (k - 1) % P,
                   kEvalTag + static_cast<uint32_t>(k))
            ->wait();
        in = in.to(device_);
      }
      Tensor out = chunk.forward(in, b.targets, 0);
      if (k == S - 1) {
        total += out.item();
      } else if ((k + 1) % P == stage_) {
        carried = out;
      } else {
        const Tensor h = out.to(Device::cpu());  // the pp group moves host memory
        pp_group_
            ->send(h.data_ptr(), static_cast<size_t>(h.numel()), h.dtype(), (k + 1) % P,
                   kEvalTag + static_cast<uint32_t>(k + 1))
            ->wait();
      }
    }
  }
  train(true);
  float loss = static_cast<float>(total / static_cast<double>(std::max<size_t>(1, batches.size())));
  if (pp_group_) {
    comm::BroadcastOptions o;
    o.root = (S - 1) % P;
    pp_group_->broadcast(&loss, 1, DType::f32, o)->wait();
  }
  return loss;
}

void PipelineStages::check_in_sync(int64_t step) const {
  std::vector<uint64_t> mine;
  for (const auto& [name, p] : params_) {
    const Tensor h = p.to(Device::cpu());
    mine.push_back(xxh3_64(h.data_ptr(), h.nbytes()));
  }
  // Both collectives run before any verdict, so that a rank that finds a difference does not
  // leave the others waiting in the second.
  const size_t n = mine.size();
  const int dp = dp_group_ ? dp_group_->size() : 1;
  std::vector<uint64_t> replicas(n * static_cast<size_t>(dp));
  if (dp_group_) dp_group_->all_gather(mine.data(), replicas.data(), n, DType::i64)->wait();
  // The tied embedding's two copies (stage 0's and the last stage's) must be the same bits.
  const bool tied = pp_group_ && options_.stages > 1 && tied_name_ != "";
  std::vector<uint64_t> copies(static_cast<size_t>(options_.stages));
  if (tied) {
    uint64_t h = 0;
    for (size_t i = 0; i < n; ++i)
      if (params_[i].first == tied_name_ && (stage_ == 0 || holds_tied_copy_)) h = mine[i];
    pp_group_->all_gather(&h, copies.data(), 1, DType::i64)->wait();
  }
  for (int r = 1; r < dp; ++r)
    for (size_t i = 0; i < n; ++i)
      if (replicas[static_cast<size_t>(r) * n + i] != replicas[i])
        MT_THROW(Error, "step ", step, ": parameters of pipeline stage ", stage_,
                 " diverged between its data-parallel replicas 0 and ", r,
                 ", first differing tensor '", params_[i].first,
                 "'; data-parallel replicas must stay identical");
  if (tied && copies.front() != copies.back())
    MT_THROW(Error, "step ", step, ": the tied parameter '", tied_name_,
             "' differs between pipeline stage 0 and its copy on "
             "stage ",
             options_.stages - 1, "; the tied copies must stay identical");
}

nn::NamedTensors PipelineStages::gather_parameters() const {
  // This stage's parameters whole: tp shards are gathered over tp first (every tp rank of the
  // stage takes part, in params_' order).
  std::map<std::string, Tensor> mine;
  {
    std::map<std::string, Tensor> owned;
    for (const auto& np : owned_parameters()) owned.insert(np);
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto it = owned.find(params_[i].first);
      if (it == owned.end() || it->second.data_ptr() != params_[i].second.data_ptr()) continue;
      mine[params_[i].first] = tp::whole_tensor(tp_, params_[i].second, infos_[i]);
    }
  }
  nn::NamedTensors out;
  for (const nn::ParamInfo& info : source_.param_infos()) {
    const std::string& name = info.name;
    const size_t layer = source_.layer_of(name);
    int owner = -1;
    for (size_t k = 0; k < ranges_.size(); ++k)
      if (ranges_[k].begin <= layer && layer < ranges_[k].end)
        owner = static_cast<int>(k) % options_.stages;
    MT_CHECK(owner >= 0, "no pipeline stage holds '", name, "'");
    Tensor t = owner == stage_ ? mine.at(name) : Tensor::empty(info.shape);
    if (pp_group_) {
      comm::BroadcastOptions o;
      o.root = owner;
      pp_group_->broadcast(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype(), o)->wait();
    }
    out.emplace_back(name, t);
  }
  return out;
}

int64_t PipelineStages::num_parameters() const {
  return source_.num_parameters();
}

void PipelineStages::train(bool on) {
  for (auto& c : chunks_) c->train(on);
}

std::string PipelineStages::describe() const {
  // One stage: the pipeline's engine runs tensor parallelism under ZeRO (engine_factory.cpp).
  std::string s = options_.stages == 1
                      ? std::string("one stage, no pipeline")
                      : "pipeline " + std::string(schedule_kind_name(options_.kind)) + " over " +
                            std::to_string(options_.stages) + " stages";
  if (options_.virtual_stages > 1) s += " x " + std::to_string(options_.virtual_stages) + " chunks";
  if (dp_group_) s += " x " + std::to_string(dp_group_->size()) + " data-parallel replicas";
  if (tp_.size() > 1)
    s += " x tensor parallelism over " + std::to_string(tp_.size()) + " ranks" +
         (tp_.sequence_parallel ? " with sequence parallelism" : "");
  s += " (this rank: stage " + std::to_string(stage_) + ", layers";
  for (int c = 0; c < options_.virtual_stages; ++c) {
    const models::LayerRange& r = ranges_[static_cast<size_t>(c * options_.stages + stage_)];
    s += " " + source_.stack().layers()[r.begin].name + ".." +
         source_.stack().layers()[r.end - 1].name;
  }
  return s + ")";
}

}  // namespace meshtrain::parallel::pipeline
