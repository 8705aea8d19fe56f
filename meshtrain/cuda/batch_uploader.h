// Moves a data loader's host batches to a CUDA device: the batch is copied into one of two pinned
// host buffers and uploaded from there with an asynchronous copy on the device's current stream,
// so the call returns before the copy ends and the copy needs no staging by the driver. A buffer
// is refilled only after the upload that last read it has finished (an event), so alternating
// batches never wait in steady state. Free of CUDA headers: the trainer includes it in every
// build; without CUDA constructing one throws "built without CUDA".
#pragma once

#include <memory>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::cuda {

class BatchUploader {
 public:
  explicit BatchUploader(Device device);
  ~BatchUploader();
  BatchUploader(const BatchUploader&) = delete;
  BatchUploader& operator=(const BatchUploader&) = delete;

  // A device copy of the host tensor `host` (any dtype), ordered before later work on the current
  // stream. `host` may be changed or freed as soon as this returns.
  Tensor upload(const Tensor& host);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshtrain::cuda
