#include "meshtrain/parallel/pipeline/stage_runner.h"

#include <cmath>
#include <cstring>

#include "meshtrain/autograd/autocast.h"
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
  // One stage needs no group (tensor parallelism under ZeRO runs as a one-stage pipeline).
  MT_CHECK((!group_ && shape_.stages == 1) ||
               (group_ && group_->size() == shape_.stages && group_->rank() == stage_),
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
    tied_chunk_ = stage_ == 0 ? 0 : shape_.virtual_stages - 1;
  }
}

void StageRunner::forward(const Action& a, const std::vector<MicroBatch>& mbs, uint64_t seed) {
  const Key key{a.micro_batch, a.chunk};
  const MicroBatch& mb = mbs[static_cast<size_t>(a.micro_batch)];
  const models::StageModule& chunk = *chunks_[static_cast<size_t>(a.chunk)];
  const Tensor in = chunk.is_first() ? mb.inputs : inputs_.at(key);
  Tensor out;
  {
    // Mixed precision: the matrix products round to the half type; what crosses stages stays f32.
    autograd::AutocastGuard autocast(precision_);
    out = chunk.forward(in, mb.targets, seed);
  }
  if (chunk.is_last()) losses_[static_cast<size_t>(a.micro_batch)] = out.item();
  outputs_[key] = std::move(out);
}

void StageRunner::backward(const Action& a) {
  const Key key{a.micro_batch, a.chunk};
  const models::StageModule& chunk = *chunks_[static_cast<size_t>(a.chunk)];
  const Tensor out = outputs_.at(key);
  if (chunk.is_last()) {
    // As a single rank accumulating M micro-batches: each loss weighted 1/M.
    // (f16: times the loss scale, as the engine's accumulation does.)
    autograd::backward(out, Tensor::scalar(loss_scale_ / static_cast<float>(shape_.micro_batches)));
  } else {
    autograd::backward(out, out_grads_.at(key));
    out_grads_.erase(key);
  }
  if (!tied_.empty() && a.chunk == tied_chunk_) add_tied_contribution(a.micro_batch);
  outputs_.erase(key);
  if (!chunk.is_first()) {
    in_grads_[key] = inputs_.at(key).grad();
    inputs_.erase(key);
  }
}

void StageRunner::transfer(const Action& a) {
  std::vector<comm::WorkPtr> works;
  std::vector<Tensor> sent;  // host copies of device tensors, alive until their sends end
  std::vector<std::pair<Key, Tensor>> received_activations, received_gradients;
  for (const P2POp& op : a.p2p) {
    const Key key{op.micro_batch, op.chunk};
    const models::StageModule& chunk = *chunks_[static_cast<size_t>(op.chunk)];
    switch (op.kind) {
      case P2POp::Kind::send_activation:
      case P2POp::Kind::send_gradient: {
        const bool activation = op.kind == P2POp::Kind::send_activation;
        const Tensor& t = activation ? outputs_.at(key) : in_grads_.at(key);
        MT_CHECK(activation || t.defined(), "stage ", stage_, ": micro-batch ", op.micro_batch,
                 " has no input gradient to send");
        // The pp group moves host memory: a device's tensor goes as its host copy (a host
        // tensor's to() is the tensor itself).
        sent.push_back(t.to(Device::cpu()));
        const Tensor& h = sent.back();
        works.push_back(
            group_->send(h.data_ptr(), static_cast<size_t>(h.numel()), h.dtype(), op.peer, op.tag));
        break;
      }
      case P2POp::Kind::recv_activation:
      case P2POp::Kind::recv_gradient: {
        const bool activation = op.kind == P2POp::Kind::recv_activation;
        Tensor t =
            Tensor::empty(activation ? chunk.input_shape(B_, T_) : chunk.output_shape(B_, T_));
        works.push_back(
            group_->recv(t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype(), op.peer, op.tag));
        (activation ? received_activations : received_gradients).emplace_back(key, t);
        break;
      }
    }
  }
  for (const comm::WorkPtr& w : works) w->wait();
  for (auto& [key, t] : received_activations) {
    Tensor in = t.to(device_);
    in.set_requires_grad(true);
    inputs_[key] = in;
  }
  for (auto& [key, t] : received_gradients) out_grads_[key] = t.to(device_);
  for (const P2POp& op : a.p2p)
    if (op.kind == P2POp::Kind::send_gradient) in_grads_.erase({op.micro_batch, op.chunk});
}

// Tags above every schedule tag (those stay below 2^30) and the evaluation's.
constexpr uint32_t kPartTag = 0x80000000u, kSumTag = 0xC0000000u;

void StageRunner::add_tied_contribution(int m) {
  // One rank holding the whole model adds the head's and the embedding's contributions of each
  // micro-batch (h_m + e_m) and accumulates those sums in micro-batch order. So the last stage
  // sends each micro-batch's contribution to stage 0 as its backward ends (backwards run in
  // micro-batch order on every stage, and the last stage's of m always precedes stage 0's), and
  // stage 0 adds it to its own as its backward of m ends; at most the micro-batches in flight
  // are held, as their activations are.
  const int peer = stage_ == 0 ? shape_.stages - 1 : 0;
  for (size_t i = 0; i < tied_.size(); ++i) {
    const Tensor mine = tied_[i].grad();
    MT_CHECK(mine.defined(), "stage ", stage_, ": tied parameter ", i,
             " has no gradient from micro-batch ", m);
    tied_[i].set_grad(Tensor());
    const size_t n = static_cast<size_t>(mine.numel());
    const uint32_t tag = kPartTag + static_cast<uint32_t>(i) * 65536u + static_cast<uint32_t>(m);
    if (tied_is_copy_) {
      const Tensor h = mine.to(Device::cpu());
      tied_sends_.emplace_back(h, group_->send(h.data_ptr(), n, DType::f32, peer, tag));
      continue;
    }
    MT_CHECK(m == tied_next_, "stage 0: the tied gradient of micro-batch ", m, " came before ",
             tied_next_, "'s");
    Tensor theirs = Tensor::empty(mine.shape());
    group_->recv(theirs.data_ptr(), n, DType::f32, peer, tag)->wait();
    Tensor& sum = tied_sum_[i];
    if (!mine.device().is_cpu()) {
      // The CPU's arithmetic below, as device additions: e + h, then sum + (e + h).
      const Tensor both = ops::add(mine, theirs.to(mine.device()));
      sum = sum.defined() ? ops::add(sum, both) : both;
      continue;
    }
    const float* e = mine.data<float>();
    const float* h = theirs.data<float>();
    // The first micro-batch starts the gradient unless one was there before the step (0 + x
    // would turn a -0 into +0).
    if (!sum.defined()) {
      sum = Tensor::empty(mine.shape());
      float* g = sum.data<float>();
      for (size_t k = 0; k < n; ++k) g[k] = e[k] + h[k];
    } else {
      float* g = sum.data<float>();
      for (size_t k = 0; k < n; ++k) g[k] += e[k] + h[k];
    }
  }
  if (!tied_is_copy_) ++tied_next_;
}

void StageRunner::sum_tied_gradients() {
  if (tied_.empty()) return;
  // Stage 0 holds the sum; the last stage takes a copy of it.
  const int peer = stage_ == 0 ? shape_.stages - 1 : 0;
  for (auto& [t, w] : tied_sends_) w->wait();
  tied_sends_.clear();
  for (size_t i = 0; i < tied_.size(); ++i) {
    Tensor sum;
    if (tied_is_copy_) {
      sum = Tensor::empty(tied_[i].shape());
      group_
          ->recv(sum.data_ptr(), static_cast<size_t>(sum.numel()), DType::f32, peer,
                 kSumTag + static_cast<uint32_t>(i))
          ->wait();
      sum = sum.to(tied_[i].device());
    } else {
      MT_CHECK(tied_next_ == shape_.micro_batches, "stage 0: the tied gradients of ",
               shape_.micro_batches - tied_next_, " micro-batches are missing");
      sum = tied_sum_[i];
      const Tensor h = sum.to(Device::cpu());
      group_
          ->send(h.data_ptr(), static_cast<size_t>(h.numel()), DType::f32, peer,
                 kSumTag + static_cast<uint32_t>(i))
          ->wait();
    }
    tied_[i].set_grad(sum);
  }
  tied_sum_.clear();
}

PipelineStepResult StageRunner::share_results(std::optional<double> local_sum_squares) {
  struct Local {
    double sum_squares;
    float loss;
    uint32_t is_last;
    uint32_t overflow;
  };
  Local local{local_sum_squares.value_or(0.0), 0.0f, 0u, overflow_ ? 1u : 0u};
  if (!local_sum_squares) {
    double shard_squares = 0.0;  // of tp shards (with tensor parallelism)
    for (const auto& chunk : chunks_) {
      const nn::NamedTensors params = chunk->named_parameters();
      const std::vector<nn::ParamInfo> infos =
          tp_group_ ? chunk->param_infos() : std::vector<nn::ParamInfo>{};
      for (size_t i = 0; i < params.size(); ++i) {
        const Tensor& t = params[i].second;
        const Tensor g = t.grad();
        if (!g.defined()) continue;
        bool copy = false;
        for (const Tensor& tied : tied_) copy |= tied_is_copy_ && tied.data_ptr() == t.data_ptr();
        if (copy) continue;
        double& sum =
            tp_group_ && infos[i].init.shard.defined() ? shard_squares : local.sum_squares;
        const Tensor h = g.to(Device::cpu());
        const float* p = h.data<float>();
        for (int64_t k = 0; k < h.numel(); ++k) sum += double{p[k]} * p[k];
      }
    }
    if (tp_group_) {
      // Doubles travel as their bits and are added in tp rank order, so every tp rank of the
      // stage ends with the same sum.
      std::vector<double> each(static_cast<size_t>(tp_group_->size()));
      // The group moves the memory the stage's tensors are in (a device's tp group, device
      // memory): the sums go there and come back (to() of a tensor already there is itself).
      Tensor mine = Tensor::empty({1}, DType::i64);
      std::memcpy(mine.data_ptr(), &shard_squares, sizeof(double));
      mine = mine.to(device_);
      Tensor all = Tensor::empty({tp_group_->size()}, DType::i64, device_);
      tp_group_->all_gather(mine.data_ptr(), all.data_ptr(), 1, DType::i64)->wait();
      std::memcpy(each.data(), all.to(Device::cpu()).data_ptr(), each.size() * sizeof(double));
      for (double v : each) local.sum_squares += v;
    }
  }
  if (chunks_.back()->is_last()) {
    local.is_last = 1;
    for (float l : losses_) local.loss += l / static_cast<float>(shape_.micro_batches);
  }
  std::vector<Local> all(static_cast<size_t>(shape_.stages), local);
  if (group_) group_->all_gather(&local, all.data(), sizeof(Local), DType::u8)->wait();
  PipelineStepResult out;
  double sum = 0.0;
  for (const Local& l : all) {
    sum += l.sum_squares;
    if (l.is_last) out.loss = l.loss;
    out.overflow = out.overflow || l.overflow != 0;
  }
  out.grad_norm = std::sqrt(sum);
  return out;
}

float StageRunner::share_loss() const {
  struct Local {
    float loss;
    uint32_t is_last;
  };
  Local local{0.0f, 0u};
  if (chunks_.back()->is_last()) {
    local.is_last = 1;
    for (float l : losses_) local.loss += l / static_cast<float>(shape_.micro_batches);
  }
  std::vector<Local> all(static_cast<size_t>(shape_.stages), local);
  if (group_) group_->all_gather(&local, all.data(), sizeof(Local), DType::u8)->wait();
  for (const Local& l : all)
    if (l.is_last) return l.loss;
  return local.loss;
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
  // The tied gradients are formed in sum_tied_gradients; what they held before the step starts
  // the sum (stage 0's copy: both copies are the same bits).
  tied_sum_.clear();
  tied_next_ = 0;
  for (Tensor& t : tied_) {
    tied_sum_.push_back(t.grad().defined() ? t.grad().clone() : Tensor());
    t.set_grad(Tensor());
  }
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
