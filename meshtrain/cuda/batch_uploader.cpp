// Pinned double buffering for host-to-device batch copies.
#include "meshtrain/cuda/batch_uploader.h"

#include <cstring>

#include "meshtrain/cuda/async_copy.h"
#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/device.h"
#include "meshtrain/cuda/pinned_buffer.h"
#include "meshtrain/cuda/stream.h"

namespace meshtrain::cuda {

struct BatchUploader::Impl {
  Device device;
  PinnedBuffer buffers[2];
  Event done[2];  // recorded after the upload that last read each buffer
  int next = 0;
};

BatchUploader::BatchUploader(Device device) {
  MT_CHECK(device.type == DeviceType::cuda, "BatchUploader uploads to a cuda device, not ",
           device.str());
  // The events belong to the device they are made on, and must be recorded on its streams.
  DeviceGuard guard(device.index);
  impl_ = std::make_unique<Impl>();
  impl_->device = device;
}

BatchUploader::~BatchUploader() {
  // The pinned buffers must outlive the copies that read them.
  for (Event& e : impl_->done) {
    try {
      e.synchronize();
    } catch (const std::exception&) {
      // The device failed; there is nothing left to wait for.
    }
  }
}

Tensor BatchUploader::upload(const Tensor& host) {
  MT_CHECK(host.device().is_cpu(), "BatchUploader::upload needs a host tensor, got ", host.str());
  Impl& s = *impl_;
  Tensor out = Tensor::empty(host.shape(), host.dtype(), s.device);
  const size_t n = host.nbytes();
  if (n == 0) return out;
  const int i = s.next;
  s.next ^= 1;
  s.done[i].synchronize();
  if (s.buffers[i].size() < n) s.buffers[i] = PinnedBuffer(n);
  std::memcpy(s.buffers[i].data(), host.data_ptr(), n);
  DeviceGuard guard(s.device.index);
  const cudaStream_t stream = current_stream(s.device.index);
  copy_to_device_async(out.data_ptr(), s.buffers[i].data(), n, stream);
  s.done[i].record(stream);
  return out;
}

}  // namespace meshtrain::cuda
