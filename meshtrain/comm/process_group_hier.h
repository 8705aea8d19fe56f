// The hier backend: shm between the ranks of one host, tcp between hosts. Hosts come from the
// host ids every rank publishes (host_layout.h). The group is built from sub-groups:
//   local   shm, the ranks of this host
//   cross   tcp, one rank per host: with the same number of ranks on every host, the ranks that
//           hold the same local rank (cross group 0 is the hosts' leaders); otherwise the
//           leaders only
//   flat    tcp, every rank (the collectives that are not all-reduce, and point to point)
// all_reduce of a large message: shm reduce-scatter within each host, tcp all-reduce of each
// shard across hosts, shm all-gather. A small one (or uneven hosts): shm reduce to the leader,
// tcp all-reduce among leaders, shm broadcast. Both orders of combination are fixed by the layout
// alone, and every rank ends with copies of the same bits. Half types are widened to f32 for the
// whole operation and rounded once; avg is a sum divided once at the end.
#pragma once

#include <memory>

#include "meshtrain/comm/host_layout.h"
#include "meshtrain/comm/process_group_base.h"
#include "meshtrain/comm/process_group_tcp.h"

namespace meshtrain::comm {

class HierProcessGroup final : public ProcessGroupBase {
 public:
  HierProcessGroup(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions opts);
  ~HierProcessGroup() override;

  const HostLayout& layout() const { return layout_; }

  // A sub-group whose members all share one host is an shm group (every collective and point to
  // point within the host, as a tensor-parallel group of a mesh wants); any other is hier again.
  ProcessGroupPtr split(const std::vector<int>& ranks) override;

  // Messages of at least this many bytes (in the accumulation type) take the sharded path.
  static constexpr size_t kShardedMinBytes = size_t{64} << 10;

 protected:
  void run_all_reduce(OpContext& ctx, void* data, size_t count, DType dtype, ReduceOp op) override;
  void run_broadcast(OpContext& ctx, void* data, size_t count, DType dtype, int root) override;
  void run_reduce(OpContext& ctx, void* data, size_t count, DType dtype, ReduceOp op,
                  int root) override;
  void run_all_gather_v(OpContext& ctx, const void* input, void* output,
                        const std::vector<size_t>& counts, DType dtype) override;
  void run_reduce_scatter(OpContext& ctx, const void* input, void* output, size_t count,
                          DType dtype, ReduceOp op) override;
  void run_gather(OpContext& ctx, const void* input, void* output, size_t count, DType dtype,
                  int root) override;
  void run_scatter(OpContext& ctx, const void* input, void* output, size_t count, DType dtype,
                   int root) override;
  void run_all_to_all(OpContext& ctx, const void* input, void* output, size_t count,
                      DType dtype) override;
  void run_all_to_all_v(OpContext& ctx, const void* input, const std::vector<size_t>& send_counts,
                        void* output, const std::vector<size_t>& recv_counts, DType dtype) override;
  void run_barrier(OpContext& ctx) override;
  Transport& p2p_transport() override { return flat_tcp_->transport(); }

  void on_abort(const std::string& reason) override;
  std::string algorithm_label(const OpContext& ctx) const override;

 private:
  // A sub-group and the global rank of each of its members.
  struct Sub {
    ProcessGroupPtr group;
    std::vector<int> members;
    const char* stage = "";
  };

  // Runs one step on a sub-group; its failure becomes a CommError that names global ranks.
  template <typename Fn>
  void step(const Sub& sub, Fn fn);
  void all_reduce_via_leaders(const OpContext& ctx, void* data, size_t count, DType dtype,
                              ReduceOp op);
  void all_reduce_sharded(const OpContext& ctx, void* data, size_t count, DType dtype, ReduceOp op);
  // The time left to a sub-group step; the cross-host step ends a little earlier so that a
  // host's leader reports an unreachable host before its local ranks give up on the leader.
  Duration left(const OpContext& ctx, bool cross) const;
  bool sharded(size_t bytes) const;

  HostLayout layout_;
  Sub local_;  // absent when this host holds one rank
  Sub cross_;  // absent when one host, or this rank is not in a cross group
  Sub flat_;
  TcpProcessGroup* flat_tcp_ = nullptr;  // flat_.group, for its transport
};

}  // namespace meshtrain::comm
