#include "meshtrain/parallel/pipeline/stage_runner.h"

#include <cmath>
#include <cstring>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/obs/trace.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/util/error.h"

namespace meshtrain::parallel::pipeline {

StageRunner::StageRunner(const PipelineShape& shape, int stage,
                         std::vector<std::shared_ptr<models::StageModule>> chunks,
                         comm::ProcessGroupPtr group, int64_t B, int64_t T)
    : shape_(shape),
      stage_(stage),
      chunks_(std::move(chunks)),
      group_(std::move(group)),
      B_(B),
      T_(T) {
  shape_.validate();
  MT_CHECK(group_ && group_->size() == shape_.stages && group_->rank() == stage_,
           "the pipeline's group must have one rank per stage (", shape_.stages,
           ") and this rank must be stage ", stage_);
  MT_CHECK(static_cast<int>(chunks_.size()) == shape_.virtual_stages, "stage ", stage_, " holds ",
           chunks_.size(), " chunks, the schedule needs ", shape_.virtual_stages);
  for (int c = 0; c < shape_.virtual_stages; ++c) {
    MT_CHECK(chunks_[static_cast<size_t>(c)]->is_first() == shape_.is_first(stage_, c) &&
                 chunks_[static_cast<size_t>(c)]->is_last() == shape_.is_last(stage_, c),
             "chunk ", c, " of stage ", stage_, " is not virtual stage ",
             shape_.virtual_stage(stage_, c), " of the model");
  }
  program_ = build_schedule(shape_, stage_);
  // Tied parameters: the first chunk's on rank 0 and the last chunk's on rank P - 1, in name
  // order on both.
  if (shape_.stages > 1 && (stage_ == 0 || stage_ == shape_.stages - 1)) {
    const auto& chunk = stage_ == 0 ? chunks_.front() : chunks_.back();
    const std::vector<nn::ParamInfo> infos = chunk->param_infos();
    const nn::NamedTensors params = chunk->named_parameters();
    std::map<std::string, Tensor> tied;
    for (size_t i = 0; i < infos.size(); ++i)
      if (!infos[i].tie_group.empty()) tied[infos[i].name] = params[i].second;
    for (auto& [name, t] : tied) tied_.push_back(t);
    tied_is_copy_ = stage_ != 0;
  }
}

void StageRunner::forward(const Action& a, const std::vector<MicroBatch>& mbs, uint64_t seed) {
  const Key key{a.micro_batch, a.chunk};
  const MicroBatch& mb = mbs[static_cast<size_t>(a.micro_batch)];
  const models::StageModule& chunk = *chunks_[static_cast<size_t>(a.chunk)];
  const Tensor in = chunk.is_first() ? mb.inputs : inputs_.at(key);
  Tensor out = chunk.forward(in, mb.targets, seed);
  if (chunk.is_last()) losses_[static_cast<size_t>(a.micro_batch)] = out.item();
  outputs_[key] = std::move(out);
}

void StageRunner::backward(const Action& a) {
  const Key key{a.micro_batch, a.chunk};
  const models::StageModule& chunk = *chunks_[static_cast<size_t>(a.chunk)];
  const Tensor out = outputs_.at(key);
  if (chunk.is_last()) {
    // As a single rank accumulating M micro-batches: each loss weighted 1/M.
    autograd::backward(out, Tensor::scalar(1.0f / static_cast<float>(shape_.micro_batches)));
  } else {
    autograd::backward(out, out_grads_.at(key));
    out_grads_.erase(key);
  }
  outputs_.erase(key);
  if (!chunk.is_first()) {
    in_grads_[key] = inputs_.at(key).grad();
    inputs_.erase(key);
  }
}

void StageRunner::transfer(const Action& a) {
  std::vector<comm::WorkPtr> works;
  std::vector<std::pair<Key, Tensor>> received_activations;
  for (const P2POp& op : a.p2p) {
    const Key key{op.micro_batch, op.chunk};
    const models::StageModule& chunk = *chunks_[static_cast<size_t>(op.chunk)];
    switch (op.kind) {
      case P2POp::Kind::send_activation: {
        const Tensor& t = outputs_.at(key);
        works.push_back(
            group_->send(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype(), op.peer, op.tag));
        break;
      }
      case P2POp::Kind::send_gradient: {
        const Tensor& t = in_grads_.at(key);
        MT_CHECK(t.defined(), "stage ", stage_, ": micro-batch ", op.micro_batch,
                 " has no input gradient to send");
        works.push_back(
            group_->send(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype(), op.peer, op.tag));
        break;
      }
      case P2POp::Kind::recv_activation: {
        Tensor t = Tensor::empty(chunk.input_shape(B_, T_));
        works.push_back(
            group_->recv(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype(), op.peer, op.tag));
        received_activations.emplace_back(key, t);
        break;
      }
      case P2POp::Kind::recv_gradient: {
        Tensor t = Tensor::empty(chunk.output_shape(B_, T_));
        works.push_back(
            group_->recv(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype(), op.peer, op.tag));
        out_grads_[key] = t;
        break;
      }
    }
  }
  for (const comm::WorkPtr& w : works) w->wait();
  for (auto& [key, t] : received_activations) inputs_[key] = t.set_requires_grad(true);
  for (const P2POp& op : a.p2p)
    if (op.kind == P2POp::Kind::send_gradient) in_grads_.erase({op.micro_batch, op.chunk});
}

void StageRunner::sum_tied_gradients() {
  if (tied_.empty()) return;
  const int peer = stage_ == 0 ? shape_.stages - 1 : 0;
  // Tags above every schedule tag (those stay below 2^30).
  constexpr uint32_t kTiedTag = 0x80000000u;
  for (size_t i = 0; i < tied_.size(); ++i) {
    const Tensor mine = tied_[i].grad();
    MT_CHECK(mine.defined(), "stage ", stage_, ": tied parameter ", i, " has no gradient");
    Tensor theirs = Tensor::empty(mine.shape());
    const size_t n = static_cast<size_t>(mine.numel());
    comm::WorkPtr s = group_->send(mine.data_ptr(), n, DType::f32, peer, kTiedTag + i);
    comm::WorkPtr r = group_->recv(theirs.data_ptr(), n, DType::f32, peer, kTiedTag + i);
    s->wait();
    r->wait();
    // embedding's + head's on both ranks: the same additions, the same bits.
    float* g = mine.data<float>();
    const float* o = theirs.data<float>();
    for (size_t k = 0; k < n; ++k) g[k] = tied_is_copy_ ? o[k] + g[k] : g[k] + o[k];
  }
}

PipelineStepResult StageRunner::share_results() {
  struct Local {
    double sum_squares;
    float loss;
    uint32_t is_last;
  };
  Local local{0.0, 0.0f, 0u};
  for (const auto& chunk : chunks_)
    for (const auto& [name, t] : chunk->named_parameters()) {
      const Tensor g = t.grad();
      if (!g.defined()) continue;
      bool copy = false;
      for (const Tensor& tied : tied_) copy |= tied_is_copy_ && tied.data_ptr() == t.data_ptr();
      if (copy) continue;
      const float* p = g.data<float>();
      for (int64_t k = 0; k < g.numel(); ++k) local.sum_squares += double{p[k]} * p[k];
    }
  if (chunks_.back()->is_last()) {
    local.is_last = 1;
    for (float l : losses_) local.loss += l / static_cast<float>(shape_.micro_batches);
  }
  std::vector<Local> all(static_cast<size_t>(shape_.stages));
  group_->all_gather(&local, all.data(), sizeof(Local), DType::u8)->wait();
  PipelineStepResult out;
  double sum = 0.0;
  for (const Local& l : all) {
    sum += l.sum_squares;
    if (l.is_last) out.loss = l.loss;
  }
  out.grad_norm = std::sqrt(sum);
  return out;
}

PipelineStepResult StageRunner::run(const std::vector<MicroBatch>& micro_batches,
                                    const std::vector<uint64_t>& dropout_seeds) {
  run_program(micro_batches, dropout_seeds);
  return finish();
}

void StageRunner::run_program(const std::vector<MicroBatch>& micro_batches,
                              const std::vector<uint64_t>& dropout_seeds) {
  MT_CHECK(static_cast<int>(micro_batches.size()) == shape_.micro_batches, "the schedule runs ",
           shape_.micro_batches, " micro-batches, got ", micro_batches.size());
  MT_CHECK(dropout_seeds.empty() || dropout_seeds.size() == micro_batches.size(),
           "one dropout seed per micro-batch");
  losses_.assign(static_cast<size_t>(shape_.micro_batches), 0.0f);
  for (const Action& a : program_) {
    // One span per action, so a trace shows the schedule and its bubble on every rank.
    obs::TraceSpan span(a.type == Action::Type::forward    ? "forward"
                        : a.type == Action::Type::backward ? "backward"
                                                           : "p2p",
                        "pipeline");
    if (a.type != Action::Type::p2p) {
      span.arg("micro_batch", a.micro_batch);
      span.arg("chunk", a.chunk);
    } else {
      span.arg("transfers", static_cast<double>(a.p2p.size()));
    }
    switch (a.type) {
      case Action::Type::forward:
        forward(a, micro_batches,
                dropout_seeds.empty() ? 0 : dropout_seeds[static_cast<size_t>(a.micro_batch)]);
        break;
      case Action::Type::backward:
        backward(a);
        break;
      case Action::Type::p2p:
        transfer(a);
        break;
    }
  }
  MT_CHECK(inputs_.empty() && outputs_.empty() && out_grads_.empty() && in_grads_.empty(), "stage ",
           stage_, ": the program left tensors behind");
}

PipelineStepResult StageRunner::finish() {
  sum_tied_gradients();
  return share_results();
}

}  // namespace meshtrain::parallel::pipeline
