// A host group that calls itself "nccl", for the fake device (fake_device.h). Counts the
// collectives it forwards.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"

namespace meshtrain::test {

// An shm group that calls itself "nccl": on the fake device, device memory is host memory, so the
// reducer's device path (buckets filled through the kernel table, the bucket order broadcast
// through device memory, gradients as device bucket views) runs against a real group.
class FakeNcclGroup final : public comm::ProcessGroup {
 public:
  // What a group and the groups split off it share: a count of their collectives and, where set,
  // a predicate every buffer they are handed must pass (device memory, as NCCL needs).
  struct Shared {
    std::atomic<int> collectives = 0;
    std::function<bool(const void*, size_t)> is_device;
  };

  // State whose groups check every buffer against `memory`'s live allocations (the fake device's
  // allocator): a group handed host memory fails the test, as NCCL would fail on a GPU.
  template <typename Memory>
  static std::shared_ptr<Shared> checking(Memory& memory) {
    auto shared = std::make_shared<Shared>();
    shared->is_device = [&memory](const void* p, size_t n) { return memory.owns(p, n); };
    return shared;
  }

  explicit FakeNcclGroup(comm::ProcessGroupPtr inner,
                         std::shared_ptr<Shared> shared = std::make_shared<Shared>())
      : comm::ProcessGroup(inner->rank(), inner->size()),
        inner_(std::move(inner)),
        shared_(std::move(shared)) {}
  std::string backend_name() const override { return "nccl"; }
  const comm::ProcessGroupOptions& options() const override { return inner_->options(); }
  comm::WorkPtr all_reduce(void* d, size_t n, DType t, const comm::AllReduceOptions& o) override {
    ++all_reduces;
    check(d, n, t, "all_reduce");
    return inner_->all_reduce(d, n, t, o);
  }
  comm::WorkPtr broadcast(void* d, size_t n, DType t, const comm::BroadcastOptions& o) override {
    ++broadcasts;
    check(d, n, t, "broadcast");
    return inner_->broadcast(d, n, t, o);
  }
  comm::WorkPtr reduce(void* d, size_t n, DType t, const comm::ReduceOptions& o) override {
    return inner_->reduce(d, n, t, o);
  }
  comm::WorkPtr all_gather(const void* i, void* o, size_t n, DType t,
                           const comm::AllGatherOptions& op) override {
    ++all_gathers;
    check(i, n, t, "all_gather");
    check(o, n * static_cast<size_t>(size()), t, "all_gather");
    return inner_->all_gather(i, o, n, t, op);
  }
  comm::WorkPtr all_gather_v(const void* i, void* o, std::vector<size_t> n, DType t,
                             const comm::AllGatherOptions& op) override {
    return inner_->all_gather_v(i, o, std::move(n), t, op);
  }
  comm::WorkPtr reduce_scatter(const void* i, void* o, size_t n, DType t,
                               const comm::ReduceScatterOptions& op) override {
    ++reduce_scatters;
    check(i, n * static_cast<size_t>(size()), t, "reduce_scatter");
    check(o, n, t, "reduce_scatter");
    return inner_->reduce_scatter(i, o, n, t, op);
  }
  comm::WorkPtr gather(const void* i, void* o, size_t n, DType t,
                       const comm::GatherOptions& op) override {
    return inner_->gather(i, o, n, t, op);
  }
  comm::WorkPtr scatter(const void* i, void* o, size_t n, DType t,
                        const comm::ScatterOptions& op) override {
    return inner_->scatter(i, o, n, t, op);
  }
  comm::WorkPtr all_to_all(const void* i, void* o, size_t n, DType t,
                           const comm::AllToAllOptions& op) override {
    return inner_->all_to_all(i, o, n, t, op);
  }
  comm::WorkPtr all_to_all_v(const void* i, const std::vector<size_t>& sn, void* o,
                             const std::vector<size_t>& rn, DType t,
                             const comm::AllToAllOptions& op) override {
    return inner_->all_to_all_v(i, sn, o, rn, t, op);
  }
  comm::WorkPtr send(const void* d, size_t n, DType t, int dst, uint32_t tag,
                     const comm::SendRecvOptions& o) override {
    return inner_->send(d, n, t, dst, tag, o);
  }
  comm::WorkPtr recv(void* d, size_t n, DType t, int src, uint32_t tag,
                     const comm::SendRecvOptions& o) override {
    return inner_->recv(d, n, t, src, tag, o);
  }
  comm::WorkPtr barrier(const comm::BarrierOptions& o) override { return inner_->barrier(o); }
  // Its sub-groups read device memory too.
  std::shared_ptr<comm::ProcessGroup> split(const std::vector<int>& ranks) override {
    auto inner = inner_->split(ranks);
    return inner ? std::make_shared<FakeNcclGroup>(std::move(inner), shared_) : nullptr;
  }
  void abort(const std::string& reason) override { inner_->abort(reason); }
  bool aborted() const override { return inner_->aborted(); }
  uint64_t next_seq() const override { return inner_->next_seq(); }
  std::string flight_recorder_json() const override { return inner_->flight_recorder_json(); }

  std::atomic<int> all_reduces = 0;
  std::atomic<int> broadcasts = 0;
  std::atomic<int> all_gathers = 0;
  std::atomic<int> reduce_scatters = 0;

 private:
  void check(const void* p, size_t n, DType t, const char* op) {
    ++shared_->collectives;
    if (shared_->is_device && n > 0) {
      EXPECT_TRUE(shared_->is_device(p, n * dtype_size(t)))
          << op << " of " << n << " elements handed memory that is not the device's";
    }
  }

  comm::ProcessGroupPtr inner_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace meshtrain::test
