// Comm hooks: how a full gradient bucket is communicated. The default all-reduces f32; hooks can
// compress (bf16/f16), sparsify (top-k with error feedback) or factorise (PowerSGD) the bucket.
// A hook runs on the training thread when the bucket is launched and returns the Work to wait
// on; `finish` runs after the wait and writes the averaged gradient back into the bucket.
//
// Ordering contract: the reducer launches buckets in the same order on every rank and then calls
// finish in bucket order, so a hook may issue further collectives from finish (PowerSGD's second
// phase) and they still match across ranks.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/module.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::parallel {

// Where one parameter's gradient lies inside a bucket's flat buffer.
struct BucketParam {
  size_t index = 0;  // the parameter's position in registration order
  std::string name;
  int64_t offset = 0;  // first element in GradBucket::buffer
  Shape shape;
  int64_t numel() const;
};

struct GradBucket {
  int index = 0;
  // Flat f32: this rank's gradients, divided by the world size unless the hook divides in its
  // collective (CommHook::divides_in_collective).
  Tensor buffer;
  // The parameters in buffer order, covering it exactly. May be empty for a bucket made by
  // hand; hooks then treat the whole buffer as one flat parameter (see bucket_params).
  std::vector<BucketParam> params;
};

// The bucket's parameters, or one flat parameter named "bucket<index>" when it lists none.
std::vector<BucketParam> bucket_params(const GradBucket& bucket);

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  // Starts communication of the bucket (asynchronously where possible).
  virtual comm::WorkPtr launch(GradBucket& bucket, comm::ProcessGroup& pg) = 0;
  // Completes the bucket after the work finished (decompression, error feedback).
  virtual void finish(GradBucket& bucket) { (void)bucket; }
  // True when the hook's collective computes the average itself (ReduceOp::avg): the reducer
  // then hands the bucket over undivided, so that the division costs no pass of its own, even
  // where autograd accumulated straight into the bucket. Hooks that transform the values before
  // reducing them (compression, sparsification) see them divided, as PyTorch's hooks do, which
  // also keeps f16 sums of many ranks from overflowing.
  virtual bool divides_in_collective() const { return false; }
  // Bytes this rank contributes to the collectives of one bucket (the payload; what the
  // algorithm forwards on top depends on the world size), for reporting.
  virtual size_t wire_bytes(const GradBucket& bucket) const {
    return static_cast<size_t>(bucket.buffer.numel()) * 4;
  }
  // State carried from step to step (error-feedback residuals, warm-start factors), named by
  // parameter so that it survives a rebuild of the buckets; saved with checkpoints. Stateless
  // hooks return nothing and refuse state (ValueError naming the first entry).
  virtual nn::NamedTensors state_dict() const { return {}; }
  virtual void load_state_dict(const nn::NamedTensors& state);
};

// Plain f32 all-reduce that averages in the collective (ReduceOp::avg).
class AllReduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  bool divides_in_collective() const override { return true; }
  comm::WorkPtr launch(GradBucket& bucket, comm::ProcessGroup& pg) override;
};

// Casts the bucket to bf16 or f16, all-reduces at half the bytes, and casts back. The host
// collectives accumulate in f32 inside the collective; NCCL keeps its partial sums in the half
// type between its steps (as under PyTorch's bf16 hook).
class HalfPrecisionHook : public CommHook {
 public:
  explicit HalfPrecisionHook(DType dtype);
  std::string name() const override;
  comm::WorkPtr launch(GradBucket& bucket, comm::ProcessGroup& pg) override;
  void finish(GradBucket& bucket) override;
  size_t wire_bytes(const GradBucket& bucket) const override {
    return static_cast<size_t>(bucket.buffer.numel()) * 2;
  }

 private:
  DType dtype_;
  std::vector<Tensor> staging_;  // one per bucket index
};

// A hook named as dist.comm_hook writes it, parsed once (where the config is resolved):
//   "allreduce" (also "none" or empty), "bf16", "f16",
//   "topk" or "topk:RATIO"       top-k sparsification with error feedback, RATIO in (0, 1]
//                                (default 0.01: the largest 1% of each bucket's entries),
//   "powersgd", "powersgd:R" or "powersgd:R:W"
//                                PowerSGD of rank R >= 1 (default 2) with error feedback, after
//                                W uncompressed warm-up steps (default 0).
// An unset parameter takes the hook's default.
enum class CommHookKind { allreduce, bf16, f16, topk, powersgd };  // comm_hook_names() order
struct CommHookSpec {
  CommHookKind kind = CommHookKind::allreduce;
  std::optional<double> topk_ratio;
  std::optional<int> powersgd_rank;
  std::optional<int64_t> powersgd_warmup;
};
// A bad name or parameter is a ValueError.
CommHookSpec parse_comm_hook_spec(const std::string& name);

std::unique_ptr<CommHook> make_comm_hook(const CommHookSpec& spec);
// make_comm_hook(parse_comm_hook_spec(name)).
std::unique_ptr<CommHook> make_comm_hook(const std::string& name);

// The hook families make_comm_hook knows ("allreduce", "bf16", "f16", "topk", "powersgd"), and
// the forms of those that take parameters: what dist.comm_hook allows and --help-config shows.
const std::vector<std::string>& comm_hook_names();
std::string_view comm_hook_forms();

}  // namespace meshtrain::parallel
