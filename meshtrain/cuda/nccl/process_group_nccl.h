// The "nccl" ProcessGroup: collectives on CUDA device memory through NCCL, behind the same
// interface and failure semantics as the CPU backends (comm/process_group.h).
//
// Every buffer passed in is device memory on the rank's current device. An operation is queued
// on the group's own high-priority stream after the work already queued on the caller's current
// stream (an event orders them), so communication overlaps later compute; its Work completes when
// the GPU has finished it. A watchdog thread polls the operations in flight: an NCCL error or a
// deadline that passes aborts the communicator (ncclCommAbort), fails every pending Work with a
// CommError naming the operation and its sequence number, and fails every later call at once.
// NCCL does not report which peers are missing, so errors cannot name them as the CPU backends do.
//
// Point-to-point tags are accepted for interface compatibility; NCCL matches sends and receives
// between two ranks in issue order only.
#pragma once

#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/cuda/stream.h"

namespace meshtrain::cuda {

class ProcessGroupNccl final : public comm::ProcessGroup {
 public:
  // Collective over `size` ranks: rank 0 publishes the NCCL id under "pg/<name>/nccl_id" in the
  // store, the others read it; creation fails with CommError when it does not finish within the
  // group timeout.
  ProcessGroupNccl(std::shared_ptr<comm::Store> store, int rank, int size,
                   const comm::ProcessGroupOptions& opts);
  ~ProcessGroupNccl() override;

  std::string backend_name() const override { return "nccl"; }
  const comm::ProcessGroupOptions& options() const override { return opts_; }

  comm::WorkPtr all_reduce(void* data, size_t count, DType dtype,
                           const comm::AllReduceOptions& opts = {}) override;
  comm::WorkPtr broadcast(void* data, size_t count, DType dtype,
                          const comm::BroadcastOptions& opts = {}) override;
  comm::WorkPtr reduce(void* data, size_t count, DType dtype,
                       const comm::ReduceOptions& opts = {}) override;
  comm::WorkPtr all_gather(const void* input, void* output, size_t count, DType dtype,
                           const comm::AllGatherOptions& opts = {}) override;
  comm::WorkPtr all_gather_v(const void* input, void* output, std::vector<size_t> counts,
                             DType dtype, const comm::AllGatherOptions& opts = {}) override;
  comm::WorkPtr reduce_scatter(const void* input, void* output, size_t count, DType dtype,
                               const comm::ReduceScatterOptions& opts = {}) override;
  comm::WorkPtr gather(const void* input, void* output, size_t count, DType dtype,
                       const comm::GatherOptions& opts = {}) override;
  comm::WorkPtr scatter(const void* input, void* output, size_t count, DType dtype,
                        const comm::ScatterOptions& opts = {}) override;
  comm::WorkPtr all_to_all(const void* input, void* output, size_t count, DType dtype,
                           const comm::AllToAllOptions& opts = {}) override;
  // Grouped ncclSend/ncclRecv, one pair per peer (empty blocks are skipped on both sides, which
  // agree on them when the counts match).
  comm::WorkPtr all_to_all_v(const void* input, const std::vector<size_t>& send_counts,
                             void* output, const std::vector<size_t>& recv_counts, DType dtype,
                             const comm::AllToAllOptions& opts = {}) override;
  // Through a small device buffer: the counts are host memory, NCCL moves device memory only.
  std::vector<size_t> exchange_counts(const std::vector<size_t>& send_counts,
                                      const comm::AllToAllOptions& opts = {}) override;
  comm::WorkPtr send(const void* data, size_t count, DType dtype, int dst, uint32_t tag,
                     const comm::SendRecvOptions& opts = {}) override;
  comm::WorkPtr recv(void* data, size_t count, DType dtype, int src, uint32_t tag,
                     const comm::SendRecvOptions& opts = {}) override;
  comm::WorkPtr barrier(const comm::BarrierOptions& opts = {}) override;
  std::shared_ptr<comm::ProcessGroup> split(const std::vector<int>& ranks) override;

  void abort(const std::string& reason) override;
  bool aborted() const override { return aborted_; }
  uint64_t next_seq() const override { return seq_; }
  std::string flight_recorder_json() const override;

 private:
  struct Pending {
    comm::WorkPtr work;
    Event done;
    std::chrono::steady_clock::time_point deadline;
    comm::Duration timeout;  // what the deadline was set from, for the message
  };
  // Wraps an existing communicator (split()).
  ProcessGroupNccl(ncclComm_t comm, int rank, int size, const comm::ProcessGroupOptions& opts);
  void start_watchdog();
  // Runs `issue` (the NCCL calls) on the group's stream after the caller's current stream, and
  // returns the Work that the watchdog completes.
  template <typename Issue>
  comm::WorkPtr enqueue(const char* op, DType dtype, size_t count,
                        std::optional<comm::Duration> timeout, Issue&& issue);
  void wait_issued(const char* op, uint64_t seq);  // a non-blocking NCCL call has been enqueued
  void fail_all(const std::string& reason);
  void watchdog_loop();

  comm::ProcessGroupOptions opts_;
  int device_ = 0;
  // Every NCCL call on comm_ holds comm_mu_; abort() frees it (and sets it to null) under the same
  // lock, so no call runs on a freed communicator. Taken after mu_ where both are held.
  std::mutex comm_mu_;
  ncclComm_t comm_ = nullptr;
  Stream stream_;
  std::mutex issue_mu_;  // one issuing thread at a time: NCCL calls on a communicator are ordered
  std::atomic<uint64_t> seq_{0};
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool stop_ = false;
  std::thread watchdog_;
  comm::FlightRecorder recorder_;
  void* barrier_buf_ = nullptr;  // one float of device memory for barrier()
};

}  // namespace meshtrain::cuda
