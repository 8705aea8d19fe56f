// BatchUploader in a build without CUDA: there is no device to upload to.
#include "meshtrain/cuda/availability.h"
#include "meshtrain/cuda/batch_uploader.h"

namespace meshtrain::cuda {

struct BatchUploader::Impl {};

BatchUploader::BatchUploader(Device device) {
  MT_THROW(Error, device.str(), " is not available: ", unavailable_reason());
}

BatchUploader::~BatchUploader() = default;

Tensor BatchUploader::upload(const Tensor&) {
  MT_THROW(Error, "cuda is not available: ", unavailable_reason());
}

}  // namespace meshtrain::cuda
