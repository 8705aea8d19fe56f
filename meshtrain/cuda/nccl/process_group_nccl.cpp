// NCCL collectives behind comm::ProcessGroup; see process_group_nccl.h for the contract. The
// communicator is non-blocking (NCCL's blocking=0), so that initialisation and every call can be
// bounded by a deadline and aborted, instead of hanging in NCCL when a peer is gone.
#include "meshtrain/cuda/nccl/process_group_nccl.h"

#include <cstring>
#include <mutex>
#include <vector>

#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/device.h"
#include "meshtrain/cuda/nccl/nccl_backend.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cuda {
namespace {

using ::meshtrain::CommError;
using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  MT_THROW(ValueError, "nccl: unsupported dtype");
}

ncclRedOp_t nccl_op(comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::sum:
      return ncclSum;
    case comm::ReduceOp::avg:
      return ncclAvg;
    case comm::ReduceOp::min:
      return ncclMin;
    case comm::ReduceOp::max:
      return ncclMax;
    case comm::ReduceOp::product:
      return ncclProd;
  }
  MT_THROW(ValueError, "nccl: unsupported reduce op");
}

void check_nccl(ncclResult_t r, ncclComm_t comm, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  MT_THROW(CommError, "nccl: ", what, " failed: ", ncclGetErrorString(r),
           last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : std::string());
}

// One poll of a non-blocking communicator: true once its last call has been enqueued; throws if
// it failed.
bool is_ready(ncclComm_t comm, const std::string& what) {
  ncclResult_t st = ncclSuccess;
  check_nccl(ncclCommGetAsyncError(comm, &st), comm, "ncclCommGetAsyncError");
  if (st == ncclSuccess) return true;
  check_nccl(st, comm, what.c_str());
  return false;
}

// Polls (`poll()`: is_ready, or a variant) until it says ready or the deadline passes.
template <typename Poll>
void poll_until(Poll poll, Clock::time_point deadline, const std::string& what) {
  while (!poll()) {
    if (Clock::now() > deadline) MT_THROW(CommError, "nccl: ", what, " did not finish in time");
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void wait_ready(ncclComm_t comm, Clock::time_point deadline, const std::string& what) {
  poll_until([&] { return is_ready(comm, what); }, deadline, what);
}

// ncclGroupStart ... ncclGroupEnd: a call that throws in between would leave the thread's NCCL
// group open, and later calls from the thread (on any communicator) would only be queued into it,
// never launched; the guard closes it on the way out.
class NcclGroup {
 public:
  explicit NcclGroup(ncclComm_t comm) : comm_(comm) {
    check_nccl(ncclGroupStart(), comm_, "ncclGroupStart");
  }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  void end() {
    open_ = false;
    check_nccl(ncclGroupEnd(), comm_, "ncclGroupEnd");
  }

 private:
  ncclComm_t comm_;
  bool open_ = true;
};

size_t bytes_of(size_t count, DType t) {
  return count * dtype_size(t);
}

// A root or peer outside the group: NCCL would fail the call inside a group, after others were
// queued, and the group would be aborted for a caller's mistake.
void check_peer(int r, int size, const char* op, const char* role) {
  MT_CHECK(r >= 0 && r < size, "nccl ", op, ": ", role, " ", r, " is not a rank of the group of ",
           size);
}

const char* at(const void* p, size_t count, DType t) {
  return static_cast<const char*>(p) + bytes_of(count, t);
}
char* at(void* p, size_t count, DType t) {
  return static_cast<char*>(p) + bytes_of(count, t);
}

}  // namespace

ProcessGroupNccl::ProcessGroupNccl(std::shared_ptr<comm::Store> store, int rank, int size,
                                   const comm::ProcessGroupOptions& opts)
    : comm::ProcessGroup(rank, size),
      opts_(opts),
      device_(current_device()),
      recorder_(opts.flight_recorder_size) {
  MT_CHECK(size >= 1 && rank >= 0 && rank < size, "nccl: rank ", rank, " of ", size);
  const std::string key = "pg/" + opts.name + "/nccl_id";
  ncclUniqueId id;
  if (rank == 0) {
    check_nccl(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
    store->set(key, comm::Bytes(reinterpret_cast<const uint8_t*>(id.internal),
                                reinterpret_cast<const uint8_t*>(id.internal) + sizeof(id)));
  } else {
    store->wait({key}, opts.timeout);
    const comm::Bytes b = store->get(key);
    MT_CHECK(b.size() == sizeof(id), "nccl: the id in the store has ", b.size(), " bytes");
    std::memcpy(id.internal, b.data(), sizeof(id));
  }
  DeviceGuard guard(device_);
  stream_ = Stream::create(device_, highest_stream_priority(device_));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  check_nccl(ncclCommInitRankConfig(&comm_, size, id, rank, &config), nullptr,
             "ncclCommInitRankConfig");
  try {
    wait_ready(comm_, Clock::now() + opts.timeout,
               "creating the communicator of group '" + opts.name + "'");
  } catch (...) {
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    throw;
  }
  start_watchdog();
}

ProcessGroupNccl::ProcessGroupNccl(ncclComm_t comm, int rank, int size,
                                   const comm::ProcessGroupOptions& opts)
    : comm::ProcessGroup(rank, size),
      opts_(opts),
      device_(current_device()),
      comm_(comm),
      recorder_(opts.flight_recorder_size) {
  DeviceGuard guard(device_);
  stream_ = Stream::create(device_, highest_stream_priority(device_));
  start_watchdog();
}

void ProcessGroupNccl::start_watchdog() {
  // From the caller's stream's pool, which outlives the group (a pool of the group's own stream
  // would be left behind, keyed by a destroyed stream, by every group and split).
  const cudaStream_t caller = current_stream(device_);
  barrier_buf_ = CachingAllocator::for_device(device_).allocate(sizeof(float), caller);
  MT_CUDA_CHECK(cudaMemsetAsync(barrier_buf_, 0, sizeof(float), caller));
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

ProcessGroupNccl::~ProcessGroupNccl() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  DeviceGuard guard(device_);
  // Collectives that finished complete as they would have; any still in flight (a peer may be
  // gone, and no watchdog is left to enforce their deadlines) abort the communicator rather than
  // make the destructor wait on them.
  size_t in_flight = 0;
  std::vector<comm::WorkPtr> finished;
  {
    std::lock_guard lock(mu_);
    while (!pending_.empty()) {
      bool done = false;
      try {
        done = pending_.front().done.query();
      } catch (const std::exception&) {
        // A device error: the collective counts as in flight, and the group is aborted.
      }
      if (!done) break;
      finished.push_back(std::move(pending_.front().work));
      pending_.pop_front();
    }
    in_flight = pending_.size();
  }
  // Completed outside the lock, as the watchdog does (a Work's waiters may call back).
  for (const comm::WorkPtr& w : finished) {
    recorder_.record_finished(w->seq(), true);
    w->finish();
  }
  if (in_flight > 0) {
    abort(::meshtrain::detail::str_cat("the process group was destroyed with ", in_flight,
                                       " collectives in flight"));
  } else if (!aborted_ && comm_ != nullptr) {
    // A non-blocking communicator is finalised (bounded by the group's timeout), then destroyed;
    // one that does not finalise in time is aborted.
    bool finalised = false;
    try {
      check_nccl(ncclCommFinalize(comm_), comm_, "ncclCommFinalize");
      wait_ready(comm_, Clock::now() + opts_.timeout, "finalising group '" + opts_.name + "'");
      finalised = true;
    } catch (const std::exception&) {
      // Not finalised in time, or failed: aborted below.
    }
    if (finalised) {
      (void)ncclCommDestroy(comm_);
    } else {
      (void)ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  fail_all("the process group was destroyed");
  if (barrier_buf_ != nullptr) CachingAllocator::for_device(device_).free(barrier_buf_);
}

void ProcessGroupNccl::wait_issued(const char* op, uint64_t seq) {
  const auto deadline = Clock::now() + opts_.timeout;
  const std::string what = std::string(op) + " #" + std::to_string(seq);
  // One poll at a time under comm_mu_, so that an abort (which frees the communicator) comes
  // between two polls, never during one.
  poll_until(
      [&] {
        std::lock_guard comm_lock(comm_mu_);
        if (comm_ == nullptr) MT_THROW(CommError, "nccl: ", what, ": the group was aborted");
        return is_ready(comm_, what);
      },
      deadline, what);
}

template <typename Issue>
comm::WorkPtr ProcessGroupNccl::enqueue(const char* op, DType dtype, size_t count,
                                        std::optional<comm::Duration> timeout, Issue&& issue) {
  std::lock_guard issue_lock(issue_mu_);
  const uint64_t seq = seq_++;
  auto work = std::make_shared<comm::Work>(op, seq);
  recorder_.record_queued(seq, op, dtype, count);
  if (aborted_) {
    std::string reason;
    {
      std::lock_guard lock(mu_);
      reason = abort_reason_;
    }
    work->finish(std::make_exception_ptr(
        CommError(::meshtrain::detail::str_cat("nccl ", op, " #", seq, " on group '", opts_.name,
                                               "': the group was aborted (", reason, ")"))));
    return work;
  }
  try {
    DeviceGuard guard(device_);
    Event ready;
    ready.record(current_stream(device_));
    stream_.wait(ready);
    {
      // The communicator is only used under comm_mu_: abort() frees it under the same lock.
      std::lock_guard comm_lock(comm_mu_);
      if (comm_ == nullptr) MT_THROW(CommError, "the group was aborted");
      issue();
    }
    wait_issued(op, seq);
    recorder_.record_started(seq, "nccl");
    const comm::Duration limit = timeout.value_or(opts_.timeout);
    Pending p{work, Event(), Clock::now() + limit, limit};
    p.done.record(stream_);
    bool queued = false;
    {
      // Checked under mu_: an abort after this point finds the Work in pending_ and fails it.
      std::lock_guard lock(mu_);
      if (!aborted_) {
        pending_.push_back(std::move(p));
        queued = true;
      }
    }
    if (!queued) MT_THROW(CommError, "the group was aborted while it was issued");
    cv_.notify_all();
  } catch (const std::exception& e) {
    const std::string reason =
        ::meshtrain::detail::str_cat("nccl ", op, " #", seq, " failed: ", e.what());
    abort(reason);
    recorder_.record_finished(seq, false, reason);
    work->finish(std::make_exception_ptr(CommError(reason)));
  }
  return work;
}

void ProcessGroupNccl::watchdog_loop() {
  // Before any CUDA call: a thread starts on device 0, and querying an event there would give
  // this process a context on device 0 (every rank of a node one, on one GPU). A failure here
  // shows in the first query, which aborts the group.
  (void)cudaSetDevice(device_);
  std::unique_lock lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(pending_.empty() ? 100 : 1));
    std::string failure;
    while (!pending_.empty() && failure.empty()) {
      Pending& p = pending_.front();
      bool done = false;
      try {
        done = p.done.query();
      } catch (const std::exception& e) {
        failure = e.what();
        break;
      }
      if (done) {
        comm::WorkPtr w = std::move(p.work);
        pending_.pop_front();
        lock.unlock();
        recorder_.record_finished(w->seq(), true);
        w->finish();
        lock.lock();
        continue;
      }
      // The operations finish in issue order (one stream), but each has its own timeout: a
      // later one with a shorter timeout can pass its deadline while the first is within its own.
      const auto now = Clock::now();
      for (const Pending& q : pending_) {
        if (now <= q.deadline) continue;
        failure = ::meshtrain::detail::str_cat(q.work->op_name(), " #", q.work->seq(),
                                               " timed out after ", q.timeout.count(),
                                               " ms (NCCL does not report which ranks are "
                                               "missing)");
        break;
      }
      break;
    }
    if (failure.empty() && !pending_.empty()) {
      // Lock order: mu_, then comm_mu_ (nothing takes mu_ while it holds comm_mu_).
      std::lock_guard comm_lock(comm_mu_);
      ncclResult_t st = ncclSuccess;
      if (comm_ != nullptr && ncclCommGetAsyncError(comm_, &st) == ncclSuccess &&
          st != ncclSuccess && st != ncclInProgress)
        failure = std::string("asynchronous NCCL error: ") + ncclGetErrorString(st);
    }
    if (!failure.empty()) {
      lock.unlock();
      abort(failure);
      lock.lock();
    }
  }
}

void ProcessGroupNccl::fail_all(const std::string& reason) {
  std::deque<Pending> failed;
  {
    std::lock_guard lock(mu_);
    failed.swap(pending_);
  }
  // A failed Work hands its buffers back to the caller, who may free or reuse them: wait (a
  // bounded while: an aborted communicator's kernels stop soon after ncclCommAbort) until the
  // operation's kernel is no longer running, so nothing it still writes lands in reused memory.
  const auto settle_by = Clock::now() + std::chrono::seconds(10);
  for (Pending& p : failed) {
    bool settled = false;
    try {
      poll_until(
          [&] {
            try {
              return p.done.query();
            } catch (const std::exception&) {
              return true;  // a device error: nothing more runs on this context
            }
          },
          settle_by, "an aborted operation");
      settled = true;
    } catch (const CommError&) {
      // Still running at the bound: said in the Work's error.
    }
    const std::string msg = ::meshtrain::detail::str_cat(
        "nccl ", p.work->op_name(), " #", p.work->seq(), " on group '", opts_.name, "' rank ",
        rank(), " failed: ", reason,
        settled ? ""
                : " (its kernel was still running 10 s later: its buffers may still be written)");
    recorder_.record_finished(p.work->seq(), false, msg);
    p.work->finish(std::make_exception_ptr(CommError(msg)));
  }
}

void ProcessGroupNccl::abort(const std::string& reason) {
  if (aborted_.exchange(true)) return;
  {
    std::lock_guard lock(mu_);
    abort_reason_ = reason;
  }
  {
    std::lock_guard comm_lock(comm_mu_);
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  fail_all(reason);
}

std::string ProcessGroupNccl::flight_recorder_json() const {
  return recorder_.dump_json(opts_.name, rank());
}

comm::WorkPtr ProcessGroupNccl::all_reduce(void* data, size_t count, DType dtype,
                                           const comm::AllReduceOptions& o) {
  return enqueue("all_reduce", dtype, count, o.timeout, [&] {
    check_nccl(
        ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(o.op), comm_, stream_.get()),
        comm_, "ncclAllReduce");
  });
}

comm::WorkPtr ProcessGroupNccl::broadcast(void* data, size_t count, DType dtype,
                                          const comm::BroadcastOptions& o) {
  check_peer(o.root, size(), "broadcast", "root");
  return enqueue("broadcast", dtype, count, o.timeout, [&] {
    check_nccl(ncclBroadcast(data, data, count, nccl_type(dtype), o.root, comm_, stream_.get()),
               comm_, "ncclBroadcast");
  });
}

comm::WorkPtr ProcessGroupNccl::reduce(void* data, size_t count, DType dtype,
                                       const comm::ReduceOptions& o) {
  check_peer(o.root, size(), "reduce", "root");
  return enqueue("reduce", dtype, count, o.timeout, [&] {
    check_nccl(ncclReduce(data, data, count, nccl_type(dtype), nccl_op(o.op), o.root, comm_,
                          stream_.get()),
               comm_, "ncclReduce");
  });
}

comm::WorkPtr ProcessGroupNccl::all_gather(const void* input, void* output, size_t count,
                                           DType dtype, const comm::AllGatherOptions& o) {
  return enqueue("all_gather", dtype, count, o.timeout, [&] {
    check_nccl(ncclAllGather(input, output, count, nccl_type(dtype), comm_, stream_.get()), comm_,
               "ncclAllGather");
  });
}

comm::WorkPtr ProcessGroupNccl::all_gather_v(const void* input, void* output,
                                             std::vector<size_t> counts, DType dtype,
                                             const comm::AllGatherOptions& o) {
  MT_CHECK(static_cast<int>(counts.size()) == size(), "all_gather_v: ", counts.size(),
           " counts for ", size(), " ranks");
  size_t total = 0;
  for (size_t c : counts) total += c;
  // Each rank broadcasts its own part into place; NCCL fuses the group into one launch.
  return enqueue("all_gather_v", dtype, total, o.timeout, [&] {
    NcclGroup group(comm_);
    size_t off = 0;
    for (int r = 0; r < size(); ++r) {
      const size_t n = counts[static_cast<size_t>(r)];
      void* dst = at(output, off, dtype);
      check_nccl(ncclBroadcast(r == rank() ? input : dst, dst, n, nccl_type(dtype), r, comm_,
                               stream_.get()),
                 comm_, "ncclBroadcast");
      off += n;
    }
    group.end();
  });
}

comm::WorkPtr ProcessGroupNccl::reduce_scatter(const void* input, void* output, size_t count,
                                               DType dtype, const comm::ReduceScatterOptions& o) {
  return enqueue("reduce_scatter", dtype, count, o.timeout, [&] {
    check_nccl(ncclReduceScatter(input, output, count, nccl_type(dtype), nccl_op(o.op), comm_,
                                 stream_.get()),
               comm_, "ncclReduceScatter");
  });
}

comm::WorkPtr ProcessGroupNccl::gather(const void* input, void* output, size_t count, DType dtype,
                                       const comm::GatherOptions& o) {
  check_peer(o.root, size(), "gather", "root");
  return enqueue("gather", dtype, count, o.timeout, [&] {
    NcclGroup group(comm_);
    if (rank() == o.root) {
      for (int r = 0; r < size(); ++r) {
        void* dst = at(output, static_cast<size_t>(r) * count, dtype);
        if (r == rank()) {
          MT_CUDA_CHECK(cudaMemcpyAsync(dst, input, bytes_of(count, dtype),
                                        cudaMemcpyDeviceToDevice, stream_.get()));
        } else {
          check_nccl(ncclRecv(dst, count, nccl_type(dtype), r, comm_, stream_.get()), comm_,
                     "ncclRecv");
        }
      }
    } else {
      check_nccl(ncclSend(input, count, nccl_type(dtype), o.root, comm_, stream_.get()), comm_,
                 "ncclSend");
    }
    group.end();
  });
}

comm::WorkPtr ProcessGroupNccl::scatter(const void* input, void* output, size_t count, DType dtype,
                                        const comm::ScatterOptions& o) {
  check_peer(o.root, size(), "scatter", "root");
  return enqueue("scatter", dtype, count, o.timeout, [&] {
    NcclGroup group(comm_);
    if (rank() == o.root) {
      for (int r = 0; r < size(); ++r) {
        const void* src = at(input, static_cast<size_t>(r) * count, dtype);
        if (r == rank()) {
          MT_CUDA_CHECK(cudaMemcpyAsync(output, src, bytes_of(count, dtype),
                                        cudaMemcpyDeviceToDevice, stream_.get()));
        } else {
          check_nccl(ncclSend(src, count, nccl_type(dtype), r, comm_, stream_.get()), comm_,
                     "ncclSend");
        }
      }
    } else {
      check_nccl(ncclRecv(output, count, nccl_type(dtype), o.root, comm_, stream_.get()), comm_,
                 "ncclRecv");
    }
    group.end();
  });
}

comm::WorkPtr ProcessGroupNccl::all_to_all(const void* input, void* output, size_t count,
                                           DType dtype, const comm::AllToAllOptions& o) {
  return enqueue("all_to_all", dtype, count * static_cast<size_t>(size()), o.timeout, [&] {
    NcclGroup group(comm_);
    for (int r = 0; r < size(); ++r) {
      const size_t off = static_cast<size_t>(r) * count;
      check_nccl(ncclSend(at(input, off, dtype), count, nccl_type(dtype), r, comm_, stream_.get()),
                 comm_, "ncclSend");
      check_nccl(ncclRecv(at(output, off, dtype), count, nccl_type(dtype), r, comm_, stream_.get()),
                 comm_, "ncclRecv");
    }
    group.end();
  });
}

comm::WorkPtr ProcessGroupNccl::all_to_all_v(const void* input,
                                             const std::vector<size_t>& send_counts, void* output,
                                             const std::vector<size_t>& recv_counts, DType dtype,
                                             const comm::AllToAllOptions& o) {
  const size_t n = static_cast<size_t>(size());
  MT_CHECK(send_counts.size() == n && recv_counts.size() == n, "all_to_all_v: ", send_counts.size(),
           " send and ", recv_counts.size(), " receive counts for ", n, " ranks");
  // NCCL does not compare the sizes of a send and its receive: the one pair that is checkable
  // here is checked before anything is queued.
  const size_t me = static_cast<size_t>(rank());
  MT_CHECK(send_counts[me] == recv_counts[me], "all_to_all_v: rank ", rank(), " sends ",
           send_counts[me], " elements to itself but expects ", recv_counts[me]);
  std::vector<size_t> send_at(n, 0), recv_at(n, 0);
  for (size_t q = 1; q < n; ++q) {
    send_at[q] = send_at[q - 1] + send_counts[q - 1];
    recv_at[q] = recv_at[q - 1] + recv_counts[q - 1];
  }
  const size_t sent = send_at[n - 1] + send_counts[n - 1];
  return enqueue("all_to_all_v", dtype, sent, o.timeout, [&] {
    NcclGroup group(comm_);
    for (size_t q = 0; q < n; ++q) {
      const int peer = static_cast<int>(q);
      if (send_counts[q] > 0) {
        check_nccl(ncclSend(at(input, send_at[q], dtype), send_counts[q], nccl_type(dtype), peer,
                            comm_, stream_.get()),
                   comm_, "ncclSend");
      }
      if (recv_counts[q] > 0) {
        check_nccl(ncclRecv(at(output, recv_at[q], dtype), recv_counts[q], nccl_type(dtype), peer,
                            comm_, stream_.get()),
                   comm_, "ncclRecv");
      }
    }
    group.end();
  });
}

std::vector<size_t> ProcessGroupNccl::exchange_counts(const std::vector<size_t>& send_counts,
                                                      const comm::AllToAllOptions& o) {
  const size_t n = static_cast<size_t>(size());
  MT_CHECK(send_counts.size() == n, "exchange_counts needs ", n, " counts, got ",
           send_counts.size());
  std::vector<int64_t> host(n);
  for (size_t q = 0; q < n; ++q) {
    MT_CHECK(send_counts[q] <= static_cast<size_t>(INT64_MAX), "exchange_counts: count ",
             send_counts[q], " too large");
    host[q] = static_cast<int64_t>(send_counts[q]);
  }
  DeviceGuard guard(device_);
  const cudaStream_t caller = current_stream(device_);
  StreamScratch scratch(device_, 2 * n * sizeof(int64_t), caller);
  auto* out = static_cast<int64_t*>(scratch.get());
  int64_t* in = out + n;
  // On the caller's stream, which the all_to_all waits for; read back once it has finished.
  MT_CUDA_CHECK(
      cudaMemcpyAsync(out, host.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice, caller));
  all_to_all(out, in, 1, DType::i64, o)->wait();
  MT_CUDA_CHECK(cudaMemcpy(host.data(), in, n * sizeof(int64_t), cudaMemcpyDeviceToHost));
  std::vector<size_t> recv(n);
  for (size_t q = 0; q < n; ++q) {
    MT_CHECK(host[q] >= 0, "exchange_counts: rank ", q, " sent a negative count");
    recv[q] = static_cast<size_t>(host[q]);
  }
  return recv;
}

comm::WorkPtr ProcessGroupNccl::send(const void* data, size_t count, DType dtype, int dst,
                                     uint32_t /*tag*/, const comm::SendRecvOptions& o) {
  check_peer(dst, size(), "send", "destination");
  return enqueue("send", dtype, count, o.timeout, [&] {
    check_nccl(ncclSend(data, count, nccl_type(dtype), dst, comm_, stream_.get()), comm_,
               "ncclSend");
  });
}

comm::WorkPtr ProcessGroupNccl::recv(void* data, size_t count, DType dtype, int src,
                                     uint32_t /*tag*/, const comm::SendRecvOptions& o) {
  check_peer(src, size(), "recv", "source");
  return enqueue("recv", dtype, count, o.timeout, [&] {
    check_nccl(ncclRecv(data, count, nccl_type(dtype), src, comm_, stream_.get()), comm_,
               "ncclRecv");
  });
}

comm::WorkPtr ProcessGroupNccl::barrier(const comm::BarrierOptions& o) {
  return enqueue("barrier", DType::f32, 1, o.timeout, [&] {
    check_nccl(
        ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_.get()),
        comm_, "ncclAllReduce");
  });
}

std::shared_ptr<comm::ProcessGroup> ProcessGroupNccl::split(const std::vector<int>& ranks) {
  int index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    MT_CHECK(ranks[i] >= 0 && ranks[i] < size(), "split: rank ", ranks[i], " out of range");
    if (ranks[i] == rank()) index = static_cast<int>(i);
  }
  std::lock_guard issue_lock(issue_mu_);
  if (aborted_) {
    std::lock_guard lock(mu_);
    MT_THROW(CommError, "split of an aborted nccl group: ", abort_reason_);
  }
  const uint64_t k = seq_++;
  DeviceGuard guard(device_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t sub = nullptr;
  {
    std::lock_guard comm_lock(comm_mu_);
    MT_CHECK(comm_ != nullptr, "split of an aborted nccl group");
    check_nccl(ncclCommSplit(comm_, index >= 0 ? 0 : NCCL_SPLIT_NOCOLOR, index, &sub, &config),
               comm_, "ncclCommSplit");
  }
  wait_issued("split", k);
  if (index < 0 || sub == nullptr) return nullptr;
  wait_ready(sub, Clock::now() + opts_.timeout, "split #" + std::to_string(k));
  comm::ProcessGroupOptions o = opts_;
  o.name = opts_.name + "/split" + std::to_string(k);
  return std::shared_ptr<ProcessGroupNccl>(
      new ProcessGroupNccl(sub, index, static_cast<int>(ranks.size()), o));
}

bool register_nccl_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    comm::register_backend("nccl", [](std::shared_ptr<comm::Store> store, int rank, int size,
                                      const comm::ProcessGroupOptions& opts) {
      return std::make_shared<ProcessGroupNccl>(std::move(store), rank, size, opts);
    });
  });
  return true;
}

}  // namespace meshtrain::cuda
