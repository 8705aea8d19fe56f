// Casts through f32: every supported pair widens to f32 exactly and narrows with the hardware's
// round-to-nearest-even conversion instructions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/cast.h"
#include "meshtrain/cuda/kernels/f32_access.cuh"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

using detail::load_f32;
using detail::store_f32;

template <typename D, typename S>
__global__ void cast_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    store_f32(dst, i, load_f32(src, i));
}

// f32 to bf16, four elements per thread (16-byte loads, 8-byte stores): the casts of autocast
// (activations, weights and gradients before each half GEMM) are the common case and
// bandwidth-bound.
__global__ void f32_to_bf16_x4_kernel(uint2* dst, const float4* src, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float4 v = src[i];
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 out;
    out.x = *reinterpret_cast<const uint32_t*>(&lo);
    out.y = *reinterpret_cast<const uint32_t*>(&hi);
    dst[i] = out;
  }
}

template <typename D, typename S>
void launch(void* dst, const void* src, int64_t n, cudaStream_t stream) {
  if constexpr (std::is_same_v<D, __nv_bfloat16> && std::is_same_v<S, float>) {
    if (n % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(dst) % 8 == 0) {
      f32_to_bf16_x4_kernel<<<detail::grid_for(n / 4), detail::kBlock, 0, stream>>>(
          static_cast<uint2*>(dst), static_cast<const float4*>(src), n / 4);
      MT_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  cast_kernel<D, S><<<detail::grid_for(n), detail::kBlock, 0, stream>>>(
      static_cast<D*>(dst), static_cast<const S*>(src), n);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename D>
void launch_from(void* dst, const void* src, DType src_type, int64_t n, cudaStream_t stream) {
  switch (src_type) {
    case DType::f32:
      return launch<D, float>(dst, src, n, stream);
    case DType::bf16:
      return launch<D, __nv_bfloat16>(dst, src, n, stream);
    case DType::f16:
      return launch<D, __half>(dst, src, n, stream);
    default:
      MT_THROW(ValueError, "cuda cast: unsupported source dtype ", dtype_name(src_type));
  }
}

}  // namespace

void cast(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
          cudaStream_t stream) {
  if (n <= 0) return;
  if (dst_type == src_type) {
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(dst_type),
                                  cudaMemcpyDeviceToDevice, stream));
    return;
  }
  switch (dst_type) {
    case DType::f32:
      return launch_from<float>(dst, src, src_type, n, stream);
    case DType::bf16:
      return launch_from<__nv_bfloat16>(dst, src, src_type, n, stream);
    case DType::f16:
      return launch_from<__half>(dst, src, src_type, n, stream);
    default:
      MT_THROW(ValueError, "cuda cast: unsupported destination dtype ", dtype_name(dst_type));
  }
}

}  // namespace meshtrain::cuda
