#include "meshtrain/parallel/param_server/ps_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/parallel/placed_state.h"
#include "meshtrain/parallel/step_record.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/storage.h"
#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

PsClient::PsClient(nn::NamedTensors params, PsLayout layout, int worker,
                   std::vector<PsPeer> servers, PsClientOptions options)
    : params_(std::move(params)),
      layout_(std::move(layout)),
      worker_(worker),
      servers_(std::move(servers)),
      options_(options) {
  MT_CHECK(static_cast<int>(servers_.size()) == layout_.servers, "a parameter-server worker has ",
           servers_.size(), " channels for ", layout_.servers, " servers");
  MT_CHECK(
      static_cast<int64_t>(params_.size()) + 1 == static_cast<int64_t>(layout_.param_offset.size()),
      "the worker has ", params_.size(), " parameters, the servers' layout ",
      layout_.param_offset.size() - 1);
  if (!params_.empty()) device_ = params_.front().second.device();
  for (const auto& [name, p] : params_)
    MT_CHECK(p.device() == device_, "a parameter-server worker's parameters are on one device; '",
             name, "' is on ", p.device().str(), ", not ", device_.str());
  grad_ = Tensor::zeros({std::max<int64_t>(layout_.total, 1)}, DType::f32, device_);
  host_grad_ = device_.is_cpu() ? grad_ : Tensor::zeros(grad_.shape(), DType::f32);
  pulled_.resize(static_cast<size_t>(layout_.total));
  begin_.resize(static_cast<size_t>(layout_.servers));
  // The chunks of every server's range, and which parameters each waits for.
  chunks_of_.resize(params_.size());
  for (int s = 0; s < layout_.servers; ++s) {
    const int64_t off = layout_.range_offset(s), n = layout_.range_size(s);
    for (int64_t b = 0; b < n; b += kPsChunkElements) {
      Chunk c;
      c.server = s;
      c.begin = off + b;
      c.end = off + std::min(n, b + kPsChunkElements);
      for (size_t i = 0; i < params_.size(); ++i) {
        if (layout_.param_offset[i] < c.end && layout_.param_offset[i + 1] > c.begin &&
            layout_.param_offset[i + 1] > layout_.param_offset[i]) {
          ++c.params;
          chunks_of_[i].push_back(chunks_.size());
        }
      }
      chunks_.push_back(c);
    }
  }
  for (size_t i = 0; i < params_.size(); ++i)
    autograd::register_grad_ready_hook(params_[i].second,
                                       [this, i](const Tensor&) { on_grad_ready(i); });
}

PsClient::~PsClient() {
  for (auto& [name, p] : params_) {
    Tensor t = p;
    autograd::clear_grad_ready_hooks(t);
  }
  try {
    for (comm::WorkPtr& w : pushes_) w->wait();
    PushHeader done;
    done.flags = PushHeader::kDone;
    std::vector<comm::WorkPtr> works;
    for (int s = 0; s < layout_.servers; ++s)
      works.push_back(send_to(s, &done, sizeof done, DType::u8, kPsPushTag));
    for (comm::WorkPtr& w : works) w->wait();
  } catch (const std::exception&) {
    // The group failed: the servers learn it from the group, not from this message.
  }
}

void PsClient::zero_grad(const nn::NamedTensors& params) {
  grad_.zero_();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = params[i].second;
    const int64_t off = layout_.param_offset[i];
    Tensor view = grad_.slice(off, off + p.numel()).view(p.shape());
    if (p.grad().defined() && p.grad().data<float>() == view.data<float>()) continue;
    p.set_grad(view);
  }
}

void PsClient::before_backward(bool last) {
  if (!last) return;
  // The step's last backward: the servers learn that a push comes and post its receives.
  ++step_;
  for (Chunk& c : chunks_) {
    c.pending = c.params;
    c.sent = false;
  }
  for (int s = 0; s < layout_.servers; ++s) {
    PushHeader& begin = begin_[static_cast<size_t>(s)];
    begin = PushHeader{};
    begin.step = step_;
    begin.resumed = resumed_;
    pushes_.push_back(send_to(s, &begin, sizeof begin, DType::u8, kPsPushTag));
  }
  armed_ = true;
}

void PsClient::on_grad_ready(size_t param) {
  if (!armed_) return;
  for (size_t k : chunks_of_[param]) {
    Chunk& c = chunks_[k];
    if (--c.pending == 0) send_chunk(c);
  }
}

void PsClient::send_chunk(Chunk& c) {
  c.sent = true;
  const auto index =
      static_cast<uint32_t>((c.begin - layout_.range_offset(c.server)) / kPsChunkElements);
  // A device's chunk comes to the host first (the copy waits for the backward that wrote it).
  if (!device_.is_cpu())
    allocator_for(device_.type)
        .copy(host_grad_.data<float>() + c.begin, Device::cpu(), grad_.data<float>() + c.begin,
              device_, static_cast<size_t>(c.end - c.begin) * sizeof(float));
  pushes_.push_back(send_to(c.server, host_grad_.data<float>() + c.begin,
                            static_cast<size_t>(c.end - c.begin), DType::f32, kPsDataTag + index));
}

void PsClient::after_backward(bool last) {
  if (!last) return;
  armed_ = false;
  // Parameters that got no gradient in this backward: their chunks go as they are.
  for (Chunk& c : chunks_)
    if (!c.sent) send_chunk(c);
}

float PsClient::finish_with_record(const StepRecord& mine, StepOutcome& out) {
  const auto start = std::chrono::steady_clock::now();
  PushHeader h;
  h.step = step_;
  h.resumed = resumed_;
  h.record = mine.mine;
  h.lr = lr_;
  if (options_.consistency != PsConsistency::sync) {
    // The whole gradient's norm, for each server to clip its range alike.
    std::vector<Tensor> grads;
    for (const auto& [name, p] : params_) grads.push_back(p.grad());
    double sq = 0.0;
    for (double s : ops::sum_squares_each(grads)) sq += s;
    h.grad_squares = sq;
  }
  const int S = layout_.servers;
  std::vector<PsReply> replies;
  std::vector<std::vector<float>> records;
  std::vector<comm::WorkPtr> works = std::move(pushes_);
  pushes_.clear();
  exchange(h, works, replies, records);
  pulled_fresh_ = true;
  const PsReply& first = replies[0];
  const bool accepted = (first.flags & PsReply::kAccepted) != 0;
  float loss;
  if (accepted) {
    loss = StepRecord::combine(records[0], first.records, out);
  } else {
    // Dropped: this worker's gradient came too late for its step. The batch is trained again
    // (StepOutcome::requeue) on the parameters just pulled; the loss reported is its own.
    std::vector<float> own(mine.mine.begin(), mine.mine.end());
    loss = StepRecord::combine(own, 1, out);
  }
  grad_squares_ = first.grad_squares;
  out.requeue = !accepted;
  if (!whole_at_rest()) {
    // The workers are at steps of their own (asynchronous ones), or some trained a dropped batch
    // again (backup workers): the servers say which steps all of them reached and saved, and
    // those are the checkpoints (the trainer follows out.save alone here).
    bool saved = true;
    for (const PsReply& r : replies) saved = saved && (r.flags & PsReply::kSaved) != 0;
    out.save = saved;
  }
  out.sync_metrics["ps"] = {
      {"version", first.version},
      {"staleness", first.staleness},
      {"dropped", !accepted},
      {"push_bytes", layout_.total * 4 + 2 * S * static_cast<int64_t>(sizeof h)},
      {"pull_bytes", layout_.total * 4 + S * static_cast<int64_t>(sizeof(PsReply))},
      {"push_pull_s",
       std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}};
  return loss;
}

void PsClient::exchange(const PushHeader& h, std::vector<comm::WorkPtr>& works,
                        std::vector<PsReply>& replies, std::vector<std::vector<float>>& records) {
  const auto S = static_cast<size_t>(layout_.servers);
  replies.assign(S, PsReply{});
  records.assign(S, std::vector<float>(static_cast<size_t>(layout_.workers) * kPsRecordFloats));
  for (int s = 0; s < layout_.servers; ++s) {
    const auto k = static_cast<size_t>(s);
    const int64_t off = layout_.range_offset(s), n = layout_.range_size(s);
    works.push_back(send_to(s, &h, sizeof h, DType::u8, kPsPushTag));
    works.push_back(recv_from(s, &replies[k], sizeof(PsReply), DType::u8, kPsReplyTag));
    works.push_back(recv_from(s, records[k].data(), records[k].size(), DType::f32, kPsReplyTag));
    if (n > 0)
      works.push_back(
          recv_from(s, pulled_.data() + off, static_cast<size_t>(n), DType::f32, kPsReplyTag));
  }
  for (comm::WorkPtr& w : works) w->wait();
}

comm::WorkPtr PsClient::send_to(int server, const void* data, size_t count, DType dtype,
                                uint32_t tag) {
  const PsPeer& p = servers_[static_cast<size_t>(server)];
  return p.group->send(data, count, dtype, p.rank, tag);
}

comm::WorkPtr PsClient::recv_from(int server, void* data, size_t count, DType dtype, uint32_t tag) {
  const PsPeer& p = servers_[static_cast<size_t>(server)];
  return p.group->recv(data, count, dtype, p.rank, tag);
}

std::optional<int64_t> PsClient::join_running_job() {
  MT_CHECK(options_.consistency != PsConsistency::sync,
           "only asynchronous parameter-server workers join a running job");
  PushHeader join;
  join.flags = PushHeader::kJoin;
  std::vector<PsReply> replies;
  std::vector<std::vector<float>> records;
  std::vector<comm::WorkPtr> works;
  exchange(join, works, replies, records);
  // A predecessor that died while pushing may have reached some servers with its last step and
  // not others: the replacement trains that step again (those servers apply it twice, as an
  // asynchronous update of a stale gradient), so no sample is skipped.
  int64_t clock = replies[0].clock;
  for (const PsReply& r : replies) {
    MT_CHECK((r.flags & PsReply::kJoined) != 0, "a server did not answer worker ", worker_,
             "'s request to join");
    clock = std::min(clock, r.clock);
  }
  pulled_fresh_ = true;
  step(1.0f);
  step_ = clock;
  return clock;
}

size_t PsClient::in_flight_bytes() const {
  return static_cast<size_t>(layout_.total) * 8;
}

std::string PsClient::describe() const {
  const char* names[] = {"sync", "async", "ssp"};
  std::string s = "parameter server: " + std::to_string(layout_.workers) + " worker" +
                  (layout_.workers > 1 ? "s" : "") + ", " + std::to_string(layout_.servers) +
                  " server" + (layout_.servers > 1 ? "s" : "") + ", " +
                  names[static_cast<int>(options_.consistency)];
  if (options_.consistency == PsConsistency::ssp)
    s += " (staleness " + std::to_string(options_.staleness) + ")";
  if (options_.backup_workers > 0)
    s += ", " + std::to_string(options_.backup_workers) + " backup worker" +
         (options_.backup_workers > 1 ? "s" : "");
  return s;
}

bool PsClient::whole_at_rest() const {
  // Only sync steps that apply every worker's gradient leave every worker the same parameters
  // at the same step; otherwise the replicas differ by design and there is nothing to compare.
  return options_.consistency == PsConsistency::sync && options_.backup_workers == 0;
}

bool PsClient::unscale(const optim::LossScaler& /*scaler*/) {
  MT_THROW(ValueError, "a parameter-server job does not scale its loss (train.precision = f16)");
}

GradSquares PsClient::grad_squares(const NormShare& /*share*/) const {
  GradSquares out;
  out.whole = grad_squares_;
  return out;
}

void PsClient::step(float /*grad_scale*/) {
  // The servers applied the optimizer; the model takes their parameters.
  if (!pulled_fresh_) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i].second;
    const float* src = pulled_.data() + layout_.param_offset[i];
    const size_t bytes = static_cast<size_t>(p.numel()) * 4;
    if (device_.is_cpu())
      std::memcpy(p.data<float>(), src, bytes);
    else
      allocator_for(device_.type).copy(p.data_ptr(), device_, src, Device::cpu(), bytes);
  }
  pulled_fresh_ = false;
}

nlohmann::json PsClient::add_to_checkpoint(ckpt::RankShards& shards,
                                           const StatePlace& place) const {
  // The parameters only: their optimizer state is the servers', which write it beside this
  // checkpoint at the same step (parameter_server.h).
  ckpt::RankShards unused;
  return add_placed_state(place.write_parts ? shards : unused, params_, place.infos,
                          optim::OptimizerState{}, {}, place.write_replicated);
}

void PsClient::restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
                       const StatePlace& place) {
  const PlacedState saved = read_placed_state(checkpoint, scalars, params_, place.infos, {});
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i].second;
    p.copy_(saved.values[i]);
  }
  // The servers load their own state of this step when the first push says so.
  step_ = checkpoint.step();
  resumed_ = checkpoint.step();
}

}  // namespace meshtrain::parallel
