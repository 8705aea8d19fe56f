// ProcessGroupBase: argument checks, the FIFO worker, abort and the watchdog.
#include "meshtrain/comm/process_group_base.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <sstream>
#include <thread>

#include "meshtrain/comm/collective_observer.h"
#include "meshtrain/comm/termination.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::comm {

namespace {

// How long an operation queued into an idle group is left to its issuer (see enqueue).
constexpr auto kLeaveToIssuer = std::chrono::microseconds(50);

// True when a failure message's "ranks [a, b, ...]" list contains `rank`.
bool names_rank(const std::string& msg, int rank) {
  for (size_t pos = msg.find("ranks ["); pos != std::string::npos;
       pos = msg.find("ranks [", pos + 1)) {
    std::istringstream is(msg.substr(pos + 7, msg.find(']', pos) - pos - 7));
    std::string item;
    while (std::getline(is, item, ',')) {
      if (std::atoi(item.c_str()) == rank && item.find_first_of("0123456789") != std::string::npos)
        return true;
    }
  }
  return false;
}

}  // namespace
namespace {

void check_buffer(const void* p, size_t count, DType dtype, const char* what) {
  MT_CHECK(count == 0 || p != nullptr, what, " buffer is null but count is ", count);
  MT_CHECK(count <= (SIZE_MAX / 64) / dtype_size(dtype), what, " count ", count, " too large");
}

// Set while this thread runs an observed collective: a composite group (hier) issues its inner
// groups' collectives from there, and those are part of the outer one, not reported again.
thread_local bool t_in_observed_collective = false;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ProcessGroupBase::ProcessGroupBase(std::shared_ptr<Store> store, int rank, int size,
                                   ProcessGroupOptions opts, std::string backend)
    : ProcessGroup(rank, size),
      store_(std::move(store)),
      opts_(std::move(opts)),
      backend_(std::move(backend)),
      recorder_(opts_.flight_recorder_size),
      shm_budget_(opts_.shm_budget) {
  MT_CHECK(size >= 1, "process group size must be positive, got ", size);
  MT_CHECK(rank >= 0 && rank < size, "rank ", rank, " out of range for group size ", size);
  MT_CHECK(store_ != nullptr, "process group needs a store");
  if (const auto env = env_value(Env::comm_algo)) env_algorithm_ = parse_algorithm(*env);
}

ProcessGroupBase::~ProcessGroupBase() {
  stop();
}

void ProcessGroupBase::start() {
  {
    std::lock_guard lock(helping_->mu);
    helping_->group = this;
  }
  worker_ = std::thread([this] { worker_loop(); });
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

void ProcessGroupBase::stop() {
  {
    // Waits for a waiter that is running an operation of this group.
    std::lock_guard lock(helping_->mu);
    helping_->group = nullptr;
  }
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify();
  watchdog_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (watchdog_.joinable()) watchdog_.join();
  // Operations still queued never ran.
  std::deque<Task> left;
  {
    std::lock_guard lock(mu_);
    left.swap(queue_);
  }
  for (auto& t : left) {
    t.work->finish(std::make_exception_ptr(CommError(
        detail::str_cat(t.ctx.op, " (seq ", t.ctx.seq, ") cancelled: process group destroyed"))));
  }
}

WorkPtr ProcessGroupBase::enqueue(const char* op, DType dtype, size_t count,
                                  std::optional<Duration> timeout, Algorithm algorithm,
                                  bool async_op, std::function<void(OpContext&)> fn,
                                  const std::function<int64_t()>& on_issue) {
  Task task;
  task.ctx.op = op;
  task.ctx.timeout = timeout.value_or(opts_.timeout);
  task.ctx.algorithm = algorithm != Algorithm::automatic         ? algorithm
                       : opts_.algorithm != Algorithm::automatic ? opts_.algorithm
                                                                 : env_algorithm_;
  if (has_collective_observer() && !t_in_observed_collective) {
    // Time the operation on the group's thread and report it, success or failure.
    const uint64_t bytes = static_cast<uint64_t>(count) * dtype_size(dtype);
    task.fn = [op, bytes, inner = std::move(fn)](OpContext& ctx) {
      const auto start = std::chrono::steady_clock::now();
      auto seconds = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      };
      try {
        t_in_observed_collective = true;
        inner(ctx);
        t_in_observed_collective = false;
      } catch (...) {
        t_in_observed_collective = false;
        notify_collective({.op = op, .bytes = bytes, .seconds = seconds(), .ok = false});
        throw;
      }
      notify_collective({.op = op, .bytes = bytes, .seconds = seconds(), .ok = true});
    };
  } else {
    task.fn = std::move(fn);
  }
  WorkPtr work;
  bool run_here = false;
  {
    std::lock_guard lock(mu_);
    MT_CHECK(!stopping_, "process group is shutting down");
    task.ctx.seq = next_seq_++;
    task.ctx.collective_seq = next_collective_seq_++;
    if (on_issue) task.ctx.ticket = on_issue();
    work = std::make_shared<Work>(op, task.ctx.seq);
    task.work = work;
    recorder_.record_queued(task.ctx.seq, op, dtype, count);
    // Nothing ahead of it and nothing running: a small operation runs right here, in order.
    const uint64_t bytes = static_cast<uint64_t>(count) * dtype_size(dtype);
    const bool idle = queue_.empty() && !busy_;
    if (idle && (bytes <= inline_bytes() || !async_op) &&
        std::this_thread::get_id() != worker_.get_id()) {
      busy_ = true;
      running_op_ = task.ctx.op;
      run_here = true;
    } else {
      // Set before anyone else sees the Work; an operation run right here never needs it.
      work->set_helper([helping = helping_, target = work.get()] {
        std::lock_guard lock(helping->mu);
        if (helping->group != nullptr) helping->group->help_until(target);
      });
      queue_.push_back(std::move(task));
      // Into an idle group: the issuer gets a moment to wait for it and run it itself; the
      // group's thread takes it only after that (an operation overlapped with compute, as DDP's
      // buckets are). Behind running work: whoever runs that work goes on to this one.
      if (idle && async_op) wake_.notify_after(leave_to_issuer(queue_.back().ctx));
    }
  }
  if (!run_here) {
    if (async_op || std::this_thread::get_id() == worker_.get_id()) {
      return work;
    }
    // Blocking: the operations ahead are running or about to; this caller runs what is left up
    // to its own. The failure, if any, stays in the Work, as for an asynchronous operation.
    try {
      work->wait();
    } catch (const std::exception&) {
    }
    return work;
  }
  run_task(task);
  // Operations issued by other threads meanwhile waited for this one.
  if (release()) wake_.notify();
  return work;
}

void ProcessGroupBase::worker_loop() {
  // No polling for the next operation: a caller that waits for a queued one runs it itself
  // (help_until) when this thread has not taken it yet. Polling here, this thread took every
  // operation that followed one it ran, and the hand-offs came back; woken at every issue, it
  // took the core from the issuer each time (2 ranks on 2 cores, 128 KiB-1 MiB: 2-4 GB/s in
  // half the runs against 6-7 when the issuer runs the operation undisturbed).
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mu_);
      while (!((stopping_ && queue_.empty()) || (!queue_.empty() && !busy_))) {
        lock.unlock();
        wake_.wait();
        lock.lock();
      }
      if (queue_.empty()) return;  // stopping with nothing left
      task = claim_front();
    }
    run_task(task);
    release();
  }
}

ProcessGroupBase::Task ProcessGroupBase::claim_front() {
  Task task = std::move(queue_.front());
  queue_.pop_front();
  running_op_ = task.ctx.op;
  busy_ = true;
  return task;
}

std::optional<std::chrono::microseconds> ProcessGroupBase::release() {
  std::lock_guard lock(mu_);
  busy_ = false;
  if (queue_.empty()) return std::nullopt;
  return leave_to_issuer(queue_.front().ctx);
}

void ProcessGroupBase::help_until(const Work* target) {
  if (std::this_thread::get_id() == worker_.get_id()) return;
  for (;;) {
    Task task;
    {
      std::lock_guard lock(mu_);
      // Something runs (the group's thread, or another caller) or the target is not queued any
      // more: the caller waits as usual.
      if (busy_ || stopping_ || std::none_of(queue_.begin(), queue_.end(), [&](const Task& t) {
            return t.work.get() == target;
          }))
        return;
      task = claim_front();
      // Nothing left for the group's thread: take back the wake-up armed for this operation.
      if (queue_.empty()) wake_.cancel_later();
    }
    run_task(task);
    const auto later = release();
    if (task.work.get() == target) {
      // What is left gets the same moment as at issue before the group's thread takes it: the
      // caller often waits for the next operation right away (DDP's buckets, in order) and then
      // runs it here, where waking the group's thread would take a core that a peer needs.
      if (later) wake_.notify_after(*later);
      return;
    }
  }
}

void ProcessGroupBase::run_task(Task& task) {
  OpContext& ctx = task.ctx;
  std::exception_ptr error;
  try {
    throw_if_aborted();
    ctx.deadline = std::chrono::steady_clock::now() + ctx.timeout;
    recorder_.record_started(ctx.seq, algorithm_label(ctx));
    running_seq_.store(ctx.seq, std::memory_order_relaxed);
    running_since_ns_.store(now_ns(), std::memory_order_relaxed);
    running_.store(true, std::memory_order_release);
    task.fn(ctx);
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::string msg = detail::str_cat(ctx.op, " (seq ", ctx.seq, ", group '", opts_.name,
                                      "', rank ", rank(), "/", size(), ") failed: ", what);
    std::string reason;
    if (aborted()) {
      std::lock_guard lock(mu_);
      reason = abort_reason_;
    }
    if (aborted() && what.rfind("group aborted", 0) == 0) {
      msg = what;
    } else if (!reason.empty() && what.find(reason) != std::string::npos) {
      // The transport failed with this rank's own abort (the watchdog's): its reason names the
      // operation already, and there is no other rank's root cause to look up.
      msg = "group aborted: " + reason;
    } else {
      // Another rank's root cause is added only when it blames someone else: a report that
      // names this rank as missing describes the same failure from the other side.
      const std::string first = first_failure(msg);
      if (first != msg && !names_rank(first, rank()))
        msg += "; first failure in the group: " + first;
    }
    error = std::make_exception_ptr(CommError(msg));
    recorder_.record_finished(ctx.seq, false, what);
    abort(msg);
  }
  running_.store(false, std::memory_order_release);
  if (!error) recorder_.record_finished(ctx.seq, true);
  task.work->finish(error);
}

std::string ProcessGroupBase::first_failure(const std::string& mine) {
  // The first rank to fail records its reason in the store before it aborts (and so before it
  // closes its connections). A rank that only saw the fallout -- a neighbour hanging up on it --
  // then reports the root cause too, instead of blaming the neighbour alone. The store may be
  // unreachable itself, so the lookup runs on its own thread and is abandoned after a second.
  auto result = std::make_shared<std::promise<std::string>>();
  std::future<std::string> answer = result->get_future();
  std::thread([store = store_, key = "failure/" + opts_.name, mine, result] {
    try {
      Bytes stored = store->compare_set(key, {}, Bytes(mine.begin(), mine.end()));
      result->set_value(std::string(stored.begin(), stored.end()));
    } catch (...) {
      result->set_value(mine);
    }
  }).detach();
  if (answer.wait_for(std::chrono::seconds(1)) != std::future_status::ready) return mine;
  return answer.get();
}

void ProcessGroupBase::watchdog_loop() {
  uint64_t warned_seq = UINT64_MAX;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    watchdog_cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stopping_) break;
    lock.unlock();
    on_watchdog_tick();
    abandon_on_termination();
    if (running_.load(std::memory_order_acquire) && !aborted()) {
      uint64_t seq = running_seq_.load(std::memory_order_relaxed);
      int64_t age_ns = now_ns() - running_since_ns_.load(std::memory_order_relaxed);
      if (seq != warned_seq &&
          age_ns > std::chrono::duration_cast<std::chrono::nanoseconds>(opts_.warn_after).count()) {
        warned_seq = seq;
        std::ostringstream os;
        std::string op;
        {
          std::lock_guard g(mu_);
          op = running_op_;
        }
        os << op << " (seq " << seq << ") has run for " << age_ns / 1000000
           << " ms; waiting for ranks [";
        auto missing = waiting_for();
        for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
        os << "]";
        log_warning(os.str());
      }
    }
    lock.lock();
  }
}

void ProcessGroupBase::abandon_on_termination() {
  if (!running_.load(std::memory_order_acquire) || aborted()) return;
  const std::optional<TerminationSignal> term = termination_signal();
  if (!term) return;
  const int64_t seq = static_cast<int64_t>(running_seq_.load(std::memory_order_relaxed));
  const auto started = std::chrono::steady_clock::time_point(
      std::chrono::nanoseconds(running_since_ns_.load(std::memory_order_relaxed)));
  const auto now = std::chrono::steady_clock::now();
  // Measured from the later of the signal and the operation's start: the step in flight and the
  // preemption save after it get their collectives' full allowance each.
  if (now - std::max(started, term->at) < abandon_after()) return;
  std::string op;
  {
    std::lock_guard g(mu_);
    op = running_op_;
  }
  const std::vector<int> missing = waiting_for();
  std::ostringstream os;
  const char* name = ::sigabbrev_np(term->sig);
  os << op << " (seq " << seq << ", group '" << opts_.name << "', rank " << rank() << "/" << size()
     << ") abandoned on SIG" << (name != nullptr ? name : std::to_string(term->sig))
     << " after waiting "
     << std::chrono::duration_cast<std::chrono::milliseconds>(now - started).count()
     << " ms for ranks [";
  for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
  os << "]";
  abort(os.str());
}

void ProcessGroupBase::abort(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (aborted_.load()) return;
    abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  log_warning("group aborted: " + reason + "\nlast collectives:\n" + recorder_.dump_text());
  on_abort(reason);
}

void ProcessGroupBase::throw_if_aborted() const {
  if (!aborted()) return;
  std::string reason;
  {
    std::lock_guard lock(mu_);
    reason = abort_reason_;
  }
  MT_THROW(CommError, "group aborted: ", reason);
}

void ProcessGroupBase::log_warning(const std::string& msg) const {
  MT_LOG_WARN("comm", backend_, " group '", opts_.name, "' rank ", rank(), "/", size(), " pid ",
              ::getpid(), ": ", msg);
}

uint64_t ProcessGroupBase::next_seq() const {
  std::lock_guard lock(mu_);
  return next_seq_;
}

std::string ProcessGroupBase::flight_recorder_json() const {
  return recorder_.dump_json(opts_.name, rank());
}

WorkPtr ProcessGroupBase::all_reduce(void* data, size_t count, DType dtype,
                                     const AllReduceOptions& opts) {
  check_buffer(data, count, dtype, "all_reduce");
  ReduceOp op = opts.op;
  return enqueue(
      "all_reduce", dtype, count, opts.timeout, opts.algorithm, opts.async_op,
      [=, this](OpContext& ctx) { run_all_reduce(ctx, data, count, dtype, op); },
      [=, this] { return on_issue_all_reduce(data, count, dtype, op); });
}

std::chrono::microseconds ProcessGroupBase::leave_to_issuer(const OpContext& /*ctx*/) const {
  return kLeaveToIssuer;
}

WorkPtr ProcessGroupBase::broadcast(void* data, size_t count, DType dtype,
                                    const BroadcastOptions& opts) {
  check_buffer(data, count, dtype, "broadcast");
  MT_CHECK(opts.root >= 0 && opts.root < size(), "broadcast root ", opts.root, " out of range");
  int root = opts.root;
  return enqueue("broadcast", dtype, count, opts.timeout, opts.algorithm, opts.async_op,
                 [=, this](OpContext& ctx) { run_broadcast(ctx, data, count, dtype, root); });
}

WorkPtr ProcessGroupBase::reduce(void* data, size_t count, DType dtype, const ReduceOptions& opts) {
  check_buffer(data, count, dtype, "reduce");
  MT_CHECK(opts.root >= 0 && opts.root < size(), "reduce root ", opts.root, " out of range");
  int root = opts.root;
  ReduceOp op = opts.op;
  return enqueue("reduce", dtype, count, opts.timeout, opts.algorithm, opts.async_op,
                 [=, this](OpContext& ctx) { run_reduce(ctx, data, count, dtype, op, root); });
}

WorkPtr ProcessGroupBase::all_gather(const void* input, void* output, size_t count, DType dtype,
                                     const AllGatherOptions& opts) {
  check_buffer(input, count, dtype, "all_gather input");
  check_buffer(output, count * size(), dtype, "all_gather output");
  std::vector<size_t> counts(size(), count);
  return enqueue(
      "all_gather", dtype, count, opts.timeout, opts.algorithm, opts.async_op,
      [=, this](OpContext& ctx) { run_all_gather_v(ctx, input, output, counts, dtype); },
      [=, this] { return on_issue_all_gather(input, output, count, dtype); });
}

WorkPtr ProcessGroupBase::all_gather_v(const void* input, void* output, std::vector<size_t> counts,
                                       DType dtype, const AllGatherOptions& opts) {
  MT_CHECK(counts.size() == static_cast<size_t>(size()), "all_gather_v needs ", size(),
           " counts, got ", counts.size());
  size_t total = 0;
  for (size_t c : counts) total += c;
  check_buffer(input, counts[rank()], dtype, "all_gather_v input");
  check_buffer(output, total, dtype, "all_gather_v output");
  return enqueue("all_gather_v", dtype, total, opts.timeout, opts.algorithm, opts.async_op,
                 [=, this, counts = std::move(counts)](OpContext& ctx) {
                   run_all_gather_v(ctx, input, output, counts, dtype);
                 });
}

WorkPtr ProcessGroupBase::reduce_scatter(const void* input, void* output, size_t count, DType dtype,
                                         const ReduceScatterOptions& opts) {
  check_buffer(input, count * size(), dtype, "reduce_scatter input");
  check_buffer(output, count, dtype, "reduce_scatter output");
  ReduceOp op = opts.op;
  return enqueue(
      "reduce_scatter", dtype, count, opts.timeout, opts.algorithm, opts.async_op,
      [=, this](OpContext& ctx) { run_reduce_scatter(ctx, input, output, count, dtype, op); },
      [=, this] { return on_issue_reduce_scatter(input, count, dtype, op); });
}

WorkPtr ProcessGroupBase::gather(const void* input, void* output, size_t count, DType dtype,
                                 const GatherOptions& opts) {
  MT_CHECK(opts.root >= 0 && opts.root < size(), "gather root ", opts.root, " out of range");
  check_buffer(input, count, dtype, "gather input");
  if (rank() == opts.root) check_buffer(output, count * size(), dtype, "gather output");
  int root = opts.root;
  return enqueue("gather", dtype, count, opts.timeout, opts.algorithm, opts.async_op,
                 [=, this](OpContext& ctx) { run_gather(ctx, input, output, count, dtype, root); });
}

WorkPtr ProcessGroupBase::scatter(const void* input, void* output, size_t count, DType dtype,
                                  const ScatterOptions& opts) {
  MT_CHECK(opts.root >= 0 && opts.root < size(), "scatter root ", opts.root, " out of range");
  if (rank() == opts.root) check_buffer(input, count * size(), dtype, "scatter input");
  check_buffer(output, count, dtype, "scatter output");
  int root = opts.root;
  return enqueue(
      "scatter", dtype, count, opts.timeout, opts.algorithm, opts.async_op,
      [=, this](OpContext& ctx) { run_scatter(ctx, input, output, count, dtype, root); });
}

WorkPtr ProcessGroupBase::all_to_all(const void* input, void* output, size_t count, DType dtype,
                                     const AllToAllOptions& opts) {
  check_buffer(input, count * size(), dtype, "all_to_all input");
  check_buffer(output, count * size(), dtype, "all_to_all output");
  return enqueue("all_to_all", dtype, count, opts.timeout, opts.algorithm, opts.async_op,
                 [=, this](OpContext& ctx) { run_all_to_all(ctx, input, output, count, dtype); });
}

WorkPtr ProcessGroupBase::all_to_all_v(const void* input, const std::vector<size_t>& send_counts,
                                       void* output, const std::vector<size_t>& recv_counts,
                                       DType dtype, const AllToAllOptions& opts) {
  const size_t n = static_cast<size_t>(size());
  MT_CHECK(send_counts.size() == n, "all_to_all_v needs ", n, " send counts, got ",
           send_counts.size());
  MT_CHECK(recv_counts.size() == n, "all_to_all_v needs ", n, " receive counts, got ",
           recv_counts.size());
  size_t sent = 0, received = 0;
  for (size_t j = 0; j < n; ++j) {
    // Checked one by one so that the sums cannot wrap around.
    check_buffer(input, send_counts[j], dtype, "all_to_all_v input");
    check_buffer(output, recv_counts[j], dtype, "all_to_all_v output");
    sent += send_counts[j];
    received += recv_counts[j];
  }
  check_buffer(input, sent, dtype, "all_to_all_v input");
  check_buffer(output, received, dtype, "all_to_all_v output");
  // What this rank sends stands for the operation's size (flight recorder, observers), as the
  // input does for the other collectives.
  return enqueue("all_to_all_v", dtype, sent, opts.timeout, opts.algorithm, opts.async_op,
                 [=, this](OpContext& ctx) {
                   run_all_to_all_v(ctx, input, send_counts, output, recv_counts, dtype);
                 });
}

WorkPtr ProcessGroupBase::post_p2p(const char* op, DType dtype, size_t count,
                                   std::optional<Duration> timeout,
                                   const std::function<RequestPtr(SteadyTime)>& post) {
  uint64_t seq;
  WorkPtr work;
  {
    std::lock_guard lock(mu_);
    MT_CHECK(!stopping_, "process group is shutting down");
    seq = next_seq_++;
    work = std::make_shared<Work>(op, seq);
    recorder_.record_queued(seq, op, dtype, count);
  }
  recorder_.record_started(seq, "p2p");
  auto fail = [this, work, seq, op](const std::string& what) {
    std::string msg = detail::str_cat(op, " (seq ", seq, ", group '", opts_.name, "', rank ",
                                      rank(), "/", size(), ") failed: ", what);
    if (aborted() && what.rfind("group aborted", 0) == 0) msg = what;
    recorder_.record_finished(seq, false, what);
    abort(msg);
    work->finish(std::make_exception_ptr(CommError(msg)));
  };
  try {
    throw_if_aborted();
    RequestPtr req = post(std::chrono::steady_clock::now() + timeout.value_or(opts_.timeout));
    // A transport that lets the waiting thread move the bytes (Request::driver) gets that thread
    // from wait(), instead of a sleep until the transport's thread has done it.
    if (req->driver) work->set_helper([req] { req->drive_until_done(); });
    p2p_transport().watch(req);
    req->on_completion([this, work, seq, fail](std::exception_ptr e) {
      if (!e) {
        recorder_.record_finished(seq, true);
        work->finish();
        return;
      }
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        fail(ex.what());
      }
    });
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return work;
}

WorkPtr ProcessGroupBase::send(const void* data, size_t count, DType dtype, int dst, uint32_t tag,
                               const SendRecvOptions& opts) {
  check_buffer(data, count, dtype, "send");
  MT_CHECK(dst >= 0 && dst < size() && dst != rank(), "send destination ", dst, " invalid");
  size_t bytes = count * dtype_size(dtype);
  return post_p2p("send", dtype, count, opts.timeout, [&](SteadyTime deadline) {
    return p2p_transport().post_send(dst, tag, data, bytes, deadline);
  });
}

WorkPtr ProcessGroupBase::recv(void* data, size_t count, DType dtype, int src, uint32_t tag,
                               const SendRecvOptions& opts) {
  check_buffer(data, count, dtype, "recv");
  MT_CHECK(src >= 0 && src < size() && src != rank(), "recv source ", src, " invalid");
  size_t bytes = count * dtype_size(dtype);
  return post_p2p("recv", dtype, count, opts.timeout, [&](SteadyTime deadline) {
    return p2p_transport().post_recv(src, tag, data, bytes, deadline);
  });
}

WorkPtr ProcessGroupBase::barrier(const BarrierOptions& opts) {
  return enqueue("barrier", DType::u8, 0, opts.timeout, Algorithm::automatic, opts.async_op,
                 [this](OpContext& ctx) { run_barrier(ctx); });
}

ProcessGroupPtr ProcessGroupBase::split(const std::vector<int>& ranks) {
  return split_with_backend(ranks, backend_);
}

ProcessGroupPtr ProcessGroupBase::split_with_backend(const std::vector<int>& ranks,
                                                     const std::string& backend) {
  // Every member of this group calls split in the same order, so the counter names the same
  // sub-group on every rank without any communication.
  int k = split_counter_++;
  int new_rank = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    MT_CHECK(ranks[i] >= 0 && ranks[i] < size(), "split: rank ", ranks[i], " out of range");
    for (size_t j = 0; j < i; ++j)
      MT_CHECK(ranks[j] != ranks[i], "split: rank ", ranks[i], " twice");
    if (ranks[i] == rank()) new_rank = static_cast<int>(i);
  }
  if (new_rank < 0) return nullptr;
  ProcessGroupOptions sub = opts_;
  sub.name = opts_.name + "/split" + std::to_string(k);
  // Every member walks the plan alike (the counter), so every one gives the same share.
  sub.shm_budget =
      split_shm_budget(shm_budget_, static_cast<size_t>(k), static_cast<int>(ranks.size()));
  return make_process_group(backend, store_, new_rank, static_cast<int>(ranks.size()), sub);
}

}  // namespace meshtrain::comm
