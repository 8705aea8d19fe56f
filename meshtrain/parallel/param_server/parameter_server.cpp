#include "meshtrain/parallel/param_server/parameter_server.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/parallel/step_record.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::parallel {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

nlohmann::json ParameterServerReport::to_json() const {
  return {{"applied", applied},
          {"steps", steps},
          {"dropped", dropped},
          {"skipped", skipped},
          {"lost", lost},
          {"staleness_histogram", staleness_histogram},
          {"max_staleness", max_staleness},
          {"worker_clock", worker_clock},
          {"push_bytes", push_bytes},
          {"pull_bytes", pull_bytes},
          {"busy_s", busy_s},
          {"wall_s", wall_s},
          {"load", wall_s > 0 ? busy_s / wall_s : 0.0}};
}

ParameterServer::ParameterServer(const nn::NamedTensors& params, PsLayout layout, int server,
                                 std::vector<PsPeer> workers, comm::ProcessGroupPtr servers,
                                 const OptimizerFactory& make_optimizer,
                                 ParameterServerOptions options)
    : layout_(std::move(layout)),
      server_(server),
      servers_(std::move(servers)),
      options_(std::move(options)) {
  MT_CHECK(static_cast<int>(workers.size()) == layout_.workers, "a parameter server has ",
           workers.size(), " channels for ", layout_.workers, " workers");
  MT_CHECK(!options_.relink || options_.consistency != PsConsistency::sync,
           "only asynchronous workers are replaced while the others go on");
  MT_CHECK(options_.backup_workers < layout_.workers, "parallel.ps.backup_workers (",
           options_.backup_workers, ") must be below the number of workers (", layout_.workers,
           ")");
  const KeyRange range = layout_.ranges[static_cast<size_t>(server_)];
  n_ = layout_.range_size(server_);
  grad_ = Tensor::zeros({std::max<int64_t>(n_, 1)}, DType::f32);
  for (size_t i = range.begin; i < range.end; ++i) {
    Tensor p = params[i].second;
    const int64_t off = layout_.param_offset[i] - layout_.range_offset(server_);
    p.set_grad(grad_.slice(off, off + p.numel()).view(p.shape()));
    own_.push_back({params[i].first, p});
  }
  optimizer_ = make_optimizer(optim::decay_groups(own_, options_.weight_decay));
  slots_.resize(static_cast<size_t>(layout_.workers));
  for (size_t w = 0; w < slots_.size(); ++w) slots_[w].peer = workers[w];
  for (Slot& s : slots_) {
    s.data.resize(static_cast<size_t>(n_));
    s.reply.resize(static_cast<size_t>(n_));
    s.records.resize(static_cast<size_t>(layout_.workers * kPsRecordFloats));
  }
  report_.worker_clock.assign(static_cast<size_t>(layout_.workers), 0);
}

ParameterServer::~ParameterServer() {
  // Receivers still running after a failure are blocked in a receive: aborting the group ends
  // them (a server that failed cannot serve on anyway).
  if (!receivers_.empty()) {
    std::lock_guard lock(mu_);
    for (Slot& s : slots_)
      if (s.peer.group)
        s.peer.group->abort("parameter server " + std::to_string(server_) + " failed");
  }
  for (std::thread& t : receivers_)
    if (t.joinable()) t.join();
}

void ParameterServer::receive(int worker) {
  Slot& slot = slots_[static_cast<size_t>(worker)];
  PsPeer peer;
  {
    std::lock_guard lock(mu_);
    peer = slot.peer;
  }
  for (;;) {
    try {
      receive_from(worker, peer);
      return;
    } catch (const std::exception& e) {
      if (!options_.relink) {
        std::lock_guard lock(mu_);
        if (!error_) error_ = std::current_exception();
        cv_.notify_all();
        return;
      }
      int64_t generation = 0;
      {
        // The others go on without it: its push in flight is dropped, its replies are not
        // waited for, and its replacement takes the parameters as they are when it joins.
        std::lock_guard lock(mu_);
        peer.group->abort(detail::str_cat("worker ", worker, " is gone"));
        slot.gone = true;
        slot.arrived = false;
        slot.sent.clear();
        generation = ++slot.generation;
        ++report_.lost;
        cv_.notify_all();
      }
      MT_LOG_WARN("parameter server", "server ", server_, ": worker ", worker, "'s link failed (",
                  e.what(), "); the other workers go on, and the process replacing it joins");
      try {
        peer = options_.relink(worker, generation);
      } catch (...) {
        std::lock_guard lock(mu_);
        if (!error_) error_ = std::current_exception();
        cv_.notify_all();
        return;
      }
      std::lock_guard lock(mu_);
      slot.peer = peer;
    }
  }
}

void ParameterServer::receive_from(int worker, const PsPeer& peer) {
  Slot& slot = slots_[static_cast<size_t>(worker)];
  comm::ProcessGroup& g = *peer.group;
  for (;;) {
    PushHeader h;
    g.recv(&h, sizeof h, DType::u8, peer.rank, kPsPushTag)->wait();
    if (h.flags & PushHeader::kDone) {
      std::lock_guard lock(mu_);
      slot.done = true;
      cv_.notify_all();
      return;
    }
    if (h.flags & PushHeader::kJoin) {
      std::lock_guard lock(mu_);
      slot.gone = false;
      PsReply r;
      r.version = version_;
      r.flags = PsReply::kJoined;
      r.clock = report_.worker_clock[static_cast<size_t>(worker)];
      reply(worker, r, {});
      MT_LOG_INFO("parameter server", "server ", server_, ": worker ", worker,
                  "'s replacement joined after its step ", r.clock, " (version ", version_, ")");
      cv_.notify_all();
      continue;
    }
    // The worker pushes again only after this push's reply, which comes after the slot was
    // consumed: the slot is free. Every chunk's receive is posted now, while the worker's
    // backward produces them; the record follows once its loss is known.
    std::vector<comm::WorkPtr> works;
    for (int64_t off = 0; off < n_; off += kPsChunkElements)
      works.push_back(g.recv(
          slot.data.data() + off, static_cast<size_t>(std::min(kPsChunkElements, n_ - off)),
          DType::f32, peer.rank, kPsDataTag + static_cast<uint32_t>(off / kPsChunkElements)));
    const int64_t step = h.step;
    works.push_back(g.recv(&h, sizeof h, DType::u8, peer.rank, kPsPushTag));
    for (comm::WorkPtr& w : works) w->wait();
    MT_CHECK(h.step == step, "worker ", worker, " sent the record of step ", h.step,
             " after the gradients of step ", step);
    std::lock_guard lock(mu_);
    MT_CHECK(!slot.arrived, "worker ", worker, " pushed step ", h.step,
             " before its previous push was answered");
    slot.header = h;
    slot.arrived = true;
    slot.arrival = ++arrivals_;
    report_.push_bytes += 2 * sizeof h + static_cast<uint64_t>(n_) * 4;
    cv_.notify_all();
  }
}

void ParameterServer::rethrow_locked() {
  if (error_) std::rethrow_exception(error_);
}

void ParameterServer::reply(int worker, PsReply header, const std::vector<float>& records) {
  Slot& slot = slots_[static_cast<size_t>(worker)];
  // A worker that is gone gets nothing: its replacement takes the parameters when it joins.
  if (slot.gone) return;
  try {
    for (comm::WorkPtr& w : slot.sent) w->wait();
  } catch (const CommError&) {
    // Its receiver learns it too and waits for the replacement.
    if (!options_.relink) throw;
    slot.sent.clear();
    slot.gone = true;
    return;
  }
  slot.sent.clear();
  slot.reply_header = header;
  std::copy(records.begin(), records.end(), slot.records.begin());
  float* dst = slot.reply.data();
  for (const auto& [name, p] : own_) {
    std::memcpy(dst, p.data<float>(), static_cast<size_t>(p.numel()) * 4);
    dst += p.numel();
  }
  comm::ProcessGroup& g = *slot.peer.group;
  const int to = slot.peer.rank;
  slot.sent.push_back(g.send(&slot.reply_header, sizeof(PsReply), DType::u8, to, kPsReplyTag));
  slot.sent.push_back(
      g.send(slot.records.data(), slot.records.size(), DType::f32, to, kPsReplyTag));
  if (n_ > 0)
    slot.sent.push_back(
        g.send(slot.reply.data(), static_cast<size_t>(n_), DType::f32, to, kPsReplyTag));
  report_.pull_bytes += sizeof(PsReply) + slot.records.size() * 4 + static_cast<uint64_t>(n_) * 4;
}

std::vector<double> ParameterServer::param_squares() const {
  std::vector<Tensor> grads;
  for (const auto& [name, p] : own_) grads.push_back(p.grad());
  return ops::sum_squares_each(grads);
}

ParameterServerReport ParameterServer::serve() {
  const auto start = Clock::now();
  for (int w = 0; w < layout_.workers; ++w) receivers_.emplace_back([this, w] { receive(w); });
  if (options_.consistency == PsConsistency::sync)
    serve_sync();
  else
    serve_async();
  for (Slot& s : slots_) {
    for (comm::WorkPtr& w : s.sent) w->wait();
    s.sent.clear();
  }
  for (std::thread& t : receivers_) t.join();
  receivers_.clear();
  report_.wall_s = seconds_since(start);
  return report_;
}

int64_t ParameterServer::first_step() {
  int64_t first = 1;
  {
    // The first push says where the workers start: a resumed run continues from this server's
    // own checkpoint of that step.
    std::unique_lock lock(mu_);
    const auto any = [&] {
      for (const Slot& s : slots_)
        if (s.arrived || s.done) return true;
      return error_ != nullptr;
    };
    cv_.wait(lock, any);
    rethrow_locked();
    for (const Slot& s : slots_)
      if (s.arrived) first = s.header.resumed + 1;
  }
  if (first > 1) load(first - 1);
  return first;
}

bool ParameterServer::saves_at(int64_t step) const {
  return !options_.checkpoint_dir.empty() &&
         ((options_.checkpoint_interval > 0 && step % options_.checkpoint_interval == 0) ||
          step == options_.last_step);
}

void ParameterServer::serve_sync() {
  const int W = layout_.workers;
  const bool decided_by_first = options_.backup_workers > 0 && layout_.servers > 1;
  const int64_t first = first_step();
  for (int64_t t = first;; ++t) {
    std::vector<int> accepted;
    {
      std::unique_lock lock(mu_);
      for (;;) {
        rethrow_locked();
        // A push of an older step came too late: its worker takes the parameters as they are
        // and trains that batch again.
        for (int w = 0; w < W; ++w) {
          Slot& s = slots_[static_cast<size_t>(w)];
          if (!s.arrived || s.header.step >= t) continue;
          s.arrived = false;
          ++report_.dropped;
          PsReply r;
          r.version = version_;
          reply(w, r, {});
        }
        if (decided_by_first && server_ != 0) break;
        int active = 0;
        for (const Slot& s : slots_) active += s.done ? 0 : 1;
        if (active == 0) break;  // accepted stays empty: the others learn that every worker is done
        // A checkpoint step waits for every worker, backups included: the saved state then
        // holds every worker's batches up to it, none is waiting to be trained again, and
        // every worker learns that the step is saved.
        const bool cut = options_.backup_workers > 0 && saves_at(t);
        const int needed = cut ? active : std::min(W - options_.backup_workers, active);
        std::vector<const Slot*> ready;
        for (const Slot& s : slots_)
          if (s.arrived && s.header.step == t) ready.push_back(&s);
        if (static_cast<int>(ready.size()) >= needed) {
          std::sort(ready.begin(), ready.end(),
                    [](const Slot* a, const Slot* b) { return a->arrival < b->arrival; });
          for (int k = 0; k < needed; ++k)
            accepted.push_back(static_cast<int>(ready[static_cast<size_t>(k)] - slots_.data()));
          break;
        }
        cv_.wait(lock);
      }
    }
    if (decided_by_first) {
      // The first server chose which workers' gradients make the step; the others follow.
      std::vector<int32_t> mask(static_cast<size_t>(W), 0);
      for (int w : accepted) mask[static_cast<size_t>(w)] = 1;
      servers_->broadcast(mask.data(), mask.size(), DType::i32)->wait();
      accepted.clear();
      for (int w = 0; w < W; ++w)
        if (mask[static_cast<size_t>(w)]) accepted.push_back(w);
      if (accepted.empty()) return;
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        if (error_) return true;
        for (int w : accepted) {
          const Slot& s = slots_[static_cast<size_t>(w)];
          if (!s.arrived || s.header.step != t) return false;
        }
        return true;
      });
      rethrow_locked();
    }
    if (accepted.empty()) return;  // every worker is done
    const auto busy = Clock::now();
    std::sort(accepted.begin(), accepted.end());
    // The average in rank order: the all-reduce's sum, divided by the count once.
    float* g = grad_.data<float>();
    const int n_acc = static_cast<int>(accepted.size());
    if (n_ > 0) {
      std::memcpy(g, slots_[static_cast<size_t>(accepted[0])].data.data(),
                  static_cast<size_t>(n_) * 4);
      for (int k = 1; k < n_acc; ++k) {
        const float* src =
            slots_[static_cast<size_t>(accepted[static_cast<size_t>(k)])].data.data();
        for (int64_t i = 0; i < n_; ++i) g[i] += src[i];
      }
      if (n_acc > 1) {
        const float count = static_cast<float>(n_acc);
        for (int64_t i = 0; i < n_; ++i) g[i] = g[i] / count;
      }
    }
    std::vector<float> records;
    for (int w : accepted) {
      const auto& r = slots_[static_cast<size_t>(w)].header.record;
      records.insert(records.end(), r.begin(), r.end());
    }
    // Every server's sum of squares per parameter, in the model's order: added up from zero in
    // that order, as a data-parallel rank adds up its whole gradients' sums.
    std::vector<double> sums = param_squares();
    if (servers_ && servers_->size() > 1) {
      std::vector<size_t> counts;
      for (const KeyRange& r : layout_.ranges) counts.push_back(r.end - r.begin);
      std::vector<double> all(layout_.ranges.back().end);
      servers_->all_gather_v(sums.data(), all.data(), counts, DType::i64)->wait();
      sums = std::move(all);
    }
    double squares = 0.0;
    for (double s : sums) squares += s;
    bool skipped = false;
    apply(records, n_acc, slots_[static_cast<size_t>(accepted[0])].header.lr, squares, &skipped);
    report_.applied += n_acc;
    report_.staleness_histogram.resize(std::max<size_t>(report_.staleness_histogram.size(), 1));
    report_.staleness_histogram[0] += n_acc;
    PsReply r;
    r.version = version_;
    r.grad_squares = squares;
    r.flags = PsReply::kAccepted | (skipped ? PsReply::kSkipped : 0u);
    r.records = n_acc;
    // The workers checkpoint this step too (runtime/checkpoint_policy.cpp): the server's state
    // of the step goes beside theirs before anyone can take the next step.
    bool stop = false;
    for (int k = 0; k < n_acc; ++k)
      stop = stop || records[static_cast<size_t>(k * kPsRecordFloats + 2)] > 0;
    const bool save_requested = records[3] > 0;
    // With backup workers only the cuts above are checkpoints: a stop or a timed request reaches
    // the accepted workers alone, and a dropped one would never write its part.
    const bool requested = options_.backup_workers == 0 && (stop || save_requested);
    const bool saved = saves_at(t) || (!options_.checkpoint_dir.empty() && requested);
    if (saved) {
      save(t);
      r.flags |= PsReply::kSaved;
    }
    std::lock_guard lock(mu_);
    for (int w : accepted) {
      Slot& s = slots_[static_cast<size_t>(w)];
      report_.worker_clock[static_cast<size_t>(w)] = s.header.step;
      s.arrived = false;
      reply(w, r, records);
    }
    report_.busy_s += seconds_since(busy);
  }
}

void ParameterServer::save(int64_t step) {
  namespace fs = std::filesystem;
  fs::create_directories(options_.checkpoint_dir);
  nn::NamedTensors tensors = own_;
  const optim::OptimizerState state = optimizer_->state_view();
  for (const auto& [name, t] : state.tensors) tensors.push_back({"optim." + name, t});
  ckpt::SafetensorsMetadata meta;
  meta["step"] = std::to_string(step);
  meta["version"] = std::to_string(version_);
  // Each scalar as its shortest round-trip text (JSON would turn a NaN into null).
  for (const auto& [k, v] : state.scalars) {
    char buf[64];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    meta["scalar." + k] = std::string(buf, end);
  }
  const fs::path dir(options_.checkpoint_dir);
  ckpt::save_safetensors((dir / ("step_" + std::to_string(step) + ".safetensors")).string(),
                         tensors, meta);
  // Retention as the workers': the newest keep_last and every keep_every-th step.
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f.starts_with("step_") && f.ends_with(".safetensors"))
      steps.push_back(std::stoll(f.substr(5, f.size() - 5 - 12)));
  }
  std::sort(steps.rbegin(), steps.rend());
  for (size_t i = 0; i < steps.size(); ++i) {
    const bool newest = options_.keep_last == 0 || i < static_cast<size_t>(options_.keep_last);
    const bool every = options_.keep_every > 0 && steps[i] % options_.keep_every == 0;
    if (!newest && !every) fs::remove(dir / ("step_" + std::to_string(steps[i]) + ".safetensors"));
  }
}

void ParameterServer::load(int64_t step) {
  const std::string path = (std::filesystem::path(options_.checkpoint_dir) /
                            ("step_" + std::to_string(step) + ".safetensors"))
                               .string();
  if (options_.checkpoint_dir.empty() || !std::filesystem::exists(path))
    MT_THROW(ValueError, "parameter server ", server_, ": the workers resume from step ", step,
             " but there is no ", path,
             "; the servers' checkpoints must sit beside the workers' (ckpt.dir)");
  const ckpt::SafetensorsFile f = ckpt::load_safetensors(path);
  // Everything is read and checked before anything changes.
  std::vector<Tensor> values;
  for (const auto& [name, p] : own_) {
    if (!f.contains(name) || f.at(name).shape() != p.shape())
      MT_THROW(ValueError, path, ": no parameter '", name, "' of shape ", shape_str(p.shape()),
               "; was it written by this model's server ", server_, "?");
    values.push_back(f.at(name));
  }
  optim::OptimizerState state;
  for (const auto& [name, t] : f.tensors)
    if (name.starts_with("optim.")) state.tensors.push_back({name.substr(6), t});
  for (const auto& [k, v] : f.metadata)
    if (k.starts_with("scalar.")) state.scalars[k.substr(7)] = std::strtod(v.c_str(), nullptr);
  optimizer_->load_state_dict(state);
  for (size_t i = 0; i < own_.size(); ++i) {
    Tensor p = own_[i].second;
    p.copy_(values[i]);
  }
  const auto v = f.metadata.find("version");
  version_ = v == f.metadata.end() ? step : std::stoll(v->second);
}

void ParameterServer::apply(const std::vector<float>& records, int count, float lr,
                            double grad_squares, bool* skipped) {
  StepOutcome unused;
  const float loss = StepRecord::combine(records, count, unused);
  // The worker's engine takes the same decision from the same bits (engine.cpp finish_step).
  const double norm = std::sqrt(0.0 + grad_squares);
  *skipped = !std::isfinite(loss) || !std::isfinite(norm);
  if (*skipped) {
    ++report_.skipped;
    return;
  }
  const float clip =
      options_.grad_clip > 0 ? optim::clip_coefficient(norm, options_.grad_clip) : 1.0f;
  optimizer_->set_lr(lr);
  optimizer_->step(clip);
  ++version_;
  ++report_.steps;
}

void ParameterServer::serve_async() {
  const int W = layout_.workers;
  const bool bounded = options_.consistency == PsConsistency::ssp;
  const int64_t first = first_step();
  // A resumed run's workers all start from the checkpoint's step.
  std::vector<int64_t> completed(static_cast<size_t>(W), first - 1);
  std::vector<int64_t> held(static_cast<size_t>(W), 0);  // a reply held back (its step), or 0
  std::vector<PsReply> held_reply(static_cast<size_t>(W));
  std::vector<std::vector<float>> held_record(static_cast<size_t>(W));
  int64_t decided = first - 1;  // the last checkpoint step whose cut is complete
  int64_t saved = 0;            // the last one saved (every worker reached it)
  // The slowest clock of the workers still training. A worker that is gone (its replacement not
  // joined yet) counts with its last applied step: ssp's bound holds the others within
  // `staleness` steps of it until its replacement has caught up, and a checkpoint's cut waits
  // for it as for a slow worker.
  auto slowest = [&] {
    int64_t m = std::numeric_limits<int64_t>::max();
    for (int w = 0; w < W; ++w)
      if (!slots_[static_cast<size_t>(w)].done) m = std::min(m, completed[static_cast<size_t>(w)]);
    return m;
  };
  // A checkpoint step is a cut: every worker's reply of that step waits until all of them have
  // been applied, so the saved state holds every gradient up to it and none after, and the
  // parameters all workers then pull (and save) are that state.
  auto releasable = [&](int64_t p) {
    if (bounded && slowest() < p - options_.staleness) return false;
    return !saves_at(p) || slowest() >= p;
  };
  std::unique_lock lock(mu_);
  for (;;) {
    rethrow_locked();
    for (int w = 0; w < W; ++w) {
      const int64_t p = held[static_cast<size_t>(w)];
      if (p == 0 || !releasable(p) || !saves_at(p) || decided >= p) continue;
      // Saved only when every worker reached the step: one that ended before it (a stop) would
      // never write its part of that checkpoint.
      // Nor while a worker is gone: it would never write its part (its replacement joins after
      // the step and arrives at the step's barrier in its place, so nobody waits for it).
      bool all = true;
      for (int v = 0; v < W; ++v)
        all = all && completed[static_cast<size_t>(v)] >= p && !slots_[static_cast<size_t>(v)].gone;
      if (all) {
        save(p);
        saved = p;
      }
      decided = p;
    }
    for (int w = 0; w < W; ++w) {
      int64_t& p = held[static_cast<size_t>(w)];
      if (p == 0 || !releasable(p)) continue;
      if (saved == p) held_reply[static_cast<size_t>(w)].flags |= PsReply::kSaved;
      reply(w, held_reply[static_cast<size_t>(w)], held_record[static_cast<size_t>(w)]);
      p = 0;
    }
    Slot* next = nullptr;
    for (Slot& s : slots_)
      if (s.arrived && (next == nullptr || s.arrival < next->arrival)) next = &s;
    if (next == nullptr) {
      bool all_done = true;
      for (const Slot& s : slots_) all_done = all_done && s.done;
      if (all_done) return;
      cv_.wait(lock);
      continue;
    }
    const auto busy = Clock::now();
    const int w = static_cast<int>(next - slots_.data());
    const PushHeader h = next->header;
    const int staleness = static_cast<int>(std::max<int64_t>(0, h.step - 1 - slowest()));
    if (n_ > 0) std::memcpy(grad_.data<float>(), next->data.data(), static_cast<size_t>(n_) * 4);
    next->arrived = false;
    std::vector<float> record(h.record.begin(), h.record.end());
    const float lr = options_.staleness_lr ? h.lr / (1.0f + static_cast<float>(staleness)) : h.lr;
    bool skipped = false;
    apply(record, 1, lr, h.grad_squares, &skipped);
    completed[static_cast<size_t>(w)] = h.step;
    report_.worker_clock[static_cast<size_t>(w)] = h.step;
    ++report_.applied;
    if (report_.staleness_histogram.size() <= static_cast<size_t>(staleness))
      report_.staleness_histogram.resize(static_cast<size_t>(staleness) + 1);
    ++report_.staleness_histogram[static_cast<size_t>(staleness)];
    report_.max_staleness = std::max(report_.max_staleness, staleness);
    PsReply r;
    r.version = version_;
    r.grad_squares = h.grad_squares;
    r.flags = PsReply::kAccepted | (skipped ? PsReply::kSkipped : 0u);
    r.staleness = staleness;
    r.records = 1;
    if (!releasable(h.step) || saves_at(h.step)) {
      held[static_cast<size_t>(w)] = h.step;
      held_reply[static_cast<size_t>(w)] = r;
      held_record[static_cast<size_t>(w)] = record;
    } else {
      reply(w, r, record);
    }
    report_.busy_s += seconds_since(busy);
  }
}

}  // namespace meshtrain::parallel
