// DetachedGroup: a rank's place among ranks that never meet one another. Asynchronous
// parameter-server workers each talk to the servers alone, so that a worker that dies can be
// replaced without the others: their rank and size still place the data (which windows a
// worker reads), the logs (rank 0's) and the checkpoints' parts, but a collective among them
// would wait for a worker that may be gone, and fails here, naming itself, instead.
#pragma once

#include <string>

#include "meshtrain/comm/process_group.h"

namespace meshtrain::comm {

class DetachedGroup final : public ProcessGroup {
 public:
  // `why` completes the error of a collective: "<op> among <why>: they never meet".
  DetachedGroup(int rank, int size, std::string why);

  bool detached() const override { return true; }
  std::string backend_name() const override { return "detached"; }
  const ProcessGroupOptions& options() const override { return options_; }

  WorkPtr all_reduce(void*, size_t, DType, const AllReduceOptions&) override;
  WorkPtr broadcast(void*, size_t, DType, const BroadcastOptions&) override;
  WorkPtr reduce(void*, size_t, DType, const ReduceOptions&) override;
  WorkPtr all_gather(const void*, void*, size_t, DType, const AllGatherOptions&) override;
  WorkPtr all_gather_v(const void*, void*, std::vector<size_t>, DType,
                       const AllGatherOptions&) override;
  WorkPtr reduce_scatter(const void*, void*, size_t, DType, const ReduceScatterOptions&) override;
  WorkPtr gather(const void*, void*, size_t, DType, const GatherOptions&) override;
  WorkPtr scatter(const void*, void*, size_t, DType, const ScatterOptions&) override;
  WorkPtr all_to_all(const void*, void*, size_t, DType, const AllToAllOptions&) override;
  WorkPtr all_to_all_v(const void*, const std::vector<size_t>&, void*, const std::vector<size_t>&,
                       DType, const AllToAllOptions&) override;
  std::vector<size_t> exchange_counts(const std::vector<size_t>&, const AllToAllOptions&) override;
  WorkPtr send(const void*, size_t, DType, int, uint32_t, const SendRecvOptions&) override;
  WorkPtr recv(void*, size_t, DType, int, uint32_t, const SendRecvOptions&) override;
  WorkPtr barrier(const BarrierOptions&) override;
  std::shared_ptr<ProcessGroup> split(const std::vector<int>& ranks) override;
  void abort(const std::string&) override {}
  bool aborted() const override { return false; }
  uint64_t next_seq() const override { return 0; }
  std::string flight_recorder_json() const override { return "[]"; }

 private:
  [[noreturn]] void refuse(const char* op) const;

  std::string why_;
  ProcessGroupOptions options_;
};

}  // namespace meshtrain::comm
