// Each element's mask is a hash of its index, so the kernel needs no state and any launch gives
// the same bits; four elements a thread (16-byte accesses) where the arrays allow.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/dropout.h"
#include "meshtrain/cuda/kernels/elementwise_map.cuh"
#include "meshtrain/cuda/kernels/launch.cuh"
#include "meshtrain/tensor/dropout_mask.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cuda {
namespace {

__global__ void dropout_kernel(float* out, const float* inp, int64_t n, float p, float scale,
                               uint64_t mixed, uint64_t offset) {
  MT_GRID_STRIDE(i, n) {
    out[i] = dropout_mask::apply(inp[i], mixed, offset + static_cast<uint64_t>(i), p, scale);
  }
}

__global__ void dropout_x4_kernel(float4* out, const float4* inp, int64_t n4, float p, float scale,
                                  uint64_t mixed, uint64_t offset) {
  MT_GRID_STRIDE(i, n4) {
    const float4 x = inp[i];
    const uint64_t at = offset + 4 * static_cast<uint64_t>(i);
    out[i] = make_float4(dropout_mask::apply(x.x, mixed, at, p, scale),
                         dropout_mask::apply(x.y, mixed, at + 1, p, scale),
                         dropout_mask::apply(x.z, mixed, at + 2, p, scale),
                         dropout_mask::apply(x.w, mixed, at + 3, p, scale));
  }
}

}  // namespace

void dropout(float* out, const float* inp, int64_t n, float p, uint64_t seed, uint64_t offset,
             cudaStream_t stream) {
  MT_CHECK(p >= 0.0f && p <= 1.0f, "dropout: p=", p, " outside [0, 1]");
  if (n <= 0) return;
  // The scale and the seed's hash are computed here, by the host's arithmetic, as the CPU does.
  const float scale = dropout_mask::keep_scale(p);
  const uint64_t mixed = dropout_mask::mixed_seed(seed);
  if (detail::quads(n, {out, inp})) {
    dropout_x4_kernel<<<detail::grid_for(n / 4), detail::kBlock, 0, stream>>>(
        reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(inp), n / 4, p, scale,
        mixed, offset);
  } else {
    dropout_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(out, inp, n, p, scale, mixed,
                                                                       offset);
  }
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda
