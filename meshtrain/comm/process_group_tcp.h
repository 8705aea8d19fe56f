// The tcp backend: the algorithms of algorithms/ over TcpTransport. Reductions of bf16/f16 run
// on an f32 copy and round once at the end; avg is a sum divided once at the end. The algorithm
// is chosen per call (option, group option, MESHTRAIN_COMM_ALGO) or by message and world size.
#pragma once

#include <memory>

#include "meshtrain/comm/process_group_base.h"
#include "meshtrain/comm/transport/tcp_transport.h"

namespace meshtrain::comm {

class TcpProcessGroup final : public ProcessGroupBase {
 public:
  TcpProcessGroup(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions opts);
  ~TcpProcessGroup() override;

  // The algorithm an automatic all-reduce of `bytes` uses on `world` ranks.
  static Algorithm choose_all_reduce(size_t bytes, int world);

  // The group's transport, for groups built on top of this one (hier's point-to-point).
  Transport& transport() { return *transport_; }

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
  Transport& p2p_transport() override { return *transport_; }

  void on_abort(const std::string& reason) override;
  std::vector<int> waiting_for() const override;
  std::string algorithm_label(const OpContext& ctx) const override;

 private:
  std::unique_ptr<TcpTransport> transport_;
};

// The address other ranks reach this one at: opts.address, else MESHTRAIN_COMM_ADDR, else the
// local address that routes to MASTER_ADDR, else 127.0.0.1.
std::string resolve_comm_address(const ProcessGroupOptions& opts);

// The local IPv4 address the kernel would send from to reach `host` (a name or an address):
// a UDP socket is connected to it (no packet is sent) and its local address read back. Empty
// when the host does not resolve or no route leads to it.
std::string local_address_towards(const std::string& host);

}  // namespace meshtrain::comm
