// Comm hooks: how a full gradient bucket is communicated. The default all-reduces f32; hooks can
// compress (bf16/f16), sparsify (top-k with error feedback) or factorise (PowerSGD) the bucket.
// A hook runs on the training thread when the bucket is launched and returns the Work to wait
// on; `finish` runs after the wait and writes the averaged gradient back into the bucket.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::parallel {

struct GradBucket {
  int index = 0;
  Tensor buffer;  // flat f32, already divided by the world size
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  // Starts communication of the bucket (asynchronously where possible).
  virtual comm::WorkPtr launch(GradBucket& bucket, comm::ProcessGroup& pg) = 0;
  // Completes the bucket after the work finished (decompression, error feedback).
  virtual void finish(GradBucket& bucket) { (void)bucket; }
  // Bytes put on the wire per rank for the last launched bucket, for reporting.
  virtual size_t wire_bytes(const GradBucket& bucket) const {
    return static_cast<size_t>(bucket.buffer.numel()) * 4;
  }
};

// Plain f32 all-reduce (sum of pre-divided gradients = average).
class AllReduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  comm::WorkPtr launch(GradBucket& bucket, comm::ProcessGroup& pg) override;
};

// Casts the bucket to bf16 or f16, all-reduces at half the bytes (accumulating in f32 inside the
// collective), and casts back.
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

// Makes a hook from its name: "allreduce", "bf16", "f16" (others are added by later work).
std::unique_ptr<CommHook> make_comm_hook(const std::string& name);

}  // namespace meshtrain::parallel
