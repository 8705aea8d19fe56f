// The data-parallel reducer. Gradients are grouped into buckets (reverse registration order,
// first bucket small so communication starts early, the rest large), each parameter's
// gradient-ready hook puts its gradient (pre-divided by the world size) into its bucket, and a
// bucket's all-reduce starts the moment its last gradient arrives, while backward continues.
// By default a parameter's .grad then stays a view into its bucket (gradient_as_bucket_view):
// the all-reduced bucket is the gradient, with no copy back, and a gradient that is still there
// at the next backward (zero_grad without set_to_none, or accumulation) is summed into the bucket
// in place by autograd, so it is not even copied in.
// Buckets live on the parameters' device. Device buckets need a group that reads device memory
// (nccl): its collectives run on their own stream, ordered after the kernels that filled the
// bucket, so they overlap the rest of backward; waiting for a bucket waits for the device.
// Buckets are launched in the same order on every rank, so collectives always match. After the
// first iteration the buckets are rebuilt once from the order in which gradients actually became
// ready (rank 0's order, broadcast, so every rank agrees).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/module.h"
#include "meshtrain/parallel/ddp/comm_hook.h"

namespace meshtrain::parallel {

struct ReducerOptions {
  size_t first_bucket_bytes = size_t{1} << 20;
  size_t bucket_bytes = size_t{25} << 20;
  // Parameters that get no gradient in a backward pass are reduced as zeros instead of making
  // the reducer wait for them (PyTorch's find_unused_parameters).
  bool find_unused_parameters = false;
  bool rebuild_buckets = true;
  CommHookSpec comm_hook;  // dist.comm_hook
  // After a synchronised backward pass every parameter's .grad is a view into its bucket
  // (PyTorch's gradient_as_bucket_view): no copy of the averaged bucket back into separate
  // gradient tensors, and no second copy of the gradients in memory. Off: .grad tensors of
  // their own, into which the averaged buckets are copied (the same values, bit for bit).
  bool gradient_as_bucket_view = true;
  // CPU buckets in memory from ProcessGroup::allocate_buffer, which the shm backend shares
  // between ranks so that the bucket all-reduce needs no staging copies (zero-filled either way).
  bool shared_buckets = true;
  // ZeRO: every bucket's buffer is padded with zeros to a multiple of pad_to elements, so that it
  // splits into pad_to equal shards, and its layout stays the one of the first iteration.
  int64_t pad_to = 1;
  // ZeRO-2/3: each bucket is reduce-scattered (averaged) into this rank's shard instead of
  // all-reduced; the parameters' .grad then holds only this rank's bucket slices correctly and
  // shard(b) has the averaged shard. Needs the allreduce hook.
  bool reduce_scatter = false;
  // reduce_scatter only: the buckets share this many buffers (bucket b uses buffer b % pool)
  // instead of one each, so that gradients take the memory of `pool` buckets plus this rank's
  // shards rather than the whole model's (ZeRO-2). A bucket's gradients are copied into its
  // buffer when the bucket is launched, once the reduce-scatter that used it before has ended,
  // and the parameters' own gradients are freed then. 0: one buffer per bucket.
  int bucket_pool = 0;
  // What the summed gradients are divided by; 0: the group's size. Expert parallelism sums an
  // expert's gradients over its copies and divides by the whole data-parallel size, whose
  // ranks' tokens they were computed from.
  int divide_by = 0;
};

struct ReducerStats {
  int buckets = 0;
  int launched_during_backward = 0;  // buckets whose communication overlapped backward
  double wait_s = 0;                 // time the training thread waited for communication
  size_t wire_bytes = 0;             // bytes sent per rank in the last step
  // Gradient elements divided by the world size in a pass of their own in the last step: only
  // with a hook that needs divided input and gradients that autograd accumulated straight into
  // the bucket (elsewhere the division rides on the copy into the bucket or on the collective).
  size_t divided_in_place = 0;
};

class Reducer {
 public:
  Reducer(nn::NamedTensors params, comm::ProcessGroupPtr pg, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call before each backward pass whose gradients should be synchronised.
  void prepare_for_backward();
  // Call after backward: reduces what is left (unused parameters), waits for every bucket and
  // leaves the averaged gradients in the parameters' .grad.
  void finalize_backward();
  // The first half of finalize_backward: launches every bucket still held back. A caller that
  // has a collective of its own for this step issues it between the two, so that it queues
  // right behind the buckets (same order on every rank) and costs no round trip of its own.
  void launch_remaining();
  // Reduces the gradients the parameters hold now, as a synchronised backward pass whose every
  // gradient arrived at once would (zeros for a parameter without one), and waits: for a caller
  // whose gradients are final only after a backward pass it cannot hook, such as a pipeline
  // stage's after its last micro-batch and the tied copies' sum. The gradient-ready hooks must not
  // reduce meanwhile: keep set_require_sync(false) during those backward passes.
  void reduce_held_gradients();
  // While false (no_sync), backward passes only accumulate locally; the next synchronised pass
  // communicates the accumulated gradients.
  void set_require_sync(bool on) { require_sync_ = on; }
  bool require_sync() const { return require_sync_; }

  const ReducerStats& stats() const { return stats_; }
  // The region of parameter `index`'s bucket that holds its gradient, shaped like the parameter.
  const Tensor& bucket_view(size_t index) const { return views_[index]; }
  // Parameter indices (registration order) per bucket.
  const std::vector<std::vector<size_t>>& bucket_layout() const { return layout_; }
  // Elements of bucket b's buffer, padding included (a multiple of ReducerOptions::pad_to).
  int64_t bucket_numel(size_t b) const { return buckets_[b].buffer.numel(); }
  // Where parameter `index`'s gradient lies: its bucket and first element there.
  size_t bucket_of(size_t index) const { return slots_[index].bucket; }
  int64_t offset_in_bucket(size_t index) const { return slots_[index].offset; }
  // reduce_scatter: this rank's averaged slice of bucket b after finalize_backward.
  const Tensor& shard(size_t b) const { return shards_[b]; }
  bool rebuilt() const { return rebuilt_; }
  // bucket_pool: bytes of the shared bucket buffers (0 without a pool).
  size_t pool_bytes() const {
    size_t n = 0;
    for (const Tensor& t : pool_) n += t.nbytes();
    return n;
  }
  // The hook, for saving and restoring its state (error feedback) with checkpoints.
  CommHook& comm_hook() { return *hook_; }
  const CommHook& comm_hook() const { return *hook_; }

 private:
  struct Slot {
    size_t bucket = 0;
    int64_t offset = 0;
  };
  void build_buckets(const std::vector<size_t>& order);
  // Puts parameter `index`'s local gradient (zeros when it has none) into its bucket slot,
  // divided by the world size.
  void fill_slot(size_t index);
  void on_grad_ready(size_t index);
  void launch_ready_buckets();
  void rebuild_from_ready_order();

  nn::NamedTensors params_;
  Device device_;  // of every parameter and bucket
  comm::ProcessGroupPtr pg_;
  ReducerOptions options_;
  std::unique_ptr<CommHook> hook_;
  float inv_world_;
  float average_correction_;  // group size / divide_by, for a hook that averages

  std::vector<std::vector<size_t>> layout_;
  std::vector<Slot> slots_;
  std::vector<GradBucket> buckets_;
  std::vector<Tensor> shards_;  // reduce_scatter: per bucket, this rank's slice
  std::vector<Tensor> pool_;    // bucket_pool: the shared bucket buffers
  std::vector<Tensor> views_;   // per parameter: its region of its bucket, parameter-shaped
  std::vector<int> pending_;    // per bucket: gradients still missing
  std::vector<comm::WorkPtr> works_;
  std::vector<bool> ready_;
  std::vector<size_t> ready_order_;
  size_t next_launch_ = 0;
  bool in_backward_ = false;
  bool launched_all_ = false;  // launch_remaining ran; finalize_backward waits
  bool require_sync_ = true;
  bool rebuilt_ = false;
  bool first_iteration_ = true;
  ReducerStats stats_;
};

}  // namespace meshtrain::parallel
