// ProcessGroupBase: what every backend of ours shares. It checks arguments when an operation is
// issued, gives it a sequence number, queues it on the group's thread (FIFO), records it in the
// flight recorder, turns a failure into an abort of the group, and runs the watchdog that warns
// about slow operations. Backends implement the run_* functions, which execute synchronously on
// the group's thread and must honour ctx.deadline. A small operation issued while the group is
// idle runs on the issuing thread instead (see inline_bytes()): handing it to the group's thread
// and back costs more than the operation itself, and on a machine with fewer cores than ranks the
// two threads compete for the core a peer needs. Likewise a caller that waits on a queued
// operation the group's thread has not taken yet runs the queue up to it itself (help_until): 2
// ranks on 2 cores, shm, all_reduce of 128 KiB-1 MiB went from 1.7-3.6 GB/s to 11-13 GB/s. Order,
// sequence numbers, the flight recorder, the watchdog and failure handling are the same either way.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/transport/transport.h"
#include "meshtrain/comm/wake_signal.h"

namespace meshtrain::comm {

struct OpContext {
  uint64_t seq = 0;
  // Counts collectives only (point-to-point operations also take sequence numbers, but not
  // necessarily on every rank), so it names the same collective on every rank: message tags.
  uint64_t collective_seq = 0;
  const char* op = "";
  SteadyTime deadline{};
  Duration timeout{};
  Algorithm algorithm = Algorithm::automatic;  // per-call, else group, else environment
  // What the backend's on_issue_all_reduce returned for this operation (-1: nothing).
  int64_t ticket = -1;
};

class ProcessGroupBase : public ProcessGroup {
 public:
  ~ProcessGroupBase() override;

  std::string backend_name() const override { return backend_; }
  const ProcessGroupOptions& options() const override { return opts_; }

  WorkPtr all_reduce(void* data, size_t count, DType dtype, const AllReduceOptions& opts) override;
  WorkPtr broadcast(void* data, size_t count, DType dtype, const BroadcastOptions& opts) override;
  WorkPtr reduce(void* data, size_t count, DType dtype, const ReduceOptions& opts) override;
  WorkPtr all_gather(const void* input, void* output, size_t count, DType dtype,
                     const AllGatherOptions& opts) override;
  WorkPtr all_gather_v(const void* input, void* output, std::vector<size_t> counts, DType dtype,
                       const AllGatherOptions& opts) override;
  WorkPtr reduce_scatter(const void* input, void* output, size_t count, DType dtype,
                         const ReduceScatterOptions& opts) override;
  WorkPtr gather(const void* input, void* output, size_t count, DType dtype,
                 const GatherOptions& opts) override;
  WorkPtr scatter(const void* input, void* output, size_t count, DType dtype,
                  const ScatterOptions& opts) override;
  WorkPtr all_to_all(const void* input, void* output, size_t count, DType dtype,
                     const AllToAllOptions& opts) override;
  WorkPtr all_to_all_v(const void* input, const std::vector<size_t>& send_counts, void* output,
                       const std::vector<size_t>& recv_counts, DType dtype,
                       const AllToAllOptions& opts) override;
  WorkPtr send(const void* data, size_t count, DType dtype, int dst, uint32_t tag,
               const SendRecvOptions& opts) override;
  WorkPtr recv(void* data, size_t count, DType dtype, int src, uint32_t tag,
               const SendRecvOptions& opts) override;
  WorkPtr barrier(const BarrierOptions& opts) override;

  ProcessGroupPtr split(const std::vector<int>& ranks) override;

  void abort(const std::string& reason) override;
  bool aborted() const override { return aborted_.load(std::memory_order_acquire); }
  uint64_t next_seq() const override;
  std::string flight_recorder_json() const override;

  const std::shared_ptr<Store>& store() const { return store_; }
  // "pg/<name>/": the prefix of every store key this group uses.
  std::string key_prefix() const { return "pg/" + opts_.name + "/"; }
  // The host-wide shm budget as this group holds it (filled in by an shm group once made); its
  // splits draw their shares from it.
  const ShmBudget& shm_budget() const { return shm_budget_; }

 protected:
  // split() with the sub-group's backend named (a backend may know a better one for some
  // member sets: hier's members on one host need only shm).
  ProcessGroupPtr split_with_backend(const std::vector<int>& ranks, const std::string& backend);

  // For a derived group that fills in the budget while it is made (before any split).
  ShmBudget& mutable_shm_budget() { return shm_budget_; }
  ProcessGroupBase(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions opts,
                   std::string backend);

  // Derived constructors call start() once they can run operations, and derived destructors
  // call stop() first so that no operation runs while the derived part is torn down.
  void start();
  void stop();

  virtual void run_all_reduce(OpContext& ctx, void* data, size_t count, DType dtype,
                              ReduceOp op) = 0;
  virtual void run_broadcast(OpContext& ctx, void* data, size_t count, DType dtype, int root) = 0;
  virtual void run_reduce(OpContext& ctx, void* data, size_t count, DType dtype, ReduceOp op,
                          int root) = 0;
  virtual void run_all_gather_v(OpContext& ctx, const void* input, void* output,
                                const std::vector<size_t>& counts, DType dtype) = 0;
  virtual void run_reduce_scatter(OpContext& ctx, const void* input, void* output, size_t count,
                                  DType dtype, ReduceOp op) = 0;
  virtual void run_gather(OpContext& ctx, const void* input, void* output, size_t count,
                          DType dtype, int root) = 0;
  virtual void run_scatter(OpContext& ctx, const void* input, void* output, size_t count,
                           DType dtype, int root) = 0;
  virtual void run_all_to_all(OpContext& ctx, const void* input, void* output, size_t count,
                              DType dtype) = 0;
  // Counts are per peer, in elements (see ProcessGroup::all_to_all_v).
  virtual void run_all_to_all_v(OpContext& ctx, const void* input,
                                const std::vector<size_t>& send_counts, void* output,
                                const std::vector<size_t>& recv_counts, DType dtype) = 0;
  // Point-to-point operations bypass the queue: they are posted to the transport at once, so a
  // receive never holds up a send issued after it.
  virtual Transport& p2p_transport() = 0;
  virtual void run_barrier(OpContext& ctx) = 0;

  // Called once when the group aborts (from any thread): wake local waiters, tell peers.
  virtual void on_abort(const std::string& /*reason*/) {}
  // The ranks the running operation still waits for (for the watchdog's warning).
  virtual std::vector<int> waiting_for() const { return {}; }
  // Called by the watchdog thread about every 100 ms (shm publishes a heartbeat).
  virtual void on_watchdog_tick() {}
  // Operations of at most this many bytes run on the issuing thread when nothing is queued or
  // running (0: never). A backend whose small operations finish in microseconds overrides it.
  virtual size_t inline_bytes() const { return 0; }
  // Called for every all-reduce when it is issued, in issue order, with the group's queue lock
  // held (so it must not block): a backend may start the operation here, on the issuing thread,
  // before it is queued. The result reaches run_all_reduce as ctx.ticket.
  virtual int64_t on_issue_all_reduce(void* /*data*/, size_t /*count*/, DType /*dtype*/,
                                      ReduceOp /*op*/) {
    return -1;
  }
  // The same for reduce-scatters (input: size() * count elements) and all-gathers (output:
  // size() * count elements); the result reaches run_reduce_scatter / run_all_gather_v.
  virtual int64_t on_issue_reduce_scatter(const void* /*input*/, size_t /*count*/, DType /*dtype*/,
                                          ReduceOp /*op*/) {
    return -1;
  }
  virtual int64_t on_issue_all_gather(const void* /*input*/, void* /*output*/, size_t /*count*/,
                                      DType /*dtype*/) {
    return -1;
  }
  // How long an asynchronous operation issued into an idle group is left for its issuer to run
  // (when it waits) before the group's thread takes it.
  virtual std::chrono::microseconds leave_to_issuer(const OpContext& ctx) const;
  // The name of the algorithm an operation will use, for the flight recorder.
  virtual std::string algorithm_label(const OpContext& ctx) const {
    return std::string(algorithm_name(ctx.algorithm));
  }

  // Throws CommError when the group was aborted (long waits poll it).
  void throw_if_aborted() const;
  // Log line on stderr prefixed with group and rank.
  void log_warning(const std::string& msg) const;

 private:
  struct Task {
    WorkPtr work;
    OpContext ctx;
    std::function<void(OpContext&)> fn;
  };

  // on_issue, when given, runs under the queue lock right after the sequence number is taken;
  // its result becomes ctx.ticket.
  WorkPtr enqueue(const char* op, DType dtype, size_t count, std::optional<Duration> timeout,
                  Algorithm algorithm, bool async_op, std::function<void(OpContext&)> fn,
                  const std::function<int64_t()>& on_issue = {});
  WorkPtr post_p2p(const char* op, DType dtype, size_t count, std::optional<Duration> timeout,
                   const std::function<RequestPtr(SteadyTime deadline)>& post);
  void worker_loop();
  // Runs queued operations on the calling thread, in order, up to and including `target`, as
  // long as the group's thread has not taken them: a caller that waits anyway saves the hand-off
  // to that thread and back (two wake-ups, tens of microseconds with more threads than cores).
  void help_until(const Work* target);
  // The running slot (busy_): claim_front() takes the first queued operation for the calling
  // thread (mu_ held); release() frees the slot after it ran and, when more are queued, says how
  // long the first of them is left to its issuer (leave_to_issuer).
  Task claim_front();
  std::optional<std::chrono::microseconds> release();
  // Runs one operation on the current thread: deadline, flight recorder, watchdog state, failure
  // turned into an abort, and the Work finished.
  void run_task(Task& task);
  void watchdog_loop();
  // Aborts the running operation when a termination signal came long enough ago
  // (termination.h).
  void abandon_on_termination();
  // The reason recorded by the first rank of the group to fail (this one's when it is first).
  std::string first_failure(const std::string& mine);

  std::shared_ptr<Store> store_;
  const ProcessGroupOptions opts_;
  const std::string backend_;
  Algorithm env_algorithm_ = Algorithm::automatic;

  mutable std::mutex mu_;
  WakeSignal wake_;                      // wakes the group's thread, now or a moment later
  std::condition_variable watchdog_cv_;  // wakes the watchdog when the group stops
  std::deque<Task> queue_;
  uint64_t next_seq_ = 0;
  uint64_t next_collective_seq_ = 0;
  bool stopping_ = false;
  bool busy_ = false;  // an operation runs (on the group's thread or inline); guarded by mu_
  std::thread worker_;
  std::thread watchdog_;

  // The running operation, for the watchdog.
  std::atomic<uint64_t> running_seq_{0};
  std::atomic<bool> running_{false};
  std::atomic<int64_t> running_since_ns_{0};
  std::string running_op_;  // guarded by mu_

  // What a waiting Work calls into: the group, until stop() clears it under the mutex, which also
  // keeps the group alive while a waiter runs an operation.
  struct Helping {
    std::mutex mu;
    ProcessGroupBase* group = nullptr;
  };
  std::shared_ptr<Helping> helping_ = std::make_shared<Helping>();

  std::atomic<bool> aborted_{false};
  std::string abort_reason_;  // guarded by mu_
  FlightRecorder recorder_;
  int split_counter_ = 0;
  ShmBudget shm_budget_;  // options().shm_budget until a derived group fills it in
};

}  // namespace meshtrain::comm
